// Allocation+free pair cost, as the program sees it, single thread and 8 threads.
//   bench_alloc malloc   cudaMalloc+cudaFree (the pool under cupool; the driver without it)
//   bench_alloc async    cudaMallocAsync+cudaFreeAsync on a warm pool (release threshold max)
//   bench_alloc steady THREADS SECONDS   512-byte cudaMalloc+cudaFree pairs on THREADS threads that
//                        live the whole run, in batches of 10000 with a pause of 40 ms a thread after each, so
//                        that a trace writer drains between them: what a profiler samples is the
//                        traced pair with its ring never full, not a ring's first touch (issue 38)
// Prints one JSON line per (mode, bytes, threads): median ns per pair over batches of pairs.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

static double now_ns() {
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static bool g_async = false;

// Returns the per-pair median over `batches` batches of `per_batch` pairs.
static double run_thread(size_t bytes, int batches, int per_batch, cudaStream_t stream) {
  std::vector<double> samples;
  for (int b = 0; b < batches; ++b) {
    double t0 = now_ns();
    for (int i = 0; i < per_batch; ++i) {
      void* p = nullptr;
      if (g_async) {
        cudaMallocAsync(&p, bytes, stream);
        cudaFreeAsync(p, stream);
      } else {
        if (cudaMalloc(&p, bytes) != cudaSuccess) { std::printf("FAIL malloc\n"); std::exit(1); }
        cudaFree(p);
      }
    }
    samples.push_back((now_ns() - t0) / per_batch);
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

static int steady(int threads, double seconds) {
  cudaFree(nullptr);
  std::vector<std::vector<double>> per(threads);
  std::vector<std::thread> pool;
  const double end = now_ns() + seconds * 1e9;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      const auto pause = std::chrono::milliseconds(40 * threads);
      run_thread(512, 1, 10000, nullptr);  // the first batch makes the thread's ring: not counted
      std::this_thread::sleep_for(pause);
      while (now_ns() < end) {
        per[t].push_back(run_thread(512, 1, 10000, nullptr));
        std::this_thread::sleep_for(pause);
      }
    });
  for (auto& th : pool) th.join();
  std::vector<double> all;
  for (auto& v : per) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  if (all.empty()) return 1;
  std::printf("{\"bench\": \"steady\", \"bytes\": 512, \"threads\": %d, \"batches\": %zu, \"min_ns\": %.1f, "
              "\"median_ns\": %.1f, \"max_ns\": %.1f}\n",
              threads, all.size(), all.front(), all[all.size() / 2], all.back());
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 3 && std::strcmp(argv[1], "steady") == 0) return steady(std::atoi(argv[2]), std::atof(argv[3]));
  g_async = argc > 1 && std::strcmp(argv[1], "async") == 0;
  const char* label = argc > 2 ? argv[2] : (g_async ? "cudaMallocAsync" : "cudaMalloc");
  cudaFree(nullptr);
  if (g_async) {
    cudaMemPool_t pool;
    cudaDeviceGetDefaultMemPool(&pool, 0);
    uint64_t threshold = UINT64_MAX;
    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
  }
  const size_t sizes[] = {512, 1 << 20, 64 << 20};
  for (size_t bytes : sizes) {
    // Driver cudaMalloc pairs cost ~100 us: fewer of them.
    const bool slow = std::strstr(label, "driver") != nullptr;
    const int batches = slow ? 21 : 101, per_batch = slow ? 10 : 1000;
    for (int threads : {1, 8}) {
      std::vector<double> medians(threads);
      std::vector<std::thread> pool;
      std::atomic<int> ready{0};
      double t0 = now_ns();
      for (int t = 0; t < threads; ++t)
        pool.emplace_back([&, t] {
          cudaStream_t s = nullptr;
          if (g_async) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
          run_thread(bytes, 3, per_batch, s);  // warm-up
          ready++;
          while (ready.load() < threads) {}
          medians[t] = run_thread(bytes, batches, per_batch, s);
        });
      for (auto& th : pool) th.join();
      double wall = now_ns() - t0;
      std::sort(medians.begin(), medians.end());
      std::printf("{\"bench\": \"pair\", \"label\": \"%s\", \"bytes\": %zu, \"threads\": %d, \"median_ns\": %.1f, "
                  "\"wall_ms\": %.1f}\n",
                  label, bytes, threads, medians[threads / 2], wall / 1e6);
      std::fflush(stdout);
    }
  }
  return 0;
}
