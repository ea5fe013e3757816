// openmp_threads: 8 OpenMP threads, each 200 iterations of cudaMalloc (sizes from 1 KiB to
// 4 MiB, varying) / kernel / copy back / cudaFree, checking every result:
//   - even iterations on the thread's own non-blocking stream: the kernel and an asynchronous
//     copy into pinned memory are queued, and every other time the buffer is freed BEFORE the
//     stream is synchronised (legal: cudaFree waits for the copy), then the stream is
//     synchronised and the copy checked;
//   - odd iterations on the legacy default stream: kernel, cudaMemcpy, cudaFree.
// Prints the totals (exact) and, in a '#' line, how often a thread's cudaMalloc returned the
// address it had just freed.
#include <omp.h>

#include "common.h"

namespace {

constexpr int kThreads = 8;
constexpr int kIters = 200;
constexpr size_t kMaxWords = size_t{1} << 20;  // 4 MiB

__global__ void k_pattern(unsigned* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    p[i] = seed ^ static_cast<unsigned>(i * 2654435761u);
}

size_t words_for(int t, int it) {
  const size_t base = size_t{256} << ((t + it) % 13);  // 1 KiB .. 4 MiB
  const size_t w = base - ((static_cast<size_t>(it) * 37 + t * 11) % 200);
  return w < kMaxWords ? w : kMaxWords;
}

}  // namespace

int main() {
  compat::Verdict verdict("openmp_threads");
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));
  long long errors = 0, checked_words = 0, iterations = 0, same_address = 0, free_before_sync = 0;
  omp_set_dynamic(0);
#pragma omp parallel num_threads(kThreads) reduction(+ : errors, checked_words, iterations, same_address, free_before_sync)
  {
    const int t = omp_get_thread_num();
    CK(cudaSetDevice(0));
    cudaStream_t own;
    CK(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking));
    unsigned* host = nullptr;
    CK(cudaMallocHost(&host, kMaxWords * sizeof(unsigned)));
    void* last_freed = nullptr;
    for (int it = 0; it < kIters; ++it) {
      const size_t n = words_for(t, it);
      const unsigned seed = 0x9E3779B9u * static_cast<unsigned>(t * kIters + it + 1);
      unsigned* d = nullptr;
      CK(cudaMalloc(&d, n * sizeof(unsigned)));
      same_address += (d == last_freed);
      const unsigned blocks = static_cast<unsigned>((n + 255) / 256 < 1024 ? (n + 255) / 256 : 1024);
      if (it % 2 == 0) {
        k_pattern<<<blocks, 256, 0, own>>>(d, n, seed);
        CK_LAUNCH();
        CK(cudaMemcpyAsync(host, d, n * sizeof(unsigned), cudaMemcpyDeviceToHost, own));
        if (it % 4 == 0) {
          CK(cudaFree(d));  // the copy may still be queued: cudaFree must wait for it
          ++free_before_sync;
          CK(cudaStreamSynchronize(own));
        } else {
          CK(cudaStreamSynchronize(own));
          CK(cudaFree(d));
        }
      } else {
        k_pattern<<<blocks, 256>>>(d, n, seed);
        CK_LAUNCH();
        CK(cudaMemcpy(host, d, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
        CK(cudaFree(d));
      }
      last_freed = d;
      for (size_t i = 0; i < n; ++i) errors += host[i] != (seed ^ static_cast<unsigned>(i * 2654435761u));
      checked_words += static_cast<long long>(n);
      ++iterations;
    }
    CK(cudaFreeHost(host));
    CK(cudaStreamDestroy(own));
  }
  std::printf("threads=%d iterations=%lld checked_words=%lld freed_before_sync=%lld wrong_words=%lld\n", kThreads, iterations,
              checked_words, free_before_sync, errors);
  std::printf("# a thread's cudaMalloc returned the address it had just freed %lld times\n", same_address);
  if (errors) std::printf("ERROR: %lld words read back wrong\n", errors);
  verdict.add("iterations", iterations);
  verdict.add("wrong_words", errors);
  return verdict.finish(errors == 0 && iterations == kThreads * kIters);
}
