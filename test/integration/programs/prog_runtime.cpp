// Runtime API through the shared libcudart.so.13: cudaMalloc/cudaFree of many sizes, cudaMallocPitch,
// cudaMallocManaged, cudaMallocAsync/cudaFreeAsync on a stream, cudaMemGetInfo, cudaFree(NULL), and a
// failing cudaMalloc followed by cudaGetLastError() == cudaErrorMemoryAllocation.
#include <cuda_runtime_api.h>

#include <cstring>
#include <vector>

#include "prog_common.hpp"

int main() {
    long long allocs = 0, frees = 0, bytes = 0;
    RT(cudaFree(nullptr));  // initializes the context only
    size_t free0 = 0, total = 0;
    RT(cudaMemGetInfo(&free0, &total));
    EXPECT(total > 0 && free0 <= total);

    const size_t sizes[] = {256, 1000, 4096, 65536, 1u << 20, (3u << 20) + 17, 16u << 20, 64u << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
        size_t n = sizes[i];
        void* p = nullptr;
        RT(cudaMalloc(&p, n));
        if (p == nullptr) continue;
        ++allocs;
        bytes += static_cast<long long>(n);
        std::vector<unsigned char> h(n), back(n);
        for (size_t k = 0; k < n; ++k) h[k] = static_cast<unsigned char>(k * 31 + i);
        RT(cudaMemcpy(p, h.data(), n, cudaMemcpyHostToDevice));
        RT(cudaMemcpy(back.data(), p, n, cudaMemcpyDeviceToHost));
        EXPECT(h == back);
        RT(cudaMemset(p, 0x3c, n));
        RT(cudaMemcpy(back.data(), p, n, cudaMemcpyDeviceToHost));
        EXPECT(back[0] == 0x3c && back[n - 1] == 0x3c);
        RT(cudaFree(p));
        ++frees;
    }

    // pitched
    void* pp = nullptr;
    size_t pitch = 0;
    RT(cudaMallocPitch(&pp, &pitch, 1000, 10));
    if (pp) {
        ++allocs;
        bytes += 1000 * 10;
        EXPECT(pitch >= 1000);
        RT(cudaMemset(pp, 7, pitch * 10));
        std::vector<unsigned char> b(pitch * 10);
        RT(cudaMemcpy(b.data(), pp, b.size(), cudaMemcpyDeviceToHost));
        EXPECT(b[pitch * 10 - 1] == 7);
        RT(cudaFree(pp));
        ++frees;
    }

    // managed: host-accessible by definition
    void* mp = nullptr;
    RT(cudaMallocManaged(&mp, 1 << 20, cudaMemAttachGlobal));
    if (mp) {
        ++allocs;
        bytes += 1 << 20;
        std::memset(mp, 0x11, 1 << 20);
        RT(cudaDeviceSynchronize());
        EXPECT(static_cast<unsigned char*>(mp)[12345] == 0x11);
        RT(cudaFree(mp));
        ++frees;
    }

    // stream-ordered
    cudaStream_t s = nullptr;
    RT(cudaStreamCreate(&s));
    void* ap = nullptr;
    RT(cudaMallocAsync(&ap, 1 << 20, s));
    if (ap) {
        ++allocs;
        bytes += 1 << 20;
        std::vector<unsigned char> h(1 << 20, 0x77), back(1 << 20);
        RT(cudaMemsetAsync(ap, 0x42, 1 << 20, s));
        RT(cudaMemcpyAsync(ap, h.data(), 4096, cudaMemcpyHostToDevice, s));
        RT(cudaMemcpyAsync(back.data(), ap, 1 << 20, cudaMemcpyDeviceToHost, s));
        RT(cudaStreamSynchronize(s));
        EXPECT(back[0] == 0x77 && back[4095] == 0x77 && back[4096] == 0x42 && back[(1 << 20) - 1] == 0x42);
        RT(cudaFreeAsync(ap, s));
        ++frees;
        RT(cudaStreamSynchronize(s));
    }
    RT(cudaStreamDestroy(s));

    // a failing allocation sets the last error
    void* big = nullptr;
    cudaError_t e = cudaMalloc(&big, total * 2);
    EXPECT(e == cudaErrorMemoryAllocation);
    EXPECT(cudaPeekAtLastError() == cudaErrorMemoryAllocation);
    EXPECT(cudaGetLastError() == cudaErrorMemoryAllocation);
    EXPECT(cudaGetLastError() == cudaSuccess);

    return prog::finish(prog::Json()
                            .num("allocs", allocs)
                            .num("frees", frees)
                            .num("bytes", bytes)
                            .num("failed_allocs", e == cudaErrorMemoryAllocation ? 1 : 0));
}
