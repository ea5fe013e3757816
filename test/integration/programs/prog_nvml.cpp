// NVML's memory queries must say what cudaMemGetInfo says. The program allocates on the last CUDA
// device, then asks NVML (nvmlDeviceGetMemoryInfo and _v2) about every NVML device, matched to
// CUDA devices by UUID (NVML's order is not CUDA's: the simulated NVML reverses it):
// - the device the program uses: NVML's total and free equal cudaMemGetInfo's, used = total - free;
// - a device the program never touched, and any device before the process reaches CUDA: the
//   whole device (total = cuDeviceTotalMem, nothing used);
// - NVML's own errors come back unchanged (before nvmlInit, no struct, a wrong struct version).
// It asks through the functions it links to and through dlopen + dlsym; built with
// PROG_NVML_DLOPEN_ONLY it does not link NVML and only dlopens it, as pynvml does.
// Environment: PROG_NVML_DEVICE=<CUDA ordinal> (the device to use; default the last),
// PROG_EXPECT_TOTAL=<bytes> (cudaMemGetInfo's total must be that: the cap; unset:
// the device's total), PROG_EXPECT_FREE_AT_MOST=<bytes> (a shared budget). Without cupool, NVML
// and cudaMemGetInfo both give the whole device. With CUPOOL_SIM_DEVICES=2 the NVML and CUDA
// orders differ (test/integration/check_nvml.py).
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "nvml_api.h"
#include "prog_common.hpp"

