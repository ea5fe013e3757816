// Allocation, free and memory-info hooks of the runtime and the driver. Allocations that a pool
// can serve (cudaMalloc, cudaMallocPitch, cuMemAlloc_v2, cuMemAllocPitch_v2) go to the pool of
// the current context; the rest (managed, stream-ordered, virtual memory) go to the driver and
// are counted against the cap. Every outermost call is one trace event.
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>

#include "device_pool.h"
#include "event_clock.h"
#include "hook_table.h"
#include "hooks_internal.h"
#include "log.h"
#include "shim_state.h"
#include "streams.h"
#include "thread_id.h"
#include "units.h"
#include "vmm_cache.h"

namespace cupool::shim {
namespace {

using trace::EventKind;
using trace::OomClass;
using trace::Path;

// True for one call in kCacheTimingSample, at random: a counter would time only allocs, or only
// frees, of a program that alternates them. xorshift32 per thread.
bool sampled() {
  thread_local std::uint32_t x = 0;
  if (x == 0) x = current_thread_id() << 1 | 1;  // distinct per thread, never 0
  x ^= x << 13;
  x ^= x >> 17;
  x ^= x << 5;
  static_assert((trace::kCacheTimingSample & (trace::kCacheTimingSample - 1)) == 0);
  return (x & (trace::kCacheTimingSample - 1)) == 0;
}

// One event, timed from construction; emitted only when tracing.
struct Event {
  trace::Record r;
  bool on = tracing();
  Event(EventKind kind, const char* api, Path path) {
    if (!on) return;
    r.t_ns = EventClock::stamp();  // converted by the trace writer, off this thread
    r.stamped = true;
    r.kind = kind;
    r.api = api;
    r.path = path;
  }
  // Where the pool writes its state after serving the call (nothing when not tracing).
  trace::PoolState* pool_state() {
    if (!on) return nullptr;
    r.has_pool = true;
    return &r.pool;
  }
  void stream(const void* s) {
    r.has_stream = true;
    r.stream = reinterpret_cast<std::uintptr_t>(s);
  }
  // The pool state, if the pool served the call, is already in r.pool (has_pool set).
  void done(int rc, std::uint64_t size, std::uint64_t ptr, const ContextPool* cp) {
    if (!on) return;
    if (r.has_pool && r.pool.cache_delta != 0)  // the thread's cache served it: timed 1 in kCacheTimingSample
      r.timed_for = sampled() ? trace::kCacheTimingSample : 0;
    if (r.timed_for != 0) {
      const std::uint64_t end = EventClock::stamp();
      r.dur_ns = end - r.t_ns;
      // `t` orders events across threads: memory is handed out by the time an allocation
      // returns and given back no earlier than its free was called, so (alloc: end, free:
      // start) is a consistent order for every reuse of an address. An untimed alloc keeps its
      // start: its block came from the thread's own cache, where no other thread could reach it.
      if (trace::timed_at_end(r.kind)) r.t_ns = end;
    }
    r.rc = rc;
    r.size = size;
    r.ptr = ptr;
    r.tid = current_thread_id();
    if (cp) r.device = static_cast<std::int16_t>(cp->device);
    emit(r);
  }
};

bool pooled() { return config().policy != PolicyKind::passthrough; }

// The context the runtime would allocate in. Like the runtime's own cudaMalloc, the first call
// on a thread with no context creates the device's primary context (cudaFree(NULL) does that).
ContextPool* runtime_pool() {
  CUresult rc = CUDA_SUCCESS;
  if (ContextPool* cp = current_pool(&rc)) return cp;
  if (auto real_free = CUPOOL_REAL(cudaFree); real_free && real_free(nullptr) == cudaSuccess)
    return current_pool(&rc);
  return nullptr;
}

ContextPool* driver_pool() {
  CUresult rc = CUDA_SUCCESS;
  return current_pool(&rc);
}

// After a refusal of cupool's own in a runtime hook, the runtime's sticky error (cudaGetLastError,
// cudaPeekAtLastError) must say what the driver's refusal would have left there:
// cudaErrorMemoryAllocation. Asked of the runtime with an allocation no device can satisfy; only
// on the error path, and not while a capture forbids this thread that call (the driver would
// invalidate the capture for it, which the program's own call would not have done).
void set_runtime_last_error_oom() {
  if (captures().any() && captures().prohibited_here()) return;
  if (auto real = CUPOOL_REAL(cudaMalloc)) {
    void* p = nullptr;
    real(&p, SIZE_MAX);
  }
}

// A stream capture in progress forbids this thread "unsafe" calls (cudaMalloc, cudaFree and
// their driver twins among them): the driver would refuse the program's own call and invalidate
// the capture. cupool must do the same rather than serve it from a pool.
bool capture_forbids_here() { return captures().any() && captures().prohibited_here(); }

ProcessMemory& memory() { return process_memory(); }

// Serves an allocation from the pool (policy/process_memory.h: kept VMM mappings go back before a
// refusal). Returns the pointer, or the OOM class.
AllocResult pool_allocate(ContextPool* cp, std::size_t size, const char* api, trace::PoolState* state) {
  return memory().allocate(*cp, size, api, state);
}

// A pointer cupool did not hand out and the driver has freed: uncharged if it was counted.
void forget_external(std::uint64_t key, std::uint64_t* bytes, ContextPool** owner) {
  memory().forget_outside(key, bytes, owner);
}

VmmCache* vmm_cache() { return memory().vmm_cache(); }

// Runs a driver allocation outside the pools (managed, stream-ordered, VMM, passthrough) through
// ProcessMemory, which charges the cap first. `call` returns the API's code and leaves the new
// pointer or handle in *key; `ok`/`oom` are that API's codes. `refused_here` (if given) is set
// when cupool itself refused (the cap), not the driver: a runtime hook must then leave the
// runtime's last error as the driver's refusal would.
template <typename Code, typename Call>
Code external_allocate(ContextPool* cp, std::uint64_t bytes, Code ok, Code oom, const char* api,
                       std::uint64_t* key, Call&& call, bool* refused_here = nullptr) {
  Code rc = oom;
  const OutsideAnswer answer = memory().allocate_outside(cp, bytes, api, [&](std::uint64_t* made) {
    rc = call();
    *made = *key;
    return rc == ok ? OutsideAnswer::ok : rc == oom ? OutsideAnswer::out_of_memory : OutsideAnswer::failed;
  });
  if (answer == OutsideAnswer::refused_by_cap) {
    if (refused_here) *refused_here = true;
    return oom;
  }
  return rc;
}

std::uint64_t round_pitch(std::size_t width) { return (width + 511) & ~std::uint64_t{511}; }

}  // namespace

namespace impl {

// ---- Runtime ----------------------------------------------------------------------------

cudaError_t cudaMalloc(Path path, void** devPtr, size_t size) {
  HookScope scope;
  auto real = CUPOOL_REAL(cudaMalloc);
  if (!scope.outermost() || devPtr == nullptr) return real ? real(devPtr, size) : cudaErrorInitializationError;
  initialize();
  Event ev(EventKind::alloc, "cudaMalloc", path);
  ContextPool* cp = runtime_pool();
  cudaError_t rc;
  if (cp == nullptr || !pooled() || capture_forbids_here()) {
    // Passthrough, or a call the capture forbids: the runtime answers (and refuses) it itself.
    std::uint64_t key = 0;
    bool refused_here = false;
    rc = external_allocate(cp, size, cudaSuccess, cudaErrorMemoryAllocation, "cudaMalloc", &key, [&] {
      cudaError_t r = real ? real(devPtr, size) : cudaErrorInitializationError;
      key = reinterpret_cast<std::uintptr_t>(*devPtr);
      return r;
    }, &refused_here);
    if (refused_here) set_runtime_last_error_oom();
    ev.done(rc, size, rc == cudaSuccess ? reinterpret_cast<std::uintptr_t>(*devPtr) : 0, cp);
    return rc;
  }
  if (size == 0) {
    *devPtr = nullptr;
    ev.done(cudaSuccess, 0, 0, cp);
    return cudaSuccess;
  }
  AllocResult r = pool_allocate(cp, size, "cudaMalloc", ev.pool_state());
  if (r.ptr) {
    *devPtr = reinterpret_cast<void*>(r.ptr);
    rc = cudaSuccess;
  } else {
    set_runtime_last_error_oom();
    rc = cudaErrorMemoryAllocation;
    ev.r.oom_class = r.oom;
  }
  ev.done(rc, size, r.ptr, cp);
  return rc;
}

cudaError_t cudaMallocPitch(Path path, void** devPtr, size_t* pitch, size_t width, size_t height) {
  HookScope scope;
  auto real = CUPOOL_REAL(cudaMallocPitch);
  if (!scope.outermost() || devPtr == nullptr || pitch == nullptr)
    return real ? real(devPtr, pitch, width, height) : cudaErrorInitializationError;
  initialize();
  Event ev(EventKind::alloc, "cudaMallocPitch", path);
  ContextPool* cp = runtime_pool();
  cudaError_t rc;
  if (cp == nullptr || !pooled() || width == 0 || height == 0 || capture_forbids_here()) {
    std::uint64_t key = 0;
    const std::uint64_t bytes = round_pitch(width) * height;
    bool refused_here = false;
    rc = external_allocate(cp, bytes, cudaSuccess, cudaErrorMemoryAllocation, "cudaMallocPitch", &key, [&] {
      cudaError_t r = real ? real(devPtr, pitch, width, height) : cudaErrorInitializationError;
      key = reinterpret_cast<std::uintptr_t>(*devPtr);
      return r;
    }, &refused_here);
    if (refused_here) set_runtime_last_error_oom();
    ev.done(rc, bytes, rc == cudaSuccess ? reinterpret_cast<std::uintptr_t>(*devPtr) : 0, cp);
    return rc;
  }
  const std::uint64_t row = round_pitch(width);
  AllocResult r = pool_allocate(cp, row * height, "cudaMallocPitch", ev.pool_state());
  if (r.ptr) {
    *devPtr = reinterpret_cast<void*>(r.ptr);
    *pitch = row;
    rc = cudaSuccess;
  } else {
    set_runtime_last_error_oom();
    rc = cudaErrorMemoryAllocation;
    ev.r.oom_class = r.oom;
  }
  ev.done(rc, row * height, r.ptr, cp);
  return rc;
}

cudaError_t cudaMallocManaged(Path path, void** devPtr, size_t size, unsigned int flags) {
  HookScope scope;
  auto real = CUPOOL_REAL(cudaMallocManaged);
  if (!scope.outermost() || devPtr == nullptr) return real ? real(devPtr, size, flags) : cudaErrorInitializationError;
  initialize();
  Event ev(EventKind::alloc, "cudaMallocManaged", path);
  ContextPool* cp = runtime_pool();
  std::uint64_t key = 0;
  bool refused_here = false;
  cudaError_t rc = external_allocate(cp, size, cudaSuccess, cudaErrorMemoryAllocation, "cudaMallocManaged", &key, [&] {
    cudaError_t r = real ? real(devPtr, size, flags) : cudaErrorInitializationError;
    key = reinterpret_cast<std::uintptr_t>(*devPtr);
    return r;
  }, &refused_here);
  if (refused_here) set_runtime_last_error_oom();
  ev.done(rc, size, rc == cudaSuccess ? key : 0, cp);
  return rc;
}

namespace {
// A stream-ordered allocation or free on a stream that is being captured is a node of the graph,
// not memory now: the driver reserves that memory when the graph is instantiated or run, and
// cupool charges it then (graph memory, hooks_graphs.cpp). Such calls go to the driver untouched,
// with no event. `per_thread`: the call is the per-thread flavour (stream 0 is the thread's own).
bool graph_node(const void* stream, bool per_thread) {
  if (!captures().any()) return false;
  CUstream s = static_cast<CUstream>(const_cast<void*>(stream));
  if (s == nullptr && per_thread) s = CU_STREAM_PER_THREAD;
  return captures().captures_work_on(s);
}

template <typename Real>
cudaError_t runtime_malloc_async(Path path, const char* api, Real real, void** devPtr, size_t size,
                                 cudaStream_t stream, bool per_thread) {
  HookScope scope;
  if (!scope.outermost() || devPtr == nullptr || graph_node(stream, per_thread))
    return real ? real(devPtr, size, stream) : cudaErrorInitializationError;
  initialize();
  Event ev(EventKind::alloc, api, path);
  ev.stream(stream);
  ContextPool* cp = runtime_pool();
  std::uint64_t key = 0;
  bool refused_here = false;
  cudaError_t rc = external_allocate(cp, size, cudaSuccess, cudaErrorMemoryAllocation, api, &key, [&] {
    cudaError_t r = real ? real(devPtr, size, stream) : cudaErrorInitializationError;
    key = reinterpret_cast<std::uintptr_t>(*devPtr);
    return r;
  }, &refused_here);
  if (refused_here) set_runtime_last_error_oom();
  ev.done(rc, size, rc == cudaSuccess ? key : 0, cp);
  return rc;
}

template <typename Real>
cudaError_t runtime_free_async(Path path, const char* api, Real real, void* devPtr, cudaStream_t stream,
                               bool per_thread) {
  HookScope scope;
  if (!scope.outermost() || devPtr == nullptr || graph_node(stream, per_thread))
    return real ? real(devPtr, stream) : cudaErrorInitializationError;
  initialize();
  Event ev(EventKind::free, api, path);
  ev.stream(stream);
  cudaError_t rc = real ? real(devPtr, stream) : cudaErrorInitializationError;
  std::uint64_t bytes = 0;
  ContextPool* owner = nullptr;
  if (rc == cudaSuccess) forget_external(reinterpret_cast<std::uintptr_t>(devPtr), &bytes, &owner);
  ev.done(rc, bytes, reinterpret_cast<std::uintptr_t>(devPtr), owner);
  return rc;
}
}  // namespace

cudaError_t cudaMallocAsync(Path path, void** devPtr, size_t size, cudaStream_t stream) {
  return runtime_malloc_async(path, "cudaMallocAsync", CUPOOL_REAL(cudaMallocAsync), devPtr, size, stream, false);
}
cudaError_t cudaMallocAsync_ptsz(Path path, void** devPtr, size_t size, cudaStream_t stream) {
  return runtime_malloc_async(path, "cudaMallocAsync_ptsz", CUPOOL_REAL(cudaMallocAsync_ptsz), devPtr, size, stream,
                              true);
}
cudaError_t cudaFreeAsync(Path path, void* devPtr, cudaStream_t stream) {
  return runtime_free_async(path, "cudaFreeAsync", CUPOOL_REAL(cudaFreeAsync), devPtr, stream, false);
}
cudaError_t cudaFreeAsync_ptsz(Path path, void* devPtr, cudaStream_t stream) {
  return runtime_free_async(path, "cudaFreeAsync_ptsz", CUPOOL_REAL(cudaFreeAsync_ptsz), devPtr, stream, true);
}

namespace {
// The runtime's twin of DriverUpstream::refuse_as_capture_does: the same unsafe call made
// through the runtime, so that its last error says so too.
cudaError_t refuse_runtime_as_capture_does(ContextPool* cp) {
  using EventQuery = cudaError_t (*)(cudaEvent_t);
  if (auto query = reinterpret_cast<EventQuery>(runtime_function("cudaEventQuery")))
    if (CUevent probe = driver_upstream(*cp).probe_event()) {
      const cudaError_t rc = query(reinterpret_cast<cudaEvent_t>(probe));
      return rc == cudaSuccess ? cudaErrorStreamCaptureUnsupported : rc;
    }
  driver_upstream(*cp).refuse_as_capture_does();
  return cudaErrorStreamCaptureUnsupported;
}

// A free by either API: a pool block goes back to its pool (with the free mode's wait), any other
// pointer goes to the driver untouched.
// `refuse_capture` refuses a pool block's free as the driver refuses a free a capture forbids
// (and returns that API's code for it).
template <typename Code, typename RealFree, typename RefuseCapture>
Code free_any(Path path, const char* api, std::uint64_t ptr, Code ok, Code invalid, RealFree&& real_free,
              RefuseCapture&& refuse_capture) {
  Event ev(EventKind::free, api, path);
  if (ContextPool* cp = pooled() ? pool_owning(ptr) : nullptr) {
    if (capture_forbids_here()) {
      const Code rc = refuse_capture(cp);
      ev.done(rc, 0, ptr, cp);
      return rc;
    }
    std::size_t size = 0;
    const FreeResult fr = cp->pool->deallocate(ptr, &size, ev.pool_state());
    const Code rc = fr == FreeResult::freed ? ok : invalid;
    if (fr == FreeResult::double_free)
      log_warn(std::string(api) + " of a block that is already free (double free); the pool is unchanged");
    ev.done(rc, size, ptr, cp);
    return rc;
  }
  Code rc = real_free();
  std::uint64_t bytes = 0;
  ContextPool* owner = nullptr;
  if (rc == ok) forget_external(ptr, &bytes, &owner);
  ev.done(rc, bytes, ptr, owner);
  return rc;
}
}  // namespace

cudaError_t cudaFree(Path path, void* devPtr) {
  HookScope scope;
  auto real = CUPOOL_REAL(cudaFree);
  // cudaFree(NULL) only initialises the runtime: not an event.
  if (!scope.outermost() || devPtr == nullptr) return real ? real(devPtr) : cudaErrorInitializationError;
  initialize();
  return free_any(path, "cudaFree", reinterpret_cast<std::uintptr_t>(devPtr), cudaSuccess, cudaErrorInvalidValue,
                  [&] { return real ? real(devPtr) : cudaErrorInitializationError; },
                  [](ContextPool* cp) { return refuse_runtime_as_capture_does(cp); });
}

namespace {
// Memory info as the process's share: total is the cap, free what it could still get.
bool pool_mem_info(ContextPool* cp, size_t* free, size_t* total) { return memory().mem_info(cp, free, total); }
}  // namespace

cudaError_t cudaMemGetInfo(Path path, size_t* free, size_t* total) {
  HookScope scope;
  auto real = CUPOOL_REAL(cudaMemGetInfo);
  if (!scope.outermost()) return real ? real(free, total) : cudaErrorInitializationError;
  initialize();
  Event ev(EventKind::mem_info, "cudaMemGetInfo", path);
  ContextPool* cp = runtime_pool();
  cudaError_t rc = cudaSuccess;
  if (!pool_mem_info(cp, free, total)) rc = real ? real(free, total) : cudaErrorInitializationError;
  ev.done(rc, free ? *free : 0, 0, cp);
  return rc;
}

// ---- Driver -----------------------------------------------------------------------------

CUresult cuMemAlloc_v2(Path path, CUdeviceptr* dptr, size_t bytesize) {
  HookScope scope;
  auto real = CUPOOL_REAL(cuMemAlloc_v2);
  if (!scope.outermost() || dptr == nullptr) return real ? real(dptr, bytesize) : CUDA_ERROR_NOT_INITIALIZED;
  initialize();
  Event ev(EventKind::alloc, "cuMemAlloc_v2", path);
  ContextPool* cp = bytesize ? driver_pool() : nullptr;
  CUresult rc;
  if (cp == nullptr || !pooled() || capture_forbids_here()) {
    // No context (the driver reports that), size 0 (CUDA_ERROR_INVALID_VALUE) or passthrough.
    std::uint64_t key = 0;
    rc = external_allocate(cp, bytesize, CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc_v2", &key, [&] {
      CUresult r = real ? real(dptr, bytesize) : CUDA_ERROR_NOT_INITIALIZED;
      key = *dptr;
      return r;
    });
    ev.done(rc, bytesize, rc == CUDA_SUCCESS ? *dptr : 0, cp);
    return rc;
  }
  AllocResult r = pool_allocate(cp, bytesize, "cuMemAlloc_v2", ev.pool_state());
  rc = r.ptr ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
  if (r.ptr) *dptr = r.ptr;
  ev.r.oom_class = r.oom;
  ev.done(rc, bytesize, r.ptr, cp);
  return rc;
}

CUresult cuMemAllocPitch_v2(Path path, CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height,
                            unsigned int elementSize) {
  HookScope scope;
  auto real = CUPOOL_REAL(cuMemAllocPitch_v2);
  if (!scope.outermost() || dptr == nullptr || pitch == nullptr)
    return real ? real(dptr, pitch, width, height, elementSize) : CUDA_ERROR_NOT_INITIALIZED;
  initialize();
  Event ev(EventKind::alloc, "cuMemAllocPitch_v2", path);
  ContextPool* cp = driver_pool();
  const bool valid_element = elementSize == 4 || elementSize == 8 || elementSize == 16;
  CUresult rc;
  if (cp == nullptr || !pooled() || width == 0 || height == 0 || !valid_element || capture_forbids_here()) {
    std::uint64_t key = 0;
    const std::uint64_t bytes = round_pitch(width) * height;
    rc = external_allocate(cp, bytes, CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY, "cuMemAllocPitch_v2", &key, [&] {
      CUresult r = real ? real(dptr, pitch, width, height, elementSize) : CUDA_ERROR_NOT_INITIALIZED;
      key = *dptr;
      return r;
    });
    ev.done(rc, bytes, rc == CUDA_SUCCESS ? *dptr : 0, cp);
    return rc;
  }
  const std::uint64_t row = round_pitch(width);
  AllocResult r = pool_allocate(cp, row * height, "cuMemAllocPitch_v2", ev.pool_state());
  rc = r.ptr ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
  if (r.ptr) {
    *dptr = r.ptr;
    *pitch = row;
  }
  ev.r.oom_class = r.oom;
  ev.done(rc, row * height, r.ptr, cp);
  return rc;
}

CUresult cuMemFree_v2(Path path, CUdeviceptr dptr) {
  HookScope scope;
  auto real = CUPOOL_REAL(cuMemFree_v2);
  if (!scope.outermost() || dptr == 0) return real ? real(dptr) : CUDA_ERROR_NOT_INITIALIZED;
  initialize();
  return free_any(path, "cuMemFree_v2", dptr, CUDA_SUCCESS, CUDA_ERROR_INVALID_VALUE,
                  [&] { return real ? real(dptr) : CUDA_ERROR_NOT_INITIALIZED; },
                  [](ContextPool* cp) { return driver_upstream(*cp).refuse_as_capture_does(); });
}

CUresult cuMemAllocManaged(Path path, CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  HookScope scope;
  auto real = CUPOOL_REAL(cuMemAllocManaged);
  if (!scope.outermost() || dptr == nullptr) return real ? real(dptr, bytesize, flags) : CUDA_ERROR_NOT_INITIALIZED;
  initialize();
  Event ev(EventKind::alloc, "cuMemAllocManaged", path);
  ContextPool* cp = driver_pool();
  std::uint64_t key = 0;
  CUresult rc = external_allocate(cp, bytesize, CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY, "cuMemAllocManaged", &key, [&] {
    CUresult r = real ? real(dptr, bytesize, flags) : CUDA_ERROR_NOT_INITIALIZED;
    key = *dptr;
    return r;
  });
  ev.done(rc, bytesize, rc == CUDA_SUCCESS ? key : 0, cp);
  return rc;
}

// ---- Driver: arrays. The runtime's cudaMallocArray, cudaMalloc3DArray and
// cudaMallocMipmappedArray come here too (through the driver's entry points), so a refusal
// reaches the program as the runtime's own cudaErrorMemoryAllocation, last error included.

namespace {

// The device memory an array takes, from its descriptor: element bytes x width x height x depth
// (layers and cube faces are depth), summed over mip levels. The driver's own figure is not to
// be had: cuArrayGetMemoryRequirements sizes only arrays made for deferred mapping (it refused
// an ordinary 8192 x 8192 float array on the H200, whose free memory then dropped by exactly
// 8192 x 8192 x 4 bytes).
std::uint64_t format_bytes(CUarray_format f) {
  switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
      return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
      return 2;
    default:
      return 4;  // 32-bit formats, and a conservative guess for packed and compressed ones
  }
}

std::uint64_t array_bytes(std::size_t width, std::size_t height, std::size_t depth, CUarray_format format,
                          unsigned channels, unsigned levels) {
  const std::uint64_t element = format_bytes(format) * std::max(channels, 1u);
  std::uint64_t total = 0;
  for (unsigned l = 0; l < std::max(levels, 1u); ++l) {
    const std::uint64_t w = std::max<std::uint64_t>(width >> l, 1);
    const std::uint64_t h = height ? std::max<std::uint64_t>(height >> l, 1) : 1;
    const std::uint64_t d = depth ? std::max<std::uint64_t>(depth >> l, 1) : 1;
    total += element * w * h * d;
  }
  return total;
}

// Layered and cubemap arrays keep their depth (layers, faces) at every level.
std::uint64_t array3d_bytes(const CUDA_ARRAY3D_DESCRIPTOR& d, unsigned levels) {
  if (d.Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) {
    std::uint64_t per_layer = array_bytes(d.Width, d.Height, 0, d.Format, d.NumChannels, levels);
    return per_layer * std::max<std::size_t>(d.Depth, 1);
  }
  return array_bytes(d.Width, d.Height, d.Depth, d.Format, d.NumChannels, levels);
}

template <typename Handle, typename Call>
CUresult create_array(Path path, const char* api, Handle* handle, std::uint64_t bytes, Call&& call) {
  HookScope scope;
  if (!scope.outermost() || handle == nullptr) return call();
  initialize();
  Event ev(EventKind::alloc, api, path);
  ContextPool* cp = driver_pool();
  std::uint64_t key = 0;
  const CUresult rc = external_allocate(cp, bytes, CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY, api, &key, [&] {
    const CUresult r = call();
    key = reinterpret_cast<std::uintptr_t>(*handle);
    return r;
  });
  ev.done(rc, bytes, rc == CUDA_SUCCESS ? key : 0, cp);
  return rc;
}

template <typename Handle, typename Call>
CUresult destroy_array(Path path, const char* api, Handle handle, Call&& call) {
  HookScope scope;
  if (!scope.outermost()) return call();
  initialize();
  Event ev(EventKind::free, api, path);
  const CUresult rc = call();
  std::uint64_t bytes = 0;
  ContextPool* owner = nullptr;
  const auto key = reinterpret_cast<std::uintptr_t>(handle);
  if (rc == CUDA_SUCCESS) forget_external(key, &bytes, &owner);
  ev.done(rc, bytes, key, owner);
  return rc;
}

}  // namespace

