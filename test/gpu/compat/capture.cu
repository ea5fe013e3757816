// capture: allocation calls made during stream capture, as PyTorch makes them.
//
// 1. For each capture mode (global, thread_local, relaxed) x capturing stream (non-blocking,
//    blocking) x call (cudaMalloc of a new buffer / cudaFree of a buffer allocated before the
//    capture): begin capture, a kernel writes buffer a, the thread switches itself to relaxed
//    with cudaThreadExchangeStreamCaptureMode, makes the call, switches back, a second kernel
//    reads a and writes b, end capture, instantiate, launch 3 times, check b every time.
//    In the cudaFree case the freed buffer is still being written by a slow kernel on another
//    stream (cudaFree must wait for it), and a buffer of the same size is allocated right after
//    the free, still inside the capture; once the capture has ended it is zeroed and checked
//    after the slow kernel is done (it must not have received the slow kernel's late writes).
// 2. Captures on 4 threads at once (each its own stream), all in global mode, then all in
//    thread_local mode, each allocating and freeing (in relaxed mode) while all 4 capture.
// 3. Unsafe calls in a prohibited mode: cudaMalloc on the capturing thread in global mode and in
//    thread_local mode, cudaFree in global mode: the call must fail with
//    cudaErrorStreamCaptureUnsupported, and the capture end with cudaErrorStreamCaptureInvalidated.
// Every return code is printed by name; cupool must give the same codes.
#include <condition_variable>
#include <mutex>
#include <thread>

#include "common.h"

namespace {

constexpr int kN = 1 << 16;                   // ints in a and b
constexpr size_t kFreeBytes = size_t{1} << 20; // the buffer freed during the capture
constexpr unsigned long long kSlowNs = 30'000'000ull;

__global__ void k_write(int* a, int n, int k) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) a[i] = i + k;
}
__global__ void k_use(const int* a, int* b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) b[i] = 2 * a[i] + 1;
}
// Waits, then writes 7 into every word of f: a kernel still using f when f is freed.
__global__ void k_slow_write(unsigned* f, size_t n, unsigned long long ns) {
  if (threadIdx.x == 0) {
    unsigned long long t0 = compat_globaltimer();
    while (compat_globaltimer() - t0 < ns) {
    }
  }
  __syncthreads();
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    f[i] = 7;
}

const char* mode_name(cudaStreamCaptureMode m) {
  switch (m) {
    case cudaStreamCaptureModeGlobal: return "global";
    case cudaStreamCaptureModeThreadLocal: return "thread_local";
    case cudaStreamCaptureModeRelaxed: return "relaxed";
  }
  return "?";
}
const char* status_name(cudaStreamCaptureStatus s) {
  switch (s) {
    case cudaStreamCaptureStatusNone: return "none";
    case cudaStreamCaptureStatusActive: return "active";
    case cudaStreamCaptureStatusInvalidated: return "invalidated";
  }
  return "?";
}
const char* E(cudaError_t e) { return cudaGetErrorName(e); }

constexpr int kGrid = (kN + 255) / 256;

