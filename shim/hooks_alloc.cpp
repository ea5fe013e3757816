// Allocation, free and memory-info hooks of the runtime and the driver. Allocations that a pool
// can serve (cudaMalloc, cudaMallocPitch, cuMemAlloc_v2, cuMemAllocPitch_v2) go to the pool of
// the current context; the rest (managed, stream-ordered, virtual memory) go to the driver and
// are counted against the cap. Every outermost call is one trace event.
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <string>

#include "device_pool.h"
#include "hook_table.h"
#include "hooks_internal.h"
#include "log.h"
#include "shim_state.h"
#include "units.h"

namespace cupool::shim {
namespace {

using trace::EventKind;
using trace::OomClass;
using trace::Path;

std::uint32_t thread_id() {
  // Cached per thread (a syscall per event cost ~200 ns in the H200's VM); a fork makes the
  // calling thread the child's only thread, with a new id, so the cache is keyed by fork count.
  thread_local std::uint64_t cached_generation = ~std::uint64_t{0};
  thread_local std::uint32_t cached_tid = 0;
  const std::uint64_t generation = fork_generation();
  if (generation != cached_generation) {
    cached_generation = generation;
    cached_tid = static_cast<std::uint32_t>(syscall(SYS_gettid));
  }
  return cached_tid;
}

// One event, timed from construction; emitted only when tracing.
struct Event {
  trace::Record r;
  bool on = tracing();
  Event(EventKind kind, const char* api, Path path) {
    if (!on) return;
    r.t_ns = now_ns();
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
    const std::uint64_t end = now_ns();
    r.dur_ns = end - r.t_ns;
    // `t` orders events across threads: memory is handed out by the time an allocation returns
    // and given back no earlier than its free was called, so (alloc: end, free: start) is a
    // consistent order for every reuse of an address.
    if (r.kind == EventKind::alloc || r.kind == EventKind::vmm_create || r.kind == EventKind::va_reserve) r.t_ns = end;
    r.rc = rc;
    r.size = size;
    r.ptr = ptr;
    r.tid = thread_id();
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

void warn_oom(const ContextPool* cp, const char* api, std::uint64_t size, OomClass oom) {
  const trace::PoolState s = cp->pool->state();
  std::size_t free = 0, total = 0;
  cp->pool->mem_info(&free, &total);
  std::string why;
  switch (oom) {
    case OomClass::limit:
      why = "limit: the cap of " + human_bytes(total) + " would be exceeded";
      break;
    case OomClass::fragmentation:
      why = "fragmentation: the pool holds " + human_bytes(s.reserved - s.in_use) +
            " free but its largest free block is " + human_bytes(s.largest_free);
      break;
    case OomClass::device:
      why = "device: the driver itself is out of memory";
      break;
    default:
      why = "unclassified";
  }
  log_warn(std::string("out of memory on device ") + std::to_string(cp->device) + ": " + api + " of " +
           human_bytes(size) + " refused (" + why + "); reserved " + human_bytes(s.reserved) + ", in use " +
           human_bytes(s.in_use) + ", " + std::to_string(s.free_blocks) + " free blocks");
}

// The runtime's sticky error must say what a failed cudaMalloc would have left there: ask the
// runtime for an allocation no device can satisfy. Only on the error path.
void set_runtime_last_error_oom() {
  if (auto real = CUPOOL_REAL(cudaMalloc)) {
    void* p = nullptr;
    real(&p, SIZE_MAX);
  }
}

// Serves an allocation from the pool. Returns 0 and the pointer, or the OOM class.
AllocResult pool_allocate(ContextPool* cp, std::size_t size, const char* api, trace::PoolState* state) {
  AllocResult r = cp->pool->allocate(size, state);
  if (r.ptr == 0) warn_oom(cp, api, size, r.oom == OomClass::none ? OomClass::device : r.oom);
  return r;
}

// A pointer cupool did not hand out and the driver will free: uncharge it if it was counted.
void forget_external(std::uint64_t key, std::uint64_t* bytes, ContextPool** owner) {
  if (external_remove(key, bytes, owner) && *owner) (*owner)->pool->uncharge_external(*bytes);
}

// Runs a driver allocation outside the pools (managed, stream-ordered, VMM, passthrough),
// charging the cap first. `call` returns the API's code; `ok`/`oom` are that API's codes.
template <typename Code, typename Call>
Code external_allocate(ContextPool* cp, std::uint64_t bytes, Code ok, Code oom, const char* api,
                       std::uint64_t* key, Call&& call) {
  if (cp && !cp->pool->try_charge_external(bytes)) {
    warn_oom(cp, api, bytes, OomClass::limit);
    return oom;
  }
  Code rc = call();
  if (rc == ok) {
    external_add(*key, bytes, cp);
  } else if (cp) {
    cp->pool->uncharge_external(bytes);
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
  if (cp == nullptr || !pooled()) {
    std::uint64_t key = 0;
    rc = external_allocate(cp, size, cudaSuccess, cudaErrorMemoryAllocation, "cudaMalloc", &key, [&] {
      cudaError_t r = real ? real(devPtr, size) : cudaErrorInitializationError;
      key = reinterpret_cast<std::uintptr_t>(*devPtr);
      return r;
    });
    if (rc == cudaErrorMemoryAllocation && cp) set_runtime_last_error_oom();
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
  if (cp == nullptr || !pooled() || width == 0 || height == 0) {
    std::uint64_t key = 0;
    const std::uint64_t bytes = round_pitch(width) * height;
    rc = external_allocate(cp, bytes, cudaSuccess, cudaErrorMemoryAllocation, "cudaMallocPitch", &key, [&] {
      cudaError_t r = real ? real(devPtr, pitch, width, height) : cudaErrorInitializationError;
      key = reinterpret_cast<std::uintptr_t>(*devPtr);
      return r;
    });
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
  cudaError_t rc = external_allocate(cp, size, cudaSuccess, cudaErrorMemoryAllocation, "cudaMallocManaged", &key, [&] {
    cudaError_t r = real ? real(devPtr, size, flags) : cudaErrorInitializationError;
    key = reinterpret_cast<std::uintptr_t>(*devPtr);
    return r;
  });
  ev.done(rc, size, rc == cudaSuccess ? key : 0, cp);
  return rc;
}

namespace {
template <typename Real>
cudaError_t runtime_malloc_async(Path path, const char* api, Real real, void** devPtr, size_t size,
                                 cudaStream_t stream) {
  HookScope scope;
  if (!scope.outermost() || devPtr == nullptr) return real ? real(devPtr, size, stream) : cudaErrorInitializationError;
  initialize();
  Event ev(EventKind::alloc, api, path);
  ev.stream(stream);
  ContextPool* cp = runtime_pool();
  std::uint64_t key = 0;
  cudaError_t rc = external_allocate(cp, size, cudaSuccess, cudaErrorMemoryAllocation, api, &key, [&] {
    cudaError_t r = real ? real(devPtr, size, stream) : cudaErrorInitializationError;
    key = reinterpret_cast<std::uintptr_t>(*devPtr);
    return r;
  });
  ev.done(rc, size, rc == cudaSuccess ? key : 0, cp);
  return rc;
}

template <typename Real>
cudaError_t runtime_free_async(Path path, const char* api, Real real, void* devPtr, cudaStream_t stream) {
  HookScope scope;
  if (!scope.outermost() || devPtr == nullptr) return real ? real(devPtr, stream) : cudaErrorInitializationError;
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
  return runtime_malloc_async(path, "cudaMallocAsync", CUPOOL_REAL(cudaMallocAsync), devPtr, size, stream);
}
cudaError_t cudaMallocAsync_ptsz(Path path, void** devPtr, size_t size, cudaStream_t stream) {
  return runtime_malloc_async(path, "cudaMallocAsync_ptsz", CUPOOL_REAL(cudaMallocAsync_ptsz), devPtr, size, stream);
}
cudaError_t cudaFreeAsync(Path path, void* devPtr, cudaStream_t stream) {
  return runtime_free_async(path, "cudaFreeAsync", CUPOOL_REAL(cudaFreeAsync), devPtr, stream);
}
cudaError_t cudaFreeAsync_ptsz(Path path, void* devPtr, cudaStream_t stream) {
  return runtime_free_async(path, "cudaFreeAsync_ptsz", CUPOOL_REAL(cudaFreeAsync_ptsz), devPtr, stream);
}

namespace {
// A free by either API: a pool block goes back to its pool (with the free mode's wait), any other
// pointer goes to the driver untouched.
template <typename Code, typename RealFree>
Code free_any(Path path, const char* api, std::uint64_t ptr, Code ok, Code invalid, RealFree&& real_free) {
  Event ev(EventKind::free, api, path);
  if (ContextPool* cp = pooled() ? pool_owning(ptr) : nullptr) {
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
                  [&] { return real ? real(devPtr) : cudaErrorInitializationError; });
}

namespace {
// Memory info as the process's share: total is the cap, free what it could still get.
bool pool_mem_info(ContextPool* cp, size_t* free, size_t* total) {
  if (cp == nullptr || free == nullptr || total == nullptr) return false;
  if (!pooled() && !config().limit.for_device(cp->device)) return false;  // pure passthrough
  cp->pool->mem_info(free, total);
  return true;
}
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
  if (cp == nullptr || !pooled()) {
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
  if (cp == nullptr || !pooled() || width == 0 || height == 0 || !valid_element) {
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
                  [&] { return real ? real(dptr) : CUDA_ERROR_NOT_INITIALIZED; });
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
CUresult driver_alloc_async(Path path, const char* api, Real real, CUdeviceptr* dptr, size_t bytesize,
                            CUstream stream, Extra... extra) {
  HookScope scope;
  auto call = [&] {
    if (!real) return CUDA_ERROR_NOT_INITIALIZED;
    if constexpr (sizeof...(Extra) == 0) return real(dptr, bytesize, stream);
    else return real(dptr, bytesize, extra..., stream);
  };
  if (!scope.outermost() || dptr == nullptr) return call();
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
CUresult driver_free_async(Path path, const char* api, Real real, CUdeviceptr dptr, CUstream stream) {
  HookScope scope;
  if (!scope.outermost()) return real ? real(dptr, stream) : CUDA_ERROR_NOT_INITIALIZED;
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
  return driver_alloc_async(path, "cuMemAllocAsync", CUPOOL_REAL(cuMemAllocAsync), dptr, bytesize, stream);
}
CUresult cuMemAllocAsync_ptsz(Path path, CUdeviceptr* dptr, size_t bytesize, CUstream stream) {
  return driver_alloc_async(path, "cuMemAllocAsync_ptsz", CUPOOL_REAL(cuMemAllocAsync_ptsz), dptr, bytesize, stream);
}
CUresult cuMemAllocFromPoolAsync(Path path, CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream stream) {
  return driver_alloc_async(path, "cuMemAllocFromPoolAsync", CUPOOL_REAL(cuMemAllocFromPoolAsync), dptr, bytesize,
                            stream, pool);
}
CUresult cuMemAllocFromPoolAsync_ptsz(Path path, CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream stream) {
  return driver_alloc_async(path, "cuMemAllocFromPoolAsync_ptsz", CUPOOL_REAL(cuMemAllocFromPoolAsync_ptsz), dptr,
                            bytesize, stream, pool);
}
CUresult cuMemFreeAsync(Path path, CUdeviceptr dptr, CUstream stream) {
  return driver_free_async(path, "cuMemFreeAsync", CUPOOL_REAL(cuMemFreeAsync), dptr, stream);
}
CUresult cuMemFreeAsync_ptsz(Path path, CUdeviceptr dptr, CUstream stream) {
  return driver_free_async(path, "cuMemFreeAsync_ptsz", CUPOOL_REAL(cuMemFreeAsync_ptsz), dptr, stream);
}

// ---- Driver: virtual memory. Physical memory (cuMemCreate) counts against the cap. -----------

CUresult cuMemCreate(Path path, CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                     unsigned long long flags) {
  HookScope scope;
  auto real = CUPOOL_REAL(cuMemCreate);
  if (!scope.outermost() || handle == nullptr) return real ? real(handle, size, prop, flags) : CUDA_ERROR_NOT_INITIALIZED;
  initialize();
  Event ev(EventKind::vmm_create, "cuMemCreate", path);
  ContextPool* cp = driver_pool();
  std::uint64_t key = 0;
  CUresult rc = external_allocate(cp, size, CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY, "cuMemCreate", &key, [&] {
    CUresult r = real ? real(handle, size, prop, flags) : CUDA_ERROR_NOT_INITIALIZED;
    key = *handle;
    return r;
  });
  if (cp == nullptr && prop) ev.r.device = static_cast<std::int16_t>(prop->location.id);
  ev.done(rc, size, rc == CUDA_SUCCESS ? key : 0, cp);
  return rc;
}

CUresult cuMemRelease(Path path, CUmemGenericAllocationHandle handle) {
  HookScope scope;
  auto real = CUPOOL_REAL(cuMemRelease);
  if (!scope.outermost()) return real ? real(handle) : CUDA_ERROR_NOT_INITIALIZED;
  initialize();
  Event ev(EventKind::vmm_release, "cuMemRelease", path);
  CUresult rc = real ? real(handle) : CUDA_ERROR_NOT_INITIALIZED;
  std::uint64_t bytes = 0;
  ContextPool* owner = nullptr;
  if (rc == CUDA_SUCCESS) forget_external(handle, &bytes, &owner);
  ev.done(rc, bytes, handle, owner);
  return rc;
}

namespace {
// Address-space and mapping calls are recorded, never changed.
template <typename Call>
CUresult recorded(Path path, EventKind kind, const char* api, std::uint64_t size, Call&& call,
                  std::uint64_t (*ptr_after)(void*), void* arg) {
  HookScope scope;
  if (!scope.outermost()) return call();
  initialize();
  Event ev(kind, api, path);
  CUresult rc = call();
  ContextPool* cp = driver_pool();
  ev.done(rc, size, ptr_after(arg), cp);
  return rc;
}
// Every pointee is a CUdeviceptr (unsigned long long). Reading it as std::uint64_t (unsigned long)
// broke strict aliasing: GCC moved the load of cuMemAddressReserve's result before the call's
// store, and every va_reserve event said "ptr":"0x0".
std::uint64_t value_of(void* p) { return *static_cast<CUdeviceptr*>(p); }
}  // namespace

CUresult cuMemMap(Path path, CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
  auto real = CUPOOL_REAL(cuMemMap);
  return recorded(path, EventKind::vmm_map, "cuMemMap", size,
                  [&] { return real ? real(ptr, size, offset, handle, flags) : CUDA_ERROR_NOT_INITIALIZED; }, value_of, &ptr);
}

CUresult cuMemUnmap(Path path, CUdeviceptr ptr, size_t size) {
  auto real = CUPOOL_REAL(cuMemUnmap);
  return recorded(path, EventKind::vmm_unmap, "cuMemUnmap", size,
                  [&] { return real ? real(ptr, size) : CUDA_ERROR_NOT_INITIALIZED; }, value_of, &ptr);
}

CUresult cuMemAddressReserve(Path path, CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
  auto real = CUPOOL_REAL(cuMemAddressReserve);
  CUdeviceptr out = 0;
  CUresult rc = recorded(path, EventKind::va_reserve, "cuMemAddressReserve", size, [&] {
    if (!real) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(ptr, size, alignment, addr, flags);
    if (r == CUDA_SUCCESS && ptr) out = *ptr;
    return r;
  }, value_of, &out);
  return rc;
}

CUresult cuMemAddressFree(Path path, CUdeviceptr ptr, size_t size) {
  auto real = CUPOOL_REAL(cuMemAddressFree);
  return recorded(path, EventKind::va_free, "cuMemAddressFree", size,
                  [&] { return real ? real(ptr, size) : CUDA_ERROR_NOT_INITIALIZED; }, value_of, &ptr);
}

}  // namespace impl
}  // namespace cupool::shim
