// What the driver's virtual-memory calls cost on this GPU, per call and per size, without cupool:
// the figures behind the vmm policy's granule, its mapping batch and when it unmaps
// (docs/design.md, "The vmm policy"). One JSON line per measurement: median ns over `reps`.
//   create/map/access/unmap/release  one handle of `bytes` (2 MiB to 512 MiB)
//   run_new     a run of n 2 MiB granules as the pool maps it: n creates + n maps + one access
//   run_free    the same run given back: n unmaps + n releases
//   run_move    n granules moved to other addresses: n unmaps + n maps (same handles) + one access
//   *_busy      the same with a kernel of 20 ms queued before the call: a call that waits for
//               the device shows it in its time
// `bench_vmm_calls handle-types` measures instead what asking for shareable handle types at
// cuMemCreate costs (issue 29: the vmm policy's granules shared over CUDA IPC): one 2 MiB granule
// created, mapped, given access, unmapped and released with requestedHandleTypes 0, POSIX file
// descriptor and (where the device says it supports it) fabric, in alternating rounds; and what
// exporting one granule's handle, and importing it back, costs. One JSON line (bench
// vmm_handle_types): per kind the median, min and max over rounds of each round's median.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <string>
#include <unistd.h>
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

// ---- handle-types --------------------------------------------------------------------------
struct Kind {
  const char* name;
  CUmemAllocationHandleType type;
  std::string state = "measured";  // or why it was not
  std::vector<double> cycle, create, release, exported, imported;  // per round: the median
};

static std::string stats(const std::vector<double>& v) {
  if (v.empty()) return "null";
  std::vector<double> s = v;
  std::sort(s.begin(), s.end());
  char b[160];
  std::snprintf(b, sizeof b, "{\"median\": %.0f, \"min\": %.0f, \"max\": %.0f, \"rounds\": %zu}", s[s.size() / 2],
                s.front(), s.back(), s.size());
  return b;
}

// One granule of `k`'s handle type exported to a shareable handle and imported back (the import
// in this process stands for the importer's): both timed; false with the driver's code if either
// call is refused.
static CUresult export_import(Kind& k, const CUmemAllocationProp& prop, double* export_ns, double* import_ns) {
  CUmemGenericAllocationHandle h, back;
  CUresult rc = cuMemCreate(&h, g_gran, &prop, 0);
  if (rc != CUDA_SUCCESS) return rc;
  int fd = -1;
  CUmemFabricHandle fabric{};
  void* out = k.type == CU_MEM_HANDLE_TYPE_FABRIC ? static_cast<void*>(&fabric) : static_cast<void*>(&fd);
  double t0 = now_ns();
  rc = cuMemExportToShareableHandle(out, h, k.type, 0);
  double t1 = now_ns();
  if (rc == CUDA_SUCCESS) {
    void* in = k.type == CU_MEM_HANDLE_TYPE_FABRIC ? static_cast<void*>(&fabric)
                                                   : reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd));
    double t2 = now_ns();
    rc = cuMemImportFromShareableHandle(&back, in, k.type);
    double t3 = now_ns();
    if (rc == CUDA_SUCCESS) CK(cuMemRelease(back));
    *export_ns = t1 - t0;
    *import_ns = t3 - t2;
  }
  if (fd >= 0) close(fd);
  CK(cuMemRelease(h));
  return rc;
}

