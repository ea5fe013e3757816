// Driver API, linked directly against libcuda.so.1 (the header maps cuMemAlloc to cuMemAlloc_v2 ...):
// cuInit, primary context, cuMemAlloc/cuMemFree, cuMemAllocPitch, cuMemAllocManaged,
// cuMemAllocAsync/cuMemFreeAsync, cuMemGetInfo.
#include <cuda.h>

#include <cstring>
#include <vector>

#include "prog_common.hpp"

int main() {
    long long allocs = 0, frees = 0, bytes = 0;
    DRV(cuInit(0));
    CUdevice dev = 0;
    DRV(cuDeviceGet(&dev, 0));
    CUcontext ctx = nullptr;
    DRV(cuDevicePrimaryCtxRetain(&ctx, dev));
    DRV(cuCtxSetCurrent(ctx));
    size_t free0 = 0, total = 0;
    DRV(cuMemGetInfo(&free0, &total));
    EXPECT(total > 0 && free0 <= total);

    const size_t sizes[] = {256, 4096, 100000, 1u << 20, 8u << 20, 32u << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
        size_t n = sizes[i];
        CUdeviceptr p = 0;
        DRV(cuMemAlloc(&p, n));
        if (p == 0) continue;
        ++allocs;
        bytes += static_cast<long long>(n);
        std::vector<unsigned char> h(n), back(n);
        for (size_t k = 0; k < n; ++k) h[k] = static_cast<unsigned char>(k * 13 + i);
        DRV(cuMemcpyHtoD(p, h.data(), n));
        DRV(cuMemcpyDtoH(back.data(), p, n));
        EXPECT(h == back);
        DRV(cuMemFree(p));
        ++frees;
    }

    CUdeviceptr pp = 0;
    size_t pitch = 0;
    DRV(cuMemAllocPitch(&pp, &pitch, 3000, 20, 4));
    if (pp) {
        ++allocs;
        bytes += 3000 * 20;
        EXPECT(pitch >= 3000);
        DRV(cuMemsetD8(pp, 0x21, pitch * 20));
        unsigned char last = 0;
        DRV(cuMemcpyDtoH(&last, pp + pitch * 20 - 1, 1));
        EXPECT(last == 0x21);
        DRV(cuMemFree(pp));
        ++frees;
    }

    CUdeviceptr mp = 0;
    DRV(cuMemAllocManaged(&mp, 1 << 20, CU_MEM_ATTACH_GLOBAL));
    if (mp) {
        ++allocs;
        bytes += 1 << 20;
        std::memset(reinterpret_cast<void*>(mp), 0x5e, 1 << 20);
        DRV(cuCtxSynchronize());
        EXPECT(reinterpret_cast<unsigned char*>(mp)[777] == 0x5e);
        DRV(cuMemFree(mp));
        ++frees;
    }

    CUstream s = nullptr;
    DRV(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUdeviceptr ap = 0;
    DRV(cuMemAllocAsync(&ap, 2 << 20, s));
    if (ap) {
        ++allocs;
        bytes += 2 << 20;
        std::vector<unsigned char> back(2 << 20);
        DRV(cuMemsetD8Async(ap, 0x66, 2 << 20, s));
        DRV(cuMemcpyDtoHAsync(back.data(), ap, back.size(), s));
        DRV(cuMemFreeAsync(ap, s));
        ++frees;
        DRV(cuStreamSynchronize(s));
        EXPECT(back[0] == 0x66 && back[back.size() - 1] == 0x66);
    }
    DRV(cuStreamDestroy(s));

    CUdeviceptr big = 0;
    CUresult r = cuMemAlloc(&big, total * 2);
    EXPECT(r == CUDA_ERROR_OUT_OF_MEMORY);

    DRV(cuDevicePrimaryCtxRelease(dev));
    return prog::finish(prog::Json()
                            .num("allocs", allocs)
                            .num("frees", frees)
                            .num("bytes", bytes)
                            .num("failed_allocs", r == CUDA_ERROR_OUT_OF_MEMORY ? 1 : 0));
}