CUresult cuArrayCreate_v2(Path path, CUarray* handle, const CUDA_ARRAY_DESCRIPTOR* desc) {
  auto real = CUPOOL_REAL(cuArrayCreate_v2);
  const std::uint64_t bytes = desc ? array_bytes(desc->Width, desc->Height, 0, desc->Format, desc->NumChannels, 1) : 0;
  return create_array(path, "cuArrayCreate_v2", handle, bytes,
                      [&] { return real ? real(handle, desc) : CUDA_ERROR_NOT_INITIALIZED; });
}

CUresult cuArray3DCreate_v2(Path path, CUarray* handle, const CUDA_ARRAY3D_DESCRIPTOR* desc) {
  auto real = CUPOOL_REAL(cuArray3DCreate_v2);
  // An array made for deferred mapping has no memory of its own until the program maps some.
  const bool deferred = desc && (desc->Flags & CUDA_ARRAY3D_DEFERRED_MAPPING);
  const std::uint64_t bytes = desc && !deferred ? array3d_bytes(*desc, 1) : 0;
  return create_array(path, "cuArray3DCreate_v2", handle, bytes,
                      [&] { return real ? real(handle, desc) : CUDA_ERROR_NOT_INITIALIZED; });
}

CUresult cuMipmappedArrayCreate(Path path, CUmipmappedArray* handle, const CUDA_ARRAY3D_DESCRIPTOR* desc,
                                unsigned int levels) {
  auto real = CUPOOL_REAL(cuMipmappedArrayCreate);
  const bool deferred = desc && (desc->Flags & CUDA_ARRAY3D_DEFERRED_MAPPING);
  const std::uint64_t bytes = desc && !deferred ? array3d_bytes(*desc, levels) : 0;
  return create_array(path, "cuMipmappedArrayCreate", handle, bytes,
                      [&] { return real ? real(handle, desc, levels) : CUDA_ERROR_NOT_INITIALIZED; });
}

