// A "kernel" (host function) on a stream reads buffer p ~100 ms after launch; the program
// destroys that stream at once (legal: queued work still runs), frees p, allocates the same size
// again and overwrites it from another stream. The kernel must still see its data, as it does
// with the driver's own cudaFree, which waits for all work, the destroyed stream's included.
// Rounds alternate a non-blocking stream (whose work the legacy stream does not wait for) and a
// blocking one. With PROG_EXPECT_REUSE set (a cap with room for one buffer), the new buffer must
// be p: the run then shows the wait, not just that the pool had other room.
#include <cuda_runtime_api.h>

#include <cstdlib>

#include "prog_common.hpp"
#include "slow_reader.hpp"

namespace {
constexpr size_t kBytes = prog::kSlowReadBytes;
constexpr int kRounds = 4;
}  // namespace

int main() {
    long long allocs = 0, frees = 0, bytes = 0, corrupt = 0, reused = 0;
    cudaStream_t writer = nullptr;
    RT(cudaStreamCreateWithFlags(&writer, cudaStreamNonBlocking));
    for (int round = 0; round < kRounds; ++round) {
        const bool non_blocking = round % 2 == 0;
        cudaStream_t s = nullptr;
        RT(cudaStreamCreateWithFlags(&s, non_blocking ? cudaStreamNonBlocking : cudaStreamDefault));
        void* p = nullptr;
        RT(cudaMalloc(&p, kBytes));
        if (!p) break;
        ++allocs;
        bytes += kBytes;
        RT(cudaMemset(p, prog::kOriginalByte, kBytes));
        prog::SlowRead args;
        args.p = static_cast<const unsigned char*>(p);
        RT(cudaLaunchHostFunc(s, prog::slow_read, &args));
        RT(cudaStreamDestroy(s));  // the read is still queued
        RT(cudaFree(p));
        ++frees;
        void* q = nullptr;
        RT(cudaMalloc(&q, kBytes));
        if (q) {
            ++allocs;
            bytes += kBytes;
            reused += q == p;
            RT(cudaMemsetAsync(q, 0x5a, kBytes, writer));
            RT(cudaStreamSynchronize(writer));
        }
        RT(cudaDeviceSynchronize());  // the destroyed stream's read is done
        corrupt += args.saw_original != 1;
        if (q) {
            RT(cudaFree(q));
            ++frees;
        }
    }
    EXPECT(corrupt == 0);
    if (std::getenv("PROG_EXPECT_REUSE") != nullptr) EXPECT(reused == kRounds);
    RT(cudaStreamDestroy(writer));
    return prog::finish(prog::Json()
                            .num("allocs", allocs)
                            .num("frees", frees)
                            .num("bytes", bytes)
                            .num("rounds", kRounds)
                            .num("kernel_saw_overwrite", corrupt)
                            .num("reused_same_address", reused));
}
