// cooperative: a cooperative launch (cudaLaunchCooperativeKernel) whose blocks synchronise the
// whole grid with cooperative_groups' grid.sync() between the phases of a reduction:
//   1. each block sums its share of in[] into partial[block];   grid.sync()
//   2. block 0 sums the partials into total[0];                 grid.sync()
//   3. every thread writes out[i] = 3 * in[i] + total % 1009;   grid.sync()
//   4. each block sums its share of out[] into partial[block];  grid.sync()
//   5. block 0 sums them into total[1].
// Launched 3 times over buffers allocated anew each time; every result is an exact integer,
// independent of the grid size (which depends on the device and is printed in a '#' line).
#include <cooperative_groups.h>

#include "common.h"

namespace cg = cooperative_groups;

namespace {

constexpr int kThreads = 256;

__device__ long long block_sum(long long v) {
  __shared__ long long sh[kThreads];
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  long long r = sh[0];
  __syncthreads();
  return r;
}

__global__ void k_coop(const int* in, long long* out, long long* partial, long long* total, int n) {
  cg::grid_group grid = cg::this_grid();
  const unsigned long long stride = grid.size();
  long long acc = 0;
  for (unsigned long long i = grid.thread_rank(); i < static_cast<unsigned long long>(n); i += stride) acc += in[i];
  long long b = block_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = b;
  grid.sync();
  if (blockIdx.x == 0) {
    long long t = 0;
    for (unsigned j = threadIdx.x; j < gridDim.x; j += blockDim.x) t += partial[j];
    t = block_sum(t);
    if (threadIdx.x == 0) total[0] = t;
  }
  grid.sync();
  const long long add = total[0] % 1009;
  acc = 0;
  for (unsigned long long i = grid.thread_rank(); i < static_cast<unsigned long long>(n); i += stride) {
    out[i] = 3LL * in[i] + add;
  }
  grid.sync();
  for (unsigned long long i = grid.thread_rank(); i < static_cast<unsigned long long>(n); i += stride) acc += out[i];
  b = block_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = b;
  grid.sync();
  if (blockIdx.x == 0) {
    long long t = 0;
    for (unsigned j = threadIdx.x; j < gridDim.x; j += blockDim.x) t += partial[j];
    t = block_sum(t);
    if (threadIdx.x == 0) total[1] = t;
  }
}

}  // namespace

int main() {
  compat::Verdict verdict("cooperative");
  CK(cudaSetDevice(0));
  int coop = 0, sms = 0, per_sm = 0;
  CK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, 0));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_coop, kThreads, 0));
  std::printf("cooperative_launch_supported=%d\n", coop);
  if (!coop || per_sm < 1) compat::die("cooperative launch not possible (supported=%d, blocks per SM=%d)", coop, per_sm);
  const int blocks = sms * (per_sm < 2 ? per_sm : 2);
  std::printf("# grid=%d blocks x %d threads\n", blocks, kThreads);
  int failures = 0;
  for (int round = 0; round < 3; ++round) {
    const int n = (1 << 22) + round * 12345;
    std::vector<int> h(n);
    for (int i = 0; i < n; ++i) h[i] = (i * 31 + round * 7) % 65537 - 30000;
    int* in = nullptr;
    long long *out = nullptr, *partial = nullptr, *total = nullptr;
    CK(cudaMalloc(&in, n * sizeof(int)));
    CK(cudaMalloc(&out, n * sizeof(long long)));
    CK(cudaMalloc(&partial, blocks * sizeof(long long)));
    CK(cudaMalloc(&total, 2 * sizeof(long long)));
    CK(cudaMemcpy(in, h.data(), n * sizeof(int), cudaMemcpyHostToDevice));
    int nn = n;
    void* args[] = {&in, &out, &partial, &total, &nn};
    CK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(k_coop), dim3(blocks), dim3(kThreads), args, 0, nullptr));
    CK(cudaDeviceSynchronize());
    long long t[2];
    CK(cudaMemcpy(t, total, sizeof t, cudaMemcpyDeviceToHost));
    std::vector<long long> o(n);
    CK(cudaMemcpy(o.data(), out, n * sizeof(long long), cudaMemcpyDeviceToHost));
    long long ref0 = 0, ref1 = 0;
    bool out_ok = true;
    for (int i = 0; i < n; ++i) ref0 += h[i];
    for (int i = 0; i < n; ++i) {
      const long long v = 3LL * h[i] + ref0 % 1009;
      out_ok = out_ok && o[i] == v;
      ref1 += v;
    }
    const bool ok = out_ok && t[0] == ref0 && t[1] == ref1;
    failures += !ok;
    std::printf("round=%d n=%d total=%lld total_after=%lld out=%s %s\n", round, n, t[0], t[1], out_ok ? "ok" : "WRONG",
                ok ? "ok" : "WRONG");
    CK(cudaFree(in));
    CK(cudaFree(out));
    CK(cudaFree(partial));
    CK(cudaFree(total));
  }
  verdict.add("rounds", 3);
  verdict.add("failed_rounds", failures);
  return verdict.finish(failures == 0);
}