// Launches the instantiated graph 3 times (b is spoiled before each) and checks b each time.
// Returns how many launches gave the right b.
int launch_and_check(cudaGraphExec_t exec, cudaStream_t s, int* b, int k, cudaError_t* first_error) {
  std::vector<int> host(kN);
  int ok = 0;
  *first_error = cudaSuccess;
  for (int l = 0; l < 3; ++l) {
    CK(cudaMemsetAsync(b, 0xFF, kN * sizeof(int), s));
    cudaError_t e = cudaGraphLaunch(exec, s);
    if (e != cudaSuccess) {
      if (*first_error == cudaSuccess) *first_error = e;
      continue;
    }
    CK(cudaMemcpyAsync(host.data(), b, kN * sizeof(int), cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    bool good = true;
    for (int i = 0; i < kN && good; ++i) good = host[i] == 2 * (i + k) + 1;
    ok += good;
  }
  return ok;
}

int g_failures = 0;
int g_cases = 0;
int g_busy_unsafe = 0;
int g_reused = 0;  // informational: the buffer allocated after the free got the freed address

void matrix_case(bool free_case, cudaStreamCaptureMode mode, bool blocking, cudaStream_t side, cudaStream_t zeroer, int k) {
  ++g_cases;
  cudaGetLastError();  // a failure of an earlier case must not show up in this one
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, blocking ? cudaStreamDefault : cudaStreamNonBlocking));
  int *a = nullptr, *b = nullptr;
  unsigned *f = nullptr, *g2 = nullptr;
  CK(cudaMalloc(&a, kN * sizeof(int)));
  if (free_case) {
    CK(cudaMalloc(&b, kN * sizeof(int)));
    CK(cudaMalloc(&f, kFreeBytes));
    CK(cudaDeviceSynchronize());
    k_slow_write<<<8, 256, 0, side>>>(f, kFreeBytes / 4, kSlowNs);  // f is busy when it is freed
    CK_LAUNCH();
  }
  cudaError_t begin = cudaStreamBeginCapture(s, mode);
  k_write<<<kGrid, 256, 0, s>>>(a, kN, k);
  cudaError_t l1 = cudaGetLastError();
  cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
  cudaError_t x1 = cudaThreadExchangeStreamCaptureMode(&m);
  const cudaStreamCaptureMode was = m;
  cudaError_t op = cudaSuccess, op2 = cudaSuccess;
  if (free_case) {
    op = cudaFree(f);
    op2 = cudaMalloc(&g2, kFreeBytes);
  } else {
    op = cudaMalloc(&b, kN * sizeof(int));
  }
  cudaError_t x2 = cudaThreadExchangeStreamCaptureMode(&m);
  const cudaStreamCaptureMode restored_from = m;
  cudaError_t l2 = cudaErrorInvalidValue;
  if (b) {
    k_use<<<kGrid, 256, 0, s>>>(a, b, kN);
    l2 = cudaGetLastError();
  }
  cudaGraph_t graph = nullptr;
  cudaError_t end = cudaStreamEndCapture(s, &graph);
  size_t nodes = 0;
  cudaError_t inst = cudaErrorInvalidValue;
  cudaError_t launch_err = cudaSuccess;
  int launches_ok = 0;
  if (end == cudaSuccess && graph) {
    CK(cudaGraphGetNodes(graph, nullptr, &nodes));
    cudaGraphExec_t exec;
    inst = cudaGraphInstantiate(&exec, graph, 0);
    if (inst == cudaSuccess) {
      launches_ok = launch_and_check(exec, s, b, k, &launch_err);
      CK(cudaGraphExecDestroy(exec));
    }
    CK(cudaGraphDestroy(graph));
  }
  int busy_safe = -1;
  if (free_case) {
    if (op2 == cudaSuccess) {
      // Zero the new buffer at once, then wait for the slow kernel that wrote the freed one.
      CK(cudaMemsetAsync(g2, 0, kFreeBytes, zeroer));
      CK(cudaStreamSynchronize(zeroer));
      CK(cudaStreamSynchronize(side));
      std::vector<unsigned> host(kFreeBytes / 4);
      CK(cudaMemcpy(host.data(), g2, kFreeBytes, cudaMemcpyDeviceToHost));
      busy_safe = 1;
      for (unsigned v : host)
        if (v != 0) busy_safe = 0;
      g_busy_unsafe += busy_safe == 0;
      g_reused += (g2 == f);
      CK(cudaFree(g2));
    }
    CK(cudaStreamSynchronize(side));
  }
  CK(cudaDeviceSynchronize());
  if (b) CK(cudaFree(b));
  CK(cudaFree(a));
  CK(cudaStreamDestroy(s));
  std::printf("capture call=%s mode=%s stream=%s begin=%s launch1=%s exchange=%s thread_mode_was=%s call_rc=%s",
              free_case ? "cudaFree" : "cudaMalloc", mode_name(mode), blocking ? "blocking" : "non_blocking", E(begin),
              E(l1), E(x1), mode_name(was), E(op));
  if (free_case) std::printf(" malloc_after_free=%s busy_buffer_safe=%d", E(op2), busy_safe);
  std::printf(" exchange_back=%s restored_from=%s launch2=%s end=%s nodes=%zu instantiate=%s launch=%s launches_ok=%d\n",
              E(x2), mode_name(restored_from), E(l2), E(end), nodes, E(inst), E(launch_err), launches_ok);
  const bool ok = begin == cudaSuccess && l1 == cudaSuccess && x1 == cudaSuccess && op == cudaSuccess &&
                  op2 == cudaSuccess && x2 == cudaSuccess && l2 == cudaSuccess && end == cudaSuccess &&
                  inst == cudaSuccess && launches_ok == 3 && busy_safe != 0;
  g_failures += !ok;
}

