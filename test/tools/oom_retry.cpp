// For test/tools/check_tools.py run: a program that retries a refused allocation, as one that
// waits for memory in a loop does, to see that cupool does not print a warning for every try.
//
//   oom_retry TRIES SIZE_MIB
//       asks cudaMalloc for SIZE_MIB MiB TRIES times (freeing any that succeed) and prints the
//       number refused.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: oom_retry TRIES SIZE_MIB\n");
    return 2;
  }
  const long tries = std::atol(argv[1]);
  const size_t size = static_cast<size_t>(std::atol(argv[2])) << 20;
  long refused = 0;
  for (long i = 0; i < tries; ++i) {
    void* p = nullptr;
    if (cudaMalloc(&p, size) != cudaSuccess) {
      ++refused;
      (void)cudaGetLastError();
      continue;
    }
    cudaFree(p);
  }
  std::printf("%ld\n", refused);
  return 0;
}
