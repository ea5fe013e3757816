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
CUPOOL_EXPORT(CUresult, cuMemPoolCreate, (CUmemoryPool* p, const CUmemPoolProps* props), p, props)
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
CUPOOL_EXPORT(CUresult, cuCtxEnablePeerAccess, (CUcontext c, unsigned f), c, f)
// Driver: arrays, stream capture, graph memory.
CUPOOL_EXPORT(CUresult, cuArrayCreate_v2, (CUarray* a0, const CUDA_ARRAY_DESCRIPTOR* a1), a0, a1)
CUPOOL_EXPORT(CUresult, cuArray3DCreate_v2, (CUarray* a0, const CUDA_ARRAY3D_DESCRIPTOR* a1), a0, a1)
CUPOOL_EXPORT(CUresult, cuMipmappedArrayCreate,
              (CUmipmappedArray* a0, const CUDA_ARRAY3D_DESCRIPTOR* a1, unsigned int a2), a0, a1, a2)
CUPOOL_EXPORT(CUresult, cuArrayDestroy, (CUarray a0), a0)
CUPOOL_EXPORT(CUresult, cuMipmappedArrayDestroy, (CUmipmappedArray a0), a0)
CUPOOL_EXPORT(CUresult, cuStreamBeginCapture, (CUstream a0), a0)
CUPOOL_EXPORT(CUresult, cuStreamBeginCapture_ptsz, (CUstream a0), a0)
CUPOOL_EXPORT(CUresult, cuStreamBeginCapture_v2, (CUstream a0, CUstreamCaptureMode a1), a0, a1)
CUPOOL_EXPORT(CUresult, cuStreamBeginCapture_v2_ptsz, (CUstream a0, CUstreamCaptureMode a1), a0, a1)
CUPOOL_EXPORT(CUresult, cuStreamBeginCaptureToGraph,
              (CUstream a0, CUgraph a1, const CUgraphNode* a2, const CUgraphEdgeData* a3, size_t a4,
               CUstreamCaptureMode a5), a0, a1, a2, a3, a4, a5)
CUPOOL_EXPORT(CUresult, cuStreamBeginCaptureToGraph_ptsz,
              (CUstream a0, CUgraph a1, const CUgraphNode* a2, const CUgraphEdgeData* a3, size_t a4,
               CUstreamCaptureMode a5), a0, a1, a2, a3, a4, a5)
CUPOOL_EXPORT(CUresult, cuStreamEndCapture, (CUstream a0, CUgraph* a1), a0, a1)
CUPOOL_EXPORT(CUresult, cuStreamEndCapture_ptsz, (CUstream a0, CUgraph* a1), a0, a1)
CUPOOL_EXPORT(CUresult, cuGraphInstantiateWithFlags, (CUgraphExec* a0, CUgraph a1, unsigned long long a2), a0, a1, a2)
CUPOOL_EXPORT(CUresult, cuGraphInstantiateWithParams,
              (CUgraphExec* a0, CUgraph a1, CUDA_GRAPH_INSTANTIATE_PARAMS* a2), a0, a1, a2)
CUPOOL_EXPORT(CUresult, cuGraphInstantiateWithParams_ptsz,
              (CUgraphExec* a0, CUgraph a1, CUDA_GRAPH_INSTANTIATE_PARAMS* a2), a0, a1, a2)
CUPOOL_EXPORT(CUresult, cuGraphLaunch, (CUgraphExec a0, CUstream a1), a0, a1)
CUPOOL_EXPORT(CUresult, cuGraphLaunch_ptsz, (CUgraphExec a0, CUstream a1), a0, a1)
CUPOOL_EXPORT(CUresult, cuGraphUpload, (CUgraphExec a0, CUstream a1), a0, a1)
CUPOOL_EXPORT(CUresult, cuGraphUpload_ptsz, (CUgraphExec a0, CUstream a1), a0, a1)
CUPOOL_EXPORT(CUresult, cuGraphExecDestroy, (CUgraphExec a0), a0)
CUPOOL_EXPORT(CUresult, cuDeviceGraphMemTrim, (CUdevice a0), a0)
// Driver: work on streams (generated wrappers that note per-thread default streams).
CUPOOL_EXPORT(CUresult, cuLaunchKernel,
              (CUfunction a0, unsigned int a1, unsigned int a2, unsigned int a3, unsigned int a4, unsigned int a5,
               unsigned int a6, unsigned int a7, CUstream a8, void **a9, void **a10),
              a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10)
CUPOOL_EXPORT(CUresult, cuLaunchKernel_ptsz,
              (CUfunction a0, unsigned int a1, unsigned int a2, unsigned int a3, unsigned int a4, unsigned int a5,
               unsigned int a6, unsigned int a7, CUstream a8, void **a9, void **a10),
              a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10)
CUPOOL_EXPORT(CUresult, cuLaunchKernelEx,
              (const CUlaunchConfig* a0, CUfunction a1, void **a2, void **a3), a0, a1, a2, a3)
