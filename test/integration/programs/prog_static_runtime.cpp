// The runtime linked statically into the executable (nvcc's default -cudart static): cudaMalloc and
// cudaFree are not dynamic symbols, so only the driver level (dlsym of cuGetProcAddress_v2 from
// libcuda.so.1 and the pointers it hands out) can be intercepted.
#include <cuda_runtime_api.h>

#include <vector>

#include "prog_common.hpp"

int main() {
    long long allocs = 0, frees = 0, bytes = 0;
    for (int i = 0; i < 100; ++i) {
        size_t n = (size_t(256) << (i % 14)) + static_cast<size_t>(i) * 256;
        void* p = nullptr;
        RT(cudaMalloc(&p, n));
        if (!p) continue;
        ++allocs;
        bytes += static_cast<long long>(n);
        RT(cudaMemset(p, i & 0xff, n));
        unsigned char first = 0, last = 0;
        RT(cudaMemcpy(&first, p, 1, cudaMemcpyDeviceToHost));
        RT(cudaMemcpy(&last, static_cast<char*>(p) + n - 1, 1, cudaMemcpyDeviceToHost));
        EXPECT(first == (i & 0xff) && last == (i & 0xff));
        RT(cudaFree(p));
        ++frees;
    }
    return prog::finish(prog::Json().num("allocs", allocs).num("frees", frees).num("bytes", bytes));
}