CUresult cuArrayDestroy(Path path, CUarray handle) {
  auto real = CUPOOL_REAL(cuArrayDestroy);
  return destroy_array(path, "cuArrayDestroy", handle,
                       [&] { return real ? real(handle) : CUDA_ERROR_NOT_INITIALIZED; });
}

CUresult cuMipmappedArrayDestroy(Path path, CUmipmappedArray handle) {
  auto real = CUPOOL_REAL(cuMipmappedArrayDestroy);
  return destroy_array(path, "cuMipmappedArrayDestroy", handle,
                       [&] { return real ? real(handle) : CUDA_ERROR_NOT_INITIALIZED; });
}

CUresult cuMemGetInfo_v2(Path path, size_t* free, size_t* total) {
  HookScope scope;
  auto real = CUPOOL_REAL(cuMemGetInfo_v2);
  if (!scope.outermost()) return real ? real(free, total) : CUDA_ERROR_NOT_INITIALIZED;
  initialize();
  Event ev(EventKind::mem_info, "cuMemGetInfo_v2", path);
  ContextPool* cp = driver_pool();
  CUresult rc = CUDA_SUCCESS;
  if (!pool_mem_info(cp, free, total)) rc = real ? real(free, total) : CUDA_ERROR_NOT_INITIALIZED;
  ev.done(rc, free ? *free : 0, 0, cp);
  return rc;
}

