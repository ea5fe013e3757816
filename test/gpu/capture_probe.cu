// What the driver itself does around stream capture, destroyed streams, per-thread default
// streams, arrays, graph memory and the runtime's last error: the facts cupool must reproduce
// (docs/design.md, "Stream capture"). Runs without cupool; prints one line per case:
//   case=<name> mode=<capture mode> stream=<nb|blk> thread=<same|other>:<thread mode>
//   rc=<the call's code> status=<capture status after it> end=<cuStreamEndCapture>
//   launch=<instantiate+launch of the graph> ms=<host time of the call>
#include <cuda.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <thread>

__global__ void spin(unsigned long long ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  while (now - start < ns);
}
__global__ void touch(int* p) {
  if (p) p[threadIdx.x] += 1;
}

static double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

static const char* mode_name(cudaStreamCaptureMode m) {
  return m == cudaStreamCaptureModeGlobal ? "global" : m == cudaStreamCaptureModeThreadLocal ? "thread_local" : "relaxed";
}

static int g_failures = 0;
#define MUST(x)                                                                      \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::printf("probe setup failed: %s: %s\n", #x, cudaGetErrorName(e_));        \
      ++g_failures;                                                                  \
    }                                                                                \
  } while (0)

struct Fixture {
  cudaStream_t other = nullptr;  // an idle non-blocking stream, never captured
  cudaEvent_t done = nullptr;    // recorded on `other` and complete
  cudaEvent_t fresh = nullptr;
  void* spare = nullptr;         // freed by the cudaFree case (re-made each time)
};

// One case: begin a capture on a new stream, enqueue a kernel, run `call` (on this thread or on
// another one whose capture mode is `other_mode`), enqueue another kernel, end, launch.
static void run_case(const char* name, cudaStreamCaptureMode mode, bool blocking, bool other_thread,
                     cudaStreamCaptureMode thread_mode, Fixture& fx, const std::function<int(Fixture&, cudaStream_t)>& call) {
  cudaStream_t s;
  MUST(cudaStreamCreateWithFlags(&s, blocking ? cudaStreamDefault : cudaStreamNonBlocking));
  MUST(cudaMalloc(&fx.spare, 1 << 20));
  MUST(cudaDeviceSynchronize());
  int rc = -1;
  double ms = 0;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaError_t begin = cudaStreamBeginCapture(s, mode);
  touch<<<1, 32, 0, s>>>(nullptr);
  auto body = [&] {
    cudaStreamCaptureMode m = thread_mode;
    cudaThreadExchangeStreamCaptureMode(&m);
    auto t0 = std::chrono::steady_clock::now();
    rc = call(fx, s);
    ms = ms_since(t0);
    cudaThreadExchangeStreamCaptureMode(&m);
  };
  if (other_thread) std::thread(body).join();
  else body();
  cudaStreamIsCapturing(s, &status);
  touch<<<1, 32, 0, s>>>(nullptr);
  cudaGraph_t g = nullptr;
  cudaError_t end = cudaStreamEndCapture(s, &g);
  cudaError_t launch = cudaErrorUnknown;
  if (end == cudaSuccess && g) {
    cudaGraphExec_t ge;
    launch = cudaGraphInstantiate(&ge, g, 0);
    if (launch == cudaSuccess) {
      launch = cudaGraphLaunch(ge, s);
      if (launch == cudaSuccess) launch = cudaStreamSynchronize(s);
      cudaGraphExecDestroy(ge);
    }
    cudaGraphDestroy(g);
  }
  cudaGetLastError();
  cudaDeviceSynchronize();
  cudaGetLastError();
  if (fx.spare) cudaFree(fx.spare);
  fx.spare = nullptr;
  cudaGetLastError();
  cudaStreamDestroy(s);
  std::printf("case=%s mode=%s stream=%s thread=%s:%s begin=%d rc=%d status=%d end=%s launch=%s ms=%.2f\n", name,
              mode_name(mode), blocking ? "blk" : "nb", other_thread ? "other" : "same", mode_name(thread_mode), begin,
              rc, static_cast<int>(status), cudaGetErrorName(end), cudaGetErrorName(launch), ms);
}

