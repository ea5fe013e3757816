// A "kernel" (host function on a NON-blocking stream) still reads buffer p ~100 ms after launch, while
// the host does cudaFree(p), cudaMalloc(&q) of the same size and fills q with another pattern. Real
// programs rely on cudaFree waiting for outstanding device work; a shim that hands p's memory back
// as q before the kernel finished would let the kernel see the new pattern. Exit 0 only if the
// kernel saw the original data. With PROG_EXPECT_REUSE set (a cap that leaves room for one buffer
// only), q must also be p: the test then proves the wait, not just that the pool had other room.
#include <cuda_runtime_api.h>

#include <cstdlib>

#include "prog_common.hpp"
#include "slow_reader.hpp"

namespace {
constexpr size_t kBytes = prog::kSlowReadBytes;
}  // namespace

int main() {
    long long allocs = 0, frees = 0, bytes = 0;
    cudaStream_t s = nullptr;
    RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    void* p = nullptr;
    RT(cudaMalloc(&p, kBytes));
    if (!p) return prog::finish(prog::Json());
    ++allocs;
    bytes += kBytes;
    RT(cudaMemset(p, prog::kOriginalByte, kBytes));
    prog::SlowRead args;
    args.p = static_cast<const unsigned char*>(p);
    RT(cudaLaunchHostFunc(s, prog::slow_read, &args));
    RT(cudaFree(p));  // must not return before the kernel is done with p
    ++frees;
    void* q = nullptr;
    RT(cudaMalloc(&q, kBytes));
    if (q) {
        ++allocs;
        bytes += kBytes;
        RT(cudaMemset(q, 0x5a, kBytes));
    }
    RT(cudaStreamSynchronize(s));
    bool saw = args.saw_original == 1;
    EXPECT(saw);
    if (std::getenv("PROG_EXPECT_REUSE") != nullptr) EXPECT(q == p);
    if (q) {
        RT(cudaFree(q));
        ++frees;
    }
    RT(cudaStreamDestroy(s));
    return prog::finish(prog::Json()
                            .num("allocs", allocs)
                            .num("frees", frees)
                            .num("bytes", bytes)
                            .boolean("kernel_saw_original", saw));
}
