// Hooks that keep pools honest about the world around them: context lifetime (a pool dies with
// its context) and pointer queries (a block carved from a chunk must look like an allocation of
// its own). Streams and captures: hooks_streams.cpp.
#include <dlfcn.h>
#include <fmt/format.h>

#include <cstring>
#include <string>
#include <type_traits>

#include "context_pool.h"
#include "hook_table.h"
#include "hooks_internal.h"
#include "ipc_handle.h"
#include "ipc_vmm.h"
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
}  // namespace

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

// The current context may now reach `peer`'s memory: cuMemAlloc memory by this call alone,
// cuMemCreate memory (the vmm policy's granules) only once cupool names the device to the driver.
CUresult cuCtxEnablePeerAccess(Path, CUcontext peer, unsigned int flags) {
  HookScope scope;
  auto real = CUPOOL_REAL(cuCtxEnablePeerAccess);
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult rc = real(peer, flags);
  if (scope.outermost() && (rc == CUDA_SUCCESS || rc == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)) {
    initialize();
    CUdevice accessor = 0;
    if (driver().ok && driver().ctx_get_device(&accessor) == CUDA_SUCCESS) peer_access_enabled(peer, accessor);
  }
  return rc;
}

// ---- Pointer queries --------------------------------------------------------------------

namespace {
// Blocks this process opened from other processes' pools over CUDA IPC (see IPC below). Never
// destroyed: threads and exit handlers may still close or query after static destructors ran.
ipc::ImportedBlocks& imported() {
  static auto* blocks = new ipc::ImportedBlocks;
  return *blocks;
}

bool imported_block_range(std::uint64_t ptr, std::uint64_t* start, std::uint64_t* size) {
  return (!imported().empty() && imported().range(ptr, start, size)) || ipc_vmm::range(ptr, start, size);
}
}  // namespace

CUresult cuMemGetAddressRange_v2(Path, CUdeviceptr* base, size_t* size, CUdeviceptr ptr) {
  HookScope scope;
  auto real = CUPOOL_REAL(cuMemGetAddressRange_v2);
  if (scope.outermost()) {
    initialize();
    if (ContextMemory* cp = pool_owning(ptr)) {
      std::uint64_t block_base = 0;
      std::size_t block_bytes = 0;
      if (cp->pool->block_range(ptr, &block_base, &block_bytes)) {
        if (base) *base = block_base;
        if (size) *size = block_bytes;
        return CUDA_SUCCESS;
      }
    }
    if (std::uint64_t start = 0, bytes = 0; imported_block_range(ptr, &start, &bytes)) {
      CUresult rc = real ? real(base, size, ptr) : CUDA_ERROR_NOT_INITIALIZED;  // still mapped?
      if (rc == CUDA_SUCCESS) {
        if (base) *base = start;
        if (size) *size = bytes;
      }
      return rc;
    }
  }
  return real ? real(base, size, ptr) : CUDA_ERROR_NOT_INITIALIZED;
}

