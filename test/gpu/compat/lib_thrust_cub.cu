// lib_thrust_cub: Thrust and CUB allocating temporary storage (built with nvcc's default static
// runtime, so only the driver level can be interposed).
//   1. thrust::device_vector of 2^21 ints: thrust::sort, thrust::reduce, thrust::transform,
//      thrust::inclusive_scan, compared with std:: on the host.
//   2. cub::DeviceRadixSort::SortPairs and cub::DeviceReduce::Sum with the two-phase pattern
//      (ask for the temporary storage size with a null pointer, cudaMalloc it, run), compared.
// Prints exact integer checksums.
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_reduce.cuh>
#include <thrust/device_vector.h>
#include <thrust/functional.h>
#include <thrust/host_vector.h>
#include <thrust/reduce.h>
#include <thrust/scan.h>
#include <thrust/sort.h>
#include <thrust/transform.h>

#include <algorithm>
#include <numeric>

#include "common.h"

namespace {

struct Affine {
  __host__ __device__ long long operator()(int v) const { return 3LL * v - 7; }
};

std::vector<int> make_data(size_t n, unsigned seed) {
  std::vector<int> v(n);
  for (auto& x : v) {
    seed = seed * 1664525u + 1013904223u;
    x = static_cast<int>(seed >> 4) % 1000003 - 500000;
  }
  return v;
}

long long weighted(const std::vector<long long>& v) {
  long long s = 0;
  for (size_t i = 0; i < v.size(); ++i) s += v[i] * static_cast<long long>(i % 1009 + 1);
  return s;
}
long long weighted(const std::vector<int>& v) {
  long long s = 0;
  for (size_t i = 0; i < v.size(); ++i) s += v[i] * static_cast<long long>(i % 1009 + 1);
  return s;
}

}  // namespace

int main() {
  compat::Verdict verdict("lib_thrust_cub");
  CK(cudaSetDevice(0));
  int checks = 0, failures = 0;
  auto report = [&](const char* what, long long checksum, bool ok) {
    std::printf("%s checksum=%lld %s\n", what, checksum, ok ? "ok" : "WRONG");
    ++checks;
    failures += !ok;
  };
  const size_t n = size_t{1} << 21;
  const std::vector<int> data = make_data(n, 42);

  // Thrust
  {
    thrust::device_vector<int> d(data.begin(), data.end());
    thrust::sort(d.begin(), d.end());
    std::vector<int> host_sorted(data);
    std::sort(host_sorted.begin(), host_sorted.end());
    std::vector<int> got(n);
    thrust::copy(d.begin(), d.end(), got.begin());
    report("thrust::sort", weighted(got), got == host_sorted);

    long long sum = thrust::reduce(d.begin(), d.end(), 0LL, thrust::plus<long long>());
    long long host_sum = std::accumulate(data.begin(), data.end(), 0LL);
    report("thrust::reduce", sum, sum == host_sum);

    thrust::device_vector<long long> t(n);
    thrust::transform(d.begin(), d.end(), t.begin(), Affine());
    std::vector<long long> tg(n), tref(n);
    thrust::copy(t.begin(), t.end(), tg.begin());
    for (size_t i = 0; i < n; ++i) tref[i] = 3LL * host_sorted[i] - 7;
    report("thrust::transform", weighted(tg), tg == tref);

    thrust::inclusive_scan(t.begin(), t.end(), t.begin());
    thrust::copy(t.begin(), t.end(), tg.begin());
    std::partial_sum(tref.begin(), tref.end(), tref.begin());
    report("thrust::inclusive_scan", weighted(tg), tg == tref);
  }

  // CUB, two-phase temporary storage
  {
    const std::vector<int> keys = make_data(n, 7);
    std::vector<int> vals(n);
    std::iota(vals.begin(), vals.end(), 0);
    int *dk_in, *dk_out, *dv_in, *dv_out;
    CK(cudaMalloc(&dk_in, n * sizeof(int)));
    CK(cudaMalloc(&dk_out, n * sizeof(int)));
    CK(cudaMalloc(&dv_in, n * sizeof(int)));
    CK(cudaMalloc(&dv_out, n * sizeof(int)));
    CK(cudaMemcpy(dk_in, keys.data(), n * sizeof(int), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dv_in, vals.data(), n * sizeof(int), cudaMemcpyHostToDevice));
    void* temp = nullptr;
    size_t temp_bytes = 0;
    CK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, dk_in, dk_out, dv_in, dv_out, static_cast<int>(n)));
    CK(cudaMalloc(&temp, temp_bytes));
    CK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, dk_in, dk_out, dv_in, dv_out, static_cast<int>(n)));
    std::vector<int> gk(n), gv(n);
    CK(cudaMemcpy(gk.data(), dk_out, n * sizeof(int), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gv.data(), dv_out, n * sizeof(int), cudaMemcpyDeviceToHost));
    // radix sort is stable: ties keep the order of their original indices
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return keys[a] < keys[b]; });
    bool ok = true;
    for (size_t i = 0; i < n && ok; ++i) ok = gv[i] == order[i] && gk[i] == keys[order[i]];
    report("cub::DeviceRadixSort::SortPairs", weighted(gv), ok);
    CK(cudaFree(temp));

    long long* dsum = nullptr;
    CK(cudaMalloc(&dsum, sizeof(long long)));
    long long* dwide = nullptr;  // the keys widened to 64 bits, so the sum cannot overflow
    CK(cudaMalloc(&dwide, n * sizeof(long long)));
    std::vector<long long> wide(keys.begin(), keys.end());
    CK(cudaMemcpy(dwide, wide.data(), n * sizeof(long long), cudaMemcpyHostToDevice));
    temp = nullptr;
    temp_bytes = 0;
    CK(cub::DeviceReduce::Sum(temp, temp_bytes, dwide, dsum, static_cast<int>(n)));
    CK(cudaMalloc(&temp, temp_bytes));
    CK(cub::DeviceReduce::Sum(temp, temp_bytes, dwide, dsum, static_cast<int>(n)));
    long long got = 0;
    CK(cudaMemcpy(&got, dsum, sizeof got, cudaMemcpyDeviceToHost));
    const long long ref = std::accumulate(wide.begin(), wide.end(), 0LL);
    report("cub::DeviceReduce::Sum", got, got == ref);
    CK(cudaFree(temp));
    CK(cudaFree(dsum));
    CK(cudaFree(dwide));
    for (int* p : {dk_in, dk_out, dv_in, dv_out}) CK(cudaFree(p));
  }
  verdict.add("checks", checks);
  verdict.add("failed_checks", failures);
  return verdict.finish(failures == 0);
}