// A reusable barrier for the threads of one multi-threaded case (no CUDA calls inside).
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lk(mu_);
    int gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lk, [&] { return gen != gen_; });
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_, count_ = 0, gen_ = 0;
};

struct ThreadResult {
  cudaError_t begin = cudaErrorUnknown, x1 = cudaErrorUnknown, malloc_rc = cudaErrorUnknown,
              free_rc = cudaErrorUnknown, x2 = cudaErrorUnknown, end = cudaErrorUnknown, inst = cudaErrorUnknown,
              launch = cudaSuccess;
  size_t nodes = 0;
  int launches_ok = 0;
};

void threaded_case(cudaStreamCaptureMode mode) {
  constexpr int kThreads = 4;
  cudaGetLastError();
  Barrier barrier(kThreads);
  ThreadResult res[kThreads];
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ThreadResult& r = res[t];
      const int k = 1000 + 10 * t + (mode == cudaStreamCaptureModeGlobal ? 0 : 5);
      CK(cudaSetDevice(0));
      cudaStream_t s;
      CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      int *a = nullptr, *b = nullptr;
      void* f = nullptr;
      CK(cudaMalloc(&a, kN * sizeof(int)));
      CK(cudaMalloc(&f, (size_t{1} << 20) + t * (size_t{64} << 10)));
      CK(cudaStreamSynchronize(s));
      barrier.wait();  // all set up
      r.begin = cudaStreamBeginCapture(s, mode);
      k_write<<<kGrid, 256, 0, s>>>(a, kN, k);
      barrier.wait();  // all 4 capture now
      cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
      r.x1 = cudaThreadExchangeStreamCaptureMode(&m);
      r.malloc_rc = cudaMalloc(&b, kN * sizeof(int));
      r.free_rc = cudaFree(f);
      r.x2 = cudaThreadExchangeStreamCaptureMode(&m);
      barrier.wait();  // every thread has allocated and freed during the captures
      if (b) k_use<<<kGrid, 256, 0, s>>>(a, b, kN);
      cudaGraph_t graph = nullptr;
      r.end = cudaStreamEndCapture(s, &graph);
      barrier.wait();  // no capture is active any more
      if (r.end == cudaSuccess && graph) {
        CK(cudaGraphGetNodes(graph, nullptr, &r.nodes));
        cudaGraphExec_t exec;
        r.inst = cudaGraphInstantiate(&exec, graph, 0);
        if (r.inst == cudaSuccess) {
          r.launches_ok = launch_and_check(exec, s, b, k, &r.launch);
          CK(cudaGraphExecDestroy(exec));
        }
        CK(cudaGraphDestroy(graph));
      }
      CK(cudaStreamSynchronize(s));
      if (b) CK(cudaFree(b));
      CK(cudaFree(a));
      CK(cudaStreamDestroy(s));
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    const ThreadResult& r = res[t];
    ++g_cases;
    std::printf("threads=4 mode=%s thread=%d begin=%s exchange=%s malloc=%s free=%s exchange_back=%s end=%s nodes=%zu "
                "instantiate=%s launch=%s launches_ok=%d\n",
                mode_name(mode), t, E(r.begin), E(r.x1), E(r.malloc_rc), E(r.free_rc), E(r.x2), E(r.end), r.nodes,
                E(r.inst), E(r.launch), r.launches_ok);
    const bool ok = r.begin == cudaSuccess && r.x1 == cudaSuccess && r.malloc_rc == cudaSuccess &&
                    r.free_rc == cudaSuccess && r.x2 == cudaSuccess && r.end == cudaSuccess && r.inst == cudaSuccess &&
                    r.launches_ok == 3;
    g_failures += !ok;
  }
}