namespace {
// Overwrites the range attributes of a pool block (or a block imported over IPC) with the
// block's own range.
void patch_range(CUpointer_attribute attribute, void* data, CUdeviceptr ptr) {
  if (attribute != CU_POINTER_ATTRIBUTE_RANGE_START_ADDR && attribute != CU_POINTER_ATTRIBUTE_RANGE_SIZE) return;
  if (data == nullptr) return;
  ContextMemory* cp = pool_owning(ptr);
  std::uint64_t block_base = 0;
  std::size_t block_bytes = 0;
  if (cp == nullptr || !cp->pool->block_range(ptr, &block_base, &block_bytes)) {
    std::uint64_t bytes = 0;
    if (!imported_block_range(ptr, &block_base, &bytes)) return;
    block_bytes = bytes;
  }
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
// The driver shares whole allocations, so a pool block travels as its chunk's handle with the
// block's place written in (policy/ipc_handle.h); an importing cupool opens the chunk and hands
// out the block. A place that cannot be written is refused with a clear message rather than let
// the other process see the chunk's start.
namespace {
// The place of the pool block holding `ptr` in its chunk; false if no pool block holds it. From
// the pool's own records: torch.multiprocessing shares from a feeder thread that has no current
// context, where a driver query would fail.
bool pool_block_place(std::uint64_t ptr, ipc::BlockPlace* place) {
  ContextMemory* cp = pool_owning(ptr);
  std::uint64_t block_base = 0, chunk_base = 0;
  std::size_t block_bytes = 0;
  if (cp == nullptr || !cp->pool->block_in_reservation(ptr, &block_base, &block_bytes, &chunk_base)) return false;
  *place = {block_base - chunk_base, block_bytes};
  return true;
}

// A block of the vmm policy lies in one virtual range mapped granule by granule: the driver's
// IPC handles do not cover such memory, so cupool writes a handle of its own and serves the
// granules to the importer (shim/ipc_vmm.h). The pool whose vmm block holds `ptr`, else nullptr.
ContextMemory* vmm_pool_of(std::uint64_t ptr) {
  ContextMemory* cp = pool_owning(ptr);
  return cp != nullptr && cp->pool->virtual_memory() ? cp : nullptr;
}

// The runtime's code for an error of the vmm IPC path (the driver's, or cupool's own refusals).
cudaError_t runtime_code(CUresult rc) {
  switch (rc) {
    case CUDA_SUCCESS: return cudaSuccess;
    case CUDA_ERROR_INVALID_VALUE: return cudaErrorInvalidValue;
    case CUDA_ERROR_INVALID_HANDLE: return cudaErrorInvalidResourceHandle;
    case CUDA_ERROR_MAP_FAILED: return cudaErrorMapBufferObjectFailed;
    case CUDA_ERROR_OUT_OF_MEMORY: return cudaErrorMemoryAllocation;
    case CUDA_ERROR_INVALID_CONTEXT: return cudaErrorDeviceUninitialized;
    case CUDA_ERROR_OPERATING_SYSTEM: return cudaErrorOperatingSystem;
    case CUDA_ERROR_NOT_SUPPORTED: return cudaErrorNotSupported;
    default: return cudaErrorUnknown;
  }
}

// After the driver made the handle of a pool block's chunk. False if the place cannot be written:
// the handle is then cleared, so that a caller that ignores the error sends nothing that opens.
bool write_place(unsigned char* handle, const ipc::BlockPlace& place, const char* api) {
  const ipc::EncodeResult r = ipc::encode(handle, place);
  if (r == ipc::EncodeResult::written) {
    log_debug(fmt::format("{}: a pool block of {} bytes at offset {} of its chunk", api, place.size, place.offset));
    return true;
  }
  std::memset(handle, 0, ipc::kHandleBytes);
  log_error(fmt::format("{}: cannot share this pool block ({} bytes at offset {} of its chunk) over CUDA IPC: {}; "
                        "the driver would share the whole chunk. Run processes that share memory over CUDA IPC "
                        "with CUPOOL_POLICY=passthrough, or under growth (smaller chunks).",
                        api, place.size, place.offset,
                        r == ipc::EncodeResult::driver_uses_bytes
                            ? "the driver's handle for this chunk uses the bytes cupool writes the block's place into"
                            : "the block lies past 256 GiB into its chunk"));
  return false;
}

// Whether the chunk mapped at `base` holds the block: a check that the handle really carried a
// place (its marker is only 4 bits, and a driver may use those bytes, as seen for 42 GB).
bool chunk_holds(std::uint64_t base, const ipc::BlockPlace& place) {
  CUdeviceptr start = 0;
  size_t bytes = 0;
  auto range = CUPOOL_REAL(cuMemGetAddressRange_v2);
  return range && range(&start, &bytes, base) == CUDA_SUCCESS && start == base && place.offset < bytes &&
         place.size <= bytes - place.offset;
}


// cudaIpcOpenMemHandle / cuIpcOpenMemHandle_v2 through the real `open` (and `close`). A handle
// that carries a block's place opens its chunk, and the block is what the caller gets; if it
// does not open that way, or the chunk cannot hold the block, the handle as it came is opened
// instead (it was not one of cupool's).
template <typename Result, typename Ptr, typename Handle>
Result open_handle(Result (*open)(Ptr*, Handle, unsigned), Result (*close)(Ptr), Ptr* out, const Handle& handle,
                   unsigned flags) {
  if (ipc::VmmHandle vh; ipc::decode_vmm(reinterpret_cast<const unsigned char*>(handle.reserved), &vh)) {
    std::uint64_t p = 0;
    const CUresult rc = ipc_vmm::open(vh, &p);
    if (rc == CUDA_SUCCESS) *out = pointer<Ptr>(p);
    if constexpr (std::is_same_v<Result, CUresult>) {
      return rc;
    } else {
      // The runtime's sticky error (cudaGetLastError) must say that an open failed, as its own
      // failed open would: it is asked to open a handle that names nothing.
      if (rc != CUDA_SUCCESS) {
        Ptr none{};
        open(&none, Handle{}, flags);
      }
      return runtime_code(rc);
    }
  }
  Handle restored = handle;
  ipc::BlockPlace place;
  if (!ipc::decode(reinterpret_cast<unsigned char*>(restored.reserved), &place)) return open(out, handle, flags);
  Ptr mapped{};
  const Result rc = open(&mapped, restored, flags);
  const std::uint64_t base = address(mapped);
  if (static_cast<int>(rc) == 0 && chunk_holds(base, place)) {
    imported().opened(base + place.offset, base, place.size);
    log_debug(fmt::format("IPC open: a pool block of {} bytes at offset {} of the chunk mapped at 0x{:x}", place.size,
                          place.offset, base));
    *out = pointer<Ptr>(base + place.offset);
    return rc;
  }
  if (static_cast<int>(rc) == 0 && close) close(mapped);
  log_debug("IPC open: the handle looked like a pool block's but is not; opening it as it came");
  const Result as_came = open(out, handle, flags);
  // Both failed: the first error is the one about the chunk (the second is an invalid handle).
  return static_cast<int>(as_came) != 0 && static_cast<int>(rc) != 0 ? rc : as_came;
}

// cudaIpcCloseMemHandle / cuIpcCloseMemHandle through the real `close`: for a block opened
// above, its chunk's mapping.
template <typename Result, typename Ptr>
Result close_handle(Result (*close)(Ptr), Ptr ptr) {
  if (CUresult rc = CUDA_SUCCESS; ipc_vmm::close(address(ptr), &rc)) {
    if constexpr (std::is_same_v<Result, CUresult>) return rc;
    else return runtime_code(rc);
  }
  std::uint64_t base = 0;
  if (!imported().chunk_of(address(ptr), &base)) return close(ptr);
  const Result rc = close(pointer<Ptr>(base));
  if (static_cast<int>(rc) == 0) imported().closed(address(ptr));
  return rc;
}
}  // namespace

cudaError_t cudaIpcGetMemHandle(Path, cudaIpcMemHandle_t* handle, void* devPtr) {
  HookScope scope;
  auto real = CUPOOL_REAL(cudaIpcGetMemHandle);
  if (!real) return cudaErrorInitializationError;
  if (!scope.outermost()) return real(handle, devPtr);
  initialize();
  if (ContextMemory* cp = vmm_pool_of(reinterpret_cast<std::uintptr_t>(devPtr))) {
    if (handle == nullptr) return cudaErrorInvalidValue;
    return runtime_code(ipc_vmm::export_block(*cp, reinterpret_cast<std::uintptr_t>(devPtr),
                                              reinterpret_cast<unsigned char*>(handle->reserved), "cudaIpcGetMemHandle"));
  }
  ipc::BlockPlace place;
  const bool block = pool_block_place(reinterpret_cast<std::uintptr_t>(devPtr), &place);
  const cudaError_t rc = real(handle, devPtr);
  if (rc != cudaSuccess || !block || handle == nullptr) return rc;
  return write_place(reinterpret_cast<unsigned char*>(handle->reserved), place, "cudaIpcGetMemHandle")
             ? rc
             : cudaErrorNotSupported;
}

CUresult cuIpcGetMemHandle(Path, CUipcMemHandle* handle, CUdeviceptr dptr) {
  HookScope scope;
  auto real = CUPOOL_REAL(cuIpcGetMemHandle);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  if (!scope.outermost()) return real(handle, dptr);
  initialize();
  if (ContextMemory* cp = vmm_pool_of(dptr)) {
    if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return ipc_vmm::export_block(*cp, dptr, reinterpret_cast<unsigned char*>(handle->reserved), "cuIpcGetMemHandle");
  }
  ipc::BlockPlace place;
  const bool block = pool_block_place(dptr, &place);
  const CUresult rc = real(handle, dptr);
  if (rc != CUDA_SUCCESS || !block || handle == nullptr) return rc;
  return write_place(reinterpret_cast<unsigned char*>(handle->reserved), place, "cuIpcGetMemHandle")
             ? rc
             : CUDA_ERROR_NOT_SUPPORTED;
}

cudaError_t cudaIpcOpenMemHandle(Path, void** devPtr, cudaIpcMemHandle_t handle, unsigned int flags) {
  HookScope scope;
  auto real = CUPOOL_REAL(cudaIpcOpenMemHandle);
  if (!real) return cudaErrorInitializationError;
  if (!scope.outermost() || devPtr == nullptr) return real(devPtr, handle, flags);
  initialize();
  // The runtime makes its context current on its first call; cupool's own open of a vmm block
  // needs it before that.
  if (auto rt_free = CUPOOL_REAL(cudaFree)) rt_free(nullptr);
  return open_handle(real, CUPOOL_REAL(cudaIpcCloseMemHandle), devPtr, handle, flags);
}

CUresult cuIpcOpenMemHandle_v2(Path, CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int flags) {
  HookScope scope;
  auto real = CUPOOL_REAL(cuIpcOpenMemHandle_v2);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  if (!scope.outermost() || pdptr == nullptr) return real(pdptr, handle, flags);
  initialize();
  return open_handle(real, CUPOOL_REAL(cuIpcCloseMemHandle), pdptr, handle, flags);
}

cudaError_t cudaIpcCloseMemHandle(Path, void* devPtr) {
  HookScope scope;
  auto real = CUPOOL_REAL(cudaIpcCloseMemHandle);
  if (!real) return cudaErrorInitializationError;
  return scope.outermost() ? close_handle(real, devPtr) : real(devPtr);
}

CUresult cuIpcCloseMemHandle(Path, CUdeviceptr dptr) {
  HookScope scope;
  auto real = CUPOOL_REAL(cuIpcCloseMemHandle);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  return scope.outermost() ? close_handle(real, dptr) : real(dptr);
}

}  // namespace cupool::shim::impl