namespace {

// NVML's functions as one way of reaching them gives them.
struct Nvml {
    const char* how;
    decltype(&nvmlInit_v2) init;
    decltype(&nvmlShutdown) shutdown;
    decltype(&nvmlDeviceGetCount_v2) count;
    decltype(&nvmlDeviceGetHandleByIndex_v2) handle;
    decltype(&nvmlDeviceGetUUID) uuid;
    decltype(&nvmlDeviceGetMemoryInfo) memory;
    decltype(&nvmlDeviceGetMemoryInfo_v2) memory_v2;
};

template <typename F>
void find(void* lib, const char* name, F* out) {
    *out = reinterpret_cast<F>(dlsym(lib, name));
    if (*out == nullptr) prog::fail(__FILE__, __LINE__, name, 0);
}

Nvml by_dlsym() {
    Nvml n{"dlsym", nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
        prog::fail(__FILE__, __LINE__, "dlopen(libnvidia-ml.so.1)", 0);
        return n;
    }
    find(lib, "nvmlInit_v2", &n.init);
    find(lib, "nvmlShutdown", &n.shutdown);
    find(lib, "nvmlDeviceGetCount_v2", &n.count);
    find(lib, "nvmlDeviceGetHandleByIndex_v2", &n.handle);
    find(lib, "nvmlDeviceGetUUID", &n.uuid);
    find(lib, "nvmlDeviceGetMemoryInfo", &n.memory);
    find(lib, "nvmlDeviceGetMemoryInfo_v2", &n.memory_v2);
    return n;
}

std::vector<Nvml> ways() {
    std::vector<Nvml> w;
#ifndef PROG_NVML_DLOPEN_ONLY
    w.push_back({"symbol", &nvmlInit_v2, &nvmlShutdown, &nvmlDeviceGetCount_v2, &nvmlDeviceGetHandleByIndex_v2,
                 &nvmlDeviceGetUUID, &nvmlDeviceGetMemoryInfo, &nvmlDeviceGetMemoryInfo_v2});
#endif
    w.push_back(by_dlsym());
    return w;
}

#define NVML(call)                                                                \
    do {                                                                          \
        nvmlReturn_t n_ = (call);                                                 \
        if (n_ != NVML_SUCCESS) prog::fail(__FILE__, __LINE__, #call, n_);        \
    } while (0)

unsigned long long env_bytes(const char* name) {
    const char* s = std::getenv(name);
    return s ? std::strtoull(s, nullptr, 10) : 0;
}

// NVML's UUID text of CUDA device `dev`, as cuDeviceGetUuid gives it.
std::string cuda_uuid_text(CUdevice dev) {
    CUuuid u;
    DRV(cuDeviceGetUuid(&u, dev));
    const auto* b = reinterpret_cast<const unsigned char*>(u.bytes);
    char text[48];
    std::snprintf(text, sizeof text, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                  b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
                  b[15]);
    return text;
}

// Both memory queries of one device agree with each other; returns the v1 answer.
nvmlMemory_t ask(const Nvml& n, nvmlDevice_t d) {
    nvmlMemory_t m{};
    NVML(n.memory(d, &m));
    nvmlMemory_v2_t m2{};
    m2.version = nvmlMemory_v2;
    NVML(n.memory_v2(d, &m2));
    EXPECT(m.used == m.total - m.free);
    EXPECT(m2.total == m.total && m2.free == m.free && m2.used + m2.reserved == m.used);
    return m;
}

}  // namespace

int main() {
#ifdef PROG_NVML_DLOPEN_ONLY
    // NVML is not loaded yet: a global lookup finds nothing, as it would without cupool (whose
    // own exports of NVML's names must not answer for it).
    EXPECT(dlsym(RTLD_DEFAULT, "nvmlDeviceGetMemoryInfo") == nullptr);
    EXPECT(dlsym(RTLD_DEFAULT, "nvmlDeviceGetMemoryInfo_v2") == nullptr);
#endif
    const unsigned long long expect_total = env_bytes("PROG_EXPECT_TOTAL");
    const unsigned long long free_at_most = env_bytes("PROG_EXPECT_FREE_AT_MOST");
    std::vector<Nvml> nvml = ways();
    prog::Json out;
    if (prog::failures() != 0) return prog::finish(out);

    // NVML's own errors, whichever way it is reached.
    for (const Nvml& n : nvml) {
        nvmlMemory_t m{};
        EXPECT(n.memory(nullptr, &m) == NVML_ERROR_UNINITIALIZED);
    }
    // Before the process reaches CUDA: the whole device.
    NVML(nvml[0].init());
    unsigned count = 0;
    NVML(nvml[0].count(&count));
    std::vector<nvmlMemory_t> before(count);
    for (unsigned i = 0; i < count; ++i) {
        nvmlDevice_t d = nullptr;
        NVML(nvml[0].handle(i, &d));
        before[i] = ask(nvml[0], d);
        EXPECT(before[i].used == 0);
    }

    int devices = 0;
    RT(cudaGetDeviceCount(&devices));
    EXPECT(devices > 0 && static_cast<unsigned>(devices) == count);
    if (prog::failures() != 0) return prog::finish(out);
    const char* dev_env = std::getenv("PROG_NVML_DEVICE");
    const int used_dev = dev_env ? std::atoi(dev_env) : devices - 1;
    RT(cudaSetDevice(used_dev));
    long long allocs = 0, frees = 0, bytes = 0;
    std::vector<void*> buffers;
    for (size_t size : {8u << 20, 8u << 20, 8u << 20, 1u << 20}) {
        void* p = nullptr;
        RT(cudaMalloc(&p, size));
        if (p == nullptr) continue;
        RT(cudaMemset(p, 0x5a, size));
        buffers.push_back(p);
        ++allocs;
        bytes += static_cast<long long>(size);
    }
    RT(cudaDeviceSynchronize());
    size_t cuda_free = 0, cuda_total = 0, device_total = 0;
    RT(cudaMemGetInfo(&cuda_free, &cuda_total));
    DRV(cuDeviceTotalMem(&device_total, used_dev));
    for (unsigned i = 0; i < count; ++i) EXPECT(before[i].total == device_total);
    EXPECT(cuda_total == (expect_total ? expect_total : device_total));
    if (free_at_most) EXPECT(cuda_free <= free_at_most);

    nvmlMemory_t seen{};
    int checked = 0;
    for (const Nvml& n : nvml) {
        NVML(n.init());  // counted: each nvmlInit_v2 has its nvmlShutdown
        nvmlDevice_t d = nullptr;
        NVML(n.handle(0, &d));
        nvmlMemory_v2_t wrong{};
        wrong.version = nvmlMemory_v2 + 1;
        EXPECT(n.memory_v2(d, &wrong) == NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        EXPECT(n.memory(d, nullptr) == NVML_ERROR_INVALID_ARGUMENT);
        for (unsigned i = 0; i < count; ++i) {
            NVML(n.handle(i, &d));
            char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
            NVML(n.uuid(d, uuid, sizeof uuid));
            const nvmlMemory_t m = ask(n, d);
            if (uuid == cuda_uuid_text(used_dev)) {
                // The device in use: what cudaMemGetInfo says.
                if (m.total != cuda_total || m.free != cuda_free)
                    std::fprintf(stderr, "%s: NVML device %u says total %llu free %llu, cudaMemGetInfo %zu %zu\n",
                                 n.how, i, m.total, m.free, cuda_total, cuda_free);
                EXPECT(m.total == cuda_total && m.free == cuda_free);
                seen = m;
                ++checked;
            } else {
                // A device the process never used: all of it, free.
                EXPECT(m.total == device_total && m.free == device_total);
            }
        }
        NVML(n.shutdown());
    }
    NVML(nvml[0].shutdown());
    EXPECT(checked == static_cast<int>(nvml.size()));

#ifdef PROG_NVML_DLOPEN_ONLY
    // NVML unloaded, then loaded again at another address (the old one blocked): the functions
    // looked up again must answer. A hook that kept the first address it learnt would jump into
    // memory that is no longer NVML's.
    {
        Dl_info info{};
        EXPECT(dladdr(reinterpret_cast<void*>(nvml[0].init), &info) != 0 && info.dli_fbase != nullptr);
        void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_NOLOAD);
        EXPECT(lib != nullptr);
        dlclose(lib);  // this lookup's reference
        dlclose(lib);  // by_dlsym's
        EXPECT(dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_NOLOAD) == nullptr);  // unloaded
        const size_t blocked = 4096;  // the first page: the library cannot start there again
        void* block = mmap(info.dli_fbase, blocked, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        EXPECT(block == info.dli_fbase);
        const Nvml again = by_dlsym();
        Dl_info moved{};
        EXPECT(dladdr(reinterpret_cast<void*>(again.init), &moved) != 0 && moved.dli_fbase != info.dli_fbase);
        NVML(again.init());
        nvmlDevice_t d = nullptr;
        NVML(again.handle(0, &d));
        nvmlMemory_t m{};
        NVML(again.memory(d, &m));
        nvmlMemory_v2_t m2{};
        m2.version = nvmlMemory_v2;
        NVML(again.memory_v2(d, &m2));
        EXPECT(m.total > 0 && m2.total == m.total);
        NVML(again.shutdown());
        if (block != MAP_FAILED) munmap(block, blocked);
    }
#endif

    for (void* p : buffers) {
        RT(cudaFree(p));
        ++frees;
    }
    out.num("allocs", allocs).num("frees", frees).num("bytes", bytes);
    out.num("nvml_ways", static_cast<long long>(nvml.size())).num("device_total", static_cast<long long>(device_total));
    out.num("cuda_total", static_cast<long long>(cuda_total)).num("cuda_free", static_cast<long long>(cuda_free));
    out.num("nvml_total", static_cast<long long>(seen.total)).num("nvml_free", static_cast<long long>(seen.free));
    return prog::finish(out);
}
