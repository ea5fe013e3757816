// What the driver's virtual-memory calls cost on this GPU, per call and per size, without cupool:
// the figures behind the vmm policy's granule, its mapping batch and when it unmaps
// (docs/design.md, "The vmm policy"). One JSON line per measurement: median ns over `reps`.
//   create/map/access/unmap/release  one handle of `bytes` (2 MiB to 512 MiB)
//   run_new     a run of n 2 MiB granules as the pool maps it: n creates + n maps + one access
//   run_free    the same run given back: n unmaps + n releases
//   run_move    n granules moved to other addresses: n unmaps + n maps (same handles) + one access
//   *_busy      the same with a kernel of 20 ms queued before the call: a call that waits for
//               the device shows it in its time
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <vector>

#define CK(x)                                                                  \
  do {                                                                         \
    CUresult rc_ = (x);                                                        \
    if (rc_ != CUDA_SUCCESS) {                                                 \
      std::fprintf(stderr, "FAIL %s: %d (line %d)\n", #x, int(rc_), __LINE__); \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

static double now_ns() {
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

__global__ void spin(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

static CUmemAllocationProp g_prop{};
static CUmemAccessDesc g_access{};
static size_t g_gran = 0;

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

static void emit(const char* what, size_t bytes, int n, bool busy, double ns, double kernel_ns) {
  std::printf("{\"bench\": \"vmm_calls\", \"what\": \"%s\", \"bytes\": %zu, \"granules\": %d, \"busy\": %s, "
              "\"median_ns\": %.0f, \"kernel_ns\": %.0f}\n",
              what, bytes, n, busy ? "true" : "false", ns, kernel_ns);
  std::fflush(stdout);
}

// Queues a 20 ms kernel when `busy`, so that the timed call finds the device working.
static void maybe_busy(bool busy) {
  if (busy) spin<<<1, 1>>>(20'000'000ull);
}

static void settle() { CK(cuCtxSynchronize()); }

// One handle of `bytes`: each call timed on its own.
static void single_handle(size_t bytes, int reps, bool busy, bool report = true) {
  CUdeviceptr va;
  CK(cuMemAddressReserve(&va, bytes, 0, 0, 0));
  std::vector<double> create, map, access, unmap, release;
  for (int i = 0; i < reps; ++i) {
    CUmemGenericAllocationHandle h;
    maybe_busy(busy);
    double t0 = now_ns();
    CK(cuMemCreate(&h, bytes, &g_prop, 0));
    double t1 = now_ns();
    CK(cuMemMap(va, bytes, 0, h, 0));
    double t2 = now_ns();
    CK(cuMemSetAccess(va, bytes, &g_access, 1));
    double t3 = now_ns();
    settle();
    maybe_busy(busy);
    double t4 = now_ns();
    CK(cuMemUnmap(va, bytes));
    double t5 = now_ns();
    CK(cuMemRelease(h));
    double t6 = now_ns();
    settle();
    create.push_back(t1 - t0);
    map.push_back(t2 - t1);
    access.push_back(t3 - t2);
    unmap.push_back(t5 - t4);
    release.push_back(t6 - t5);
  }
  CK(cuMemAddressFree(va, bytes));
  if (!report) return;
  const int n = int(bytes / g_gran);
  const char* sfx = busy ? "_busy" : "";
  char name[64];
  const std::pair<const char*, std::vector<double>*> all[] = {
      {"create", &create}, {"map", &map}, {"access", &access}, {"unmap", &unmap}, {"release", &release}};
  for (const auto& [what, v] : all) {
    std::snprintf(name, sizeof name, "%s%s", what, sfx);
    emit(name, bytes, n, busy, median(*v), busy ? 20e6 : 0);
  }
}

// A run of n granules, as the pool maps, gives back and (the alternative) moves them.
static void granule_run(int n, int reps, bool busy) {
  const size_t g = g_gran, bytes = g * size_t(n);
  CUdeviceptr va, va2;
  CK(cuMemAddressReserve(&va, bytes, 0, 0, 0));
  CK(cuMemAddressReserve(&va2, bytes, 0, 0, 0));
  std::vector<double> mk, fr, mv;
  std::vector<CUmemGenericAllocationHandle> h(n);
  for (int r = 0; r < reps; ++r) {
    maybe_busy(busy);
    double t0 = now_ns();
    for (int i = 0; i < n; ++i) {
      CK(cuMemCreate(&h[i], g, &g_prop, 0));
      CK(cuMemMap(va + i * g, g, 0, h[i], 0));
    }
    CK(cuMemSetAccess(va, bytes, &g_access, 1));
    mk.push_back(now_ns() - t0);
    settle();
    maybe_busy(busy);
    t0 = now_ns();
    for (int i = 0; i < n; ++i) CK(cuMemUnmap(va + i * g, g));
    for (int i = 0; i < n; ++i) CK(cuMemMap(va2 + i * g, g, 0, h[i], 0));
    CK(cuMemSetAccess(va2, bytes, &g_access, 1));
    mv.push_back(now_ns() - t0);
    settle();
    maybe_busy(busy);
    t0 = now_ns();
    for (int i = 0; i < n; ++i) {
      CK(cuMemUnmap(va2 + i * g, g));
      CK(cuMemRelease(h[i]));
    }
    fr.push_back(now_ns() - t0);
    settle();
  }
  CK(cuMemAddressFree(va, bytes));
  CK(cuMemAddressFree(va2, bytes));
  emit(busy ? "run_new_busy" : "run_new", bytes, n, busy, median(mk), busy ? 20e6 : 0);
  emit(busy ? "run_move_busy" : "run_move", bytes, n, busy, median(mv), busy ? 20e6 : 0);
  emit(busy ? "run_free_busy" : "run_free", bytes, n, busy, median(fr), busy ? 20e6 : 0);
}

int main() {
  CK(cuInit(0));
  cudaFree(nullptr);  // the runtime's primary context, current on this thread
  CUdevice dev;
  CK(cuCtxGetDevice(&dev));
  g_prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  g_prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  g_prop.location.id = dev;
  g_access.location = g_prop.location;
  g_access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CK(cuMemGetAllocationGranularity(&g_gran, &g_prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  // Warm the driver's paths once (not reported).
  single_handle(g_gran, 3, false, false);
  for (size_t mib : {2, 8, 32, 128, 512}) single_handle(mib << 20, 15, false);
  for (int n : {1, 16, 64, 256}) granule_run(n, 9, false);
  single_handle(g_gran, 5, true);
  granule_run(16, 5, true);
  std::printf("{\"bench\": \"vmm_calls\", \"done\": true, \"granularity\": %zu}\n", g_gran);
  return 0;
}
