// The CUDA declarations the shim compiles against: the toolkit's own headers (so every hook's
// signature is checked by the compiler), plus the ABI symbols those headers hide behind macros
// (the _ptsz per-thread-stream variants and the CUDA 11.3 four-argument cuGetProcAddress).
#pragma once

// We hook deprecated entry points too (cudaGetDriverEntryPoint): declare them without warnings.
#define CUDA_ENABLE_DEPRECATED 1
// The driver's own view of its header: every ABI variant declared under its real name (the
// legacy-stream names, the _ptsz/_ptds per-thread ones, the old versions), no name remapped.
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <cuda_runtime_api.h>

// cuda.h maps cuGetProcAddress to cuGetProcAddress_v2; the library exports both names.
#undef cuGetProcAddress

extern "C" {
CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags);
cudaError_t CUDARTAPI cudaMallocAsync_ptsz(void** devPtr, size_t size, cudaStream_t hStream);
cudaError_t CUDARTAPI cudaFreeAsync_ptsz(void* devPtr, cudaStream_t hStream);
cudaError_t CUDARTAPI cudaGetDriverEntryPoint_ptsz(const char* symbol, void** funcPtr,
                                                   unsigned long long flags,
                                                   cudaDriverEntryPointQueryResult* driverStatus);
cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion_ptsz(const char* symbol, void** funcPtr,
                                                            unsigned int cudaVersion, unsigned long long flags,
                                                            cudaDriverEntryPointQueryResult* driverStatus);
}