CUPOOL_EXPORT(CUresult, cuLaunchKernelEx_ptsz,
              (const CUlaunchConfig* a0, CUfunction a1, void **a2, void **a3), a0, a1, a2, a3)
CUPOOL_EXPORT(CUresult, cuLaunchCooperativeKernel,
              (CUfunction a0, unsigned int a1, unsigned int a2, unsigned int a3, unsigned int a4, unsigned int a5,
               unsigned int a6, unsigned int a7, CUstream a8, void **a9), a0, a1, a2, a3, a4, a5, a6, a7, a8, a9)
CUPOOL_EXPORT(CUresult, cuLaunchCooperativeKernel_ptsz,
              (CUfunction a0, unsigned int a1, unsigned int a2, unsigned int a3, unsigned int a4, unsigned int a5,
               unsigned int a6, unsigned int a7, CUstream a8, void **a9), a0, a1, a2, a3, a4, a5, a6, a7, a8, a9)
CUPOOL_EXPORT(CUresult, cuLaunchHostFunc, (CUstream a0, CUhostFn a1, void* a2), a0, a1, a2)
CUPOOL_EXPORT(CUresult, cuLaunchHostFunc_ptsz, (CUstream a0, CUhostFn a1, void* a2), a0, a1, a2)
CUPOOL_EXPORT(CUresult, cuMemcpyAsync, (CUdeviceptr a0, CUdeviceptr a1, size_t a2, CUstream a3), a0, a1, a2, a3)
CUPOOL_EXPORT(CUresult, cuMemcpyAsync_ptsz, (CUdeviceptr a0, CUdeviceptr a1, size_t a2, CUstream a3), a0, a1, a2, a3)
CUPOOL_EXPORT(CUresult, cuMemcpyHtoDAsync_v2, (CUdeviceptr a0, const void* a1, size_t a2, CUstream a3), a0, a1, a2, a3)
CUPOOL_EXPORT(CUresult, cuMemcpyHtoDAsync_v2_ptsz,
              (CUdeviceptr a0, const void* a1, size_t a2, CUstream a3), a0, a1, a2, a3)
CUPOOL_EXPORT(CUresult, cuMemcpyDtoHAsync_v2, (void* a0, CUdeviceptr a1, size_t a2, CUstream a3), a0, a1, a2, a3)
CUPOOL_EXPORT(CUresult, cuMemcpyDtoHAsync_v2_ptsz, (void* a0, CUdeviceptr a1, size_t a2, CUstream a3), a0, a1, a2, a3)
CUPOOL_EXPORT(CUresult, cuMemcpyDtoDAsync_v2, (CUdeviceptr a0, CUdeviceptr a1, size_t a2, CUstream a3), a0, a1, a2, a3)
CUPOOL_EXPORT(CUresult, cuMemcpyDtoDAsync_v2_ptsz,
              (CUdeviceptr a0, CUdeviceptr a1, size_t a2, CUstream a3), a0, a1, a2, a3)
CUPOOL_EXPORT(CUresult, cuMemcpy2DAsync_v2, (const CUDA_MEMCPY2D* a0, CUstream a1), a0, a1)
CUPOOL_EXPORT(CUresult, cuMemcpy2DAsync_v2_ptsz, (const CUDA_MEMCPY2D* a0, CUstream a1), a0, a1)
CUPOOL_EXPORT(CUresult, cuMemcpy3DAsync_v2, (const CUDA_MEMCPY3D* a0, CUstream a1), a0, a1)
CUPOOL_EXPORT(CUresult, cuMemcpy3DAsync_v2_ptsz, (const CUDA_MEMCPY3D* a0, CUstream a1), a0, a1)
CUPOOL_EXPORT(CUresult, cuMemcpyPeerAsync,
              (CUdeviceptr a0, CUcontext a1, CUdeviceptr a2, CUcontext a3, size_t a4, CUstream a5),
              a0, a1, a2, a3, a4, a5)
CUPOOL_EXPORT(CUresult, cuMemcpyPeerAsync_ptsz,
              (CUdeviceptr a0, CUcontext a1, CUdeviceptr a2, CUcontext a3, size_t a4, CUstream a5),
              a0, a1, a2, a3, a4, a5)
CUPOOL_EXPORT(CUresult, cuMemsetD8Async, (CUdeviceptr a0, unsigned char a1, size_t a2, CUstream a3), a0, a1, a2, a3)
CUPOOL_EXPORT(CUresult, cuMemsetD8Async_ptsz,
              (CUdeviceptr a0, unsigned char a1, size_t a2, CUstream a3), a0, a1, a2, a3)
CUPOOL_EXPORT(CUresult, cuMemsetD16Async, (CUdeviceptr a0, unsigned short a1, size_t a2, CUstream a3), a0, a1, a2, a3)
CUPOOL_EXPORT(CUresult, cuMemsetD16Async_ptsz,
              (CUdeviceptr a0, unsigned short a1, size_t a2, CUstream a3), a0, a1, a2, a3)
