// lib_cusolver: cuSOLVER dense solvers with the workspace-size query, the workspace allocated by
// the program, and the library's own allocations (handle).
//   1. LU: cusolverDnSgetrf_bufferSize, cusolverDnSgetrf (pivoting), cusolverDnSgetrs, on a
//      diagonally dominant 200x200 system whose solution is a vector of small integers.
//   2. Cholesky: cusolverDnSpotrf_bufferSize, cusolverDnSpotrf, cusolverDnSpotrs, on a 160x160
//      symmetric positive definite system, 3 right-hand sides.
// Prints devInfo, the largest error as a bucket and the solution rounded to integers (a
// checksum); ok when every component is within 1e-2 of the known solution.
#include <cusolverDn.h>

#include <cmath>

#include "common.h"

namespace {

void cks(cusolverStatus_t s, const char* what, int line) {
  if (s != CUSOLVER_STATUS_SUCCESS) compat::die("%s returned cuSOLVER status %d (line %d)", what, static_cast<int>(s), line);
}
#define CKS(x) cks((x), #x, __LINE__)

unsigned g_lcg = 777;
float unit() {  // [-1, 1)
  g_lcg = g_lcg * 1103515245u + 12345u;
  return static_cast<float>((g_lcg >> 8) & 0xFFFF) / 32768.0f - 1.0f;
}
const char* bucket(double e) {
  if (e < 1e-6) return "<1e-6";
  if (e < 1e-5) return "<1e-5";
  if (e < 1e-4) return "<1e-4";
  if (e < 1e-3) return "<1e-3";
  if (e < 1e-2) return "<1e-2";
  return ">=1e-2";
}
int g_checks = 0, g_failures = 0;

void verify(const char* what, const std::vector<float>& x, const std::vector<double>& truth, int info) {
  double err = 0;
  long long sum = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    err = std::fmax(err, std::fabs(x[i] - truth[i]));
    sum += std::lround(x[i]) * static_cast<long long>(i % 31 + 1);
  }
  const bool ok = info == 0 && err < 1e-2;
  std::printf("%s info=%d max_error=%s rounded_checksum=%lld %s\n", what, info, bucket(err), sum, ok ? "ok" : "WRONG");
  ++g_checks;
  g_failures += !ok;
}

void lu(cusolverDnHandle_t h, cudaStream_t s) {
  const int n = 200;
  std::vector<float> a(n * n), b(n);
  std::vector<double> x(n);
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < n; ++i) a[i + j * n] = unit() + (i == j ? static_cast<float>(n) : 0.f);
  for (int i = 0; i < n; ++i) x[i] = (i % 11) - 5;
  for (int i = 0; i < n; ++i) {
    double acc = 0;
    for (int j = 0; j < n; ++j) acc += static_cast<double>(a[i + j * n]) * x[j];
    b[i] = static_cast<float>(acc);
  }
  float *da, *db;
  int *ipiv, *info;
  CK(cudaMalloc(&da, sizeof(float) * n * n));
  CK(cudaMalloc(&db, sizeof(float) * n));
  CK(cudaMalloc(&ipiv, sizeof(int) * n));
  CK(cudaMalloc(&info, sizeof(int)));
  CK(cudaMemcpyAsync(da, a.data(), sizeof(float) * n * n, cudaMemcpyHostToDevice, s));
  CK(cudaMemcpyAsync(db, b.data(), sizeof(float) * n, cudaMemcpyHostToDevice, s));
  int lwork = 0;
  CKS(cusolverDnSgetrf_bufferSize(h, n, n, da, n, &lwork));
  float* work = nullptr;
  CK(cudaMalloc(&work, sizeof(float) * std::max(lwork, 1)));
  CKS(cusolverDnSgetrf(h, n, n, da, n, work, ipiv, info));
  CKS(cusolverDnSgetrs(h, CUBLAS_OP_N, n, 1, da, n, ipiv, db, n, info));
  std::vector<float> got(n);
  int hinfo = -1;
  CK(cudaMemcpyAsync(got.data(), db, sizeof(float) * n, cudaMemcpyDeviceToHost, s));
  CK(cudaMemcpyAsync(&hinfo, info, sizeof(int), cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  verify("getrf_getrs n=200", got, x, hinfo);
  CK(cudaFree(work));
  CK(cudaFree(da));
  CK(cudaFree(db));
  CK(cudaFree(ipiv));
  CK(cudaFree(info));
}

void cholesky(cusolverDnHandle_t h, cudaStream_t s) {
  const int n = 160, nrhs = 3;
  std::vector<float> m(n * n), a(n * n, 0.f), b(n * nrhs);
  for (auto& v : m) v = unit();
  // a = m^T m / n + I: symmetric positive definite
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      double acc = 0;
      for (int k = 0; k < n; ++k) acc += static_cast<double>(m[k + i * n]) * m[k + j * n];
      a[i + j * n] = static_cast<float>(acc / n + (i == j ? 1.0 : 0.0));
    }
  std::vector<double> x(n * nrhs);
  for (int i = 0; i < n * nrhs; ++i) x[i] = (i % 7) - 3;
  for (int r = 0; r < nrhs; ++r)
    for (int i = 0; i < n; ++i) {
      double acc = 0;
      for (int j = 0; j < n; ++j) acc += static_cast<double>(a[i + j * n]) * x[j + r * n];
      b[i + r * n] = static_cast<float>(acc);
    }
  float *da, *db;
  int* info;
  CK(cudaMalloc(&da, sizeof(float) * n * n));
  CK(cudaMalloc(&db, sizeof(float) * n * nrhs));
  CK(cudaMalloc(&info, sizeof(int)));
  CK(cudaMemcpyAsync(da, a.data(), sizeof(float) * n * n, cudaMemcpyHostToDevice, s));
  CK(cudaMemcpyAsync(db, b.data(), sizeof(float) * n * nrhs, cudaMemcpyHostToDevice, s));
  int lwork = 0;
  CKS(cusolverDnSpotrf_bufferSize(h, CUBLAS_FILL_MODE_LOWER, n, da, n, &lwork));
  float* work = nullptr;
  CK(cudaMalloc(&work, sizeof(float) * std::max(lwork, 1)));
  CKS(cusolverDnSpotrf(h, CUBLAS_FILL_MODE_LOWER, n, da, n, work, lwork, info));
  CKS(cusolverDnSpotrs(h, CUBLAS_FILL_MODE_LOWER, n, nrhs, da, n, db, n, info));
  std::vector<float> got(n * nrhs);
  int hinfo = -1;
  CK(cudaMemcpyAsync(got.data(), db, sizeof(float) * n * nrhs, cudaMemcpyDeviceToHost, s));
  CK(cudaMemcpyAsync(&hinfo, info, sizeof(int), cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  verify("potrf_potrs n=160 nrhs=3", got, x, hinfo);
  CK(cudaFree(work));
  CK(cudaFree(da));
  CK(cudaFree(db));
  CK(cudaFree(info));
}

}  // namespace

int main() {
  compat::Verdict verdict("lib_cusolver");
  CK(cudaSetDevice(0));
  cusolverDnHandle_t h;
  CKS(cusolverDnCreate(&h));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CKS(cusolverDnSetStream(h, s));
  lu(h, s);
  cholesky(h, s);
  CKS(cusolverDnDestroy(h));
  CK(cudaStreamDestroy(s));
  verdict.add("checks", g_checks);
  verdict.add("failed_checks", g_failures);
  return verdict.finish(g_failures == 0);
}
