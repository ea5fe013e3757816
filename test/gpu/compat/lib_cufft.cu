// lib_cufft: cuFFT allocating its work areas itself (C2C plans) and a work area the program
// allocates after asking for its size (R2C/C2R plans with auto-allocation off).
//   1. C2C, N=256, 4 batches: forward compared with a host DFT (double), inverse / N compared
//      with the input; the largest relative errors printed as buckets.
//   2. R2C then C2R, N=512, 3 batches, user work area: the spectrum's strong bins printed as
//      rounded magnitudes, the round trip compared with the input.
//   3. 2D C2C 48x64 forward + inverse round trip.
// Inputs are sums of a few integer-frequency tones, so the strong bins are exact integers up to
// rounding error far below 0.5.
#include <cufft.h>

#include <cmath>
#include <complex>

#include "common.h"

namespace {

void ckf(cufftResult r, const char* what, int line) {
  if (r != CUFFT_SUCCESS) compat::die("%s returned cuFFT result %d (line %d)", what, static_cast<int>(r), line);
}
#define CKF(x) ckf((x), #x, __LINE__)

const double kPi = 3.14159265358979323846;
int g_checks = 0, g_failures = 0;

const char* bucket(double e) {
  if (e < 1e-7) return "<1e-7";
  if (e < 1e-6) return "<1e-6";
  if (e < 1e-5) return "<1e-5";
  if (e < 1e-4) return "<1e-4";
  if (e < 1e-3) return "<1e-3";
  return ">=1e-3";
}

void report(const char* what, double err, double tol) {
  const bool ok = err < tol;
  std::printf("%s max_rel_error=%s %s\n", what, bucket(err), ok ? "ok" : "WRONG");
  ++g_checks;
  g_failures += !ok;
}

double tone(int n, int N, int b) {
  return 3.0 * std::cos(2 * kPi * (5 + b) * n / N) + 2.0 * std::sin(2 * kPi * (17 + 2 * b) * n / N) + 1.0 + b;
}

void c2c_1d() {
  const int N = 256, B = 4;
  std::vector<cufftComplex> in(N * B), out(N * B), back(N * B);
  for (int b = 0; b < B; ++b)
    for (int n = 0; n < N; ++n) in[b * N + n] = make_cuComplex(static_cast<float>(tone(n, N, b)), static_cast<float>(0.5 * b));
  cufftComplex* d = nullptr;
  CK(cudaMalloc(&d, sizeof(cufftComplex) * N * B));
  CK(cudaMemcpy(d, in.data(), sizeof(cufftComplex) * N * B, cudaMemcpyHostToDevice));
  cufftHandle plan;
  CKF(cufftPlan1d(&plan, N, CUFFT_C2C, B));
  CKF(cufftExecC2C(plan, d, d, CUFFT_FORWARD));
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(out.data(), d, sizeof(cufftComplex) * N * B, cudaMemcpyDeviceToHost));
  double err = 0, scale = 0;
  for (int b = 0; b < B; ++b)
    for (int k = 0; k < N; ++k) {
      std::complex<double> ref = 0;
      for (int n = 0; n < N; ++n)
        ref += std::complex<double>(in[b * N + n].x, in[b * N + n].y) * std::polar(1.0, -2 * kPi * k * n / N);
      err = std::fmax(err, std::abs(ref - std::complex<double>(out[b * N + k].x, out[b * N + k].y)));
      scale = std::fmax(scale, std::abs(ref));
    }
  report("c2c N=256 batch=4 forward_vs_host_dft", err / scale, 1e-4);
  std::printf("c2c batch0 |X[0]|=%ld |X[5]|=%ld |X[17]|=%ld |X[239]|=%ld\n", std::lround(std::hypot(out[0].x, out[0].y)),
              std::lround(std::hypot(out[5].x, out[5].y)), std::lround(std::hypot(out[17].x, out[17].y)),
              std::lround(std::hypot(out[239].x, out[239].y)));
  CKF(cufftExecC2C(plan, d, d, CUFFT_INVERSE));
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(back.data(), d, sizeof(cufftComplex) * N * B, cudaMemcpyDeviceToHost));
  err = 0;
  scale = 0;
  for (int i = 0; i < N * B; ++i) {
    err = std::fmax(err, std::hypot(back[i].x / N - in[i].x, back[i].y / N - in[i].y));
    scale = std::fmax(scale, std::hypot(in[i].x, in[i].y));
  }
  report("c2c N=256 batch=4 inverse_round_trip", err / scale, 1e-5);
  CKF(cufftDestroy(plan));
  CK(cudaFree(d));
}

