// Hooks that keep pools honest about the world around them: stream creation (deferred frees
// must fence every non-blocking stream), context lifetime (a pool dies with its context), and
// pointer queries (a block carved from a chunk must look like an allocation of its own).
#include <cstring>
#include <string>

#include "device_pool.h"
#include "hook_table.h"
#include "hooks_internal.h"
#include "log.h"
#include "shim_state.h"

namespace cupool::shim::impl {

using trace::Path;

namespace {
CUcontext current_context() {
  CUcontext ctx = nullptr;
  if (driver().ok) driver().ctx_get_current(&ctx);
  return ctx;
}
}  // namespace

// ---- Streams ----------------------------------------------------------------------------

cudaError_t cudaStreamCreate(Path, cudaStream_t* stream) {
  HookScope scope;
  auto real = CUPOOL_REAL(cudaStreamCreate);
  cudaError_t rc = real ? real(stream) : cudaErrorInitializationError;
  if (rc == cudaSuccess && scope.outermost()) streams().created(current_context(), reinterpret_cast<CUstream>(*stream), 0);
  return rc;
}

cudaError_t cudaStreamCreateWithFlags(Path, cudaStream_t* stream, unsigned int flags) {
  HookScope scope;
  auto real = CUPOOL_REAL(cudaStreamCreateWithFlags);
  cudaError_t rc = real ? real(stream, flags) : cudaErrorInitializationError;
  if (rc == cudaSuccess && scope.outermost())
    streams().created(current_context(), reinterpret_cast<CUstream>(*stream),
                      (flags & cudaStreamNonBlocking) ? CU_STREAM_NON_BLOCKING : 0);
  return rc;
}

cudaError_t cudaStreamCreateWithPriority(Path, cudaStream_t* stream, unsigned int flags, int priority) {
  HookScope scope;
  auto real = CUPOOL_REAL(cudaStreamCreateWithPriority);
  cudaError_t rc = real ? real(stream, flags, priority) : cudaErrorInitializationError;
  if (rc == cudaSuccess && scope.outermost())
    streams().created(current_context(), reinterpret_cast<CUstream>(*stream),
                      (flags & cudaStreamNonBlocking) ? CU_STREAM_NON_BLOCKING : 0);
  return rc;
}

cudaError_t cudaStreamDestroy(Path, cudaStream_t stream) {
  HookScope scope;
  auto real = CUPOOL_REAL(cudaStreamDestroy);
  if (scope.outermost()) streams().destroyed(reinterpret_cast<CUstream>(stream));
  return real ? real(stream) : cudaErrorInitializationError;
}

CUresult cuStreamCreate(Path, CUstream* stream, unsigned int flags) {
  HookScope scope;
  auto real = CUPOOL_REAL(cuStreamCreate);
  CUresult rc = real ? real(stream, flags) : CUDA_ERROR_NOT_INITIALIZED;
  // Streams the runtime creates for its own calls are seen here too: they count.
  if (rc == CUDA_SUCCESS) streams().created(current_context(), *stream, flags);
  return rc;
}

CUresult cuStreamCreateWithPriority(Path, CUstream* stream, unsigned int flags, int priority) {
  HookScope scope;
  auto real = CUPOOL_REAL(cuStreamCreateWithPriority);
  CUresult rc = real ? real(stream, flags, priority) : CUDA_ERROR_NOT_INITIALIZED;
  if (rc == CUDA_SUCCESS) streams().created(current_context(), *stream, flags);
  return rc;
}

CUresult cuStreamDestroy_v2(Path, CUstream stream) {
  HookScope scope;
  auto real = CUPOOL_REAL(cuStreamDestroy_v2);
  streams().destroyed(stream);
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
