// device_malloc: the device-side heap (malloc/free called by kernels), which the driver sets
// aside itself and no host allocation call serves.
// cudaDeviceSetLimit(cudaLimitMallocHeapSize, 256 MiB) before any kernel, read back with
// cudaDeviceGetLimit (printed). Then:
//   1. 64 blocks x 128 threads: each thread mallocs 8..68 ints, writes and reads them back, frees;
//      thread 0 of each block mallocs an array the whole block fills through shared memory.
//   2. Blocks malloc 64 KiB each in one kernel and keep the pointers in a cudaMalloc'd table;
//      a second kernel checks the contents and frees them (the heap outlives a kernel).
// Counts failed mallocs and wrong words on the device (all must be 0).
#include "common.h"

namespace {

constexpr int kBlocks = 64, kThreads = 128;

// stats[0]: failed mallocs, stats[1]: wrong words
__global__ void k_thread_heap(unsigned long long* stats) {
  const int gtid = blockIdx.x * blockDim.x + threadIdx.x;
  const int n = 8 + gtid % 61;
  int* p = static_cast<int*>(malloc(n * sizeof(int)));
  if (!p) {
    atomicAdd(&stats[0], 1ull);
  } else {
    for (int j = 0; j < n; ++j) p[j] = gtid * 131 + j;
    unsigned long long bad = 0;
    for (int j = 0; j < n; ++j) bad += p[j] != gtid * 131 + j;
    if (bad) atomicAdd(&stats[1], bad);
    free(p);
  }
  __shared__ int* shared_block;
  if (threadIdx.x == 0) {
    shared_block = static_cast<int*>(malloc(blockDim.x * sizeof(int)));
    if (!shared_block) atomicAdd(&stats[0], 1ull);
  }
  __syncthreads();
  if (shared_block) shared_block[threadIdx.x] = blockIdx.x * 1000 + threadIdx.x;
  __syncthreads();
  if (threadIdx.x == 0 && shared_block) {
    unsigned long long bad = 0;
    for (unsigned j = 0; j < blockDim.x; ++j) bad += shared_block[j] != static_cast<int>(blockIdx.x * 1000 + j);
    if (bad) atomicAdd(&stats[1], bad);
    free(shared_block);
  }
}

constexpr int kKeepInts = 16384;  // 64 KiB per block

__global__ void k_keep(int** table, unsigned long long* stats) {
  __shared__ int* block_mem;
  if (threadIdx.x == 0) {
    block_mem = static_cast<int*>(malloc(kKeepInts * sizeof(int)));
    table[blockIdx.x] = block_mem;
    if (!block_mem) atomicAdd(&stats[0], 1ull);
  }
  __syncthreads();
  if (block_mem)
    for (int j = threadIdx.x; j < kKeepInts; j += blockDim.x) block_mem[j] = blockIdx.x * 7 + j;
}

__global__ void k_check_and_free(int** table, unsigned long long* stats) {
  int* mem = table[blockIdx.x];
  if (!mem) return;
  unsigned long long bad = 0;
  for (int j = threadIdx.x; j < kKeepInts; j += blockDim.x) bad += mem[j] != static_cast<int>(blockIdx.x * 7 + j);
  if (bad) atomicAdd(&stats[1], bad);
  __syncthreads();
  if (threadIdx.x == 0) free(mem);
}

}  // namespace

int main() {
  compat::Verdict verdict("device_malloc");
  CK(cudaSetDevice(0));
  const size_t heap = size_t{256} << 20;
  CK(cudaDeviceSetLimit(cudaLimitMallocHeapSize, heap));
  size_t got = 0;
  CK(cudaDeviceGetLimit(&got, cudaLimitMallocHeapSize));
  std::printf("malloc_heap_size set=%zu read_back=%zu\n", heap, got);
  unsigned long long* stats = nullptr;
  CK(cudaMalloc(&stats, 2 * sizeof(unsigned long long)));
  CK(cudaMemset(stats, 0, 2 * sizeof(unsigned long long)));
  int** table = nullptr;
  CK(cudaMalloc(&table, kBlocks * sizeof(int*)));
  unsigned long long h[2] = {0, 0};
  for (int round = 0; round < 3; ++round) {
    k_thread_heap<<<kBlocks, kThreads>>>(stats);
    CK_LAUNCH();
    k_keep<<<kBlocks, kThreads>>>(table, stats);
    CK_LAUNCH();
    CK(cudaDeviceSynchronize());
    // An ordinary allocation between the kernels: it must not disturb the heap's blocks.
    void* between = nullptr;
    CK(cudaMalloc(&between, size_t{64} << 20));
    CK(cudaMemset(between, 0xAB, size_t{64} << 20));
    k_check_and_free<<<kBlocks, kThreads>>>(table, stats);
    CK_LAUNCH();
    CK(cudaDeviceSynchronize());
    CK(cudaFree(between));
    CK(cudaMemcpy(h, stats, sizeof h, cudaMemcpyDeviceToHost));
    std::printf("round=%d failed_mallocs=%llu wrong_words=%llu\n", round, h[0], h[1]);
  }
  CK(cudaFree(table));
  CK(cudaFree(stats));
  verdict.add("heap_limit", static_cast<long long>(got));
  verdict.add("failed_mallocs", static_cast<long long>(h[0]));
  verdict.add("wrong_words", static_cast<long long>(h[1]));
  return verdict.finish(h[0] == 0 && h[1] == 0 && got >= heap);
}
