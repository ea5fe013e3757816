// A "kernel" (host function on a NON-blocking stream) still reads buffer p ~100 ms after launch, while
// the host does cudaFree(p), cudaMalloc(&q) of the same size and fills q with another pattern. Real
// programs rely on cudaFree waiting for outstanding device work; a shim that hands p's memory back
// as q before the kernel finished would let the kernel see the new pattern. Exit 0 only if the
// kernel saw the original data.
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "prog_common.hpp"

namespace {
constexpr size_t kBytes = 4 << 20;
struct KernelArgs {
    const unsigned char* p;
    std::atomic<int> saw_original{-1};
};
void CUDART_CB kernel(void* u) {
    auto* a = static_cast<KernelArgs*>(u);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    bool ok = true;
    for (size_t i = 0; i < kBytes; i += 64) ok &= a->p[i] == 0xa5;
    ok &= a->p[kBytes - 1] == 0xa5;
    a->saw_original = ok ? 1 : 0;
}
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
    RT(cudaMemset(p, 0xa5, kBytes));
    KernelArgs args;
    args.p = static_cast<const unsigned char*>(p);
    RT(cudaLaunchHostFunc(s, kernel, &args));
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
