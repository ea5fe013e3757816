// The exported symbols: each forwards to its implementation, saying it was reached by symbol.
// Which symbols are exported is decided by hooks.def (through the linker version script).
#include "hooks_internal.h"

#define CUPOOL_EXPORT(ret, symbol, params, ...) \
  extern "C" __attribute__((visibility("default"))) ret symbol params { \
    return ::cupool::shim::impl::symbol(::cupool::trace::symbol_path_ __VA_OPT__(, ) __VA_ARGS__); \
  }

namespace cupool::trace {
inline constexpr Path symbol_path_ = Path::symbol;
}

// Runtime.
CUPOOL_EXPORT(cudaError_t, cudaMalloc, (void** p, size_t n), p, n)
CUPOOL_EXPORT(cudaError_t, cudaFree, (void* p), p)
CUPOOL_EXPORT(cudaError_t, cudaMallocPitch, (void** p, size_t* pitch, size_t w, size_t h), p, pitch, w, h)
CUPOOL_EXPORT(cudaError_t, cudaMallocManaged, (void** p, size_t n, unsigned f), p, n, f)
CUPOOL_EXPORT(cudaError_t, cudaMallocAsync, (void** p, size_t n, cudaStream_t s), p, n, s)
CUPOOL_EXPORT(cudaError_t, cudaMallocAsync_ptsz, (void** p, size_t n, cudaStream_t s), p, n, s)
CUPOOL_EXPORT(cudaError_t, cudaFreeAsync, (void* p, cudaStream_t s), p, s)
CUPOOL_EXPORT(cudaError_t, cudaFreeAsync_ptsz, (void* p, cudaStream_t s), p, s)
CUPOOL_EXPORT(cudaError_t, cudaMemGetInfo, (size_t* f, size_t* t), f, t)
CUPOOL_EXPORT(cudaError_t, cudaGetDriverEntryPoint,
              (const char* s, void** fp, unsigned long long fl, cudaDriverEntryPointQueryResult* st), s, fp, fl, st)
CUPOOL_EXPORT(cudaError_t, cudaGetDriverEntryPoint_ptsz,
              (const char* s, void** fp, unsigned long long fl, cudaDriverEntryPointQueryResult* st), s, fp, fl, st)
CUPOOL_EXPORT(cudaError_t, cudaGetDriverEntryPointByVersion,
              (const char* s, void** fp, unsigned v, unsigned long long fl, cudaDriverEntryPointQueryResult* st),
              s, fp, v, fl, st)
CUPOOL_EXPORT(cudaError_t, cudaGetDriverEntryPointByVersion_ptsz,
              (const char* s, void** fp, unsigned v, unsigned long long fl, cudaDriverEntryPointQueryResult* st),
              s, fp, v, fl, st)
CUPOOL_EXPORT(cudaError_t, cudaDeviceReset, (void))
CUPOOL_EXPORT(cudaError_t, cudaStreamCreate, (cudaStream_t* s), s)
CUPOOL_EXPORT(cudaError_t, cudaStreamCreateWithFlags, (cudaStream_t* s, unsigned f), s, f)
CUPOOL_EXPORT(cudaError_t, cudaStreamCreateWithPriority, (cudaStream_t* s, unsigned f, int p), s, f, p)
CUPOOL_EXPORT(cudaError_t, cudaStreamDestroy, (cudaStream_t s), s)
CUPOOL_EXPORT(cudaError_t, cudaIpcGetMemHandle, (cudaIpcMemHandle_t* h, void* p), h, p)
CUPOOL_EXPORT(cudaError_t, cudaIpcOpenMemHandle, (void** p, cudaIpcMemHandle_t h, unsigned f), p, h, f)
CUPOOL_EXPORT(cudaError_t, cudaIpcCloseMemHandle, (void* p), p)
// Driver.
CUPOOL_EXPORT(CUresult, cuMemAlloc_v2, (CUdeviceptr* p, size_t n), p, n)
CUPOOL_EXPORT(CUresult, cuMemFree_v2, (CUdeviceptr p), p)
CUPOOL_EXPORT(CUresult, cuMemAllocPitch_v2, (CUdeviceptr* p, size_t* pitch, size_t w, size_t h, unsigned e),
              p, pitch, w, h, e)