CUPOOL_EXPORT(CUresult, cuMemsetD32Async, (CUdeviceptr a0, unsigned int a1, size_t a2, CUstream a3), a0, a1, a2, a3)
CUPOOL_EXPORT(CUresult, cuMemsetD32Async_ptsz,
              (CUdeviceptr a0, unsigned int a1, size_t a2, CUstream a3), a0, a1, a2, a3)
CUPOOL_EXPORT(CUresult, cuMemsetD2D8Async,
              (CUdeviceptr a0, size_t a1, unsigned char a2, size_t a3, size_t a4, CUstream a5), a0, a1, a2, a3, a4, a5)
CUPOOL_EXPORT(CUresult, cuMemsetD2D8Async_ptsz,
              (CUdeviceptr a0, size_t a1, unsigned char a2, size_t a3, size_t a4, CUstream a5), a0, a1, a2, a3, a4, a5)
CUPOOL_EXPORT(CUresult, cuMemsetD2D16Async,
              (CUdeviceptr a0, size_t a1, unsigned short a2, size_t a3, size_t a4, CUstream a5), a0, a1, a2, a3, a4, a5)
CUPOOL_EXPORT(CUresult, cuMemsetD2D16Async_ptsz,
              (CUdeviceptr a0, size_t a1, unsigned short a2, size_t a3, size_t a4, CUstream a5), a0, a1, a2, a3, a4, a5)
CUPOOL_EXPORT(CUresult, cuMemsetD2D32Async,
              (CUdeviceptr a0, size_t a1, unsigned int a2, size_t a3, size_t a4, CUstream a5), a0, a1, a2, a3, a4, a5)
CUPOOL_EXPORT(CUresult, cuMemsetD2D32Async_ptsz,
              (CUdeviceptr a0, size_t a1, unsigned int a2, size_t a3, size_t a4, CUstream a5), a0, a1, a2, a3, a4, a5)
CUPOOL_EXPORT(CUresult, cuMemcpy_ptds, (CUdeviceptr a0, CUdeviceptr a1, size_t a2), a0, a1, a2)
CUPOOL_EXPORT(CUresult, cuMemcpyHtoD_v2_ptds, (CUdeviceptr a0, const void* a1, size_t a2), a0, a1, a2)
CUPOOL_EXPORT(CUresult, cuMemcpyDtoH_v2_ptds, (void* a0, CUdeviceptr a1, size_t a2), a0, a1, a2)
CUPOOL_EXPORT(CUresult, cuMemcpyDtoD_v2_ptds, (CUdeviceptr a0, CUdeviceptr a1, size_t a2), a0, a1, a2)
CUPOOL_EXPORT(CUresult, cuMemcpy2D_v2_ptds, (const CUDA_MEMCPY2D* a0), a0)
CUPOOL_EXPORT(CUresult, cuMemcpy2DUnaligned_v2_ptds, (const CUDA_MEMCPY2D* a0), a0)
CUPOOL_EXPORT(CUresult, cuMemcpy3D_v2_ptds, (const CUDA_MEMCPY3D* a0), a0)
CUPOOL_EXPORT(CUresult, cuMemcpyPeer_ptds,
              (CUdeviceptr a0, CUcontext a1, CUdeviceptr a2, CUcontext a3, size_t a4), a0, a1, a2, a3, a4)
CUPOOL_EXPORT(CUresult, cuMemsetD8_v2_ptds, (CUdeviceptr a0, unsigned char a1, size_t a2), a0, a1, a2)
CUPOOL_EXPORT(CUresult, cuMemsetD16_v2_ptds, (CUdeviceptr a0, unsigned short a1, size_t a2), a0, a1, a2)
CUPOOL_EXPORT(CUresult, cuMemsetD32_v2_ptds, (CUdeviceptr a0, unsigned int a1, size_t a2), a0, a1, a2)
CUPOOL_EXPORT(CUresult, cuMemsetD2D8_v2_ptds,
              (CUdeviceptr a0, size_t a1, unsigned char a2, size_t a3, size_t a4), a0, a1, a2, a3, a4)
CUPOOL_EXPORT(CUresult, cuMemsetD2D16_v2_ptds,
              (CUdeviceptr a0, size_t a1, unsigned short a2, size_t a3, size_t a4), a0, a1, a2, a3, a4)
CUPOOL_EXPORT(CUresult, cuMemsetD2D32_v2_ptds,
              (CUdeviceptr a0, size_t a1, unsigned int a2, size_t a3, size_t a4), a0, a1, a2, a3, a4)
CUPOOL_EXPORT(CUresult, cuGetProcAddress, (const char* s, void** p, int v, cuuint64_t f), s, p, v, f)
CUPOOL_EXPORT(CUresult, cuGetProcAddress_v2,
              (const char* s, void** p, int v, cuuint64_t f, CUdriverProcAddressQueryResult* st), s, p, v, f, st)
// NVML.
CUPOOL_EXPORT(nvmlReturn_t, nvmlDeviceGetMemoryInfo, (nvmlDevice_t d, nvmlMemory_t* m), d, m)
CUPOOL_EXPORT(nvmlReturn_t, nvmlDeviceGetMemoryInfo_v2, (nvmlDevice_t d, nvmlMemory_v2_t* m), d, m)
