// Safe reuse after free, on a real GPU: a slow kernel on a non-blocking stream reads buffer p;
// meanwhile the host frees p, allocates the same size again (maybe getting p back) and
// overwrites the new buffer on the legacy stream. The kernel must see the original data, as it
// does with the driver's own cudaFree (which waits for all device work).
#include <cuda_runtime.h>

#include <cstdio>

__global__ void fill(int* p, size_t n, int value) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = value;
}

__global__ void slow_check(const int* p, size_t n, int expect, unsigned long long spin_ns, int* bad) {
  unsigned long long start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  for (;;) {
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start > spin_ns) break;
  }
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    if (p[i] != expect) atomicAdd(bad, 1);
}

#define CHECK(x)                                                                 \
  do {                                                                           \
    cudaError_t e = (x);                                                         \
    if (e != cudaSuccess) {                                                      \
      std::printf("FAIL %s: %s\n", #x, cudaGetErrorString(e));                  \
      return 1;                                                                  \
    }                                                                            \
  } while (0)

int main() {
  const size_t n = 64 << 20;  // 256 MiB of ints
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int *p = nullptr, *q = nullptr, *bad = nullptr;
  CHECK(cudaMalloc(&bad, sizeof(int)));
  CHECK(cudaMemset(bad, 0, sizeof(int)));
  int reused = 0, failures = 0;
  for (int round = 0; round < 5; ++round) {
    CHECK(cudaMalloc(&p, n * sizeof(int)));
    fill<<<1024, 256, 0, s>>>(p, n, 7);
    slow_check<<<1024, 256, 0, s>>>(p, n, 7, 100'000'000ull, bad);  // 100 ms, then read p
    CHECK(cudaFree(p));
    CHECK(cudaMalloc(&q, n * sizeof(int)));
    reused += q == p;
    CHECK(cudaMemsetAsync(q, 0xff, n * sizeof(int), 0));  // legacy stream: does not wait for s
    fill<<<1024, 256>>>(q, n, 9);
    CHECK(cudaDeviceSynchronize());
    int h_bad = 0;
    CHECK(cudaMemcpy(&h_bad, bad, sizeof(int), cudaMemcpyDeviceToHost));
    failures += h_bad != 0;
    CHECK(cudaMemset(bad, 0, sizeof(int)));
    CHECK(cudaFree(q));
  }
  CHECK(cudaFree(bad));
  CHECK(cudaStreamDestroy(s));
  std::printf("{\"check\": \"inflight\", \"rounds\": 5, \"reused_same_address\": %d, \"kernel_saw_overwrite\": %d}\n",
              reused, failures);
  return failures ? 1 : 0;
}
