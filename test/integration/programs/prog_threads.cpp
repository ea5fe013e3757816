// 8 threads, each doing 1000 cudaMalloc/cudaFree pairs of varying size (every 50th buffer is written
// and read back); the counts must match.
#include <cuda_runtime_api.h>

#include <atomic>
#include <thread>
#include <vector>

#include "prog_common.hpp"

int main() {
    constexpr int kThreads = 8, kIters = 1000;
    std::atomic<long long> allocs{0}, frees{0}, bytes{0}, errors{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < kThreads; ++t) {
        ts.emplace_back([&, t] {
            for (int i = 0; i < kIters; ++i) {
                size_t n = (size_t(256) << ((i + t) % 13)) + static_cast<size_t>((i * 37 + t) % 1000);
                void* p = nullptr;
                if (cudaMalloc(&p, n) != cudaSuccess || p == nullptr) {
                    ++errors;
                    continue;
                }
                ++allocs;
                bytes += static_cast<long long>(n);
                if (i % 50 == 0) {
                    unsigned char v = static_cast<unsigned char>(t * 16 + i);
                    unsigned char back = 0;
                    if (cudaMemset(p, v, n) != cudaSuccess ||
                        cudaMemcpy(&back, static_cast<char*>(p) + n - 1, 1, cudaMemcpyDeviceToHost) != cudaSuccess ||
                        back != v)
                        ++errors;
                }
                if (cudaFree(p) != cudaSuccess) {
                    ++errors;
                    continue;
                }
                ++frees;
            }
        });
    }
    for (auto& th : ts) th.join();
    EXPECT(errors == 0);
    EXPECT(allocs == kThreads * kIters && frees == kThreads * kIters);
    return prog::finish(prog::Json()
                            .num("allocs", allocs)
                            .num("frees", frees)
                            .num("bytes", bytes)
                            .num("threads", kThreads));
}
