// CUDA IPC of pool blocks. The driver shares whole allocations, so a handle to a block carved
// from the middle of a pool chunk would open, in another process, at the chunk's start: cupool
// must refuse it (cudaErrorNotSupported) rather than share the wrong memory. A block that starts
// its chunk, and everything under passthrough or without cupool, is shared normally.
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>

#include "prog_common.hpp"

int main() {
    const char* policy = std::getenv("CUPOOL_POLICY");
    const bool preloaded = std::getenv("LD_PRELOAD") && std::strstr(std::getenv("LD_PRELOAD"), "cupool");
    const bool pooled = preloaded && !(policy && std::strcmp(policy, "passthrough") == 0);
    long long allocs = 0, frees = 0, bytes = 0;
    void *a = nullptr, *b = nullptr;
    RT(cudaMalloc(&a, 1 << 20));
    RT(cudaMalloc(&b, 1 << 20));
    allocs += 2;
    bytes += 2 << 20;
    cudaIpcMemHandle_t ha, hb;
    const cudaError_t ra = cudaIpcGetMemHandle(&ha, a);
    const cudaError_t rb = cudaIpcGetMemHandle(&hb, b);
    // The first block starts the pool's first chunk (growth) or its one region (preallocate).
    EXPECT(ra == cudaSuccess);
    EXPECT(pooled ? rb == cudaErrorNotSupported : rb == cudaSuccess);
    if (rb != cudaSuccess) cudaGetLastError();
    RT(cudaFree(a));
    RT(cudaFree(b));
    frees += 2;
    return prog::finish(prog::Json().num("allocs", allocs).num("frees", frees).num("bytes", bytes)
                            .boolean("interior_block_refused", rb == cudaErrorNotSupported));
}