namespace {
template <typename Real, typename... Extra>
CUresult driver_alloc_async(Path path, const char* api, bool per_thread, Real real, CUdeviceptr* dptr,
                            size_t bytesize, CUstream stream, Extra... extra) {
  HookScope scope;
  auto call = [&] {
    if (!real) return CUDA_ERROR_NOT_INITIALIZED;
    if constexpr (sizeof...(Extra) == 0) return real(dptr, bytesize, stream);
    else return real(dptr, bytesize, extra..., stream);
  };
  if (!scope.outermost() || dptr == nullptr || graph_node(stream, per_thread)) return call();
  initialize();
  Event ev(EventKind::alloc, api, path);
  ev.stream(stream);
  ContextPool* cp = driver_pool();
  std::uint64_t key = 0;
  CUresult rc = external_allocate(cp, bytesize, CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY, api, &key, [&] {
    CUresult r = call();
    key = *dptr;
    return r;
  });
  ev.done(rc, bytesize, rc == CUDA_SUCCESS ? key : 0, cp);
  return rc;
}

template <typename Real>
CUresult driver_free_async(Path path, const char* api, bool per_thread, Real real, CUdeviceptr dptr,
                           CUstream stream) {
  HookScope scope;
  if (!scope.outermost() || graph_node(stream, per_thread))
    return real ? real(dptr, stream) : CUDA_ERROR_NOT_INITIALIZED;
  initialize();
  Event ev(EventKind::free, api, path);
  ev.stream(stream);
  CUresult rc = real ? real(dptr, stream) : CUDA_ERROR_NOT_INITIALIZED;
  std::uint64_t bytes = 0;
  ContextPool* owner = nullptr;
  if (rc == CUDA_SUCCESS) forget_external(dptr, &bytes, &owner);
  ev.done(rc, bytes, dptr, owner);
  return rc;
}
}  // namespace

