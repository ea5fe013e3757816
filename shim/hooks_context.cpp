// Hooks that keep pools honest about the world around them: stream creation (deferred frees
// must fence every non-blocking stream), context lifetime (a pool dies with its context), and
// pointer queries (a block carved from a chunk must look like an allocation of its own).
#include <dlfcn.h>

#include <cstring>
#include <string>

#include "device_pool.h"
#include "hook_table.h"
#include "hooks_internal.h"
#include "log.h"
#include "shim_state.h"
#include "thread_id.h"

namespace cupool::shim::impl {

using trace::Path;

namespace {
CUcontext current_context() {
  CUcontext ctx = nullptr;
  if (driver().ok) driver().ctx_get_current(&ctx);
  return ctx;
}

// A stream the process created: registered (deferred frees must know which streams can run at
// the same time) and, for the outermost call, one trace event. `caller` names the object that
// asked, in the debug log: libraries create streams of their own, and they change what
// deferred frees cost.
void stream_created(Path path, const char* api, bool outermost, CUstream stream, unsigned flags, std::uint64_t t0,
                    const void* caller) {
  const CUcontext ctx = current_context();
  // Memory freed while all work was one order was reusable at once, and some of it waits in the
  // pools (free lists, thread caches, kept VMM mappings) with work still running on it. From
  // now on the new stream can run beside that work: wait for it once, here, so that nothing
  // freed before this point is handed to the new stream early.
  if (streams().created(ctx, stream, flags)) synchronize_all_pools();
  if (!outermost) return;
  if (log_debug_enabled()) {
    Dl_info info{};
    const char* who = dladdr(caller, &info) && info.dli_fname ? info.dli_fname : "?";
    log_debug(std::string(api) + ": stream " + std::to_string(reinterpret_cast<std::uintptr_t>(stream)) +
              ((flags & CU_STREAM_NON_BLOCKING) ? " (non-blocking)" : " (blocking)") + " created by " + who);
  }
  if (!tracing()) return;
  trace::Record r;
  r.t_ns = now_ns();
  r.dur_ns = r.t_ns - t0;
  r.kind = trace::EventKind::stream_create;
  r.api = api;
  r.path = path;
  r.has_stream = true;
  r.stream = reinterpret_cast<std::uintptr_t>(stream);
  r.has_flags = true;
  r.flags = flags;
  r.tid = current_thread_id();
  CUdevice device = 0;
  if (ctx != nullptr && driver().ok && driver().ctx_get_device(&device) == CUDA_SUCCESS)
    r.device = static_cast<std::int16_t>(device);
  emit(r);
}

void stream_destroyed(Path path, const char* api, bool outermost, CUstream stream) {
  streams().destroyed(stream);
  if (!outermost || !tracing()) return;
  trace::Record r;
  r.t_ns = now_ns();
  r.kind = trace::EventKind::stream_destroy;
  r.api = api;
  r.path = path;
  r.has_stream = true;
  r.stream = reinterpret_cast<std::uintptr_t>(stream);
  r.tid = current_thread_id();
  emit(r);
}

unsigned runtime_stream_flags(unsigned flags) { return (flags & cudaStreamNonBlocking) ? CU_STREAM_NON_BLOCKING : 0; }
}  // namespace

// ---- Streams ----------------------------------------------------------------------------

// The stream-creating hooks of both APIs: the real call, then, if it made a stream, its record.
template <typename Code, typename Handle, typename Call>
Code create_stream(Path path, const char* api, Code ok, Handle* stream, unsigned flags, Call&& call,
                   const void* caller) {
  HookScope scope;
  initialize();
  const std::uint64_t t0 = now_ns();
  const Code rc = call();
  if (rc == ok)
    stream_created(path, api, scope.outermost(), reinterpret_cast<CUstream>(*stream), flags, t0, caller);
  return rc;
}

cudaError_t cudaStreamCreate(Path path, cudaStream_t* stream) {
  auto real = CUPOOL_REAL(cudaStreamCreate);
  return create_stream(path, "cudaStreamCreate", cudaSuccess, stream, 0,
                       [&] { return real ? real(stream) : cudaErrorInitializationError; },
                       __builtin_return_address(0));
}

cudaError_t cudaStreamCreateWithFlags(Path path, cudaStream_t* stream, unsigned int flags) {
  auto real = CUPOOL_REAL(cudaStreamCreateWithFlags);
  return create_stream(path, "cudaStreamCreateWithFlags", cudaSuccess, stream, runtime_stream_flags(flags),
                       [&] { return real ? real(stream, flags) : cudaErrorInitializationError; },
                       __builtin_return_address(0));
}

cudaError_t cudaStreamCreateWithPriority(Path path, cudaStream_t* stream, unsigned int flags, int priority) {
  auto real = CUPOOL_REAL(cudaStreamCreateWithPriority);
  return create_stream(path, "cudaStreamCreateWithPriority", cudaSuccess, stream, runtime_stream_flags(flags),
                       [&] { return real ? real(stream, flags, priority) : cudaErrorInitializationError; },
                       __builtin_return_address(0));
}

cudaError_t cudaStreamDestroy(Path path, cudaStream_t stream) {
  HookScope scope;
  auto real = CUPOOL_REAL(cudaStreamDestroy);
  stream_destroyed(path, "cudaStreamDestroy", scope.outermost(), reinterpret_cast<CUstream>(stream));
  return real ? real(stream) : cudaErrorInitializationError;
}

// Streams the runtime creates for its own purposes are seen here too: they count.
CUresult cuStreamCreate(Path path, CUstream* stream, unsigned int flags) {
  auto real = CUPOOL_REAL(cuStreamCreate);
  return create_stream(path, "cuStreamCreate", CUDA_SUCCESS, stream, flags,
                       [&] { return real ? real(stream, flags) : CUDA_ERROR_NOT_INITIALIZED; },
                       __builtin_return_address(0));
}

CUresult cuStreamCreateWithPriority(Path path, CUstream* stream, unsigned int flags, int priority) {
  auto real = CUPOOL_REAL(cuStreamCreateWithPriority);
  return create_stream(path, "cuStreamCreateWithPriority", CUDA_SUCCESS, stream, flags,
                       [&] { return real ? real(stream, flags, priority) : CUDA_ERROR_NOT_INITIALIZED; },
                       __builtin_return_address(0));
}

CUresult cuStreamDestroy_v2(Path path, CUstream stream) {
  HookScope scope;
  auto real = CUPOOL_REAL(cuStreamDestroy_v2);
  stream_destroyed(path, "cuStreamDestroy_v2", scope.outermost(), stream);
  return real ? real(stream) : CUDA_ERROR_NOT_INITIALIZED;
}

// ---- Context lifetime -------------------------------------------------------------------

cudaError_t cudaDeviceReset(Path) {
  HookScope scope;
  auto real = CUPOOL_REAL(cudaDeviceReset);
  if (scope.outermost()) {
    initialize();
    // The runtime resets the primary context of its current device.
    CUcontext ctx = current_context();
    if (ctx != nullptr) drop_context(ctx, "cudaDeviceReset");
  }
  return real ? real() : cudaErrorInitializationError;
}

CUresult cuCtxDestroy_v2(Path, CUcontext ctx) {
  HookScope scope;
  auto real = CUPOOL_REAL(cuCtxDestroy_v2);
  if (scope.outermost()) {
    initialize();
    drop_context(ctx, "cuCtxDestroy_v2");
  }
  return real ? real(ctx) : CUDA_ERROR_NOT_INITIALIZED;
}

CUresult cuDevicePrimaryCtxReset_v2(Path, CUdevice device) {
  HookScope scope;
  auto real = CUPOOL_REAL(cuDevicePrimaryCtxReset_v2);
  // Inside cudaDeviceReset the pool is already dropped; a direct call drops it here.
  if (scope.outermost()) {
    initialize();
    drop_primary_context(device, "cuDevicePrimaryCtxReset_v2");
  }
  return real ? real(device) : CUDA_ERROR_NOT_INITIALIZED;
}

// ---- Pointer queries --------------------------------------------------------------------

CUresult cuMemGetAddressRange_v2(Path, CUdeviceptr* base, size_t* size, CUdeviceptr ptr) {
  HookScope scope;
  auto real = CUPOOL_REAL(cuMemGetAddressRange_v2);
  if (scope.outermost()) {
    initialize();
    if (ContextPool* cp = pool_owning(ptr)) {
      std::uint64_t block_base = 0;
      std::size_t block_bytes = 0;
      if (cp->pool->block_range(ptr, &block_base, &block_bytes)) {
        if (base) *base = block_base;
        if (size) *size = block_bytes;
        return CUDA_SUCCESS;
      }
    }
  }
  return real ? real(base, size, ptr) : CUDA_ERROR_NOT_INITIALIZED;
}

namespace {
// Overwrites the range attributes of a pool block with the block's own range.
void patch_range(CUpointer_attribute attribute, void* data, CUdeviceptr ptr) {
  if (attribute != CU_POINTER_ATTRIBUTE_RANGE_START_ADDR && attribute != CU_POINTER_ATTRIBUTE_RANGE_SIZE) return;
  ContextPool* cp = pool_owning(ptr);
  std::uint64_t block_base = 0;
  std::size_t block_bytes = 0;
  if (cp == nullptr || data == nullptr || !cp->pool->block_range(ptr, &block_base, &block_bytes)) return;
  if (attribute == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)
    *static_cast<CUdeviceptr*>(data) = block_base;
  else
    *static_cast<size_t*>(data) = block_bytes;
}
}  // namespace

CUresult cuPointerGetAttribute(Path, void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  HookScope scope;
  auto real = CUPOOL_REAL(cuPointerGetAttribute);
  CUresult rc = real ? real(data, attribute, ptr) : CUDA_ERROR_NOT_INITIALIZED;
  if (rc == CUDA_SUCCESS && scope.outermost()) patch_range(attribute, data, ptr);
  return rc;
}

CUresult cuPointerGetAttributes(Path, unsigned int count, CUpointer_attribute* attributes, void** data,
                                CUdeviceptr ptr) {
  HookScope scope;
  auto real = CUPOOL_REAL(cuPointerGetAttributes);
  CUresult rc = real ? real(count, attributes, data, ptr) : CUDA_ERROR_NOT_INITIALIZED;
  if (rc == CUDA_SUCCESS && scope.outermost() && attributes && data)
    for (unsigned i = 0; i < count; ++i) patch_range(attributes[i], data[i], ptr);
  return rc;
}

// ---- IPC ---------------------------------------------------------------------------------
// The driver shares whole allocations: a handle to a block carved from a chunk would open, in
// the other process, as the chunk's start. A block that starts its chunk opens correctly (the
// receiver maps a little more than the block); any other is refused with a clear message rather
// than let the other process read the wrong memory.
namespace {
bool ipc_refused(std::uint64_t ptr, const char* api) {
  ContextPool* cp = pool_owning(ptr);
  std::uint64_t block_base = 0;
  std::size_t block_bytes = 0;
  if (cp == nullptr || !cp->pool->block_range(ptr, &block_base, &block_bytes)) return false;
  CUdeviceptr chunk_base = 0;
  size_t chunk_bytes = 0;
  auto range = CUPOOL_REAL(cuMemGetAddressRange_v2);
  if (range && range(&chunk_base, &chunk_bytes, block_base) == CUDA_SUCCESS && chunk_base == block_base) return false;
  log_error(std::string(api) + " of a block inside a pool chunk is not supported: the driver would share the whole "
            "chunk, and the other process would see the wrong memory. Run processes that share memory over "
            "CUDA IPC with CUPOOL_POLICY=passthrough.");
  return true;
}
}  // namespace

cudaError_t cudaIpcGetMemHandle(Path, cudaIpcMemHandle_t* handle, void* devPtr) {
  HookScope scope;
  auto real = CUPOOL_REAL(cudaIpcGetMemHandle);
  if (scope.outermost()) {
    initialize();
    if (ipc_refused(reinterpret_cast<std::uintptr_t>(devPtr), "cudaIpcGetMemHandle")) return cudaErrorNotSupported;
  }
  return real ? real(handle, devPtr) : cudaErrorInitializationError;
}

CUresult cuIpcGetMemHandle(Path, CUipcMemHandle* handle, CUdeviceptr dptr) {
  HookScope scope;
  auto real = CUPOOL_REAL(cuIpcGetMemHandle);
  if (scope.outermost()) {
    initialize();
    if (ipc_refused(dptr, "cuIpcGetMemHandle")) return CUDA_ERROR_NOT_SUPPORTED;
  }
  return real ? real(handle, dptr) : CUDA_ERROR_NOT_INITIALIZED;
}

}  // namespace cupool::shim::impl
