// Simulated NVML: a fake libnvidia-ml.so.1 for CI machines without a GPU, with NVML's real names
// and signatures (shim/nvml_api.h). It reports the simulated devices of libcuda.so.1 as NVML
// does real ones: the whole device's memory (total, what is used on it, free), whatever a
// process's cap, and the device's UUID (the same bytes cuDeviceGetUuid_v2 gives).
//
// NVML numbers devices in PCI bus order; CUDA, by default, fastest first, and it honours
// CUDA_VISIBLE_DEVICES, which NVML ignores: the two orders need not agree. The sim numbers its
// devices in the reverse of CUDA's order, so that nothing can match them by index.
//
// The device memory lives in the simulated driver (per process: the sim has no device shared
// between processes); NVML reads it through the driver's test hook cupoolSimDeviceMemory.
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <mutex>

#pragma GCC visibility push(default)
#include "nvml_api.h"
#pragma GCC visibility pop
#include "sim_common.hpp"

struct nvmlDevice_st {
    int cuda_ordinal;
};

namespace {

constexpr int kMaxDevices = 64;

using DeviceMemoryFn = int (*)(int, unsigned long long*, unsigned long long*);

std::mutex g_mu;
int g_init_count = 0;  // nvmlInit_v2 calls not yet matched by nvmlShutdown
DeviceMemoryFn g_device_memory = nullptr;
unsigned g_count = 0;
nvmlDevice_st g_devices[kMaxDevices];

bool initialized() {
    std::lock_guard<std::mutex> lk(g_mu);
    return g_init_count > 0;
}

// The handle's device, or nullptr when it is not one of ours.
const nvmlDevice_st* device_of(nvmlDevice_t device) {
    for (unsigned i = 0; i < g_count; ++i)
        if (device == &g_devices[i]) return device;
    return nullptr;
}

nvmlReturn_t device_memory(nvmlDevice_t device, unsigned long long* total, unsigned long long* used) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    const nvmlDevice_st* d = device_of(device);
    if (d == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
    return g_device_memory(d->cuda_ordinal, total, used) == 0 ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}

}  // namespace

extern "C" {

nvmlReturn_t nvmlInit_v2(void) {
    std::lock_guard<std::mutex> lk(g_mu);
    if (g_init_count++ > 0) return NVML_SUCCESS;
    void* cuda = dlopen("libcuda.so.1", RTLD_LAZY);
    g_device_memory = cuda ? reinterpret_cast<DeviceMemoryFn>(dlsym(cuda, "cupoolSimDeviceMemory")) : nullptr;
    if (g_device_memory == nullptr) {
        g_init_count = 0;
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    unsigned long long total = 0, used = 0;
    int n = 0;
    while (n < kMaxDevices && g_device_memory(n, &total, &used) == 0) ++n;
    g_count = static_cast<unsigned>(n);
    for (int i = 0; i < n; ++i) g_devices[i].cuda_ordinal = n - 1 - i;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlShutdown(void) {
    std::lock_guard<std::mutex> lk(g_mu);
    if (g_init_count == 0) return NVML_ERROR_UNINITIALIZED;
    --g_init_count;
    return NVML_SUCCESS;
}

const char* nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* deviceCount) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    if (deviceCount == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
    *deviceCount = g_count;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    if (device == nullptr || index >= g_count) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g_devices[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char* uuid, unsigned int length) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    const nvmlDevice_st* d = device_of(device);
    if (d == nullptr || uuid == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned char b[16];
    cupool_sim::device_uuid(d->cuda_ordinal, b);
    char text[48];
    std::snprintf(text, sizeof text,
                  "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
                  b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
    if (length < std::strlen(text) + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
    std::memcpy(uuid, text, std::strlen(text) + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
    if (memory == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long total = 0, used = 0;
    if (nvmlReturn_t rc = device_memory(device, &total, &used); rc != NVML_SUCCESS) return rc;
    memory->total = total;
    memory->used = used;
    memory->free = total - used;
    return NVML_SUCCESS;
}

// The sim's driver reserves nothing of a device for itself: `reserved` is 0.
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t* memory) {
    if (memory == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned long long total = 0, used = 0;
    if (nvmlReturn_t rc = device_memory(device, &total, &used); rc != NVML_SUCCESS) return rc;
    memory->total = total;
    memory->reserved = 0;
    memory->used = used;
    memory->free = total - used;
    return NVML_SUCCESS;
}

}  // extern "C"