CUresult cuMemAllocAsync(Path path, CUdeviceptr* dptr, size_t bytesize, CUstream stream) {
  return driver_alloc_async(path, "cuMemAllocAsync", false, CUPOOL_REAL(cuMemAllocAsync), dptr, bytesize, stream);
}
CUresult cuMemAllocAsync_ptsz(Path path, CUdeviceptr* dptr, size_t bytesize, CUstream stream) {
  return driver_alloc_async(path, "cuMemAllocAsync_ptsz", true, CUPOOL_REAL(cuMemAllocAsync_ptsz), dptr, bytesize,
                            stream);
}
CUresult cuMemAllocFromPoolAsync(Path path, CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream stream) {
  return driver_alloc_async(path, "cuMemAllocFromPoolAsync", false, CUPOOL_REAL(cuMemAllocFromPoolAsync), dptr,
                            bytesize, stream, pool);
}
CUresult cuMemAllocFromPoolAsync_ptsz(Path path, CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream stream) {
  return driver_alloc_async(path, "cuMemAllocFromPoolAsync_ptsz", true, CUPOOL_REAL(cuMemAllocFromPoolAsync_ptsz), dptr,
                            bytesize, stream, pool);
}
CUresult cuMemFreeAsync(Path path, CUdeviceptr dptr, CUstream stream) {
  return driver_free_async(path, "cuMemFreeAsync", false, CUPOOL_REAL(cuMemFreeAsync), dptr, stream);
}
CUresult cuMemFreeAsync_ptsz(Path path, CUdeviceptr dptr, CUstream stream) {
  return driver_free_async(path, "cuMemFreeAsync_ptsz", true, CUPOOL_REAL(cuMemFreeAsync_ptsz), dptr, stream);
}