// An unsafe call on the capturing thread in a mode that prohibits it.
void prohibited_case(bool free_call, cudaStreamCaptureMode mode) {
  ++g_cases;
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int* a = nullptr;
  void* f = nullptr;
  CK(cudaMalloc(&a, kN * sizeof(int)));
  if (free_call) CK(cudaMalloc(&f, kFreeBytes));
  CK(cudaDeviceSynchronize());
  cudaGetLastError();  // a failure of an earlier case must not show up in this one
  cudaStreamCaptureMode m = mode;  // the thread takes the capture's mode, as the thread that began it
  CK(cudaThreadExchangeStreamCaptureMode(&m));
  cudaError_t begin = cudaStreamBeginCapture(s, mode);
  k_write<<<kGrid, 256, 0, s>>>(a, kN, 5);
  void* x = nullptr;
  cudaError_t rc = free_call ? cudaFree(f) : cudaMalloc(&x, kFreeBytes);
  cudaError_t peek = cudaPeekAtLastError();
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaError_t is_cap = cudaStreamIsCapturing(s, &status);
  cudaGraph_t graph = nullptr;
  cudaError_t end = cudaStreamEndCapture(s, &graph);
  cudaError_t peek_end = cudaPeekAtLastError();
  cudaError_t get = cudaGetLastError();
  cudaError_t get2 = cudaGetLastError();
  CK(cudaThreadExchangeStreamCaptureMode(&m));  // back to what the thread had
  if (graph) CK(cudaGraphDestroy(graph));
  if (!free_call && rc == cudaSuccess && x) CK(cudaFree(x));
  cudaError_t free_again = cudaSuccess;
  if (free_call) {
    free_again = cudaFree(f);  // the refused free did not free it
    cudaGetLastError();
  }
  // The stream and the context work as before.
  k_write<<<kGrid, 256, 0, s>>>(a, kN, 9);
  CK_LAUNCH();
  std::vector<int> host(kN);
  CK(cudaMemcpyAsync(host.data(), a, kN * sizeof(int), cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  bool usable = true;
  for (int i = 0; i < kN && usable; ++i) usable = host[i] == i + 9;
  CK(cudaFree(a));
  CK(cudaStreamDestroy(s));
  std::printf("prohibited call=%s mode=%s begin=%s rc=%s peek=%s is_capturing=%s status=%s end=%s graph=%s "
              "peek_after_end=%s get=%s get_again=%s",
              free_call ? "cudaFree" : "cudaMalloc", mode_name(mode), E(begin), E(rc), E(peek), E(is_cap),
              status_name(status), E(end), graph ? "made" : "none", E(peek_end), E(get), E(get2));
  if (free_call) std::printf(" free_after_capture=%s", E(free_again));
  std::printf(" stream_usable_after=%d\n", usable ? 1 : 0);
  const bool ok = begin == cudaSuccess && rc == cudaErrorStreamCaptureUnsupported &&
                  end == cudaErrorStreamCaptureInvalidated && usable;
  g_failures += !ok;
}

}  // namespace

int main() {
  compat::Verdict verdict("capture");
  CK(cudaSetDevice(0));
  cudaStream_t side, zeroer;
  CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&zeroer, cudaStreamNonBlocking));
  {  // load every kernel before any capture
    int* w = nullptr;
    CK(cudaMalloc(&w, 2 * kN * sizeof(int)));
    k_write<<<kGrid, 256>>>(w, kN, 0);
    k_use<<<kGrid, 256>>>(w, w + kN, kN);
    k_slow_write<<<1, 32>>>(reinterpret_cast<unsigned*>(w), 32, 0);
    CK_LAUNCH();
    CK(cudaDeviceSynchronize());
    CK(cudaFree(w));
  }
  const cudaStreamCaptureMode modes[] = {cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal,
                                         cudaStreamCaptureModeRelaxed};
  int k = 1;
  for (int free_case = 0; free_case < 2; ++free_case)
    for (cudaStreamCaptureMode mode : modes)
      for (int blocking = 0; blocking < 2; ++blocking) matrix_case(free_case, mode, blocking, side, zeroer, k++);
  threaded_case(cudaStreamCaptureModeGlobal);
  threaded_case(cudaStreamCaptureModeThreadLocal);
  prohibited_case(false, cudaStreamCaptureModeGlobal);
  prohibited_case(false, cudaStreamCaptureModeThreadLocal);
  prohibited_case(true, cudaStreamCaptureModeGlobal);
  CK(cudaStreamDestroy(side));
  CK(cudaStreamDestroy(zeroer));
  std::printf("# freed-while-busy buffer handed out again during the capture: %d of 6\n", g_reused);
  if (g_busy_unsafe) std::printf("ERROR: %d buffers allocated right after a free got the freed buffer's late writes\n", g_busy_unsafe);
  verdict.add("cases", g_cases);
  verdict.add("failed_cases", g_failures);
  verdict.add("busy_free_unsafe", g_busy_unsafe);
  return verdict.finish(g_failures == 0);
}
