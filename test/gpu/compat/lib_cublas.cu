// lib_cublas: cuBLAS allocating for itself (handle, workspace) beside the program's buffers.
//   1. cublasSgemm 96x80x64 on small integers: the result is exact, compared bit for bit with a
//      host reference; a checksum of the integers is printed.
//   2. cublasSgemm 128x96x112 on values in [-1, 1): compared with a double host reference;
//      the largest error is printed as a bucket (a power of ten), "ok" when under 1e-3.
//   3. cublasGemmEx, FP16 inputs, FP32 output and compute, 64x64x64 small integers: exact.
//   4. cublasSgemmStridedBatched, 8 batches of 32x32x32 integers: exact.
#include <cublas_v2.h>
#include <cuda_fp16.h>

#include <cmath>

#include "common.h"

namespace {

void ckb(cublasStatus_t s, const char* what, int line) {
  if (s != CUBLAS_STATUS_SUCCESS) compat::die("%s returned cuBLAS status %d (line %d)", what, static_cast<int>(s), line);
}
#define CKB(x) ckb((x), #x, __LINE__)

unsigned g_lcg = 12345;
int small_int() {  // -4..4
  g_lcg = g_lcg * 1103515245u + 12345u;
  return static_cast<int>((g_lcg >> 16) % 9) - 4;
}
float unit() {  // [-1, 1)
  g_lcg = g_lcg * 1103515245u + 12345u;
  return static_cast<float>((g_lcg >> 8) & 0xFFFF) / 32768.0f - 1.0f;
}

const char* bucket(double e) {
  if (e == 0) return "0";
  if (e < 1e-7) return "<1e-7";
  if (e < 1e-6) return "<1e-6";
  if (e < 1e-5) return "<1e-5";
  if (e < 1e-4) return "<1e-4";
  if (e < 1e-3) return "<1e-3";
  return ">=1e-3";
}

int g_checks = 0, g_failures = 0;

// Column-major C = A (m x k) * B (k x n).
template <typename T>
std::vector<double> host_gemm(const std::vector<T>& a, const std::vector<T>& b, int m, int n, int k) {
  std::vector<double> c(static_cast<size_t>(m) * n, 0.0);
  for (int j = 0; j < n; ++j)
    for (int p = 0; p < k; ++p)
      for (int i = 0; i < m; ++i) c[i + static_cast<size_t>(j) * m] += static_cast<double>(a[i + static_cast<size_t>(p) * m]) * b[p + static_cast<size_t>(j) * k];
  return c;
}

template <typename T>
T* to_device(const std::vector<T>& h) {
  T* d = nullptr;
  CK(cudaMalloc(&d, h.size() * sizeof(T)));
  CK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  CK(cudaDeviceSynchronize());  // the library works on a non-blocking stream
  return d;
}

// The library's stream does not wait for the legacy stream, nor it for the library's.
template <typename T>
void download(std::vector<T>& h, const T* d) {
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(h.data(), d, h.size() * sizeof(T), cudaMemcpyDeviceToHost));
}

void sgemm_exact(cublasHandle_t h) {
  const int m = 96, n = 80, k = 64;
  std::vector<float> a(m * k), b(k * n), c(m * n, -1.f);
  for (auto& x : a) x = static_cast<float>(small_int());
  for (auto& x : b) x = static_cast<float>(small_int());
  float *da = to_device(a), *db = to_device(b), *dc = to_device(c);
  const float one = 1.f, zero = 0.f;
  CKB(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, da, m, db, k, &zero, dc, m));
  download(c, dc);
  std::vector<double> ref = host_gemm(a, b, m, n, k);
  bool ok = true;
  long long sum = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    ok = ok && static_cast<double>(c[i]) == ref[i];
    sum += static_cast<long long>(c[i]) * static_cast<long long>(i % 97 + 1);
  }
  std::printf("sgemm_exact 96x80x64 checksum=%lld %s\n", sum, ok ? "ok" : "WRONG");
  ++g_checks;
  g_failures += !ok;
  CK(cudaFree(da));
  CK(cudaFree(db));
  CK(cudaFree(dc));
}

