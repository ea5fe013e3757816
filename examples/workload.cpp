// An allocation pattern like a training loop with varying shapes: weights that live for the
// whole run, activations whose sizes follow a varying sequence length, freed each step, and a
// few large temporary buffers. Plain CUDA runtime calls, so it builds with nvcc for a real GPU
// and with g++ against the project's simulated CUDA. It checks its data and prints its own
// counts on the last line, so a trace can be compared with what the program really did.
//
//   workload [steps] [scale_mib]
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

long g_allocs = 0, g_frees = 0;
unsigned long long g_bytes = 0;

void* device_alloc(std::size_t bytes) {
  void* p = nullptr;
  cudaError_t rc = cudaMalloc(&p, bytes);
  if (rc != cudaSuccess) {
    std::fprintf(stderr, "workload: cudaMalloc(%zu) failed: %s\n", bytes, cudaGetErrorString(rc));
    std::exit(1);
  }
  ++g_allocs;
  g_bytes += bytes;
  return p;
}

void device_free(void* p) {
  if (cudaFree(p) != cudaSuccess) {
    std::fprintf(stderr, "workload: cudaFree failed\n");
    std::exit(1);
  }
  ++g_frees;
}

// Fills with a pattern and reads back a sample: the memory handed out must be usable.
bool check_usable(void* p, std::size_t bytes, unsigned char value) {
  if (cudaMemset(p, value, bytes) != cudaSuccess) return false;
  unsigned char probe[64];
  const std::size_t n = bytes < sizeof probe ? bytes : sizeof probe;
  if (cudaMemcpy(probe, static_cast<char*>(p) + (bytes - n), n, cudaMemcpyDeviceToHost) != cudaSuccess) return false;
  for (std::size_t i = 0; i < n; ++i)
    if (probe[i] != value) return false;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 200;
  const std::size_t scale = (argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 4) << 20;
  std::uint64_t rng = 42;
  auto next = [&] {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return rng >> 33;
  };

  std::vector<void*> weights;
  for (int layer = 0; layer < 8; ++layer) weights.push_back(device_alloc(scale * 2 + 4096 * layer));

  bool ok = true;
  for (int step = 0; step < steps; ++step) {
    // Sequence length varies from 1/16 to the full scale, like batches of varying length.
    const std::size_t seq = 1 + next() % 16;
    std::vector<void*> activations;
    for (int layer = 0; layer < 8; ++layer) activations.push_back(device_alloc(scale * seq / 16 + 256 * (next() % 64)));
    if (step % 10 == 0) {
      void* workspace = device_alloc(scale * 8);
      ok = ok && check_usable(workspace, scale * 8, static_cast<unsigned char>(step));
      device_free(workspace);
    }
    ok = ok && check_usable(activations.back(), 4096, 0x5a);
    for (auto it = activations.rbegin(); it != activations.rend(); ++it) device_free(*it);
  }
  for (void* w : weights) device_free(w);

  std::size_t free_bytes = 0, total_bytes = 0;
  cudaMemGetInfo(&free_bytes, &total_bytes);
  std::fprintf(stderr, "workload: %d steps, memory info: %zu free of %zu\n", steps, free_bytes, total_bytes);
  std::printf("{\"allocs\": %ld, \"frees\": %ld, \"bytes\": %llu, \"data_ok\": %s}\n", g_allocs, g_frees, g_bytes,
              ok ? "true" : "false");
  return ok ? 0 : 1;
}
