// stream_destroy: a buffer freed while a DESTROYED stream still has queued work that reads it.
//
// Each round: p (256 MiB) holds a known value; a slow kernel (waits ~50 ms, then reads all of p)
// is queued on a fresh stream s; s is destroyed (legal: its work still runs), p is freed, a buffer
// of the same size is allocated (it may be p again) and overwritten at once from ANOTHER
// non-blocking stream. cudaFree waits for all device work, so the slow kernel must still see its
// value. 10 rounds with a non-blocking s, then 10 with a blocking s.
// Prints, per round, whether the kernel saw the overwrite (must be 0), and in '#' lines whether
// the new buffer had p's address. Verdict: rounds, corrupt_rounds, reused_same_address.
#include "common.h"

namespace {
constexpr size_t kBytes = size_t{256} << 20;
constexpr size_t kWords = kBytes / sizeof(unsigned);
constexpr int kRounds = 10;
constexpr unsigned long long kSpinNs = 50'000'000ull;
}  // namespace

int main() {
  compat::Verdict verdict("stream_destroy");
  CK(cudaSetDevice(0));
  cudaStream_t overwriter;
  CK(cudaStreamCreateWithFlags(&overwriter, cudaStreamNonBlocking));
  unsigned long long* bad = nullptr;  // one counter per round
  CK(cudaMalloc(&bad, 2 * kRounds * sizeof(unsigned long long)));
  CK(cudaMemset(bad, 0, 2 * kRounds * sizeof(unsigned long long)));
  unsigned* p = nullptr;
  CK(cudaMalloc(&p, kBytes));

  int corrupt = 0, same = 0, round_index = 0;
  for (int blocking = 0; blocking < 2; ++blocking) {
    const char* kind = blocking ? "blocking" : "non_blocking";
    for (int r = 0; r < kRounds; ++r, ++round_index) {
      const unsigned value = 0x13570000u + static_cast<unsigned>(round_index);
      compat_fill_u32<<<1024, 256>>>(p, kWords, value);
      CK_LAUNCH();
      CK(cudaDeviceSynchronize());
      cudaStream_t s;
      CK(cudaStreamCreateWithFlags(&s, blocking ? cudaStreamDefault : cudaStreamNonBlocking));
      compat_slow_check<<<16, 256, 0, s>>>(p, kWords, value, kSpinNs, bad + round_index);
      CK_LAUNCH();
      CK(cudaStreamDestroy(s));
      CK(cudaFree(p));
      unsigned* q = nullptr;
      CK(cudaMalloc(&q, kBytes));
      const bool same_address = (q == p);
      CK(cudaMemsetAsync(q, 0x5A, kBytes, overwriter));
      CK(cudaDeviceSynchronize());
      unsigned long long seen = 0;
      CK(cudaMemcpy(&seen, bad + round_index, sizeof seen, cudaMemcpyDeviceToHost));
      corrupt += seen != 0;
      same += same_address;
      std::printf("stream=%s round=%d kernel_saw_overwrite=%d\n", kind, r, seen != 0 ? 1 : 0);
      std::printf("# stream=%s round=%d same_address=%d\n", kind, r, same_address ? 1 : 0);
      p = q;
    }
  }
  CK(cudaFree(p));
  CK(cudaFree(bad));
  CK(cudaStreamDestroy(overwriter));
  if (corrupt) std::printf("ERROR: in %d rounds the slow kernel read memory that was freed and overwritten under it\n", corrupt);
  verdict.add("rounds", 2 * kRounds);
  verdict.add("corrupt_rounds", corrupt);
  verdict.add("reused_same_address", same);
  return verdict.finish(corrupt == 0);
}
