// Per-thread default streams (built with CUDA_API_PER_THREAD_DEFAULT_STREAM, as nvcc's
// --default-stream per-thread does): thread A's "kernel" (a host function on A's per-thread
// stream) reads buffer p ~100 ms after launch, and A frees p at once; then thread B allocates
// the same size and overwrites it on B's own per-thread stream, which does not wait for A's.
// Without cupool the free waits for A's work. The program creates no stream: nothing but the
// work itself shows that two streams run side by side. With PROG_EXPECT_REUSE set (a cap with
// room for one buffer), B's buffer must be p.
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <thread>

#include "prog_common.hpp"
#include "slow_reader.hpp"

namespace {
constexpr size_t kBytes = prog::kSlowReadBytes;
constexpr int kRounds = 4;
}  // namespace

int main() {
    long long allocs = 0, frees = 0, bytes = 0, corrupt = 0, reused = 0;
    for (int round = 0; round < kRounds; ++round) {
        void* p = nullptr;
        void* q = nullptr;
        prog::SlowRead args;
        std::thread a([&] {
            RT(cudaMalloc(&p, kBytes));
            if (!p) return;
            RT(cudaMemset(p, prog::kOriginalByte, kBytes));  // on A's per-thread stream
            args.p = static_cast<const unsigned char*>(p);
            RT(cudaLaunchHostFunc(0, prog::slow_read, &args));
            RT(cudaFree(p));
        });
        a.join();
        if (!p) break;
        allocs += 1;
        frees += 1;
        bytes += kBytes;
        std::thread b([&] {
            RT(cudaMalloc(&q, kBytes));
            if (!q) return;
            RT(cudaMemset(q, 0x5a, kBytes));  // on B's per-thread stream
            RT(cudaStreamSynchronize(0));
        });
        b.join();
        RT(cudaDeviceSynchronize());
        corrupt += args.saw_original != 1;
        if (q) {
            ++allocs;
            bytes += kBytes;
            reused += q == p;
            RT(cudaFree(q));
            ++frees;
        }
    }
    EXPECT(corrupt == 0);
    if (std::getenv("PROG_EXPECT_REUSE") != nullptr) EXPECT(reused == kRounds);
    return prog::finish(prog::Json()
                            .num("allocs", allocs)
                            .num("frees", frees)
                            .num("bytes", bytes)
                            .num("rounds", kRounds)
                            .num("kernel_saw_overwrite", corrupt)
                            .num("reused_same_address", reused));
}
