// dlopen libcuda, dlsym cuGetProcAddress_v2, and fetch the driver functions through it: "cuMemAlloc"
// at version 12000, "cuMemAllocAsync"/"cuMemFreeAsync" with the per-thread-default-stream flag (the
// _ptsz variants), and "cuMemAlloc"/"cuMemFree" through the old 4-argument cuGetProcAddress.
#include <cuda.h>

#include <dlfcn.h>

#include <vector>

#include "prog_common.hpp"

using GetProc4 = CUresult (*)(const char*, void**, int, cuuint64_t);
using GetProc5 = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);

static GetProc5 g_gpa = nullptr;

template <typename F>
static F get(const char* name, int version, cuuint64_t flags) {
    void* p = nullptr;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r = g_gpa(name, &p, version, flags, &st);
    if (r != CUDA_SUCCESS || st != CU_GET_PROC_ADDRESS_SUCCESS || p == nullptr) prog::fail(__FILE__, __LINE__, name, r);
    return reinterpret_cast<F>(p);
}

int main() {
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
        std::fprintf(stderr, "dlopen libcuda.so.1: %s\n", dlerror());
        return 1;
    }
    g_gpa = reinterpret_cast<GetProc5>(dlsym(h, "cuGetProcAddress_v2"));
    auto gpa4 = reinterpret_cast<GetProc4>(dlsym(h, "cuGetProcAddress"));
    if (!g_gpa || !gpa4) {
        std::fprintf(stderr, "cuGetProcAddress(_v2) not found\n");
        return 1;
    }
    const cuuint64_t LEG = CU_GET_PROC_ADDRESS_DEFAULT, PT = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    auto Init = get<decltype(&cuInit)>("cuInit", 12000, LEG);
    auto Retain = get<decltype(&cuDevicePrimaryCtxRetain)>("cuDevicePrimaryCtxRetain", 12000, LEG);
    auto Release = get<decltype(&cuDevicePrimaryCtxRelease_v2)>("cuDevicePrimaryCtxRelease", 12000, LEG);
    auto SetCurrent = get<decltype(&cuCtxSetCurrent)>("cuCtxSetCurrent", 12000, LEG);
    auto Alloc = get<decltype(&cuMemAlloc_v2)>("cuMemAlloc", 12000, LEG);
    auto Free = get<decltype(&cuMemFree_v2)>("cuMemFree", 12000, LEG);
    auto AllocAsyncPt = get<decltype(&cuMemAllocAsync)>("cuMemAllocAsync", 12000, PT);
    auto FreeAsyncPt = get<decltype(&cuMemFreeAsync)>("cuMemFreeAsync", 12000, PT);
    auto SyncPt = get<decltype(&cuStreamSynchronize)>("cuStreamSynchronize", 12000, PT);
    auto HtoD = get<decltype(&cuMemcpyHtoD_v2)>("cuMemcpyHtoD", 12000, LEG);
    auto DtoH = get<decltype(&cuMemcpyDtoH_v2)>("cuMemcpyDtoH", 12000, LEG);
    auto MemsetAsyncPt = get<decltype(&cuMemsetD8Async)>("cuMemsetD8Async", 12000, PT);
    auto DtoHAsyncPt = get<decltype(&cuMemcpyDtoHAsync_v2)>("cuMemcpyDtoHAsync", 12000, PT);
    if (prog::failures()) return 1;

    long long allocs = 0, frees = 0, bytes = 0, async_allocs = 0, async_frees = 0;
    DRV(Init(0));
    CUcontext ctx = nullptr;
    DRV(Retain(&ctx, 0));
    DRV(SetCurrent(ctx));

    for (size_t n : {size_t(4096), size_t(3) << 20}) {
        CUdeviceptr p = 0;
        DRV(Alloc(&p, n));
        if (!p) continue;
        ++allocs;
        bytes += static_cast<long long>(n);
        std::vector<unsigned char> a(n, 0x9d), b(n);
        DRV(HtoD(p, a.data(), n));
        DRV(DtoH(b.data(), p, n));
        EXPECT(a == b);
        DRV(Free(p));
        ++frees;
    }

    // per-thread default stream (stream 0 with the _ptsz entry points)
    CUdeviceptr ap = 0;
    DRV(AllocAsyncPt(&ap, 1 << 20, nullptr));
    if (ap) {
        ++allocs;
        ++async_allocs;
        bytes += 1 << 20;
        std::vector<unsigned char> b(1 << 20);
        DRV(MemsetAsyncPt(ap, 0x4b, 1 << 20, nullptr));
        DRV(DtoHAsyncPt(b.data(), ap, b.size(), nullptr));
        DRV(FreeAsyncPt(ap, nullptr));
        ++frees;
        ++async_frees;
        DRV(SyncPt(nullptr));
        EXPECT(b[0] == 0x4b && b[b.size() - 1] == 0x4b);
    }

    // old 4-argument cuGetProcAddress (CUDA 11.3 .. 11.8)
    void* pa = nullptr;
    void* pf = nullptr;
    DRV(gpa4("cuMemAlloc", &pa, 11030, CU_GET_PROC_ADDRESS_DEFAULT));
    DRV(gpa4("cuMemFree", &pf, 11030, CU_GET_PROC_ADDRESS_DEFAULT));
    if (pa && pf) {
        CUdeviceptr p = 0;
        DRV(reinterpret_cast<decltype(&cuMemAlloc_v2)>(pa)(&p, 8192));
        if (p) {
            ++allocs;
            bytes += 8192;
            DRV(reinterpret_cast<decltype(&cuMemFree_v2)>(pf)(p));
            ++frees;
        }
    }

    DRV(Release(0));
    return prog::finish(prog::Json()
                            .num("allocs", allocs)
                            .num("frees", frees)
                            .num("bytes", bytes)
                            .num("async_allocs", async_allocs)
                            .num("async_frees", async_frees));
}