// ---- Driver: virtual memory. Physical memory (cuMemCreate) counts against the cap. -----------
// Under growth and preallocate, whole mappings (one handle over one reservation of its size) are
// recycled by the VmmCache (policy/vmm_cache.h): a call it serves makes no driver call and its
// event says "recycled". Anything else goes to the driver as before.

namespace {

// Packs what must be equal for a mapping to be reused.
VmmProps pack_props(const CUmemAllocationProp& p) {
  VmmProps k;
  k.w[0] = static_cast<std::uint64_t>(p.type) | (static_cast<std::uint64_t>(p.requestedHandleTypes) << 32);
  k.w[1] = static_cast<std::uint64_t>(p.location.type) |
           (static_cast<std::uint64_t>(static_cast<std::uint32_t>(p.location.id)) << 32);
  static_assert(sizeof p.allocFlags <= sizeof k.w[2]);
  std::memcpy(&k.w[2], &p.allocFlags, sizeof p.allocFlags);
  k.w[3] = reinterpret_cast<std::uintptr_t>(p.win32HandleMetaData);
  return k;
}

VmmAccess pack_access(const CUmemAccessDesc* desc, size_t count) {
  VmmAccess a;
  if (desc == nullptr || count == 0 || count > VmmAccess::kMax) {
    a.count = VmmAccess::kMax + 1;  // never served from the cache
    return a;
  }
  a.count = static_cast<std::uint32_t>(count);
  for (size_t i = 0; i < count; ++i)
    a.w[i] = (static_cast<std::uint64_t>(desc[i].location.type) << 48) |
             (static_cast<std::uint64_t>(static_cast<std::uint16_t>(desc[i].location.id)) << 32) |
             static_cast<std::uint32_t>(desc[i].flags);
  return a;
}

}  // namespace