int main() {
  MUST(cudaFree(nullptr));
  Fixture fx;
  MUST(cudaStreamCreateWithFlags(&fx.other, cudaStreamNonBlocking));
  MUST(cudaEventCreateWithFlags(&fx.done, cudaEventDisableTiming));
  MUST(cudaEventCreateWithFlags(&fx.fresh, cudaEventDisableTiming));
  MUST(cudaEventRecord(fx.done, fx.other));
  MUST(cudaEventSynchronize(fx.done));
  int version = 0;
  cuDriverGetVersion(&version);
  std::printf("driver_version=%d\n", version);

  struct Call {
    const char* name;
    std::function<int(Fixture&, cudaStream_t)> fn;
  };
  const Call calls[] = {
      {"cudaMalloc", [](Fixture&, cudaStream_t) { void* p = nullptr; int r = cudaMalloc(&p, 1 << 20); if (r == 0) cudaFree(p); return r; }},
      {"cudaFree", [](Fixture& f, cudaStream_t) { int r = cudaFree(f.spare); if (r == 0) f.spare = nullptr; return r; }},
      {"cudaFree_busy_other", [](Fixture& f, cudaStream_t) {
         spin<<<1, 1, 0, f.other>>>(50'000'000ull);
         int r = cudaFree(f.spare); if (r == 0) f.spare = nullptr; return r; }},
      {"cuMemAlloc", [](Fixture&, cudaStream_t) { CUdeviceptr p = 0; int r = cuMemAlloc(&p, 1 << 20); if (r == 0) cuMemFree(p); return r; }},
      {"cuMemFree", [](Fixture& f, cudaStream_t) { int r = cuMemFree(reinterpret_cast<CUdeviceptr>(f.spare)); if (r == 0) f.spare = nullptr; return r; }},
      {"cuCtxSynchronize", [](Fixture&, cudaStream_t) { return static_cast<int>(cuCtxSynchronize()); }},
      {"cuStreamQuery_other", [](Fixture& f, cudaStream_t) { return static_cast<int>(cuStreamQuery(reinterpret_cast<CUstream>(f.other))); }},
      {"cuStreamQuery_capturing", [](Fixture&, cudaStream_t s) { return static_cast<int>(cuStreamQuery(reinterpret_cast<CUstream>(s))); }},
      {"cuEventQuery_done", [](Fixture& f, cudaStream_t) { return static_cast<int>(cuEventQuery(reinterpret_cast<CUevent>(f.done))); }},
      {"cuEventSynchronize_done", [](Fixture& f, cudaStream_t) { return static_cast<int>(cuEventSynchronize(reinterpret_cast<CUevent>(f.done))); }},
      {"cuEventRecord_legacy", [](Fixture& f, cudaStream_t) { return static_cast<int>(cuEventRecord(reinterpret_cast<CUevent>(f.fresh), CU_STREAM_LEGACY)); }},
      {"cuEventRecord_other", [](Fixture& f, cudaStream_t) { return static_cast<int>(cuEventRecord(reinterpret_cast<CUevent>(f.fresh), reinterpret_cast<CUstream>(f.other))); }},
      {"cuStreamSynchronize_other", [](Fixture& f, cudaStream_t) { return static_cast<int>(cuStreamSynchronize(reinterpret_cast<CUstream>(f.other))); }},
      {"cuStreamIsCapturing_legacy", [](Fixture&, cudaStream_t) { CUstreamCaptureStatus st; return static_cast<int>(cuStreamIsCapturing(CU_STREAM_LEGACY, &st)); }},
      {"cuStreamGetCaptureInfo_legacy", [](Fixture&, cudaStream_t) { CUstreamCaptureStatus st; return static_cast<int>(cuStreamGetCaptureInfo(CU_STREAM_LEGACY, &st, nullptr, nullptr, nullptr, nullptr, nullptr)); }},
      {"cuStreamCreate", [](Fixture&, cudaStream_t) { CUstream t; int r = cuStreamCreate(&t, CU_STREAM_NON_BLOCKING); if (r == 0) cuStreamDestroy(t); return r; }},
      {"cuThreadExchangeStreamCaptureMode", [](Fixture&, cudaStream_t) { CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED; int r = cuThreadExchangeStreamCaptureMode(&m); cuThreadExchangeStreamCaptureMode(&m); return r; }},
      {"cudaMallocAsync_capturing", [](Fixture&, cudaStream_t s) { void* p = nullptr; int r = cudaMallocAsync(&p, 1 << 20, s); if (r == 0) cudaFreeAsync(p, s); return r; }},
  };
  const cudaStreamCaptureMode modes[] = {cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal,
                                         cudaStreamCaptureModeRelaxed};
  for (const Call& c : calls)
    for (cudaStreamCaptureMode mode : modes)
      for (bool blocking : {false, true}) {
        run_case(c.name, mode, blocking, false, mode, fx, c.fn);                            // the capturing thread, as it began
        run_case(c.name, mode, blocking, false, cudaStreamCaptureModeRelaxed, fx, c.fn);    // it, switched to relaxed
        run_case(c.name, mode, blocking, true, cudaStreamCaptureModeGlobal, fx, c.fn);      // another thread, default mode
        run_case(c.name, mode, blocking, true, cudaStreamCaptureModeThreadLocal, fx, c.fn);
        run_case(c.name, mode, blocking, true, cudaStreamCaptureModeRelaxed, fx, c.fn);
      }

  // Destroyed streams: does an event on the legacy stream, recorded after a stream with queued
  // work was destroyed, wait for that work? (blocking and non-blocking)
  for (bool blocking : {false, true}) {
    cudaStream_t s;
    MUST(cudaStreamCreateWithFlags(&s, blocking ? cudaStreamDefault : cudaStreamNonBlocking));
    spin<<<1, 1, 0, s>>>(100'000'000ull);
    auto t0 = std::chrono::steady_clock::now();
    MUST(cudaStreamDestroy(s));
    double destroy_ms = ms_since(t0);
    MUST(cudaEventRecord(fx.fresh, cudaStreamLegacy));
    MUST(cudaEventSynchronize(fx.fresh));
    double legacy_ms = ms_since(t0);
    MUST(cudaDeviceSynchronize());
    std::printf("destroyed_stream=%s destroy_ms=%.2f legacy_event_waited_ms=%.2f total_ms=%.2f\n",
                blocking ? "blk" : "nb", destroy_ms, legacy_ms, ms_since(t0));
  }
  // Per-thread default stream of another thread: does a legacy-stream event wait for it?
  {
    auto t0 = std::chrono::steady_clock::now();
    std::thread([] { spin<<<1, 1, 0, cudaStreamPerThread>>>(100'000'000ull); }).join();
    MUST(cudaEventRecord(fx.fresh, cudaStreamLegacy));
    MUST(cudaEventSynchronize(fx.fresh));
    double legacy_ms = ms_since(t0);
    MUST(cudaDeviceSynchronize());
    std::printf("per_thread_stream legacy_event_waited_ms=%.2f\n", legacy_ms);
    // And two per-thread streams: does thread B's work wait for thread A's? (expect no)
    int* flag = nullptr;
    MUST(cudaMalloc(&flag, 4));
    t0 = std::chrono::steady_clock::now();
    std::thread([] { spin<<<1, 1, 0, cudaStreamPerThread>>>(100'000'000ull); }).join();
    double b_ms = 0;
    std::thread([&] {
      auto t1 = std::chrono::steady_clock::now();
      touch<<<1, 1, 0, cudaStreamPerThread>>>(flag);
      cudaStreamSynchronize(cudaStreamPerThread);
      b_ms = ms_since(t1);
    }).join();
    MUST(cudaDeviceSynchronize());
    std::printf("per_thread_streams_independent b_waited_ms=%.2f\n", b_ms);
    cudaFree(flag);
  }
  // Arrays: what they take, what cudaMemGetInfo sees.
  {
    size_t f0 = 0, f1 = 0, t = 0;
    cudaMemGetInfo(&f0, &t);
    cudaArray_t a;
    cudaChannelFormatDesc d = cudaCreateChannelDesc<float>();
    cudaError_t r = cudaMalloc3DArray(&a, &d, make_cudaExtent(8192, 8192, 0));
    cudaMemGetInfo(&f1, &t);
    CUDA_ARRAY_MEMORY_REQUIREMENTS req{};
    CUresult rq = cuArrayGetMemoryRequirements(&req, reinterpret_cast<CUarray>(a), 0);
    std::printf("array3d rc=%d meminfo_delta=%zu req_rc=%d req_size=%zu req_align=%zu\n", r, f0 - f1, rq, req.size,
                req.alignment);
    cudaArray_t b;
    r = cudaMallocArray(&b, &d, 1000, 1000);
    size_t f2 = 0;
    cudaMemGetInfo(&f2, &t);
    rq = cuArrayGetMemoryRequirements(&req, reinterpret_cast<CUarray>(b), 0);
    std::printf("array2d 1000x1000 rc=%d meminfo_delta=%zu req_rc=%d req_size=%zu\n", r, f1 - f2, rq, req.size);
    cudaFreeArray(a);
    cudaFreeArray(b);
  }
  // Graph memory: a captured cudaMallocAsync/cudaFreeAsync pair of 64 MiB.
  {
    cudaStream_t s;
    MUST(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    auto attr = [](cudaGraphMemAttributeType a) {
      unsigned long long v = 0;
      cudaDeviceGetGraphMemAttribute(0, a, &v);
      return v;
    };
    size_t f0 = 0, f1 = 0, f2 = 0, t = 0;
    cudaMemGetInfo(&f0, &t);
    cudaGraph_t g;
    MUST(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    void* p = nullptr;
    MUST(cudaMallocAsync(&p, 64 << 20, s));
    touch<<<1, 32, 0, s>>>(static_cast<int*>(p));
    MUST(cudaFreeAsync(p, s));
    MUST(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t ge;
    MUST(cudaGraphInstantiate(&ge, g, 0));
    unsigned long long r_inst = attr(cudaGraphMemAttrReservedMemCurrent);
    MUST(cudaGraphLaunch(ge, s));
    MUST(cudaStreamSynchronize(s));
    cudaMemGetInfo(&f1, &t);
    unsigned long long r_launch = attr(cudaGraphMemAttrReservedMemCurrent), u_launch = attr(cudaGraphMemAttrUsedMemCurrent);
    MUST(cudaDeviceGraphMemTrim(0));
    cudaMemGetInfo(&f2, &t);
    unsigned long long r_trim = attr(cudaGraphMemAttrReservedMemCurrent);
    std::printf("graph_mem reserved_after_instantiate=%llu reserved_after_launch=%llu used_after_launch=%llu meminfo_delta_launch=%lld reserved_after_trim=%llu meminfo_delta_trim=%lld\n",
                r_inst, r_launch, u_launch, static_cast<long long>(f0) - static_cast<long long>(f1), r_trim,
                static_cast<long long>(f0) - static_cast<long long>(f2));
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaStreamDestroy(s);
  }
  // The runtime's last error after a refusal of each allocating call.
  {
    void* p = nullptr;
    size_t pitch = 0;
    const size_t huge = size_t{1} << 50;
    cudaGetLastError();
    int r = cudaMalloc(&p, huge);
    std::printf("last_error cudaMalloc rc=%d last=%d\n", r, cudaGetLastError());
    r = cudaMallocManaged(&p, huge);
    std::printf("last_error cudaMallocManaged rc=%d last=%d\n", r, cudaGetLastError());
    r = cudaMallocAsync(&p, huge, 0);
    std::printf("last_error cudaMallocAsync rc=%d last=%d\n", r, cudaGetLastError());
    r = cudaMallocPitch(&p, &pitch, size_t{1} << 25, size_t{1} << 25);
    std::printf("last_error cudaMallocPitch rc=%d last=%d\n", r, cudaGetLastError());
    cudaArray_t a;
    cudaChannelFormatDesc d = cudaCreateChannelDesc<float>();
    r = cudaMalloc3DArray(&a, &d, make_cudaExtent(16384, 16384, 2048));
    std::printf("last_error cudaMalloc3DArray rc=%d last=%d peek_after=%d\n", r, cudaGetLastError(), cudaPeekAtLastError());
    r = cudaMalloc(&p, huge);
    std::printf("last_error peek cudaMalloc rc=%d peek=%d peek2=%d get=%d get2=%d\n", r, cudaPeekAtLastError(),
                cudaPeekAtLastError(), cudaGetLastError(), cudaGetLastError());
  }
  std::printf("probe_failures=%d\n", g_failures);
  return g_failures ? 1 : 0;
}
