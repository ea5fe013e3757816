// A plugin that reaches CUDA late: the program starts with no CUDA library loaded at all, does
// host work, then a worker thread dlopens libcuda.so.1 and finds every function with dlsym and
// cuGetProcAddress (as XLA's and TensorFlow's stream executors, and CUDA plugins of tools, do).
// Under cupool the shim is in the process long before libcuda is; what the plugin looks up must
// still be cupool's wrappers, and its buffers must read back what it wrote.
#include <cuda.h>
#include <dlfcn.h>

#include <thread>
#include <vector>

#include "common.h"

namespace {

template <typename F>
F find(void* lib, const char* name) {
  F f = reinterpret_cast<F>(dlsym(lib, name));
  if (f == nullptr) compat::die("dlsym(%s): %s", name, dlerror());
  return f;
}

}  // namespace

int main() {
  compat::Verdict v("late_dlopen");
  if (dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD) != nullptr) compat::die("libcuda was loaded at start-up");
  // Host work first: the process runs for a while without CUDA.
  std::vector<double> host(1 << 20);
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<double>(i) * 0.5;
  int bad = 0;
  std::thread plugin([&] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) compat::die("dlopen(libcuda.so.1): %s", dlerror());
    auto init = find<decltype(&cuInit)>(lib, "cuInit");
    auto get_proc = find<decltype(&cuGetProcAddress_v2)>(lib, "cuGetProcAddress_v2");
    auto device_get = find<decltype(&cuDeviceGet)>(lib, "cuDeviceGet");
    auto retain = find<decltype(&cuDevicePrimaryCtxRetain)>(lib, "cuDevicePrimaryCtxRetain");
    auto release = find<decltype(&cuDevicePrimaryCtxRelease_v2)>(lib, "cuDevicePrimaryCtxRelease_v2");
    auto set_current = find<decltype(&cuCtxSetCurrent)>(lib, "cuCtxSetCurrent");
    auto alloc = find<decltype(&cuMemAlloc_v2)>(lib, "cuMemAlloc_v2");
    if (init(0) != CUDA_SUCCESS) compat::die("cuInit");
    void* fn = nullptr;
    CUdriverProcAddressQueryResult q;
    if (get_proc("cuMemFree", &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &q) != CUDA_SUCCESS || fn == nullptr)
      compat::die("cuGetProcAddress(cuMemFree)");
    auto mem_free = reinterpret_cast<decltype(&cuMemFree_v2)>(fn);
    if (get_proc("cuMemcpyHtoD", &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &q) != CUDA_SUCCESS || fn == nullptr)
      compat::die("cuGetProcAddress(cuMemcpyHtoD)");
    auto htod = reinterpret_cast<decltype(&cuMemcpyHtoD_v2)>(fn);
    if (get_proc("cuMemcpyDtoH", &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &q) != CUDA_SUCCESS || fn == nullptr)
      compat::die("cuGetProcAddress(cuMemcpyDtoH)");
    auto dtoh = reinterpret_cast<decltype(&cuMemcpyDtoH_v2)>(fn);
    CUdevice dev;
    CUcontext ctx;
    if (device_get(&dev, 0) != CUDA_SUCCESS || retain(&ctx, dev) != CUDA_SUCCESS || set_current(ctx) != CUDA_SUCCESS)
      compat::die("the primary context");
    const std::size_t bytes = host.size() * sizeof(double);
    for (int round = 0; round < 8; ++round) {
      CUdeviceptr p = 0;
      if (alloc(&p, bytes) != CUDA_SUCCESS) compat::die("cuMemAlloc_v2");
      if (htod(p, host.data(), bytes) != CUDA_SUCCESS) compat::die("cuMemcpyHtoD");
      std::vector<double> back(host.size());
      if (dtoh(back.data(), p, bytes) != CUDA_SUCCESS) compat::die("cuMemcpyDtoH");
      if (back != host) ++bad;
      if (mem_free(p) != CUDA_SUCCESS) compat::die("cuMemFree");
    }
    release(dev);
  });
  plugin.join();
  std::printf("rounds checked: %d bad\n", bad);
  return v.finish(bad == 0);
}
