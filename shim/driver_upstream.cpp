#include "driver_upstream.h"

#include "hook_table.h"

namespace cupool::shim {

const DriverCalls& driver() {
  static const DriverCalls calls = [] {
    DriverCalls c;
    auto get = [](auto& slot, const char* name) {
      slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(driver_function(name));
      return slot != nullptr;
    };
    c.ok = get(c.ctx_get_current, "cuCtxGetCurrent") & get(c.ctx_get_device, "cuCtxGetDevice") &
           get(c.ctx_synchronize, "cuCtxSynchronize") & get(c.ctx_push, "cuCtxPushCurrent_v2") &
           get(c.ctx_pop, "cuCtxPopCurrent_v2") & get(c.device_get_name, "cuDeviceGetName") &
           get(c.device_total_mem, "cuDeviceTotalMem_v2") &
           get(c.primary_ctx_retain, "cuDevicePrimaryCtxRetain") &
           get(c.primary_ctx_release, "cuDevicePrimaryCtxRelease_v2") &
           get(c.stream_query, "cuStreamQuery") & get(c.event_create, "cuEventCreate") &
           get(c.event_record, "cuEventRecord") &
           get(c.event_query, "cuEventQuery") & get(c.event_synchronize, "cuEventSynchronize") &
           get(c.event_destroy, "cuEventDestroy_v2");
    return c;
  }();
  return calls;
}

bool StreamRegistry::created(CUcontext ctx, CUstream stream, unsigned flags) {
  std::lock_guard lock(mutex_);
  const bool was = concurrent_.load(std::memory_order_relaxed);
  if (flags & CU_STREAM_NON_BLOCKING) {
    non_blocking_[stream] = ctx;
    concurrent_.store(true, std::memory_order_relaxed);
  } else if (blocking_.insert(stream).second && ++blocking_created_ >= 2) {
    // A handle seen twice (the runtime's create calls the driver's) counts once.
    concurrent_.store(true, std::memory_order_relaxed);
  }
  return !was && concurrent_.load(std::memory_order_relaxed);
}

void StreamRegistry::destroyed(CUstream stream) {
  std::lock_guard lock(mutex_);
  non_blocking_.erase(stream);
  blocking_.erase(stream);
}

std::vector<CUstream> StreamRegistry::non_blocking(CUcontext ctx) {
  std::lock_guard lock(mutex_);
  std::vector<CUstream> out;
  for (const auto& [s, c] : non_blocking_)
    if (c == ctx) out.push_back(s);
  return out;
}

StreamRegistry& streams() {
  static StreamRegistry* registry = new StreamRegistry;  // never destroyed: used until exit
  return *registry;
}

namespace {
// Makes `ctx` current for a scope if it is not: a free may come from a thread with another
// context current, or none (the VMM cache fences a mapping on the thread of its last free), and
// an event recorded or a synchronize done there would not cover the pool's context.
class ContextScope {
 public:
  explicit ContextScope(CUcontext ctx) {
    CUcontext cur = nullptr;
    if (driver().ctx_get_current(&cur) == CUDA_SUCCESS && cur != ctx && ctx != nullptr)
      pushed_ = driver().ctx_push(ctx) == CUDA_SUCCESS;
  }
  ~ContextScope() {
    CUcontext popped = nullptr;
    if (pushed_) driver().ctx_pop(&popped);
  }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  bool pushed_ = false;
};
}  // namespace

DriverUpstream::DriverUpstream(CUcontext ctx, CUdevice device) : ctx_(ctx), device_(device) {}

DriverUpstream::~DriverUpstream() {
  if (detached_) return;
  for (auto& [id, fence] : fences_)
    for (CUevent e : fence.events) driver().event_destroy(e);
  for (CUevent e : spare_events_) driver().event_destroy(e);
}

UpstreamStatus DriverUpstream::reserve(std::size_t bytes, std::uint64_t* base, int* driver_code) {
  if (detached_) return UpstreamStatus::error;
  CUdeviceptr ptr = 0;
  CUresult rc = CUPOOL_REAL(cuMemAlloc_v2)(&ptr, bytes);
  *driver_code = rc;
  if (rc == CUDA_SUCCESS) {
    *base = ptr;
    return UpstreamStatus::ok;
  }
  return rc == CUDA_ERROR_OUT_OF_MEMORY ? UpstreamStatus::out_of_memory : UpstreamStatus::error;
}

void DriverUpstream::release(std::uint64_t base, std::size_t) {
  if (detached_) return;
  CUPOOL_REAL(cuMemFree_v2)(static_cast<CUdeviceptr>(base));
}

void DriverUpstream::device_memory(std::size_t* total, std::size_t* free) {
  *total = 0;
  *free = 0;
  if (detached_) return;
  CUPOOL_REAL(cuMemGetInfo_v2)(free, total);
}

void DriverUpstream::synchronize() {
  if (detached_) return;
  ContextScope scope(ctx_);
  driver().ctx_synchronize();
}

bool DriverUpstream::needs_fences() { return streams().concurrent(); }

FenceId DriverUpstream::place_fence() {
  if (detached_) return 0;
  ContextScope scope(ctx_);
  std::vector<CUstream> targets;
  // A non-blocking stream found idle now has finished all its work issued before the free: it
  // needs no event. Most of a framework's streams are idle at any moment (XLA creates 57 and
  // uses a few), and a query costs about what a record does, while each event recorded is also
  // queried later: on the H200 this about halved what XLA's fences cost (29 ms to 15-17 ms a run).
  for (CUstream s : streams().non_blocking(ctx_))
    if (driver().stream_query(s) != CUDA_SUCCESS) targets.push_back(s);
  // The legacy default stream waits for every blocking stream, so one event there covers them
  // (a query of it would not: it does not look at the blocking streams).
  targets.push_back(CU_STREAM_LEGACY);
  std::lock_guard lock(fence_mutex_);
  std::vector<CUevent> events;
  for (CUstream s : targets) {
    CUevent e = nullptr;
    if (!spare_events_.empty()) {
      e = spare_events_.back();
      spare_events_.pop_back();
    } else if (driver().event_create(&e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
      continue;
    }
    if (driver().event_record(e, s) != CUDA_SUCCESS) {
      spare_events_.push_back(e);
      continue;
    }
    events.push_back(e);
  }
  FenceId id = next_fence_++;
  fences_.emplace(id, Fence{std::move(events), 0});
  return id;
}

void DriverUpstream::forget_fence(FenceId fence) {
  auto it = fences_.find(fence);
  if (it == fences_.end()) return;
  for (CUevent e : it->second.events) spare_events_.push_back(e);
  fences_.erase(it);
}

bool DriverUpstream::fence_retired(FenceId fence) {
  if (detached_) return true;
  std::lock_guard lock(fence_mutex_);
  auto it = fences_.find(fence);
  if (it == fences_.end()) return true;
  // Events found complete are recycled at once, so that the next poll of this fence asks only
  // about the streams still busy (a fence covers every stream: XLA creates 57). Not while a
  // thread waits on the fence: a recycled event may be recorded again, on newer work.
  Fence& f = it->second;
  if (f.waiters > 0) {
    for (CUevent e : f.events)
      if (driver().event_query(e) == CUDA_ERROR_NOT_READY) return false;
    return true;  // the last waiter recycles them
  }
  while (!f.events.empty()) {
    if (driver().event_query(f.events.back()) == CUDA_ERROR_NOT_READY) return false;
    spare_events_.push_back(f.events.back());
    f.events.pop_back();
  }
  fences_.erase(it);
  return true;
}

void DriverUpstream::wait_fence(FenceId fence) {
  if (detached_) return;
  std::vector<CUevent> events;
  {
    std::lock_guard lock(fence_mutex_);
    auto it = fences_.find(fence);
    if (it == fences_.end()) return;
    ++it->second.waiters;
    events = it->second.events;
  }
  for (CUevent e : events) driver().event_synchronize(e);
  std::lock_guard lock(fence_mutex_);
  if (auto it = fences_.find(fence); it != fences_.end() && --it->second.waiters == 0) forget_fence(fence);
}

}  // namespace cupool::shim
