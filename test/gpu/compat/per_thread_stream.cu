// per_thread_stream: a buffer freed by one thread while its per-thread default stream still reads
// it, then allocated and overwritten by another thread on ITS per-thread default stream.
//
// Built twice from this source:
//   per_thread_stream           nvcc --default-stream per-thread: work goes to stream 0, which
//                               means the calling thread's per-thread default stream;
//   per_thread_stream_explicit  -DCOMPAT_EXPLICIT_PER_THREAD, built without that flag: every call
//                               passes cudaStreamPerThread.
// Each round: thread A queues a slow kernel (waits ~50 ms, then reads all of p, 256 MiB) on its
// per-thread stream and frees p; after A's free has returned, thread B allocates the same size
// (it may get p back) and overwrites it with a memset on B's per-thread stream. Per-thread streams
// do not wait for each other, but cudaFree waits for all device work, so A's kernel must still see
// its value. The program creates no stream of its own. Prints, per round, whether the kernel saw
// the overwrite (must be 0); '#' lines say whether B got p's address.
#include <future>
#include <thread>

#include "common.h"

#ifdef COMPAT_EXPLICIT_PER_THREAD
#define PT_STREAM cudaStreamPerThread
#define PT_NAME "per_thread_stream_explicit"
#else
#define PT_STREAM 0
#define PT_NAME "per_thread_stream"
#endif

namespace {
constexpr size_t kBytes = size_t{256} << 20;
constexpr size_t kWords = kBytes / sizeof(unsigned);
constexpr int kRounds = 10;
constexpr unsigned long long kSpinNs = 50'000'000ull;
}  // namespace

int main() {
  compat::Verdict verdict(PT_NAME);
  CK(cudaSetDevice(0));
  unsigned long long* bad = nullptr;
  CK(cudaMalloc(&bad, kRounds * sizeof(unsigned long long)));
  CK(cudaMemset(bad, 0, kRounds * sizeof(unsigned long long)));
  unsigned* p = nullptr;
  CK(cudaMalloc(&p, kBytes));

  int corrupt = 0, same = 0;
  for (int r = 0; r < kRounds; ++r) {
    const unsigned value = 0x24680000u + static_cast<unsigned>(r);
    compat_fill_u32<<<1024, 256, 0, PT_STREAM>>>(p, kWords, value);
    CK_LAUNCH();
    CK(cudaDeviceSynchronize());

    std::promise<void> a_freed, b_done;
    std::future<void> a_freed_f = a_freed.get_future(), b_done_f = b_done.get_future();
    unsigned* q = nullptr;
    // Both threads stay alive until B is done, so neither per-thread stream goes away early.
    std::thread a([&] {
      CK(cudaSetDevice(0));
      compat_slow_check<<<16, 256, 0, PT_STREAM>>>(p, kWords, value, kSpinNs, bad + r);
      CK_LAUNCH();
      CK(cudaFree(p));
      a_freed.set_value();
      b_done_f.wait();
    });
    std::thread b([&] {
      CK(cudaSetDevice(0));
      a_freed_f.wait();
      CK(cudaMalloc(&q, kBytes));
      CK(cudaMemsetAsync(q, 0x5A, kBytes, PT_STREAM));
      CK(cudaStreamSynchronize(PT_STREAM));
      b_done.set_value();
    });
    a.join();
    b.join();
    CK(cudaDeviceSynchronize());
    unsigned long long seen = 0;
    CK(cudaMemcpy(&seen, bad + r, sizeof seen, cudaMemcpyDeviceToHost));
    const bool same_address = (q == p);
    corrupt += seen != 0;
    same += same_address;
    std::printf("round=%d kernel_saw_overwrite=%d\n", r, seen != 0 ? 1 : 0);
    std::printf("# round=%d same_address=%d\n", r, same_address ? 1 : 0);
    p = q;
  }
  CK(cudaFree(p));
  CK(cudaFree(bad));
  if (corrupt) std::printf("ERROR: in %d rounds thread A's kernel read memory that thread B got and overwrote under it\n", corrupt);
  verdict.add("rounds", kRounds);
  verdict.add("corrupt_rounds", corrupt);
  verdict.add("reused_same_address", same);
  return verdict.finish(corrupt == 0);
}
