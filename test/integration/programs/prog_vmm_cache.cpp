// Like XLA's platform allocator (XLA_PYTHON_CLIENT_ALLOCATOR=platform): every buffer is its own
// virtual-memory mapping, made and unmade on one thread with the exact sequence
//   cuMemCreate -> cuMemAddressReserve -> cuMemMap -> cuMemSetAccess      (allocate)
//   cuMemUnmap -> cuMemRelease -> cuMemAddressFree                         (free)
// in a loop of "steps", with device work (host functions on a non-blocking stream, reading the
// buffers late) in flight while the host frees and allocates again. Then the cases cupool's VMM
// cache must hand to the driver untouched: a recycled handle mapped at another reservation,
// another handle mapped onto a recycled address, frees in another order, a double release, an
// exported handle. Memory info must count kept mappings as free, one buffer of nearly all the
// memory allowed needs them given back, and a context reset drops them without driver calls.
//
// The program counts the VMM calls that reached the (simulated) driver (cupoolSimVmmCalls) and
// prints them; run_under_shim.py checks that, under cupool's pooling policies, the steps after the
// first cost no driver call. Freeing memory a kernel still reads is undefined on the real driver
// (the bare simulator unmaps it at once), so the in-flight checks run only where cupool's cache is
// expected to keep the mappings (CUPOOL_POLICY growth or preallocate under LD_PRELOAD).
#include <cuda.h>

#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "prog_common.hpp"

namespace {

// Deferred mode creates mappings while a size has fewer than VmmCache::kMaxPerKey (32) and none
// of it has retired; the host here runs ahead of the device without bound, so the steps are
// steady only once each size has enough (measured: after about 60 steps, at 54 mappings).
constexpr int kSteps = 90;
constexpr int kWarmupSteps = 80;

CUmemAllocationProp g_prop{};
CUmemAccessDesc g_access{};
long long g_creates = 0, g_releases = 0, g_maps = 0, g_unmaps = 0, g_vmm_bytes = 0;

struct Buffer {
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr va = 0;
    size_t size = 0;
};

Buffer allocate(size_t size) {
    Buffer b;
    b.size = size;
    DRV(cuMemCreate(&b.h, size, &g_prop, 0));
    ++g_creates;
    g_vmm_bytes += static_cast<long long>(size);
    DRV(cuMemAddressReserve(&b.va, size, 0, 0, 0));
    DRV(cuMemMap(b.va, size, 0, b.h, 0));
    ++g_maps;
    DRV(cuMemSetAccess(b.va, size, &g_access, 1));
    return b;
}

void release(const Buffer& b) {
    DRV(cuMemUnmap(b.va, b.size));
    ++g_unmaps;
    DRV(cuMemRelease(b.h));
    ++g_releases;
    DRV(cuMemAddressFree(b.va, b.size));
}

// A "kernel": reads its buffer late, on the device's timeline, and records what it saw.
struct Check {
    const unsigned char* p = nullptr;
    size_t size = 0;
    unsigned char expect = 0;
    int delay_ms = 0;
    std::atomic<int>* bad = nullptr;
};
void CUDA_CB kernel(void* u) {
    auto* c = static_cast<Check*>(u);
    if (c->delay_ms) std::this_thread::sleep_for(std::chrono::milliseconds(c->delay_ms));
    bool ok = true;
    for (size_t i = 0; i < c->size; i += 4096) ok &= c->p[i] == c->expect;
    ok &= c->p[c->size - 1] == c->expect;
    if (!ok) c->bad->fetch_add(1);
}

bool cache_expected() {
    const char* preload = std::getenv("LD_PRELOAD");
    const char* policy = std::getenv("CUPOOL_POLICY");
    const char* cache = std::getenv("CUPOOL_VMM_CACHE");
    if (preload == nullptr || std::strstr(preload, "libcupool") == nullptr) return false;
    if (cache && (std::strcmp(cache, "off") == 0 || std::strcmp(cache, "0") == 0 || std::strcmp(cache, "false") == 0))
        return false;
    return policy == nullptr || *policy == '\0' || std::strcmp(policy, "passthrough") != 0;
}

void fill_and_check(const Buffer& b, unsigned char v) {
    DRV(cuMemsetD8_v2(b.va, v, b.size));
    unsigned char first = 0, last = 0;
    DRV(cuMemcpyDtoH_v2(&first, b.va, 1));
    DRV(cuMemcpyDtoH_v2(&last, b.va + b.size - 1, 1));
    EXPECT(first == v && last == v);
}

}  // namespace

