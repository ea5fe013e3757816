// Peer access to pool blocks (runs on the simulated CUDA with CUPOOL_SIM_DEVICES=2, and on two
// real GPUs: test/gpu/peer_check.cu does the same with kernels). Device 1 enables access to
// device 0's memory; a block device 0 allocated before, and one after, must then be reachable
// from device 1. cuMemAlloc memory is, by the enabling alone; cuMemCreate memory (the vmm
// policy's granules) only if cuMemSetAccess named device 1: cuMemGetAccess says which. Prints
// one JSON line: how many blocks were virtual-memory mappings (checked by cuMemGetAccess).
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdlib>

#include "prog_common.hpp"

namespace {
long long mappings = 0, reachable = 0;

// Reachable from device 1: cuMemAlloc memory is, once peer access is on; a mapping only if its
// access names device 1.
void expect_reachable_from_1(void* p, const char* what) {
    CUmemLocation loc{};
    loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
    loc.id = 1;
    unsigned long long flags = 0;
    if (cuMemGetAccess(&flags, &loc, reinterpret_cast<CUdeviceptr>(p)) != CUDA_SUCCESS) {
        ++reachable;  // not a mapping: cuMemAlloc memory
        return;
    }
    ++mappings;
    if (flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) prog::fail(__FILE__, __LINE__, what, static_cast<long long>(flags));
    else ++reachable;
}
}  // namespace

int main() {
    // The simulated CUDA has one device unless told otherwise (a real driver ignores this).
    setenv("CUPOOL_SIM_DEVICES", "2", 0);
    int n = 0;
    RT(cudaGetDeviceCount(&n));
    if (n < 2) {
        std::printf("{\"skipped\": true, \"devices\": %d}\n", n);
        return 0;
    }
    int can = 0;
    RT(cudaDeviceCanAccessPeer(&can, 1, 0));
    EXPECT(can == 1);
    RT(cudaSetDevice(0));
    void *before = nullptr, *after = nullptr, *small = nullptr;
    RT(cudaMalloc(&before, 8 << 20));
    RT(cudaMemset(before, 0x11, 8 << 20));
    RT(cudaSetDevice(1));
    RT(cudaDeviceEnablePeerAccess(0, 0));
    EXPECT(cudaDeviceEnablePeerAccess(0, 0) == cudaErrorPeerAccessAlreadyEnabled);
    cudaGetLastError();
    RT(cudaSetDevice(0));
    RT(cudaMalloc(&after, 24 << 20));  // granules mapped after the enabling
    RT(cudaMalloc(&small, 4096));
    expect_reachable_from_1(before, "a block allocated before peer access was enabled");
    expect_reachable_from_1(after, "a block allocated after");
    expect_reachable_from_1(small, "a small block");
    RT(cudaFree(before));
    RT(cudaFree(after));
    RT(cudaFree(small));
    return prog::finish(prog::Json().num("allocs", 3).num("frees", 3).num("bytes", (8 << 20) + (24 << 20) + 4096)
                            .num("mappings", mappings).num("reachable", reachable));
}
