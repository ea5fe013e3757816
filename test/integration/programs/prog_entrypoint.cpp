// Like PyTorch's expandable segments: driver functions fetched through the runtime with
// cudaGetDriverEntryPointByVersion (cuMemCreate, cuMemAddressReserve, cuMemMap, ... at 12000) and the
// older cudaGetDriverEntryPoint ("cuMemAlloc", "cuMemFree"), then used: a segment that grows by
// mapping a second chunk behind the first, written and read back through the runtime.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <vector>

#include "prog_common.hpp"

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

template <typename F>
static F entry(const char* name) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult st = cudaDriverEntryPointSymbolNotFound;
    cudaError_t e = cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &st);
    if (e != cudaSuccess || st != cudaDriverEntryPointSuccess || p == nullptr) prog::fail(__FILE__, __LINE__, name, e);
    return reinterpret_cast<F>(p);
}

int main() {
    RT(cudaFree(nullptr));
    auto Granularity = entry<decltype(&cuMemGetAllocationGranularity)>("cuMemGetAllocationGranularity");
    auto Create = entry<decltype(&cuMemCreate)>("cuMemCreate");
    auto Release = entry<decltype(&cuMemRelease)>("cuMemRelease");
    auto Reserve = entry<decltype(&cuMemAddressReserve)>("cuMemAddressReserve");
    auto AddressFree = entry<decltype(&cuMemAddressFree)>("cuMemAddressFree");
    auto Map = entry<decltype(&cuMemMap)>("cuMemMap");
    auto Unmap = entry<decltype(&cuMemUnmap)>("cuMemUnmap");
    auto SetAccess = entry<decltype(&cuMemSetAccess)>("cuMemSetAccess");
    void* pa = nullptr;
    void* pf = nullptr;
    cudaDriverEntryPointQueryResult st{};
    RT(cudaGetDriverEntryPoint("cuMemAlloc", &pa, cudaEnableDefault, &st));
    EXPECT(st == cudaDriverEntryPointSuccess && pa != nullptr);
    RT(cudaGetDriverEntryPoint("cuMemFree", &pf, cudaEnableDefault, &st));
    EXPECT(st == cudaDriverEntryPointSuccess && pf != nullptr);
    if (prog::failures()) return 1;
    auto Alloc = reinterpret_cast<decltype(&cuMemAlloc_v2)>(pa);
    auto Free = reinterpret_cast<decltype(&cuMemFree_v2)>(pf);

    long long allocs = 0, frees = 0, bytes = 0, creates = 0, releases = 0, vmm_bytes = 0, maps = 0, unmaps = 0;
    int dev = 0;
    RT(cudaGetDevice(&dev));
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    size_t g = 0;
    DRV(Granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    if (g == 0) return prog::finish(prog::Json());

    // reserve 4 chunks of address space, map 1 chunk, then grow to 2
    CUdeviceptr va = 0;
    DRV(Reserve(&va, 4 * g, 0, 0, 0));
    CUmemGenericAllocationHandle h[2] = {};
    CUmemAccessDesc acc{};
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    for (int i = 0; i < 2; ++i) {
        DRV(Create(&h[i], g, &prop, 0));
        ++creates;
        vmm_bytes += static_cast<long long>(g);
        DRV(Map(va + i * g, g, 0, h[i], 0));
        ++maps;
        DRV(SetAccess(va + i * g, g, &acc, 1));
    }
    std::vector<unsigned char> a(2 * g), b(2 * g);
    for (size_t k = 0; k < a.size(); ++k) a[k] = static_cast<unsigned char>(k * 11 + 5);
    void* seg = reinterpret_cast<void*>(va);
    RT(cudaMemcpy(seg, a.data(), a.size(), cudaMemcpyHostToDevice));
    RT(cudaMemcpy(b.data(), seg, b.size(), cudaMemcpyDeviceToHost));
    EXPECT(a == b);
    for (int i = 0; i < 2; ++i) {
        DRV(Unmap(va + i * g, g));
        ++unmaps;
        DRV(Release(h[i]));
        ++releases;
    }
    DRV(AddressFree(va, 4 * g));

    CUdeviceptr p = 0;
    DRV(Alloc(&p, 1 << 20));
    if (p) {
        ++allocs;
        bytes += 1 << 20;
        RT(cudaMemset(reinterpret_cast<void*>(p), 0x12, 1 << 20));
        unsigned char last = 0;
        RT(cudaMemcpy(&last, reinterpret_cast<void*>(p + (1 << 20) - 1), 1, cudaMemcpyDeviceToHost));
        EXPECT(last == 0x12);
        DRV(Free(p));
        ++frees;
    }
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