CUresult cuMemCreate(Path path, CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                     unsigned long long flags) {
  HookScope scope;
  auto real = CUPOOL_REAL(cuMemCreate);
  if (!scope.outermost() || handle == nullptr) return real ? real(handle, size, prop, flags) : CUDA_ERROR_NOT_INITIALIZED;
  initialize();
  Event ev(EventKind::vmm_create, "cuMemCreate", path);
  ContextPool* cp = driver_pool();
  VmmCache* cache = vmm_cache();
  // Recycled only on the device of the context, whose fences cover the work that used it.
  const bool cacheable = cache && cp && prop && flags == 0 && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
                         prop->location.id == cp->device;
  VmmProps key;
  if (cacheable) {
    key = pack_props(*prop);
    if (const std::uint64_t h = cache->take(cp->upstream, size, key, cp->pool->has_room(size))) {
      *handle = h;
      ev.r.recycled = true;
      ev.done(CUDA_SUCCESS, size, h, cp);
      return CUDA_SUCCESS;
    }
  }
  std::uint64_t key_handle = 0;
  CUresult rc = external_allocate(cp, size, CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY, "cuMemCreate", &key_handle, [&] {
    CUresult r = real ? real(handle, size, prop, flags) : CUDA_ERROR_NOT_INITIALIZED;
    key_handle = *handle;
    return r;
  });
  if (rc == CUDA_SUCCESS && cacheable) cache->created(cp->upstream, key_handle, size, key);
  if (cp == nullptr && prop) ev.r.device = static_cast<std::int16_t>(prop->location.id);
  ev.done(rc, size, rc == CUDA_SUCCESS ? key_handle : 0, cp);
  return rc;
}

CUresult cuMemRelease(Path path, CUmemGenericAllocationHandle handle) {
  HookScope scope;
  auto real = CUPOOL_REAL(cuMemRelease);
  if (!scope.outermost()) return real ? real(handle) : CUDA_ERROR_NOT_INITIALIZED;
  initialize();
  Event ev(EventKind::vmm_release, "cuMemRelease", path);
  if (VmmCache* cache = vmm_cache()) {
    std::uint64_t size = 0;
    if (cache->release(handle, &size) == VmmCache::Verdict::served) {
      ev.r.recycled = true;  // kept, and still charged, until it is reused or given back
      ev.done(CUDA_SUCCESS, size, handle, driver_pool());
      return CUDA_SUCCESS;
    }
  }
  CUresult rc = real ? real(handle) : CUDA_ERROR_NOT_INITIALIZED;
  std::uint64_t bytes = 0;
  ContextPool* owner = nullptr;
  if (rc == CUDA_SUCCESS) forget_external(handle, &bytes, &owner);
  ev.done(rc, bytes, handle, owner);
  return rc;
}

