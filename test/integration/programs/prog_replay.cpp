// A deterministic single-threaded workload for replay: cudaMalloc of sizes from 256 bytes to 24
// MiB, freed in a scrambled order, with managed and stream-ordered allocations, pitched ones, and
// (with PROG_VMM=1) whole VMM mappings made and dropped like XLA's. Under a cap some allocations
// are refused: that is part of what a replay must reproduce, so a refusal is not a failure here
// (any error other than out-of-memory is). One thread, no streams of its own: what happens does
// not depend on timing, so `cupool replay --policy recorded` of its trace must find exactly the
// reserved bytes and out-of-memory events of the run (test/integration/check_replay_exact.py).
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdlib>
#include <vector>

#include "prog_common.hpp"

namespace {

std::uint64_t g_x = 0x2545F4914F6CDD1DULL;
std::uint64_t next() {  // xorshift64: the same numbers everywhere
    g_x ^= g_x << 13;
    g_x ^= g_x >> 7;
    g_x ^= g_x << 17;
    return g_x;
}

struct Buffer {
    void* ptr;
    bool managed;
    bool async;
};

struct Mapping {
    CUmemGenericAllocationHandle handle;
    CUdeviceptr va;
    size_t size;
};

}  // namespace

int main() {
    long long allocs = 0, frees = 0, refused = 0, bytes = 0, vmm_creates = 0, vmm_releases = 0, maps = 0, unmaps = 0;
    const bool vmm = std::getenv("PROG_VMM") && std::getenv("PROG_VMM")[0] == '1';
    RT(cudaFree(nullptr));
    std::vector<Buffer> live;
    std::vector<Mapping> mappings;

    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t granularity = 2u << 20;
    if (vmm) DRV(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));

    for (int step = 0; step < 600; ++step) {
        const std::uint64_t r = next();
        const int what = static_cast<int>(r % 16);
        if (what < 9 || live.empty()) {
            // Sizes spread over orders of magnitude, as a framework's tensors are.
            const size_t size = static_cast<size_t>(256) << (next() % 17) | static_cast<size_t>(next() % 4096);
            Buffer b{nullptr, what == 1, what == 2};
            cudaError_t e;
            if (b.managed) e = cudaMallocManaged(&b.ptr, size, cudaMemAttachGlobal);
            else if (b.async) e = cudaMallocAsync(&b.ptr, size, nullptr);
            else if (what == 3) {
                size_t pitch = 0;
                e = cudaMallocPitch(&b.ptr, &pitch, 1000 + size % 3000, 1 + size / 4096);
            } else e = cudaMalloc(&b.ptr, size);
            if (e == cudaErrorMemoryAllocation) {
                ++refused;
                (void)cudaGetLastError();
                continue;
            }
            RT(e);
            if (b.ptr == nullptr) continue;
            ++allocs;
            bytes += static_cast<long long>(size);
            live.push_back(b);
        } else if (what < 14) {
            const size_t i = next() % live.size();
            const Buffer b = live[i];
            live[i] = live.back();
            live.pop_back();
            if (b.async) RT(cudaFreeAsync(b.ptr, nullptr));
            else RT(cudaFree(b.ptr));
            ++frees;
        } else if (vmm && what == 14) {
            // A whole mapping of one to four granules, as XLA's platform allocator makes them.
            Mapping m{0, 0, granularity * (1 + next() % 4)};
            CUresult c = cuMemCreate(&m.handle, m.size, &prop, 0);
            if (c == CUDA_ERROR_OUT_OF_MEMORY) {
                ++refused;
                continue;
            }
            DRV(c);
            if (c != CUDA_SUCCESS) continue;
            ++vmm_creates;
            DRV(cuMemAddressReserve(&m.va, m.size, 0, 0, 0));
            DRV(cuMemMap(m.va, m.size, 0, m.handle, 0));
            ++maps;
            CUmemAccessDesc access = {};
            access.location = prop.location;
            access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            DRV(cuMemSetAccess(m.va, m.size, &access, 1));
            mappings.push_back(m);
        } else if (vmm && what == 15 && !mappings.empty()) {
            const size_t i = next() % mappings.size();
            const Mapping m = mappings[i];
            mappings[i] = mappings.back();
            mappings.pop_back();
            DRV(cuMemUnmap(m.va, m.size));
            ++unmaps;
            DRV(cuMemRelease(m.handle));
            ++vmm_releases;
            DRV(cuMemAddressFree(m.va, m.size));
        }
    }
    for (const Buffer& b : live) {
        if (b.async) RT(cudaFreeAsync(b.ptr, nullptr));
        else RT(cudaFree(b.ptr));
        ++frees;
    }
    for (const Mapping& m : mappings) {
        DRV(cuMemUnmap(m.va, m.size));
        ++unmaps;
        DRV(cuMemRelease(m.handle));
        ++vmm_releases;
        DRV(cuMemAddressFree(m.va, m.size));
    }
    RT(cudaDeviceSynchronize());
    prog::Json j;
    j.num("allocs", allocs).num("frees", frees).num("bytes", bytes).num("refused", refused);
    if (vmm) j.num("vmm_creates", vmm_creates).num("vmm_releases", vmm_releases).num("maps", maps).num("unmaps", unmaps);
    return prog::finish(j);
}