void r2c_1d() {
  const int N = 512, B = 3, H = N / 2 + 1;
  std::vector<float> in(N * B), back(N * B);
  for (int b = 0; b < B; ++b)
    for (int n = 0; n < N; ++n) in[b * N + n] = static_cast<float>(tone(n, N, b));
  std::vector<cufftComplex> spec(H * B);
  float* dr = nullptr;
  cufftComplex* dc = nullptr;
  CK(cudaMalloc(&dr, sizeof(float) * N * B));
  CK(cudaMalloc(&dc, sizeof(cufftComplex) * H * B));
  CK(cudaMemcpy(dr, in.data(), sizeof(float) * N * B, cudaMemcpyHostToDevice));
  cufftHandle fwd, inv;
  size_t ws_fwd = 0, ws_inv = 0;
  CKF(cufftCreate(&fwd));
  CKF(cufftCreate(&inv));
  CKF(cufftSetAutoAllocation(fwd, 0));
  CKF(cufftSetAutoAllocation(inv, 0));
  CKF(cufftMakePlan1d(fwd, N, CUFFT_R2C, B, &ws_fwd));
  CKF(cufftMakePlan1d(inv, N, CUFFT_C2R, B, &ws_inv));
  void* work = nullptr;
  const size_t ws = std::max<size_t>(std::max(ws_fwd, ws_inv), 256);
  CK(cudaMalloc(&work, ws));
  CKF(cufftSetWorkArea(fwd, work));
  CKF(cufftSetWorkArea(inv, work));
  CKF(cufftExecR2C(fwd, dr, dc));
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(spec.data(), dc, sizeof(cufftComplex) * H * B, cudaMemcpyDeviceToHost));
  for (int b = 0; b < B; ++b) {
    std::printf("r2c batch=%d strong_bins:", b);
    for (int k = 0; k < H; ++k) {
      double mag = std::hypot(spec[b * H + k].x, spec[b * H + k].y);
      if (mag > 0.5) std::printf(" %d:%ld", k, std::lround(mag));
    }
    std::printf("\n");
  }
  CK(cudaMemset(dr, 0, sizeof(float) * N * B));
  CKF(cufftExecC2R(inv, dc, dr));
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(back.data(), dr, sizeof(float) * N * B, cudaMemcpyDeviceToHost));
  double err = 0, scale = 0;
  for (int i = 0; i < N * B; ++i) {
    err = std::fmax(err, std::fabs(back[i] / N - in[i]));
    scale = std::fmax(scale, std::fabs(in[i]));
  }
  report("r2c_c2r N=512 batch=3 user_work_area round_trip", err / scale, 1e-5);
  CKF(cufftDestroy(fwd));
  CKF(cufftDestroy(inv));
  CK(cudaFree(work));
  CK(cudaFree(dr));
  CK(cudaFree(dc));
}

void c2c_2d() {
  const int NX = 48, NY = 64, N = NX * NY;
  std::vector<cufftComplex> in(N), back(N);
  for (int x = 0; x < NX; ++x)
    for (int y = 0; y < NY; ++y)
      in[x * NY + y] = make_cuComplex(static_cast<float>(std::cos(2 * kPi * 3 * x / NX) + std::sin(2 * kPi * 7 * y / NY)),
                                      static_cast<float>((x + y) % 5));
  cufftComplex* d = nullptr;
  CK(cudaMalloc(&d, sizeof(cufftComplex) * N));
  CK(cudaMemcpy(d, in.data(), sizeof(cufftComplex) * N, cudaMemcpyHostToDevice));
  cufftHandle plan;
  CKF(cufftPlan2d(&plan, NX, NY, CUFFT_C2C));
  CKF(cufftExecC2C(plan, d, d, CUFFT_FORWARD));
  CKF(cufftExecC2C(plan, d, d, CUFFT_INVERSE));
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(back.data(), d, sizeof(cufftComplex) * N, cudaMemcpyDeviceToHost));
  double err = 0, scale = 0;
  for (int i = 0; i < N; ++i) {
    err = std::fmax(err, std::hypot(back[i].x / N - in[i].x, back[i].y / N - in[i].y));
    scale = std::fmax(scale, std::hypot(in[i].x, in[i].y));
  }
  report("c2c_2d 48x64 round_trip", err / scale, 1e-5);
  CKF(cufftDestroy(plan));
  CK(cudaFree(d));
}

}  // namespace

int main() {
  compat::Verdict verdict("lib_cufft");
  CK(cudaSetDevice(0));
  c2c_1d();
  r2c_1d();
  c2c_2d();
  verdict.add("checks", g_checks);
  verdict.add("failed_checks", g_failures);
  return verdict.finish(g_failures == 0);
}