namespace {
// An address-space or mapping call on `ptr`: one event; served by the cache when `serve` (given
// the cache) says so, else the real call, after which `done` (given the cache and the result)
// lets the cache learn what the driver did.
template <typename Call, typename Serve, typename Done>
CUresult vmm_range_call(Path path, EventKind kind, const char* api, CUdeviceptr ptr, size_t size, Call&& call,
                        Serve&& serve, Done&& done, const CUmemGenericAllocationHandle* mapped = nullptr,
                        size_t offset = 0) {
  HookScope scope;
  if (!scope.outermost()) return call();
  initialize();
  Event ev(kind, api, path);
  if (mapped) {  // cuMemMap: what is mapped, so that replay can run the mapping cache
    ev.r.has_handle = true;
    ev.r.handle = *mapped;
    ev.r.offset = offset;
  }
  VmmCache* cache = vmm_cache();
  CUresult rc;
  if (cache && serve(*cache) == VmmCache::Verdict::served) {
    ev.r.recycled = true;
    rc = CUDA_SUCCESS;
  } else {
    rc = call();
    if (cache) done(*cache, rc);
  }
  ev.done(rc, size, ptr, driver_pool());
  return rc;
}
void nothing_learned(VmmCache&, CUresult) {}
}  // namespace

// Address-space and mapping calls: recorded; the cache may serve them.
CUresult cuMemMap(Path path, CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
  auto real = CUPOOL_REAL(cuMemMap);
  return vmm_range_call(
      path, EventKind::vmm_map, "cuMemMap", ptr, size,
      [&] { return real ? real(ptr, size, offset, handle, flags) : CUDA_ERROR_NOT_INITIALIZED; },
      [&](VmmCache& c) { return flags == 0 ? c.map(ptr, size, offset, handle) : VmmCache::Verdict::forward; },
      [&](VmmCache& c, CUresult rc) {
        if (rc == CUDA_SUCCESS) c.map_done(ptr, size, offset, handle);
      },
      &handle, offset);
}

CUresult cuMemUnmap(Path path, CUdeviceptr ptr, size_t size) {
  auto real = CUPOOL_REAL(cuMemUnmap);
  return vmm_range_call(
      path, EventKind::vmm_unmap, "cuMemUnmap", ptr, size,
      [&] { return real ? real(ptr, size) : CUDA_ERROR_NOT_INITIALIZED; },
      [&](VmmCache& c) { return c.unmap(ptr, size); }, nothing_learned);
}

// Not an event of its own: the mapping's events say enough.
CUresult cuMemSetAccess(Path, CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  HookScope scope;
  auto real = CUPOOL_REAL(cuMemSetAccess);
  auto call = [&] { return real ? real(ptr, size, desc, count) : CUDA_ERROR_NOT_INITIALIZED; };
  if (!scope.outermost()) return call();
  initialize();
  VmmCache* cache = vmm_cache();
  if (cache == nullptr) return call();
  const VmmAccess access = pack_access(desc, count);
  if (cache->set_access(ptr, size, access) == VmmCache::Verdict::served) return CUDA_SUCCESS;
  CUresult rc = call();
  if (rc == CUDA_SUCCESS) cache->set_access_done(ptr, size, access);
  return rc;
}

CUresult cuMemAddressReserve(Path path, CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
  HookScope scope;
  auto real = CUPOOL_REAL(cuMemAddressReserve);
  auto call = [&] { return real ? real(ptr, size, alignment, addr, flags) : CUDA_ERROR_NOT_INITIALIZED; };
  if (!scope.outermost()) return call();
  initialize();
  Event ev(EventKind::va_reserve, "cuMemAddressReserve", path);
  VmmCache* cache = vmm_cache();
  CUresult rc = CUDA_ERROR_INVALID_VALUE;
  CUdeviceptr out = 0;
  bool served = false;
  if (cache && ptr && addr == 0 && flags == 0) {
    if (const std::uint64_t va = cache->reserve(size, alignment)) {
      *ptr = out = va;
      rc = CUDA_SUCCESS;
      served = true;
      ev.r.recycled = true;
    }
  }
  if (!served) {
    if (cache && addr != 0) cache->before_reserve_at(addr, size);
    rc = call();
    if (rc == CUDA_SUCCESS && ptr) {
      out = *ptr;
      if (cache && flags == 0) cache->reserved(out, size);
    }
  }
  ev.done(rc, size, out, driver_pool());  // the reserved address (was 0x0: an aliasing bug)
  return rc;
}

CUresult cuMemAddressFree(Path path, CUdeviceptr ptr, size_t size) {
  auto real = CUPOOL_REAL(cuMemAddressFree);
  return vmm_range_call(
      path, EventKind::va_free, "cuMemAddressFree", ptr, size,
      [&] { return real ? real(ptr, size) : CUDA_ERROR_NOT_INITIALIZED; },
      [&](VmmCache& c) { return c.address_free(ptr, size); }, nothing_learned);
}

// A handle shared with another process lives on there: it must never be recycled here.
CUresult cuMemExportToShareableHandle(Path, void* shareableHandle, CUmemGenericAllocationHandle handle,
                                      CUmemAllocationHandleType handleType, unsigned long long flags) {
  HookScope scope;
  auto real = CUPOOL_REAL(cuMemExportToShareableHandle);
  if (scope.outermost()) {
    initialize();
    if (VmmCache* cache = vmm_cache()) cache->pin_handle(handle);
  }
  return real ? real(shareableHandle, handle, handleType, flags) : CUDA_ERROR_NOT_INITIALIZED;
}

// A retained handle is released once more by the program: its calls go to the driver from now on.
CUresult cuMemRetainAllocationHandle(Path, CUmemGenericAllocationHandle* handle, void* addr) {
  HookScope scope;
  auto real = CUPOOL_REAL(cuMemRetainAllocationHandle);
  if (scope.outermost()) {
    initialize();
    if (VmmCache* cache = vmm_cache()) cache->pin_address(reinterpret_cast<std::uintptr_t>(addr));
  }
  return real ? real(handle, addr) : CUDA_ERROR_NOT_INITIALIZED;
}

}  // namespace impl
}  // namespace cupool::shim