int main() {
    auto vmm_calls = reinterpret_cast<unsigned long long (*)()>(dlsym(RTLD_DEFAULT, "cupoolSimVmmCalls"));
    EXPECT(vmm_calls != nullptr);
    if (vmm_calls == nullptr) return prog::finish(prog::Json());
    const bool expect_cache = cache_expected();

    DRV(cuInit(0));
    CUcontext ctx = nullptr;
    DRV(cuDevicePrimaryCtxRetain(&ctx, 0));
    DRV(cuCtxSetCurrent(ctx));
    CUstream s = nullptr;
    DRV(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    g_prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    g_prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    g_prop.location.id = 0;
    g_prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;  // one buffer is exported
    g_access.location = g_prop.location;
    g_access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    size_t g = 0;
    DRV(cuMemGetAllocationGranularity(&g, &g_prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    if (g == 0) return prog::finish(prog::Json());

    // ---- first of all (no fence placed yet, so no event to recycle): a buffer a kernel reads late,
    // freed by a thread with no context current; its reuse must still wait for the kernel
    std::atomic<int> bad{0};
    {
        Buffer a = allocate(g);
        DRV(cuMemsetD8_v2(a.va, 0xa7, g));
        Check c{reinterpret_cast<const unsigned char*>(a.va), g, 0xa7, 100, &bad};
        DRV(cuLaunchHostFunc(s, kernel, &c));
        if (!expect_cache) DRV(cuStreamSynchronize(s));
        std::thread([&] { release(a); }).join();
        Buffer b = allocate(g);
        DRV(cuMemsetD8_v2(b.va, 0x7a, g));
        DRV(cuStreamSynchronize(s));
        EXPECT(bad.load() == 0);
        release(b);
    }

    size_t free_before = 0, total = 0;
    DRV(cuMemGetInfo_v2(&free_before, &total));

    // ---- the steps: allocate, fill, launch readers, free while they may still run
    const size_t sizes[] = {g, 2 * g, g, 3 * g, g};
    std::vector<Check> checks(kSteps * std::size(sizes));
    unsigned long long steady_calls = 0, before = 0;
    for (int step = 0; step < kSteps; ++step) {
        if (step == kWarmupSteps) before = vmm_calls();
        std::vector<Buffer> bufs;
        for (size_t i = 0; i < std::size(sizes); ++i) {
            Buffer b = allocate(sizes[i]);
            const auto v = static_cast<unsigned char>(step * 16 + i + 1);
            DRV(cuMemsetD8_v2(b.va, v, b.size));
            Check& c = checks[static_cast<size_t>(step) * std::size(sizes) + i];
            c = Check{reinterpret_cast<const unsigned char*>(b.va), b.size, v, i == 0 ? 20 : 0, &bad};
            DRV(cuLaunchHostFunc(s, kernel, &c));
            bufs.push_back(b);
        }
        if (!expect_cache) DRV(cuStreamSynchronize(s));  // freeing under a running kernel is undefined
        for (const Buffer& b : bufs) release(b);
    }
    steady_calls = vmm_calls() - before;
    DRV(cuStreamSynchronize(s));
    EXPECT(bad.load() == 0);

    // ---- a kernel reading late while the host frees and gets the same size back, and fills it
    {
        Buffer a = allocate(g);
        DRV(cuMemsetD8_v2(a.va, 0xa5, g));
        Check c{reinterpret_cast<const unsigned char*>(a.va), g, 0xa5, 100, &bad};
        DRV(cuLaunchHostFunc(s, kernel, &c));
        if (!expect_cache) DRV(cuStreamSynchronize(s));
        release(a);
        Buffer b = allocate(g);
        DRV(cuMemsetD8_v2(b.va, 0x5a, g));
        DRV(cuStreamSynchronize(s));
        EXPECT(bad.load() == 0);  // the kernel saw 0xa5
        release(b);
    }

    // ---- mismatches: each must behave as on the driver, data intact
    const size_t odd = 5 * g;  // a size no other buffer has
    {
        // A recycled handle mapped at a reservation of another size.
        Buffer a = allocate(odd);
        release(a);
        CUmemGenericAllocationHandle h = 0;
        DRV(cuMemCreate(&h, odd, &g_prop, 0));
        ++g_creates;
        g_vmm_bytes += static_cast<long long>(odd);
        CUdeviceptr va = 0;
        DRV(cuMemAddressReserve(&va, 2 * odd, 0, 0, 0));
        DRV(cuMemMap(va + odd, odd, 0, h, 0));
        ++g_maps;
        DRV(cuMemSetAccess(va + odd, odd, &g_access, 1));
        fill_and_check(Buffer{h, va + odd, odd}, 0x31);
        DRV(cuMemUnmap(va + odd, odd));
        ++g_unmaps;
        DRV(cuMemRelease(h));
        ++g_releases;
        DRV(cuMemAddressFree(va, 2 * odd));
    }
    {
        // Another handle mapped onto an address the cache keeps mapped.
        Buffer a = allocate(odd);
        DRV(cuMemUnmap(a.va, odd));
        ++g_unmaps;
        CUmemGenericAllocationHandle other = 0;
        DRV(cuMemCreate(&other, odd, &g_prop, 0));
        ++g_creates;
        g_vmm_bytes += static_cast<long long>(odd);
        DRV(cuMemMap(a.va, odd, 0, other, 0));
        ++g_maps;
        DRV(cuMemSetAccess(a.va, odd, &g_access, 1));
        fill_and_check(Buffer{other, a.va, odd}, 0x32);
        // and the first handle, unmapped, goes to another reservation of its own
        CUdeviceptr va2 = 0;
        DRV(cuMemAddressReserve(&va2, odd, 0, 0, 0));
        DRV(cuMemMap(va2, odd, 0, a.h, 0));
        ++g_maps;
        DRV(cuMemSetAccess(va2, odd, &g_access, 1));
        fill_and_check(Buffer{a.h, va2, odd}, 0x33);
        unsigned char v = 0;
        DRV(cuMemcpyDtoH_v2(&v, a.va, 1));
        EXPECT(v == 0x32);
        release(Buffer{other, a.va, odd});
        release(Buffer{a.h, va2, odd});
    }
    {
        // Frees in another order: release, address free refused while mapped, unmap, address free.
        Buffer a = allocate(g);
        DRV(cuMemRelease(a.h));
        ++g_releases;
        CUresult r = cuMemAddressFree(a.va, g);
        EXPECT(r == CUDA_ERROR_INVALID_VALUE);  // still mapped
        fill_and_check(a, 0x34);              // released but mapped: still usable
        DRV(cuMemUnmap(a.va, g));
        ++g_unmaps;
        DRV(cuMemAddressFree(a.va, g));
        // Release first, then unmap and address free: a whole free, reusable.
        Buffer b = allocate(g);
        DRV(cuMemRelease(b.h));
        ++g_releases;
        DRV(cuMemUnmap(b.va, g));
        ++g_unmaps;
        DRV(cuMemAddressFree(b.va, g));
        Buffer c = allocate(g);
        fill_and_check(c, 0x35);
        // A double release is refused as the driver refuses it.
        release(c);
        EXPECT(cuMemRelease(c.h) == CUDA_ERROR_INVALID_VALUE);
    }
    {
        // An exported handle is never recycled: allocating its size again reaches the driver.
        const size_t unique = 7 * g;
        Buffer a = allocate(unique);
        int fd = -1;
        DRV(cuMemExportToShareableHandle(&fd, a.h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
        release(a);
        const unsigned long long calls = vmm_calls();
        Buffer b = allocate(unique);
        EXPECT(vmm_calls() > calls);
        release(b);
        // (the fd is the shared handle: closing it is the receiver's business; here, nobody's)
    }

    // ---- memory: what cupool keeps is free to the program, and given back when it needs it
    {
        size_t free_after = 0;
        DRV(cuMemGetInfo_v2(&free_after, &total));
        EXPECT(free_after >= free_before);  // kept mappings count as free
        // Nearly everything the device (or CUPOOL_LIMIT) allows, in one buffer: the kept mappings
        // must go back to the driver first. Only its ends are touched (the simulator's memory is sparse).
        const size_t big = (total / g - 4) * g;
        Buffer b = allocate(big);
        DRV(cuMemsetD8_v2(b.va, 0x36, 1));
        DRV(cuMemsetD8_v2(b.va + big - 1, 0x37, 1));
        unsigned char first = 0, last = 0;
        DRV(cuMemcpyDtoH_v2(&first, b.va, 1));
        DRV(cuMemcpyDtoH_v2(&last, b.va + big - 1, 1));
        EXPECT(first == 0x36 && last == 0x37);
        release(b);
    }

    DRV(cuStreamDestroy_v2(s));

    // ---- a context reset: cuMemCreate memory outlives the context, so what cupool kept of it is
    // given back for real (unmap, release, address free: driver calls), and the new context
    // starts afresh (prog_reset checks that no byte is lost)
    {
        Buffer a = allocate(g);
        release(a);
        const unsigned long long calls = vmm_calls();
        DRV(cuDevicePrimaryCtxReset_v2(0));
        EXPECT(expect_cache ? vmm_calls() >= calls + 3 : vmm_calls() == calls);
        DRV(cuDevicePrimaryCtxRetain(&ctx, 0));
        DRV(cuCtxSetCurrent(ctx));
        Buffer b = allocate(g);
        EXPECT(vmm_calls() > calls);  // not one of the old context's mappings
        fill_and_check(b, 0x38);
        release(b);
    }
    DRV(cuDevicePrimaryCtxRelease_v2(0));
    return prog::finish(prog::Json()
                            .num("allocs", 0)
                            .num("frees", 0)
                            .num("bytes", 0)
                            .num("vmm_creates", g_creates)
                            .num("vmm_releases", g_releases)
                            .num("vmm_bytes", g_vmm_bytes)
                            .num("maps", g_maps)
                            .num("unmaps", g_unmaps)
                            .num("steady_vmm_driver_calls", static_cast<long long>(steady_calls))
                            // allocate() makes 4 VMM calls and release() 3, for 5 buffers a step
                            .num("steady_vmm_calls", static_cast<long long>((kSteps - kWarmupSteps) * std::size(sizes) * 7))
                            .boolean("cache_expected", expect_cache));
}