void sgemm_float(cublasHandle_t h) {
  const int m = 128, n = 96, k = 112;
  std::vector<float> a(m * k), b(k * n), c(m * n, -1.f);
  for (auto& x : a) x = unit();
  for (auto& x : b) x = unit();
  float *da = to_device(a), *db = to_device(b), *dc = to_device(c);
  const float one = 1.f, zero = 0.f;
  CKB(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, da, m, db, k, &zero, dc, m));
  download(c, dc);
  std::vector<double> ref = host_gemm(a, b, m, n, k);
  double err = 0;
  for (size_t i = 0; i < c.size(); ++i) err = std::fmax(err, std::fabs(c[i] - ref[i]));
  const bool ok = err < 1e-3;
  std::printf("sgemm_float 128x96x112 max_error=%s %s\n", bucket(err), ok ? "ok" : "WRONG");
  ++g_checks;
  g_failures += !ok;
  CK(cudaFree(da));
  CK(cudaFree(db));
  CK(cudaFree(dc));
}

void gemm_ex_half(cublasHandle_t h) {
  const int m = 64, n = 64, k = 64;
  std::vector<float> af(m * k), bf(k * n);
  for (auto& x : af) x = static_cast<float>(small_int());
  for (auto& x : bf) x = static_cast<float>(small_int());
  std::vector<__half> a(af.size()), b(bf.size());
  for (size_t i = 0; i < a.size(); ++i) a[i] = __float2half(af[i]);
  for (size_t i = 0; i < b.size(); ++i) b[i] = __float2half(bf[i]);
  std::vector<float> c(m * n, -1.f);
  __half *da = to_device(a), *db = to_device(b);
  float* dc = to_device(c);
  const float one = 1.f, zero = 0.f;
  CKB(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, da, CUDA_R_16F, m, db, CUDA_R_16F, k, &zero, dc, CUDA_R_32F,
                   m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  download(c, dc);
  std::vector<double> ref = host_gemm(af, bf, m, n, k);
  bool ok = true;
  long long sum = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    ok = ok && static_cast<double>(c[i]) == ref[i];
    sum += static_cast<long long>(c[i]) * static_cast<long long>(i % 89 + 1);
  }
  std::printf("gemm_ex fp16->fp32 64x64x64 checksum=%lld %s\n", sum, ok ? "ok" : "WRONG");
  ++g_checks;
  g_failures += !ok;
  CK(cudaFree(da));
  CK(cudaFree(db));
  CK(cudaFree(dc));
}

void sgemm_batched(cublasHandle_t h) {
  const int m = 32, n = 32, k = 32, batches = 8;
  std::vector<float> a(m * k * batches), b(k * n * batches), c(m * n * batches, -1.f);
  for (auto& x : a) x = static_cast<float>(small_int());
  for (auto& x : b) x = static_cast<float>(small_int());
  float *da = to_device(a), *db = to_device(b), *dc = to_device(c);
  const float one = 1.f, zero = 0.f;
  CKB(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, da, m, m * k, db, k, k * n, &zero, dc, m, m * n,
                                batches));
  download(c, dc);
  bool ok = true;
  long long sum = 0;
  for (int t = 0; t < batches; ++t) {
    std::vector<float> at(a.begin() + t * m * k, a.begin() + (t + 1) * m * k), bt(b.begin() + t * k * n, b.begin() + (t + 1) * k * n);
    std::vector<double> ref = host_gemm(at, bt, m, n, k);
    for (int i = 0; i < m * n; ++i) {
      ok = ok && static_cast<double>(c[t * m * n + i]) == ref[i];
      sum += static_cast<long long>(c[t * m * n + i]) * (i % 83 + 1 + t);
    }
  }
  std::printf("sgemm_strided_batched 8x32x32x32 checksum=%lld %s\n", sum, ok ? "ok" : "WRONG");
  ++g_checks;
  g_failures += !ok;
  CK(cudaFree(da));
  CK(cudaFree(db));
  CK(cudaFree(dc));
}

}  // namespace

int main() {
  compat::Verdict verdict("lib_cublas");
  CK(cudaSetDevice(0));
  cublasHandle_t h;
  CKB(cublasCreate(&h));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CKB(cublasSetStream(h, s));
  sgemm_exact(h);
  sgemm_float(h);
  gemm_ex_half(h);
  sgemm_batched(h);
  CKB(cublasDestroy(h));
  CK(cudaStreamDestroy(s));
  verdict.add("checks", g_checks);
  verdict.add("failed_checks", g_failures);
  return verdict.finish(g_failures == 0);
}
