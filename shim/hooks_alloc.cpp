// Allocation, free and memory-info hooks of the runtime and the driver: each translates its CUDA
// call into ProcessMemory's operations (policy/process_memory.h) and the answer back into CUDA
// codes. Which allocations a pool serves (cudaMalloc, cudaMallocPitch, cuMemAlloc_v2,
// cuMemAllocPitch_v2) and which go to the driver, counted against the cap (managed,
// stream-ordered, arrays), is the table of policy/memory_calls.h. Every outermost call is one
// trace event. A runtime hook and its driver twin are one body over the API's traits
// (hooks_memory.h). Virtual-memory hooks: hooks_vmm.cpp.
#include <algorithm>
#include <cstdint>
#include <mutex>
#include <type_traits>
#include <unordered_map>

#include "hook_table.h"
#include "hooks_internal.h"
#include "hooks_memory.h"
#include "streams.h"

namespace cupool::shim {

using trace::EventKind;
using trace::OomClass;
using trace::Path;

ContextMemory* runtime_pool() {
  CUresult rc = CUDA_SUCCESS;
  if (ContextMemory* cp = current_pool(&rc)) return cp;
  if (auto real_free = CUPOOL_REAL(cudaFree); real_free && real_free(nullptr) == cudaSuccess)
    return current_pool(&rc);
  return nullptr;
}

ContextMemory* driver_pool() {
  CUresult rc = CUDA_SUCCESS;
  return current_pool(&rc);
}

ContextMemory* pool_of_context(CUcontext ctx) {
  if (ContextMemory* cp = existing_pool(ctx)) return cp;
  // The context is not this thread's: made current for the moment describe_context needs it,
  // then the thread's own is current again (no call of the program sees the difference).
  const DriverCalls& d = driver();
  if (!d.ok || d.ctx_push(ctx) != CUDA_SUCCESS) return nullptr;
  CUresult rc = CUDA_SUCCESS;
  ContextMemory* cp = current_pool(&rc);
  CUcontext popped = nullptr;
  d.ctx_pop(&popped);
  return cp;
}

Placement placed_on_device(int device) {
  if (device < 0) return {};
  if (ContextMemory* cp = driver_pool(); cp && cp->device == device) return cp;
  return Placement::on_device(device);
}

std::uint64_t device_total_memory(int device) {
  constexpr int kKept = 64;
  static std::atomic<std::uint64_t> kept[kKept] = {};
  if (device >= 0 && device < kKept)
    if (const std::uint64_t t = kept[device].load(std::memory_order_relaxed)) return t;
  std::size_t total = 0;
  if (driver().device_total_mem == nullptr || driver().device_total_mem(&total, device) != CUDA_SUCCESS) return 0;
  if (device >= 0 && device < kKept) kept[device].store(total, std::memory_order_relaxed);
  return total;
}

bool capture_forbids_here() { return captures().any() && captures().prohibited_here(); }

// Asked of the runtime with an allocation no device can satisfy: cudaErrorMemoryAllocation. Only
// on the error path, and not while a capture forbids this thread that call (the driver would
// invalidate the capture for it, which the program's own call would not have done).
void set_runtime_last_error_oom() {
  if (capture_forbids_here()) return;
  if (auto real = CUPOOL_REAL(cudaMalloc)) {
    void* p = nullptr;
    real(&p, SIZE_MAX);
  }
}

namespace {

std::uint64_t round_pitch(std::size_t width) { return (width + 511) & ~std::uint64_t{511}; }


// Calls `body` for the outermost call with usable arguments, after the shim is set up; anything
// else goes straight to the real function (`real_call`).
template <typename RealCall, typename Body>
auto outermost(bool args_ok, RealCall&& real_call, Body&& body) -> decltype(real_call()) {
  HookScope scope;
  if (!scope.outermost() || !args_ok) return real_call();
  initialize();
  return body();
}

// An allocation outside the pools: charged, then the driver's. `stream`: the API's stream, if any.
template <typename Api, typename Out, typename RealCall>
typename Api::Code allocate_outside_hook(Path path, const char* api, Out* out, std::uint64_t bytes, Placement where,
                                         RealCall&& real_call, const void* const* stream) {
  HookEvent ev(EventKind::alloc, api, path);
  if (stream) ev.stream(*stream);
  std::uint64_t key = 0;
  const auto rc = outside_allocate<Api>(where, bytes, api, &key, [&] {
    const auto r = real_call();
    key = address(*out);
    return r;
  });
  ev.device(where.device);
  ev.done(rc, bytes, rc == Api::ok ? key : 0, where.cp);
  return rc;
}

// An allocation by the API `kApi` (its line in policy/memory_calls.h says what serves it): by the
// pool of `where`'s context when the table says a pool serves it and one can (a context, a policy
// that pools, arguments the driver accepts (`poolable`), no capture that forbids the call), else
// by the driver outside the pools. `bytes`: what it takes; `row`: the pitch to report; `stream`:
// the API's stream, if any.
template <MemoryApi kApi, typename Api, typename Ptr, typename RealCall>
typename Api::Code allocate_hook(Path path, Ptr* out, std::size_t* pitch, std::uint64_t bytes, std::uint64_t row,
                                 bool poolable, Placement where, RealCall&& real_call,
                                 const void* const* stream = nullptr) {
  constexpr const MemoryCall& call = memory_call(kApi);
  if constexpr (call.serve != Serve::pool) {
    return allocate_outside_hook<Api>(path, call.name, out, bytes, where, real_call, stream);
  } else {
    ContextMemory* cp = where.cp;
    if (cp == nullptr || !memory().serves_from_pool(call) || !poolable || capture_forbids_here())
      return allocate_outside_hook<Api>(path, call.name, out, bytes, where, real_call, stream);
    HookEvent ev(EventKind::alloc, call.name, path);
    if (bytes == 0 && Api::zero_size_gives_null) {
      *out = Ptr{};
      ev.done(Api::ok, 0, 0, cp);
      return Api::ok;
    }
    const AllocResult r = memory().allocate(*cp, bytes, call.name, ev.pool_state());
    typename Api::Code rc = Api::ok;
    if (r.ptr) {
      *out = pointer<Ptr>(r.ptr);
      if (pitch) *pitch = row;
    } else {
      Api::refused_here();
      rc = Api::out_of_memory;
      ev.oom(r.oom);
    }
    ev.done(rc, bytes, r.ptr, cp);
    return rc;
  }
}

// A free of memory outside the pools (stream-ordered, arrays): the driver's, then uncharged.
template <typename Api, typename RealCall>
typename Api::Code free_outside_hook(Path path, const char* api, std::uint64_t key, RealCall&& real_call,
                                     const void* const* stream = nullptr) {
  HookEvent ev(EventKind::free, api, path);
  if (stream) ev.stream(*stream);
  const auto rc = real_call();
  std::uint64_t bytes = 0;
  ContextMemory* owner = nullptr;
  int device = -1;
  if (rc == Api::ok) forget_outside(key, &bytes, &owner, &device);
  ev.device(device);
  ev.done(rc, bytes, key, owner);
  return rc;
}

// A free by either API: a pool block goes back to its pool (with the free mode's wait), any other
// pointer goes to the driver untouched. `refuse_capture` refuses a pool block's free as the driver
// refuses a free a capture forbids (and returns that API's code for it).
template <typename Api, typename RealFree, typename RefuseCapture>
typename Api::Code free_any(Path path, const char* api, std::uint64_t ptr, RealFree&& real_free,
                            RefuseCapture&& refuse_capture) {
  HookEvent ev(EventKind::free, api, path);
  if (ContextMemory* cp = pooled() ? pool_owning(ptr) : nullptr) {
    if (capture_forbids_here()) {
      const auto rc = refuse_capture(cp);
      ev.done(rc, 0, ptr, cp);
      return rc;
    }
    std::size_t size = 0;
    const auto rc = memory().free(*cp, ptr, api, &size, ev.pool_state()) == FreeResult::freed ? Api::ok : Api::invalid;
    ev.done(rc, size, ptr, cp);
    return rc;
  }
  const auto rc = real_free();
  std::uint64_t bytes = 0;
  ContextMemory* owner = nullptr;
  int device = -1;
  if (rc == Api::ok) forget_outside(ptr, &bytes, &owner, &device);
  ev.device(device);
  ev.done(rc, bytes, ptr, owner);
  return rc;
}

// Memory info as the process's share: total is the cap, free what it could still get; the
// driver's answer when the process is not governed.
template <typename Api, typename RealCall>
typename Api::Code mem_info_hook(Path path, const char* api, size_t* free, size_t* total, ContextMemory* cp,
                                 RealCall&& real_call) {
  HookEvent ev(EventKind::mem_info, api, path);
  typename Api::Code rc = Api::ok;
  if (!memory().mem_info(cp, free, total)) rc = real_call();
  ev.done(rc, free ? *free : 0, 0, cp);
  return rc;
}

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

// The device of each memory pool the process made (cuMemPoolCreate names it): an allocation from
// the pool is charged there. Pools are few and live long; a destroyed pool's entry stays, and is
// overwritten if the driver hands the same handle out again.
std::mutex g_mempools_mu;
auto* g_mempool_device = new std::unordered_map<std::uint64_t, int>;  // never destroyed: hooks may run at exit

int mempool_device(CUmemoryPool pool) {
  std::lock_guard lock(g_mempools_mu);
  auto it = g_mempool_device->find(address(pool));
  return it == g_mempool_device->end() ? -1 : it->second;
}

// Where a stream-ordered allocation takes its memory: the pool's device for a pool the process
// made, else the stream's context's (cuMemAllocAsync takes the current pool of the stream's
// device). The default streams are the calling thread's context's; a stream names its own
// context (cuStreamGetCtx), which need not be current on this thread, or on any.
template <typename Api>
Placement stream_ordered_placement(const void* stream, CUmemoryPool pool) {
  const CUstream s = static_cast<CUstream>(const_cast<void*>(stream));
  Placement where;
  if (s == nullptr || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) {
    where = Api::context(~std::uint64_t{0});
  } else {
    if (CUcontext ctx = stream_context(s)) where = pool_of_context(ctx);
    if (where.cp == nullptr && where.device < 0) where = Api::context(~std::uint64_t{0});  // as before: the thread's
  }
  if (pool != nullptr)
    if (const int d = mempool_device(pool); d >= 0 && d != where.device) where = placed_on_device(d);
  return where;
}

// cudaMallocAsync and cuMemAlloc(FromPool)Async, legacy and per-thread flavours.
template <MemoryApi kApi, typename Api, typename Ptr, typename Stream, typename RealCall>
typename Api::Code stream_ordered_alloc(Path path, bool per_thread, Ptr* out, std::size_t bytes, Stream stream,
                                        RealCall&& real_call, CUmemoryPool pool = nullptr) {
  const void* s = stream;
  return outermost(out != nullptr && !graph_node(s, per_thread), real_call, [&] {
    return allocate_hook<kApi, Api>(path, out, nullptr, bytes, 0, true, stream_ordered_placement<Api>(s, pool),
                                    real_call, &s);
  });
}

template <typename Api, typename Ptr, typename Stream, typename RealCall>
typename Api::Code stream_ordered_free(Path path, const char* api, bool per_thread, Ptr ptr, Stream stream,
                                       RealCall&& real_call) {
  const void* s = stream;
  return outermost(!graph_node(s, per_thread) && (!std::is_pointer_v<Ptr> || address(ptr) != 0), real_call, [&] {
    return free_outside_hook<Api>(path, api, address(ptr), real_call, &s);
  });
}

// The runtime's twin of DriverUpstream::refuse_as_capture_does: the same unsafe call made
// through the runtime, so that its last error says so too.
cudaError_t refuse_runtime_as_capture_does(ContextMemory* cp) {
  using EventQuery = cudaError_t (*)(cudaEvent_t);
  if (auto query = reinterpret_cast<EventQuery>(runtime_function("cudaEventQuery")))
    if (CUevent probe = driver_upstream(*cp).probe_event()) {
      const cudaError_t rc = query(reinterpret_cast<cudaEvent_t>(probe));
      return rc == cudaSuccess ? cudaErrorStreamCaptureUnsupported : rc;
    }
  driver_upstream(*cp).refuse_as_capture_does();
  return cudaErrorStreamCaptureUnsupported;
}

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

}  // namespace

namespace impl {

// ---- Runtime ----------------------------------------------------------------------------

cudaError_t cudaMalloc(Path path, void** devPtr, size_t size) {
  auto call = [&] {
    auto real = CUPOOL_REAL(cudaMalloc);
    return real ? real(devPtr, size) : RuntimeApi::no_library;
  };
  return outermost(devPtr != nullptr, call, [&] {
    return allocate_hook<MemoryApi::cudaMalloc, RuntimeApi>(path, devPtr, nullptr, size, 0, true, runtime_pool(),
                                                            call);
  });
}

cudaError_t cudaMallocPitch(Path path, void** devPtr, size_t* pitch, size_t width, size_t height) {
  auto call = [&] {
    auto real = CUPOOL_REAL(cudaMallocPitch);
    return real ? real(devPtr, pitch, width, height) : RuntimeApi::no_library;
  };
  return outermost(devPtr != nullptr && pitch != nullptr, call, [&] {
    const std::uint64_t row = round_pitch(width);
    return allocate_hook<MemoryApi::cudaMallocPitch, RuntimeApi>(path, devPtr, pitch, row * height, row,
                                                                 width != 0 && height != 0, runtime_pool(), call);
  });
}

cudaError_t cudaMallocManaged(Path path, void** devPtr, size_t size, unsigned int flags) {
  auto call = [&] {
    auto real = CUPOOL_REAL(cudaMallocManaged);
    return real ? real(devPtr, size, flags) : RuntimeApi::no_library;
  };
  return outermost(devPtr != nullptr, call, [&] {
    return allocate_hook<MemoryApi::cudaMallocManaged, RuntimeApi>(path, devPtr, nullptr, size, 0, true,
                                                                   runtime_pool(), call);
  });
}

cudaError_t cudaMallocAsync(Path path, void** devPtr, size_t size, cudaStream_t stream) {
  auto real = CUPOOL_REAL(cudaMallocAsync);
  return stream_ordered_alloc<MemoryApi::cudaMallocAsync, RuntimeApi>(path, false, devPtr, size, stream, [&] {
    return real ? real(devPtr, size, stream) : RuntimeApi::no_library;
  });
}
cudaError_t cudaMallocAsync_ptsz(Path path, void** devPtr, size_t size, cudaStream_t stream) {
  auto real = CUPOOL_REAL(cudaMallocAsync_ptsz);
  return stream_ordered_alloc<MemoryApi::cudaMallocAsync_ptsz, RuntimeApi>(path, true, devPtr, size, stream, [&] {
    return real ? real(devPtr, size, stream) : RuntimeApi::no_library;
  });
}
cudaError_t cudaFreeAsync(Path path, void* devPtr, cudaStream_t stream) {
  auto real = CUPOOL_REAL(cudaFreeAsync);
  return stream_ordered_free<RuntimeApi>(path, "cudaFreeAsync", false, devPtr, stream, [&] {
    return real ? real(devPtr, stream) : RuntimeApi::no_library;
  });
}
cudaError_t cudaFreeAsync_ptsz(Path path, void* devPtr, cudaStream_t stream) {
  auto real = CUPOOL_REAL(cudaFreeAsync_ptsz);
  return stream_ordered_free<RuntimeApi>(path, "cudaFreeAsync_ptsz", true, devPtr, stream, [&] {
    return real ? real(devPtr, stream) : RuntimeApi::no_library;
  });
}

cudaError_t cudaFree(Path path, void* devPtr) {
  auto call = [&] {
    auto real = CUPOOL_REAL(cudaFree);
    return real ? real(devPtr) : RuntimeApi::no_library;
  };
  // cudaFree(NULL) only initialises the runtime: not an event.
  return outermost(devPtr != nullptr, call, [&] {
    return free_any<RuntimeApi>(path, "cudaFree", address(devPtr), call,
                                [](ContextMemory* cp) { return refuse_runtime_as_capture_does(cp); });
  });
}

cudaError_t cudaMemGetInfo(Path path, size_t* free, size_t* total) {
  auto call = [&] {
    auto real = CUPOOL_REAL(cudaMemGetInfo);
    return real ? real(free, total) : RuntimeApi::no_library;
  };
  return outermost(true, call, [&] { return mem_info_hook<RuntimeApi>(path, "cudaMemGetInfo", free, total, runtime_pool(), call); });
}

// ---- Driver -----------------------------------------------------------------------------

CUresult cuMemAlloc_v2(Path path, CUdeviceptr* dptr, size_t bytesize) {
  auto call = [&] {
    auto real = CUPOOL_REAL(cuMemAlloc_v2);
    return real ? real(dptr, bytesize) : DriverApi::no_library;
  };
  return outermost(dptr != nullptr, call, [&] {
    return allocate_hook<MemoryApi::cuMemAlloc_v2, DriverApi>(path, dptr, nullptr, bytesize, 0, true,
                                                              DriverApi::context(bytesize), call);
  });
}

CUresult cuMemAllocPitch_v2(Path path, CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height,
                            unsigned int elementSize) {
  auto call = [&] {
    auto real = CUPOOL_REAL(cuMemAllocPitch_v2);
    return real ? real(dptr, pitch, width, height, elementSize) : DriverApi::no_library;
  };
  return outermost(dptr != nullptr && pitch != nullptr, call, [&] {
    const std::uint64_t row = round_pitch(width);
    const bool valid_element = elementSize == 4 || elementSize == 8 || elementSize == 16;
    return allocate_hook<MemoryApi::cuMemAllocPitch_v2, DriverApi>(
        path, dptr, pitch, row * height, row, width != 0 && height != 0 && valid_element, driver_pool(), call);
  });
}

CUresult cuMemFree_v2(Path path, CUdeviceptr dptr) {
  auto call = [&] {
    auto real = CUPOOL_REAL(cuMemFree_v2);
    return real ? real(dptr) : DriverApi::no_library;
  };
  return outermost(dptr != 0, call, [&] {
    return free_any<DriverApi>(path, "cuMemFree_v2", dptr, call,
                               [](ContextMemory* cp) { return driver_upstream(*cp).refuse_as_capture_does(); });
  });
}

CUresult cuMemAllocManaged(Path path, CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  auto call = [&] {
    auto real = CUPOOL_REAL(cuMemAllocManaged);
    return real ? real(dptr, bytesize, flags) : DriverApi::no_library;
  };
  return outermost(dptr != nullptr, call, [&] {
    return allocate_hook<MemoryApi::cuMemAllocManaged, DriverApi>(path, dptr, nullptr, bytesize, 0, true,
                                                                  driver_pool(), call);
  });
}

CUresult cuMemGetInfo_v2(Path path, size_t* free, size_t* total) {
  auto call = [&] {
    auto real = CUPOOL_REAL(cuMemGetInfo_v2);
    return real ? real(free, total) : DriverApi::no_library;
  };
  return outermost(true, call, [&] { return mem_info_hook<DriverApi>(path, "cuMemGetInfo_v2", free, total, driver_pool(), call); });
}

CUresult cuMemAllocAsync(Path path, CUdeviceptr* dptr, size_t bytesize, CUstream stream) {
  auto real = CUPOOL_REAL(cuMemAllocAsync);
  return stream_ordered_alloc<MemoryApi::cuMemAllocAsync, DriverApi>(path, false, dptr, bytesize, stream, [&] {
    return real ? real(dptr, bytesize, stream) : DriverApi::no_library;
  });
}
CUresult cuMemAllocAsync_ptsz(Path path, CUdeviceptr* dptr, size_t bytesize, CUstream stream) {
  auto real = CUPOOL_REAL(cuMemAllocAsync_ptsz);
  return stream_ordered_alloc<MemoryApi::cuMemAllocAsync_ptsz, DriverApi>(path, true, dptr, bytesize, stream, [&] {
    return real ? real(dptr, bytesize, stream) : DriverApi::no_library;
  });
}
CUresult cuMemAllocFromPoolAsync(Path path, CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream stream) {
  auto real = CUPOOL_REAL(cuMemAllocFromPoolAsync);
  return stream_ordered_alloc<MemoryApi::cuMemAllocFromPoolAsync, DriverApi>(
      path, false, dptr, bytesize, stream,
      [&] { return real ? real(dptr, bytesize, pool, stream) : DriverApi::no_library; }, pool);
}
CUresult cuMemAllocFromPoolAsync_ptsz(Path path, CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream stream) {
  auto real = CUPOOL_REAL(cuMemAllocFromPoolAsync_ptsz);
  return stream_ordered_alloc<MemoryApi::cuMemAllocFromPoolAsync_ptsz, DriverApi>(
      path, true, dptr, bytesize, stream,
      [&] { return real ? real(dptr, bytesize, pool, stream) : DriverApi::no_library; }, pool);
}
// Recorded at every depth (the runtime's cudaMemPoolCreate comes here from inside its own call).
CUresult cuMemPoolCreate(Path, CUmemoryPool* pool, const CUmemPoolProps* props) {
  auto real = CUPOOL_REAL(cuMemPoolCreate);
  const CUresult rc = real ? real(pool, props) : DriverApi::no_library;
  if (rc == CUDA_SUCCESS && pool && props && props->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
    std::lock_guard lock(g_mempools_mu);
    (*g_mempool_device)[address(*pool)] = props->location.id;
  }
  return rc;
}

CUresult cuMemFreeAsync(Path path, CUdeviceptr dptr, CUstream stream) {
  auto real = CUPOOL_REAL(cuMemFreeAsync);
  return stream_ordered_free<DriverApi>(path, "cuMemFreeAsync", false, dptr, stream, [&] {
    return real ? real(dptr, stream) : DriverApi::no_library;
  });
}
CUresult cuMemFreeAsync_ptsz(Path path, CUdeviceptr dptr, CUstream stream) {
  auto real = CUPOOL_REAL(cuMemFreeAsync_ptsz);
  return stream_ordered_free<DriverApi>(path, "cuMemFreeAsync_ptsz", true, dptr, stream, [&] {
    return real ? real(dptr, stream) : DriverApi::no_library;
  });
}

// ---- Driver: arrays. The runtime's cudaMallocArray, cudaMalloc3DArray and
// cudaMallocMipmappedArray come here too (through the driver's entry points), so a refusal
// reaches the program as the runtime's own cudaErrorMemoryAllocation, last error included.

CUresult cuArrayCreate_v2(Path path, CUarray* handle, const CUDA_ARRAY_DESCRIPTOR* desc) {
  auto call = [&] {
    auto real = CUPOOL_REAL(cuArrayCreate_v2);
    return real ? real(handle, desc) : DriverApi::no_library;
  };
  const std::uint64_t bytes = desc ? array_bytes(desc->Width, desc->Height, 0, desc->Format, desc->NumChannels, 1) : 0;
  return outermost(handle != nullptr, call, [&] {
    return allocate_hook<MemoryApi::cuArrayCreate_v2, DriverApi>(path, handle, nullptr, bytes, 0, true, driver_pool(),
                                                                 call);
  });
}

CUresult cuArray3DCreate_v2(Path path, CUarray* handle, const CUDA_ARRAY3D_DESCRIPTOR* desc) {
  auto call = [&] {
    auto real = CUPOOL_REAL(cuArray3DCreate_v2);
    return real ? real(handle, desc) : DriverApi::no_library;
  };
  // An array made for deferred mapping has no memory of its own until the program maps some.
  const bool deferred = desc && (desc->Flags & CUDA_ARRAY3D_DEFERRED_MAPPING);
  const std::uint64_t bytes = desc && !deferred ? array3d_bytes(*desc, 1) : 0;
  return outermost(handle != nullptr, call, [&] {
    return allocate_hook<MemoryApi::cuArray3DCreate_v2, DriverApi>(path, handle, nullptr, bytes, 0, true, driver_pool(),
                                                                   call);
  });
}

CUresult cuMipmappedArrayCreate(Path path, CUmipmappedArray* handle, const CUDA_ARRAY3D_DESCRIPTOR* desc,
                                unsigned int levels) {
  auto call = [&] {
    auto real = CUPOOL_REAL(cuMipmappedArrayCreate);
    return real ? real(handle, desc, levels) : DriverApi::no_library;
  };
  const bool deferred = desc && (desc->Flags & CUDA_ARRAY3D_DEFERRED_MAPPING);
  const std::uint64_t bytes = desc && !deferred ? array3d_bytes(*desc, levels) : 0;
  return outermost(handle != nullptr, call, [&] {
    return allocate_hook<MemoryApi::cuMipmappedArrayCreate, DriverApi>(path, handle, nullptr, bytes, 0, true,
                                                                       driver_pool(), call);
  });
}

CUresult cuArrayDestroy(Path path, CUarray handle) {
  auto call = [&] {
    auto real = CUPOOL_REAL(cuArrayDestroy);
    return real ? real(handle) : DriverApi::no_library;
  };
  return outermost(true, call, [&] { return free_outside_hook<DriverApi>(path, "cuArrayDestroy", address(handle), call); });
}

CUresult cuMipmappedArrayDestroy(Path path, CUmipmappedArray handle) {
  auto call = [&] {
    auto real = CUPOOL_REAL(cuMipmappedArrayDestroy);
    return real ? real(handle) : DriverApi::no_library;
  };
  return outermost(true, call, [&] {
    return free_outside_hook<DriverApi>(path, "cuMipmappedArrayDestroy", address(handle), call);
  });
}

}  // namespace impl
}  // namespace cupool::shim
