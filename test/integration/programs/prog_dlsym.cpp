// Like JAX/XLA: no runtime, no link to libcuda; dlopen("libcuda.so.1") and dlsym of the ABI names
// (cuMemAlloc_v2, cuMemFree_v2, cuMemGetInfo_v2, and the virtual-memory calls), then use them,
// including two physical chunks mapped into one reserved range, written and read back.
#include <cuda.h>

#include <dlfcn.h>

#include <vector>

#include "prog_common.hpp"

template <typename F>
static F sym(void* h, const char* name) {
    F f = reinterpret_cast<F>(dlsym(h, name));
    if (f == nullptr) prog::fail(__FILE__, __LINE__, name, 0);
    return f;
}

int main() {
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
        std::fprintf(stderr, "dlopen libcuda.so.1: %s\n", dlerror());
        return 1;
    }
    auto Init = sym<decltype(&cuInit)>(h, "cuInit");
    auto Retain = sym<decltype(&cuDevicePrimaryCtxRetain)>(h, "cuDevicePrimaryCtxRetain");
    auto Release = sym<decltype(&cuDevicePrimaryCtxRelease_v2)>(h, "cuDevicePrimaryCtxRelease_v2");
    auto SetCurrent = sym<decltype(&cuCtxSetCurrent)>(h, "cuCtxSetCurrent");
    auto Alloc = sym<decltype(&cuMemAlloc_v2)>(h, "cuMemAlloc_v2");
    auto Free = sym<decltype(&cuMemFree_v2)>(h, "cuMemFree_v2");
    auto GetInfo = sym<decltype(&cuMemGetInfo_v2)>(h, "cuMemGetInfo_v2");
    auto HtoD = sym<decltype(&cuMemcpyHtoD_v2)>(h, "cuMemcpyHtoD_v2");
    auto DtoH = sym<decltype(&cuMemcpyDtoH_v2)>(h, "cuMemcpyDtoH_v2");
    auto Granularity = sym<decltype(&cuMemGetAllocationGranularity)>(h, "cuMemGetAllocationGranularity");
    auto Create = sym<decltype(&cuMemCreate)>(h, "cuMemCreate");
    auto Reserve = sym<decltype(&cuMemAddressReserve)>(h, "cuMemAddressReserve");
    auto Map = sym<decltype(&cuMemMap)>(h, "cuMemMap");
    auto SetAccess = sym<decltype(&cuMemSetAccess)>(h, "cuMemSetAccess");
    auto Unmap = sym<decltype(&cuMemUnmap)>(h, "cuMemUnmap");
    auto MemRelease = sym<decltype(&cuMemRelease)>(h, "cuMemRelease");
    auto AddressFree = sym<decltype(&cuMemAddressFree)>(h, "cuMemAddressFree");
    if (prog::failures()) return 1;

    long long allocs = 0, frees = 0, bytes = 0, creates = 0, releases = 0, vmm_bytes = 0, maps = 0, unmaps = 0;
    DRV(Init(0));
    CUcontext ctx = nullptr;
    DRV(Retain(&ctx, 0));
    DRV(SetCurrent(ctx));
    size_t free0 = 0, total = 0;
    DRV(GetInfo(&free0, &total));
    EXPECT(total > 0);

    // plain allocations
    for (size_t n : {size_t(512), size_t(1) << 20, size_t(24) << 20}) {
        CUdeviceptr p = 0;
        DRV(Alloc(&p, n));
        if (!p) continue;
        ++allocs;
        bytes += static_cast<long long>(n);
        std::vector<unsigned char> a(n), b(n);
        for (size_t k = 0; k < n; ++k) a[k] = static_cast<unsigned char>(k ^ (k >> 8));
        DRV(HtoD(p, a.data(), n));
        DRV(DtoH(b.data(), p, n));
        EXPECT(a == b);
        DRV(Free(p));
        ++frees;
    }

    // VMM: two chunks in one reserved range
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t g = 0;
    DRV(Granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    EXPECT(g > 0);
    if (g == 0) return prog::finish(prog::Json());
    CUmemGenericAllocationHandle c1 = 0, c2 = 0;
    DRV(Create(&c1, g, &prop, 0));
    DRV(Create(&c2, g, &prop, 0));
    creates += 2;
    vmm_bytes += static_cast<long long>(2 * g);
    CUdeviceptr va = 0;
    DRV(Reserve(&va, 2 * g, 0, 0, 0));
    DRV(Map(va, g, 0, c1, 0));
    DRV(Map(va + g, g, 0, c2, 0));
    maps += 2;
    CUmemAccessDesc acc{};
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    DRV(SetAccess(va, 2 * g, &acc, 1));
    std::vector<unsigned char> a(2 * g), b(2 * g);
    for (size_t k = 0; k < a.size(); ++k) a[k] = static_cast<unsigned char>((k * 7) ^ (k >> 12));
    DRV(HtoD(va, a.data(), a.size()));  // one copy across both chunks
    DRV(DtoH(b.data(), va, b.size()));
    EXPECT(a == b);
    DRV(Unmap(va, 2 * g));
    unmaps += 1;
    DRV(MemRelease(c1));
    DRV(MemRelease(c2));
    releases += 2;
    DRV(AddressFree(va, 2 * g));

    DRV(Release(0));
    return prog::finish(prog::Json()
                            .num("allocs", allocs)
                            .num("frees", frees)
                            .num("bytes", bytes)
                            .num("vmm_creates", creates)
                            .num("vmm_releases", releases)
                            .num("vmm_bytes", vmm_bytes)
                            .num("maps", maps)
                            .num("unmaps", unmaps));
}
