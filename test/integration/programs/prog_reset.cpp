// A context reset gives every byte back: memory from cudaMalloc and the program's own
// virtual-memory mappings (cuMemCreate + cuMemMap), allocated, some of it freed, then
// cudaDeviceReset. The driver frees cudaMalloc memory with the context but not cuMemCreate
// allocations (cuCtxDestroy's documentation says so, and the simulated driver does the same), so
// whatever cupool holds from cuMemCreate (the vmm policy's granules, the VMM cache's kept
// mappings) must be given back at the reset, or the device loses it for the rest of the process.
// The device's own count of used bytes (the simulated driver's test hook, the whole device as
// NVML sees it) must be where it was before the first allocation, after a reset and again after
// a destroyed context of the driver API.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include "prog_common.hpp"

namespace {

unsigned long long device_used() {
    using Fn = int (*)(int, unsigned long long*, unsigned long long*);
    static Fn fn = reinterpret_cast<Fn>(dlsym(dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD), "cupoolSimDeviceMemory"));
    unsigned long long total = 0, used = 0;
    if (fn == nullptr || fn(0, &total, &used) != 0) prog::fail(__FILE__, __LINE__, "cupoolSimDeviceMemory", 0);
    return used;
}

long long g_allocs = 0, g_frees = 0, g_bytes = 0, g_creates = 0, g_releases = 0, g_maps = 0, g_unmaps = 0;

void* device_malloc(size_t n) {
    void* p = nullptr;
    RT(cudaMalloc(&p, n));
    ++g_allocs;
    g_bytes += static_cast<long long>(n);
    RT(cudaMemset(p, 0x5a, n));
    return p;
}

void device_free(void* p) {
    RT(cudaFree(p));
    ++g_frees;
}

// One mapping made and given back by the program (a VMM cache may keep it).
void mapping_made_and_released(size_t size, int device) {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr va = 0;
    DRV(cuMemCreate(&h, size, &prop, 0));
    ++g_creates;
    DRV(cuMemAddressReserve(&va, size, 0, 0, 0));
    DRV(cuMemMap(va, size, 0, h, 0));
    ++g_maps;
    DRV(cuMemSetAccess(va, size, &access, 1));
    DRV(cuMemsetD8_v2(va, 0x11, size));
    DRV(cuMemUnmap(va, size));
    ++g_unmaps;
    DRV(cuMemRelease(h));
    ++g_releases;
    DRV(cuMemAddressFree(va, size));
}

// Memory of every kind in the current context: live blocks, freed blocks, a released mapping.
void use_memory() {
    void* live = device_malloc(64u << 20);
    void* small = device_malloc(3u << 20);
    device_free(device_malloc(8u << 20));
    device_free(small);
    mapping_made_and_released(2u << 20, 0);
    (void)live;  // the reset takes it
}

}  // namespace

int main() {
    RT(cudaFree(nullptr));
    const unsigned long long used0 = device_used();

    use_memory();
    EXPECT(device_used() > used0);
    RT(cudaDeviceReset());
    RT(cudaFree(nullptr));  // a new primary context
    EXPECT(device_used() == used0);

    // The same through the driver API: a context of the program's own, destroyed.
    DRV(cuInit(0));
    CUdevice dev = 0;
    DRV(cuDeviceGet(&dev, 0));
    CUcontext ctx = nullptr;
    CUcontext primary = nullptr;
    DRV(cuCtxGetCurrent(&primary));
    const unsigned long long used1 = device_used();
#if CUDA_VERSION >= 13000
    DRV(cuCtxCreate_v4(&ctx, nullptr, 0, dev));
#else
    DRV(cuCtxCreate_v2(&ctx, 0, dev));
#endif
    use_memory();
    EXPECT(device_used() > used1);
    DRV(cuCtxDestroy_v2(ctx));
    DRV(cuCtxSetCurrent(primary));
    EXPECT(device_used() == used1);

    return prog::finish(prog::Json()
                            .num("allocs", g_allocs)
                            .num("frees", g_frees)
                            .num("bytes", g_bytes)
                            .num("vmm_creates", g_creates)
                            .num("vmm_releases", g_releases)
                            .num("maps", g_maps)
                            .num("unmaps", g_unmaps));
}
