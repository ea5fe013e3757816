// A program that asks NVML for memory info the way monitors and framework runtimes do, with NVML
// reached before CUDA: linked at build time (DT_NEEDED, as nvidia-smi-style tools and DCGM clients
// are; cupool at 51ba0d9 crashed them at the first query after CUDA, issue 25), or, built with
// -DCOMPAT_NVML_DLOPEN, dlopened before CUDA as pynvml does. It queries before CUDA, after
// cudaMalloc from the thread that allocated, and from a sampling thread with no CUDA context, and
// checks what a monitor relies on: every query succeeds, used = total - free, v1 and v2 agree,
// and the process's own allocation shows (free falls by at least what it holds, up to the cap).
// The numbers themselves differ under a pool and go to '#' lines.
#include <dlfcn.h>

#include <thread>

#include "common.h"
#include "nvml_api.h"

namespace {

struct Nvml {
  decltype(&nvmlInit_v2) init = nullptr;
  decltype(&nvmlShutdown) shutdown = nullptr;
  decltype(&nvmlDeviceGetCount_v2) count = nullptr;
  decltype(&nvmlDeviceGetHandleByIndex_v2) handle = nullptr;
  decltype(&nvmlDeviceGetUUID) uuid = nullptr;
  decltype(&nvmlDeviceGetMemoryInfo) memory = nullptr;
  decltype(&nvmlDeviceGetMemoryInfo_v2) memory_v2 = nullptr;
};

Nvml load() {
  Nvml n;
#ifdef COMPAT_NVML_DLOPEN
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) compat::die("dlopen(libnvidia-ml.so.1): %s", dlerror());
  n.init = reinterpret_cast<decltype(n.init)>(dlsym(lib, "nvmlInit_v2"));
  n.shutdown = reinterpret_cast<decltype(n.shutdown)>(dlsym(lib, "nvmlShutdown"));
  n.count = reinterpret_cast<decltype(n.count)>(dlsym(lib, "nvmlDeviceGetCount_v2"));
  n.handle = reinterpret_cast<decltype(n.handle)>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
  n.uuid = reinterpret_cast<decltype(n.uuid)>(dlsym(lib, "nvmlDeviceGetUUID"));
  n.memory = reinterpret_cast<decltype(n.memory)>(dlsym(lib, "nvmlDeviceGetMemoryInfo"));
  n.memory_v2 = reinterpret_cast<decltype(n.memory_v2)>(dlsym(lib, "nvmlDeviceGetMemoryInfo_v2"));
  if (!n.init || !n.shutdown || !n.count || !n.handle || !n.uuid || !n.memory || !n.memory_v2)
    compat::die("an NVML function is missing");
#else
  n = {&nvmlInit_v2, &nvmlShutdown, &nvmlDeviceGetCount_v2, &nvmlDeviceGetHandleByIndex_v2,
       &nvmlDeviceGetUUID, &nvmlDeviceGetMemoryInfo, &nvmlDeviceGetMemoryInfo_v2};
#endif
  return n;
}

int bad = 0;

nvmlMemory_t query(const Nvml& n, nvmlDevice_t d, const char* when) {
  nvmlMemory_t m{};
  nvmlMemory_v2_t v2{};
  v2.version = nvmlMemory_v2;
  const nvmlReturn_t r1 = n.memory(d, &m), r2 = n.memory_v2(d, &v2);
  if (r1 != NVML_SUCCESS || r2 != NVML_SUCCESS) {
    std::printf("%s: nvmlDeviceGetMemoryInfo %d, _v2 %d\n", when, r1, r2);
    ++bad;
    return m;
  }
  // Only what holds on a real driver while other processes allocate beside this one: between the
  // two queries free memory may move, and NVML's v1 "used" counts what v2 calls "reserved".
  if (m.free > m.total || m.used > m.total || v2.free > v2.total || v2.total != m.total) {
    std::printf("%s: inconsistent memory info\n", when);
    ++bad;
  }
  std::printf("# %s: total %llu free %llu used %llu; v2 free %llu reserved %llu\n", when, m.total, m.free, m.used,
              v2.free, v2.reserved);
  return m;
}

}  // namespace

int main() {
  compat::Verdict v(
#ifdef COMPAT_NVML_DLOPEN
      "nvml_dlopen_first"
#else
      "nvml_linked"
#endif
  );
  const Nvml n = load();
  if (n.init() != NVML_SUCCESS) compat::die("nvmlInit_v2 failed");
  unsigned count = 0;
  if (n.count(&count) != NVML_SUCCESS || count == 0) compat::die("no NVML device");
  // The CUDA device 0 is the NVML device with its UUID (NVML ignores CUDA_VISIBLE_DEVICES).
  cudaDeviceProp prop{};
  int device = 0;
  char want[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
  for (unsigned i = 0; i < count; ++i) {
    nvmlDevice_t d;
    if (n.handle(i, &d) == NVML_SUCCESS) query(n, d, "before CUDA");
  }
  compat::check_rt(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties", __FILE__, __LINE__);
  const unsigned char* b = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
  std::snprintf(want, sizeof want, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  nvmlDevice_t mine = nullptr;
  for (unsigned i = 0; i < count && !mine; ++i) {
    nvmlDevice_t d;
    char text[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
    if (n.handle(i, &d) == NVML_SUCCESS && n.uuid(d, text, sizeof text) == NVML_SUCCESS &&
        std::strcmp(text, want) == 0)
      mine = d;
  }
  if (mine == nullptr) compat::die("no NVML device has CUDA device 0's UUID");
  query(n, mine, "CUDA initialised");
  const std::size_t bytes = 256ull << 20;
  void* p = nullptr;
  compat::check_rt(cudaMalloc(&p, bytes), "cudaMalloc", __FILE__, __LINE__);
  compat::check_rt(cudaMemset(p, 0x11, bytes), "cudaMemset", __FILE__, __LINE__);
  compat::check_rt(cudaDeviceSynchronize(), "cudaDeviceSynchronize", __FILE__, __LINE__);
  const nvmlMemory_t after = query(n, mine, "after cudaMalloc");
  nvmlMemory_t sampled{};
  std::thread sampler([&] { sampled = query(n, mine, "sampling thread without a context"); });
  sampler.join();
  if (sampled.total != after.total) {
    std::printf("a thread without a context sees another total\n");
    ++bad;
  }
  for (unsigned i = 0; i < count; ++i) {  // every device, as a monitor lists them
    nvmlDevice_t d;
    if (n.handle(i, &d) == NVML_SUCCESS) query(n, d, "every device");
  }
  compat::check_rt(cudaFree(p), "cudaFree", __FILE__, __LINE__);
  query(n, mine, "after cudaFree");
  if (n.shutdown() != NVML_SUCCESS) ++bad;
  std::printf("nvml queries checked\n");
  v.add("devices_listed", count > 0);
  return v.finish(bad == 0);
}