CUPOOL_EXPORT(CUresult, cuMemAllocManaged, (CUdeviceptr* p, size_t n, unsigned f), p, n, f)
CUPOOL_EXPORT(CUresult, cuMemGetInfo_v2, (size_t* f, size_t* t), f, t)
CUPOOL_EXPORT(CUresult, cuMemAllocAsync, (CUdeviceptr* p, size_t n, CUstream s), p, n, s)
CUPOOL_EXPORT(CUresult, cuMemAllocAsync_ptsz, (CUdeviceptr* p, size_t n, CUstream s), p, n, s)
CUPOOL_EXPORT(CUresult, cuMemAllocFromPoolAsync, (CUdeviceptr* p, size_t n, CUmemoryPool m, CUstream s),
              p, n, m, s)
CUPOOL_EXPORT(CUresult, cuMemAllocFromPoolAsync_ptsz, (CUdeviceptr* p, size_t n, CUmemoryPool m, CUstream s),
              p, n, m, s)
CUPOOL_EXPORT(CUresult, cuMemFreeAsync, (CUdeviceptr p, CUstream s), p, s)
CUPOOL_EXPORT(CUresult, cuMemFreeAsync_ptsz, (CUdeviceptr p, CUstream s), p, s)
CUPOOL_EXPORT(CUresult, cuMemCreate,
              (CUmemGenericAllocationHandle* h, size_t n, const CUmemAllocationProp* prop, unsigned long long f),
              h, n, prop, f)
CUPOOL_EXPORT(CUresult, cuMemRelease, (CUmemGenericAllocationHandle h), h)
CUPOOL_EXPORT(CUresult, cuMemMap, (CUdeviceptr p, size_t n, size_t off, CUmemGenericAllocationHandle h,
                                   unsigned long long f), p, n, off, h, f)
CUPOOL_EXPORT(CUresult, cuMemUnmap, (CUdeviceptr p, size_t n), p, n)
CUPOOL_EXPORT(CUresult, cuMemAddressReserve,
              (CUdeviceptr* p, size_t n, size_t align, CUdeviceptr addr, unsigned long long f), p, n, align, addr, f)
CUPOOL_EXPORT(CUresult, cuMemAddressFree, (CUdeviceptr p, size_t n), p, n)
CUPOOL_EXPORT(CUresult, cuMemSetAccess, (CUdeviceptr p, size_t n, const CUmemAccessDesc* d, size_t c), p, n, d, c)
CUPOOL_EXPORT(CUresult, cuMemExportToShareableHandle,
              (void* sh, CUmemGenericAllocationHandle h, CUmemAllocationHandleType t, unsigned long long f), sh, h, t, f)
CUPOOL_EXPORT(CUresult, cuMemRetainAllocationHandle, (CUmemGenericAllocationHandle* h, void* a), h, a)
CUPOOL_EXPORT(CUresult, cuMemGetAddressRange_v2, (CUdeviceptr* b, size_t* n, CUdeviceptr p), b, n, p)
CUPOOL_EXPORT(CUresult, cuPointerGetAttribute, (void* d, CUpointer_attribute a, CUdeviceptr p), d, a, p)
CUPOOL_EXPORT(CUresult, cuPointerGetAttributes,
              (unsigned n, CUpointer_attribute* a, void** d, CUdeviceptr p), n, a, d, p)
CUPOOL_EXPORT(CUresult, cuIpcGetMemHandle, (CUipcMemHandle* h, CUdeviceptr p), h, p)
CUPOOL_EXPORT(CUresult, cuIpcOpenMemHandle_v2, (CUdeviceptr* p, CUipcMemHandle h, unsigned f), p, h, f)
CUPOOL_EXPORT(CUresult, cuIpcCloseMemHandle, (CUdeviceptr p), p)
CUPOOL_EXPORT(CUresult, cuStreamCreate, (CUstream* s, unsigned f), s, f)
CUPOOL_EXPORT(CUresult, cuStreamCreateWithPriority, (CUstream* s, unsigned f, int p), s, f, p)
CUPOOL_EXPORT(CUresult, cuStreamDestroy_v2, (CUstream s), s)
CUPOOL_EXPORT(CUresult, cuCtxDestroy_v2, (CUcontext c), c)
CUPOOL_EXPORT(CUresult, cuDevicePrimaryCtxReset_v2, (CUdevice d), d)
CUPOOL_EXPORT(CUresult, cuGetProcAddress, (const char* s, void** p, int v, cuuint64_t f), s, p, v, f)
CUPOOL_EXPORT(CUresult, cuGetProcAddress_v2,
              (const char* s, void** p, int v, cuuint64_t f, CUdriverProcAddressQueryResult* st), s, p, v, f, st)
