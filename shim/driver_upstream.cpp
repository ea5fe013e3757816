// DriverUpstream: the Upstream of a pool on a real device (driver_upstream.h).
#include "driver_upstream.h"

#include <unistd.h>

#include <algorithm>

#include "hook_table.h"
#include "streams.h"

namespace cupool::shim {

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

// The last work of a destroyed non-blocking stream: an event recorded on it at the destroy.
// Shared by the fences placed while that work may still run; destroyed (never recycled: a
// recycled event is recorded again on newer work) when the last of them lets go.
struct DriverUpstream::Tombstone {
  CUevent event = nullptr;
  const DriverUpstream* owner = nullptr;
  ~Tombstone() {
    if (!owner->detached_) driver().event_destroy(event);
  }
};

DriverUpstream::DriverUpstream(CUcontext ctx, CUdevice device) : ctx_(ctx), device_(device) {}

DriverUpstream::~DriverUpstream() {
  if (detached_) return;
  for (auto& [id, fence] : fences_)
    for (CUevent e : fence.events) driver().event_destroy(e);
  for (CUevent e : spare_events_) driver().event_destroy(e);
  for (CUevent e : {legacy_snapshot_, probe_event_})
    if (e) driver().event_destroy(e);
}

CUevent DriverUpstream::take_event_locked() {
  CUevent e = nullptr;
  if (!spare_events_.empty()) {
    e = spare_events_.back();
    spare_events_.pop_back();
  } else if (driver().event_create(&e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
    return nullptr;
  }
  return e;
}

UpstreamStatus DriverUpstream::reserve(std::size_t bytes, std::size_t min_bytes, std::uint64_t* base,
                                       std::size_t* got, int* driver_code) {
  if (detached_) return UpstreamStatus::error;
  return reserve_at_least(bytes, min_bytes, got, [&](std::size_t n, bool) {
    CUdeviceptr ptr = 0;
    const CUresult rc = CUPOOL_REAL(cuMemAlloc_v2)(&ptr, n);
    *driver_code = rc;
    if (rc == CUDA_SUCCESS) {
      *base = ptr;
      return UpstreamStatus::ok;
    }
    return rc == CUDA_ERROR_OUT_OF_MEMORY ? UpstreamStatus::out_of_memory : UpstreamStatus::error;
  });
}

void DriverUpstream::release(std::uint64_t base, std::size_t) {
  if (detached_) return;
  ContextScope scope(ctx_);  // the shared budget's give-back thread has no context of its own
  CUPOOL_REAL(cuMemFree_v2)(static_cast<CUdeviceptr>(base));
}

void DriverUpstream::device_memory(std::size_t* total, std::size_t* free) {
  *total = 0;
  *free = 0;
  if (detached_) return;
  ContextScope scope(ctx_);
  CUPOOL_REAL(cuMemGetInfo_v2)(free, total);
}

// What cudaFree waits for. During a stream capture the driver's own cudaFree waits for the work
// that is not being captured (measured: 50 ms behind a 50 ms kernel on another stream), while a
// context synchronize would invalidate the capture; and a thread the capture mode forbids to
// wait would invalidate it too, so such a thread does not wait (its free is refused before it
// gets here, as the driver refuses it; what remains is cupool's own housekeeping).
void DriverUpstream::synchronize() {
  if (detached_) return;
  if (captures().any()) {
    if (!captures().prohibited_here()) wait_uncaptured();
    return;
  }
  ContextScope scope(ctx_);
  driver().ctx_synchronize();
}

// An event on every stream of the context that is not capturing, the legacy stream (or, while a
// blocking stream captures and the legacy stream cannot be used, the event recorded on it before
// that capture began), and destroyed streams' last work; then a wait for each. Work that other
// threads put on their per-thread streams during a blocking capture is not covered: the blocks
// freed meanwhile stay in quarantine until the capture ends (ContextPool::deallocate).
void DriverUpstream::wait_uncaptured() {
  ContextScope scope(ctx_);
  std::vector<CUstream> targets = streams().non_blocking_of(ctx_);
  for (CUstream s : streams().blocking_of(ctx_)) targets.push_back(s);
  targets.erase(std::remove_if(targets.begin(), targets.end(), [](CUstream s) { return captures().capturing(s); }),
                targets.end());
  const bool legacy_usable = !captures().blocking_capture(ctx_);
  if (legacy_usable) targets.push_back(CU_STREAM_LEGACY);
  std::vector<CUevent> recorded;
  std::vector<TombstoneRef> tombstones;
  CUevent snapshot = nullptr;
  {
    std::lock_guard lock(fence_mutex_);
    for (CUstream s : targets) {
      CUevent e = take_event_locked();
      if (e == nullptr) continue;
      if (driver().event_record(e, s) == CUDA_SUCCESS) recorded.push_back(e);
      else spare_events_.push_back(e);
    }
    tombstones = tombstones_;
    if (!legacy_usable) snapshot = legacy_snapshot_;
  }
  for (CUevent e : recorded) driver().event_synchronize(e);
  for (const TombstoneRef& t : tombstones) driver().event_synchronize(t->event);
  if (snapshot) driver().event_synchronize(snapshot);
  std::lock_guard lock(fence_mutex_);
  for (CUevent e : recorded) spare_events_.push_back(e);
}

bool DriverUpstream::needs_fences() { return streams().concurrent(); }

bool DriverUpstream::capturing() { return captures().any(); }

void DriverUpstream::stream_destroying(CUstream stream) {
  if (detached_ || captures().capturing(stream)) return;  // captured work never runs
  ContextScope scope(ctx_);
  // An idle stream needs no tombstone; a query is an unsafe call, though, not to be made while a
  // capture forbids it (then the event is recorded anyway: recording on a stream that is not
  // capturing is always allowed).
  const bool may_query = !captures().prohibited_here();
  if (may_query && driver().stream_query(stream) == CUDA_SUCCESS) return;
  std::lock_guard lock(fence_mutex_);
  // Tombstones whose work is done go now too: in sync mode no fence is placed to prune them, and
  // a program that makes and destroys busy streams in a loop would otherwise pile them up.
  if (may_query) prune_tombstones_locked();
  CUevent e = nullptr;
  if (driver().event_create(&e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) return;
  if (driver().event_record(e, stream) != CUDA_SUCCESS) {
    driver().event_destroy(e);
    return;
  }
  auto t = std::make_shared<Tombstone>();
  t->event = e;
  t->owner = this;
  tombstones_.push_back(std::move(t));
}

void DriverUpstream::before_blocking_capture() {
  if (detached_) return;
  ContextScope scope(ctx_);
  std::lock_guard lock(fence_mutex_);
  if (legacy_snapshot_ == nullptr && driver().event_create(&legacy_snapshot_, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
    legacy_snapshot_ = nullptr;
  if (legacy_snapshot_) driver().event_record(legacy_snapshot_, CU_STREAM_LEGACY);
}

CUevent DriverUpstream::probe_event() {
  if (detached_) return nullptr;
  ContextScope scope(ctx_);
  std::lock_guard lock(fence_mutex_);
  if (probe_event_ == nullptr && driver().event_create(&probe_event_, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
    probe_event_ = nullptr;
  return probe_event_;
}

CUresult DriverUpstream::refuse_as_capture_does() {
  CUevent probe = probe_event();
  const CUresult rc = probe ? driver().event_query(probe) : CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  return rc == CUDA_SUCCESS ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : rc;
}

FenceId DriverUpstream::place_fence() {
  if (detached_) return 0;
  ContextScope scope(ctx_);
  std::vector<CUstream> targets;
  // A non-blocking stream found idle now has finished all its work issued before the free: it
  // needs no event. Most of a framework's streams are idle at any moment (XLA creates 57 and
  // uses a few), and a query costs about what a record does, while each event recorded is also
  // queried later: on the H200 this about halved what XLA's fences cost (29 ms to 15-17 ms a run).
  for (CUstream s : streams().non_blocking_of(ctx_))
    if (driver().stream_query(s) != CUDA_SUCCESS) targets.push_back(s);
  // The legacy default stream waits for every blocking stream, per-thread default streams
  // included, so one event there covers them (a query of it would not: it does not look at the
  // blocking streams).
  targets.push_back(CU_STREAM_LEGACY);
  std::lock_guard lock(fence_mutex_);
  Fence fence;
  for (CUstream s : targets) {
    CUevent e = take_event_locked();
    if (e == nullptr) continue;
    if (driver().event_record(e, s) != CUDA_SUCCESS) {
      spare_events_.push_back(e);
      continue;
    }
    fence.events.push_back(e);
  }
  // Destroyed streams whose last work is still running: no event can be recorded there any more.
  prune_tombstones_locked();
  fence.tombstones = tombstones_;
  FenceId id = next_fence_++;
  fences_.emplace(id, std::move(fence));
  return id;
}

void DriverUpstream::prune_tombstones_locked() {
  tombstones_.erase(std::remove_if(tombstones_.begin(), tombstones_.end(),
                                   [](const TombstoneRef& t) {
                                     return driver().event_query(t->event) != CUDA_ERROR_NOT_READY;
                                   }),
                    tombstones_.end());
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
  while (!f.tombstones.empty()) {
    if (driver().event_query(f.tombstones.back()->event) == CUDA_ERROR_NOT_READY) return false;
    f.tombstones.pop_back();
  }
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
  std::vector<TombstoneRef> tombstones;
  {
    std::lock_guard lock(fence_mutex_);
    auto it = fences_.find(fence);
    if (it == fences_.end()) return;
    ++it->second.waiters;
    events = it->second.events;
    tombstones = it->second.tombstones;
  }
  for (CUevent e : events) driver().event_synchronize(e);
  for (const TombstoneRef& t : tombstones) driver().event_synchronize(t->event);
  {
    std::lock_guard lock(fence_mutex_);
    tombstones.clear();  // the last reference may go here: under the lock, as everywhere else
  }
  std::lock_guard lock(fence_mutex_);
  if (auto it = fences_.find(fence); it != fences_.end() && --it->second.waiters == 0) forget_fence(fence);
}

// ---- the vmm policy ---------------------------------------------------------------------------

namespace {
CUmemAllocationProp device_memory_prop(CUdevice device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = static_cast<int>(device);
  return prop;
}
}  // namespace

std::size_t DriverUpstream::vmm_granularity() {
  if (std::size_t g = granularity_.load(std::memory_order_acquire)) return g;
  std::lock_guard lock(vmm_mutex_);
  if (vmm_unsupported_ || detached_) return 0;
  std::size_t g = 0;
  const CUmemAllocationProp prop = device_memory_prop(device_);
  auto query = driver().mem_get_allocation_granularity;
  int vmm_attribute = 1;
  if (auto attr = driver().device_get_attribute;
      attr && attr(&vmm_attribute, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device_) == CUDA_SUCCESS &&
      vmm_attribute == 0) {
    vmm_unsupported_ = true;
    no_vmm_reason_ = "device " + std::to_string(device_) +
                     " has no virtual memory management (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0)";
    return 0;
  }
  if (query == nullptr || !CUPOOL_REAL(cuMemCreate) || !CUPOOL_REAL(cuMemMap) || !CUPOOL_REAL(cuMemSetAccess) ||
      !CUPOOL_REAL(cuMemAddressReserve)) {
    vmm_unsupported_ = true;
    no_vmm_reason_ = "it lacks the virtual memory calls (cuMemCreate, cuMemMap, cuMemSetAccess, cuMemAddressReserve)";
    return 0;
  }
  if (const CUresult rc = query(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM); rc != CUDA_SUCCESS || g == 0) {
    vmm_unsupported_ = true;
    no_vmm_reason_ = "cuMemGetAllocationGranularity gave no granularity (CUresult " + std::to_string(static_cast<int>(rc)) + ")";
    return 0;
  }
  // Exportable granules (CUDA IPC of vmm blocks) where the device offers file descriptors. The
  // granularity was asked without a handle type; the driver gives the same for both.
  int fd_ok = 0;
  if (auto attr = driver().device_get_attribute;
      attr && CUPOOL_REAL(cuMemExportToShareableHandle) && driver().mem_import_from_shareable_handle &&
      attr(&fd_ok, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, device_) == CUDA_SUCCESS)
    fd_handles_.store(fd_ok != 0, std::memory_order_relaxed);
  granularity_.store(g, std::memory_order_release);
  return g;
}

std::string DriverUpstream::no_virtual_memory_reason() {
  std::lock_guard lock(vmm_mutex_);
  return no_vmm_reason_.empty() ? std::string("it has no virtual memory management") : no_vmm_reason_;
}

bool DriverUpstream::shareable() { return vmm_granularity() != 0 && fd_handles_.load(std::memory_order_relaxed); }

CUresult DriverUpstream::export_granules(std::uint64_t first_va, std::size_t count, std::vector<int>* fds) {
  if (detached_) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  const std::size_t g = vmm_granularity();
  std::vector<CUmemGenericAllocationHandle> handles;
  handles.reserve(count);
  {
    std::lock_guard lock(vmm_mutex_);
    for (std::size_t i = 0; i < count; ++i) {
      auto it = granule_handles_.find(first_va + i * g);
      if (it == granule_handles_.end()) return CUDA_ERROR_INVALID_VALUE;
      handles.push_back(it->second);
    }
  }
  ContextScope scope(ctx_);  // the socket server's thread has no context of its own
  auto exporter = CUPOOL_REAL(cuMemExportToShareableHandle);
  CUresult rc = exporter ? CUDA_SUCCESS : CUDA_ERROR_NOT_SUPPORTED;
  const std::size_t before = fds->size();
  for (std::size_t i = 0; i < handles.size() && rc == CUDA_SUCCESS; ++i) {
    int fd = -1;
    rc = exporter(&fd, handles[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (rc == CUDA_SUCCESS) fds->push_back(fd);
  }
  if (rc != CUDA_SUCCESS) {
    for (std::size_t i = before; i < fds->size(); ++i) ::close((*fds)[i]);
    fds->resize(before);
  }
  return rc;
}

UpstreamStatus DriverUpstream::reserve_address(std::size_t bytes, std::uint64_t* va) {
  if (detached_) return UpstreamStatus::error;
  ContextScope scope(ctx_);
  CUdeviceptr ptr = 0;
  const CUresult rc = CUPOOL_REAL(cuMemAddressReserve)(&ptr, bytes, vmm_granularity(), 0, 0);
  if (rc != CUDA_SUCCESS) return rc == CUDA_ERROR_OUT_OF_MEMORY ? UpstreamStatus::out_of_memory : UpstreamStatus::error;
  *va = ptr;
  std::lock_guard lock(vmm_mutex_);
  vmm_ranges_[ptr] = bytes;
  return UpstreamStatus::ok;
}

void DriverUpstream::free_address(std::uint64_t va, std::size_t bytes) {
  if (detached_) return;
  {
    std::lock_guard lock(vmm_mutex_);
    vmm_ranges_.erase(va);
  }
  ContextScope scope(ctx_);
  CUPOOL_REAL(cuMemAddressFree)(static_cast<CUdeviceptr>(va), bytes);
}

void DriverUpstream::release_virtual_memory() {
  if (detached_) return;
  std::unordered_map<std::uint64_t, CUmemGenericAllocationHandle> handles;
  std::unordered_map<std::uint64_t, std::size_t> ranges;
  {
    std::lock_guard lock(vmm_mutex_);
    handles.swap(granule_handles_);
    ranges.swap(vmm_ranges_);
    vmm_released_ = true;
  }
  if (handles.empty() && ranges.empty()) return;
  const std::size_t g = granularity_.load(std::memory_order_acquire);
  ContextScope scope(ctx_);
  driver().ctx_synchronize();  // cuMemUnmap does not wait for the device: its queued work ends first
  for (const auto& [at, h] : handles) {
    CUPOOL_REAL(cuMemUnmap)(static_cast<CUdeviceptr>(at), g);
    CUPOOL_REAL(cuMemRelease)(h);
  }
  for (const auto& [va, bytes] : ranges) CUPOOL_REAL(cuMemAddressFree)(static_cast<CUdeviceptr>(va), bytes);
}

// Asks for an exportable granule where the device offers one; a driver that refuses the handle
// type (where the attribute promised it) is not asked again, and IPC of this pool's blocks is
// then refused as before.
CUresult DriverUpstream::create_granule(CUmemGenericAllocationHandle* h, std::size_t g, CUmemAllocationProp prop) {
  if (fd_handles_.load(std::memory_order_relaxed)) {
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    const CUresult rc = CUPOOL_REAL(cuMemCreate)(h, g, &prop, 0);
    if (rc != CUDA_ERROR_INVALID_VALUE && rc != CUDA_ERROR_NOT_SUPPORTED) return rc;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    const CUresult plain = CUPOOL_REAL(cuMemCreate)(h, g, &prop, 0);
    if (plain == CUDA_SUCCESS) fd_handles_.store(false, std::memory_order_relaxed);
    return plain;
  }
  return CUPOOL_REAL(cuMemCreate)(h, g, &prop, 0);
}

UpstreamStatus DriverUpstream::map(std::uint64_t va, std::size_t bytes, int* driver_code) {
  *driver_code = 0;
  if (detached_) return UpstreamStatus::error;
  const std::size_t g = vmm_granularity();
  if (g == 0) return UpstreamStatus::error;
  ContextScope scope(ctx_);
  const CUmemAllocationProp prop = device_memory_prop(device_);
  std::vector<CUmemAccessDesc> access(1);  // this device, then the peers granted access
  access[0].location = prop.location;
  access[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  {
    std::lock_guard lock(vmm_mutex_);
    for (CUdevice peer : peers_) {
      access.push_back(access[0]);
      access.back().location.id = peer;
    }
  }
  std::vector<std::pair<std::uint64_t, CUmemGenericAllocationHandle>> made;
  made.reserve(bytes / g);
  CUresult rc = CUDA_SUCCESS;
  for (std::uint64_t at = va; at < va + bytes; at += g) {
    CUmemGenericAllocationHandle h = 0;
    rc = create_granule(&h, g, prop);
    if (rc != CUDA_SUCCESS) break;
    rc = CUPOOL_REAL(cuMemMap)(static_cast<CUdeviceptr>(at), g, 0, h, 0);
    if (rc != CUDA_SUCCESS) {
      CUPOOL_REAL(cuMemRelease)(h);
      break;
    }
    made.emplace_back(at, h);
  }
  if (rc == CUDA_SUCCESS) rc = CUPOOL_REAL(cuMemSetAccess)(static_cast<CUdeviceptr>(va), bytes, access.data(), access.size());
  if (rc != CUDA_SUCCESS) {  // nothing half done stays behind
    for (const auto& [at, h] : made) {
      CUPOOL_REAL(cuMemUnmap)(static_cast<CUdeviceptr>(at), g);
      CUPOOL_REAL(cuMemRelease)(h);
    }
    *driver_code = rc;
    return rc == CUDA_ERROR_OUT_OF_MEMORY ? UpstreamStatus::out_of_memory : UpstreamStatus::error;
  }
  std::vector<CUdevice> late;  // peers granted access while this map was in flight
  bool released = false;
  {
    std::lock_guard lock(vmm_mutex_);
    released = vmm_released_;
    if (!released) {
      for (const auto& [at, h] : made) granule_handles_[at] = h;
      late.assign(peers_.begin() + static_cast<std::ptrdiff_t>(access.size() - 1), peers_.end());
    }
  }
  if (released) {
    // The context went while this map was in flight, and its granules were given back without
    // these: cuMemCreate memory outlives its context, so they go now or never.
    for (const auto& [at, h] : made) {
      CUPOOL_REAL(cuMemUnmap)(static_cast<CUdeviceptr>(at), g);
      CUPOOL_REAL(cuMemRelease)(h);
    }
    return UpstreamStatus::error;
  }
  for (CUdevice peer : late) {
    CUmemAccessDesc d = access[0];
    d.location.id = peer;
    CUPOOL_REAL(cuMemSetAccess)(static_cast<CUdeviceptr>(va), bytes, &d, 1);
  }
  return UpstreamStatus::ok;
}

void DriverUpstream::grant_peer(CUdevice accessor) {
  if (detached_ || accessor == device_) return;
  std::vector<std::uint64_t> mapped;
  {
    std::lock_guard lock(vmm_mutex_);
    if (std::find(peers_.begin(), peers_.end(), accessor) != peers_.end()) return;
    peers_.push_back(accessor);
    mapped.reserve(granule_handles_.size());
    for (const auto& [at, h] : granule_handles_) mapped.push_back(at);
  }
  if (mapped.empty()) return;
  const std::size_t g = granularity_.load(std::memory_order_acquire);
  std::sort(mapped.begin(), mapped.end());
  CUmemAccessDesc d{};
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = accessor;
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  ContextScope scope(ctx_);
  // Adjacent granules in one call; a run that another thread unmapped meanwhile fails as a whole,
  // and its granules are then asked one by one (those still mapped get access).
  for (std::size_t i = 0; i < mapped.size();) {
    std::size_t j = i + 1;
    while (j < mapped.size() && mapped[j] == mapped[j - 1] + g) ++j;
    if (CUPOOL_REAL(cuMemSetAccess)(static_cast<CUdeviceptr>(mapped[i]), (j - i) * g, &d, 1) != CUDA_SUCCESS)
      for (std::size_t k = i; k < j; ++k) CUPOOL_REAL(cuMemSetAccess)(static_cast<CUdeviceptr>(mapped[k]), g, &d, 1);
    i = j;
  }
}

void DriverUpstream::unmap(std::uint64_t va, std::size_t bytes) {
  if (detached_) return;
  const std::size_t g = vmm_granularity();
  if (g == 0) return;
  std::vector<std::pair<std::uint64_t, CUmemGenericAllocationHandle>> gone;
  {
    std::lock_guard lock(vmm_mutex_);
    for (std::uint64_t at = va; at < va + bytes; at += g)
      if (auto it = granule_handles_.find(at); it != granule_handles_.end()) {
        gone.emplace_back(at, it->second);
        granule_handles_.erase(it);
      }
  }
  ContextScope scope(ctx_);  // the shared budget's give-back thread has no context of its own
  for (const auto& [at, h] : gone) {
    CUPOOL_REAL(cuMemUnmap)(static_cast<CUdeviceptr>(at), g);
    CUPOOL_REAL(cuMemRelease)(h);
  }
}

}  // namespace cupool::shim
