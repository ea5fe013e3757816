// What the trace's per-event costs are made of on the host it runs on: one cuCtxGetCurrent (the
// runtime hooks' context lookup), one ordered TSC read (lfence + rdtsc: EventClock::stamp) and one
// bare rdtsc, each the mean of 20 million calls, three times. docs/design.md, "Where the pair's
// time goes", quotes it. Build: nvcc -O2 -cudart shared -o clock_probe clock_probe.cu -lcuda
#include <cuda.h>
#include <cuda_runtime.h>
#include <x86intrin.h>

#include <chrono>
#include <cstdio>

int main() {
  cudaFree(nullptr);
  CUcontext ctx = nullptr;
  constexpr long kCalls = 20'000'000;
  unsigned long long sink = 0;
  auto per_call = [](auto t0) {
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / kCalls;
  };
  for (int round = 0; round < 3; ++round) {
    auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < kCalls; ++i) cuCtxGetCurrent(&ctx);
    const double ctx_ns = per_call(t0);
    t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < kCalls; ++i) {
      _mm_lfence();
      sink += __rdtsc();
    }
    const double ordered_ns = per_call(t0);
    t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < kCalls; ++i) sink += __rdtsc();
    const double bare_ns = per_call(t0);
    std::printf("cuCtxGetCurrent %.1f ns, lfence+rdtsc %.1f ns, rdtsc %.1f ns (%llu)\n", ctx_ns, ordered_ns, bare_ns,
                sink & 1);
  }
  return ctx == nullptr;
}