static int handle_types(CUdevice dev, int rounds, int iters) {
  int posix = 0, fabric = 0;
  CK(cuDeviceGetAttribute(&posix, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev));
  CK(cuDeviceGetAttribute(&fabric, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, dev));
  std::vector<Kind> kinds = {{"none", CUmemAllocationHandleType(0)},
                             {"posix_fd", CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR},
                             {"fabric", CU_MEM_HANDLE_TYPE_FABRIC}};
  if (!posix) kinds[1].state = "not supported (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED 0)";
  if (!fabric) kinds[2].state = "not supported (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED 0)";
  // A kind the driver refuses at cuMemCreate or at export is recorded with its code, not measured.
  for (auto& k : kinds) {
    if (k.state != "measured") continue;
    CUmemAllocationProp prop = g_prop;
    prop.requestedHandleTypes = k.type;
    CUmemGenericAllocationHandle h;
    if (CUresult rc = cuMemCreate(&h, g_gran, &prop, 0); rc != CUDA_SUCCESS) {
      k.state = "cuMemCreate refused: " + std::to_string(int(rc));
      continue;
    }
    CK(cuMemRelease(h));
    double e, i;
    if (k.type != 0)
      if (CUresult rc = export_import(k, prop, &e, &i); rc != CUDA_SUCCESS)
        k.state = "measured; export or import refused: " + std::to_string(int(rc));
  }
  CUdeviceptr va;
  CK(cuMemAddressReserve(&va, g_gran, 0, 0, 0));
  std::vector<double> cyc, cre, rel, exp, imp;
  for (int r = 0; r < rounds + 1; ++r) {  // round 0 warms every path and is not reported
    for (size_t n = 0; n < kinds.size(); ++n) {
      Kind& k = kinds[(n + size_t(r)) % kinds.size()];  // each round starts with the next kind
      if (k.state.rfind("measured", 0) != 0) continue;
      CUmemAllocationProp prop = g_prop;
      prop.requestedHandleTypes = k.type;
      cyc.clear(), cre.clear(), rel.clear(), exp.clear(), imp.clear();
      for (int i = 0; i < iters; ++i) {
        CUmemGenericAllocationHandle h;
        double t0 = now_ns();
        CK(cuMemCreate(&h, g_gran, &prop, 0));
        double t1 = now_ns();
        CK(cuMemMap(va, g_gran, 0, h, 0));
        CK(cuMemSetAccess(va, g_gran, &g_access, 1));
        CK(cuMemUnmap(va, g_gran));
        double t2 = now_ns();
        CK(cuMemRelease(h));
        double t3 = now_ns();
        cyc.push_back(t3 - t0);
        cre.push_back(t1 - t0);
        rel.push_back(t3 - t2);
      }
      if (k.type != 0 && k.state == "measured")
        for (int i = 0; i < iters / 4; ++i) {
          double e = 0, m = 0;
          if (export_import(k, prop, &e, &m) != CUDA_SUCCESS) break;
          exp.push_back(e);
          imp.push_back(m);
        }
      if (r == 0) continue;
      k.cycle.push_back(median(cyc));
      k.create.push_back(median(cre));
      k.release.push_back(median(rel));
      if (!exp.empty()) k.exported.push_back(median(exp)), k.imported.push_back(median(imp));
    }
  }
  CK(cuMemAddressFree(va, g_gran));
  std::string out = "{\"bench\": \"vmm_handle_types\", \"granule\": " + std::to_string(g_gran) +
                    ", \"rounds\": " + std::to_string(rounds) + ", \"iterations_per_round\": " + std::to_string(iters) +
                    ", \"export_iterations_per_round\": " + std::to_string(iters / 4) +
                    ", \"posix_fd_supported\": " + std::to_string(posix) + ", \"fabric_supported\": " + std::to_string(fabric) +
                    ", \"cycle\": \"cuMemCreate+cuMemMap+cuMemSetAccess+cuMemUnmap+cuMemRelease of one granule, ns\", \"kinds\": {";
  for (size_t n = 0; n < kinds.size(); ++n) {
    const Kind& k = kinds[n];
    out += std::string(n ? ", " : "") + "\"" + k.name + "\": {\"state\": \"" + k.state + "\", \"cycle_ns\": " +
           stats(k.cycle) + ", \"create_ns\": " + stats(k.create) + ", \"release_ns\": " + stats(k.release) +
           ", \"export_ns\": " + stats(k.exported) + ", \"import_ns\": " + stats(k.imported) + "}";
  }
  const auto ratio = [&](size_t n) {
    if (kinds[0].cycle.empty() || kinds[n].cycle.empty()) return std::string("null");
    char b[32];
    std::snprintf(b, sizeof b, "%.4f", median(kinds[n].cycle) / median(kinds[0].cycle));
    return std::string(b);
  };
  out += "}, \"cycle_over_none\": {\"posix_fd\": " + ratio(1) + ", \"fabric\": " + ratio(2) + "}}";
  std::printf("%s\n", out.c_str());
  std::fflush(stdout);
  return 0;
}

int main(int argc, char** argv) {
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
  if (argc > 1 && !std::strcmp(argv[1], "handle-types"))
    return handle_types(dev, argc > 2 ? std::atoi(argv[2]) : 7, argc > 3 ? std::atoi(argv[3]) : 200);
  // Warm the driver's paths once (not reported).
  single_handle(g_gran, 3, false, false);
  for (size_t mib : {2, 8, 32, 128, 512}) single_handle(mib << 20, 15, false);
  for (int n : {1, 16, 64, 256}) granule_run(n, 9, false);
  single_handle(g_gran, 5, true);
  granule_run(16, 5, true);
  std::printf("{\"bench\": \"vmm_calls\", \"done\": true, \"granularity\": %zu}\n", g_gran);
  return 0;
}
