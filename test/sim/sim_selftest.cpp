// Checks of the simulated CUDA driver/runtime themselves (meson test 'sim-selftest').
// Run with LD_LIBRARY_PATH=<build>/test/sim, CUPOOL_SIM_TOTAL_MEM=1GiB, CUPOOL_SIM_DEVICES=2.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../integration/programs/child_process.hpp"

namespace {

int g_fail = 0;
#define CHECK(cond)                                                                 \
    do {                                                                            \
        if (!(cond)) {                                                              \
            std::fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);    \
            ++g_fail;                                                               \
        }                                                                           \
    } while (0)
#define OK(call) CHECK((call) == CUDA_SUCCESS)

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

void* g_cuda = nullptr;
template <typename F>
F sym(const char* name) {
    return reinterpret_cast<F>(dlsym(g_cuda, name));
}

// Driver entry points, all by dlsym of their ABI names.
#define DECL(name, ...) using name##_t = CUresult (*)(__VA_ARGS__); name##_t p_##name = nullptr;
DECL(cuInit, unsigned)
DECL(cuDriverGetVersion, int*)
DECL(cuDeviceGetCount, int*)
DECL(cuDeviceGetName, char*, int, CUdevice)
DECL(cuDeviceTotalMem_v2, size_t*, CUdevice)
DECL(cuDevicePrimaryCtxRetain, CUcontext*, CUdevice)
DECL(cuDevicePrimaryCtxRelease_v2, CUdevice)
DECL(cuDevicePrimaryCtxReset_v2, CUdevice)
DECL(cuDevicePrimaryCtxGetState, CUdevice, unsigned*, int*)
DECL(cuCtxCreate_v4, CUcontext*, CUctxCreateParams*, unsigned, CUdevice)
DECL(cuCtxDestroy_v2, CUcontext)
DECL(cuCtxSetCurrent, CUcontext)
DECL(cuCtxGetCurrent, CUcontext*)
DECL(cuCtxPushCurrent_v2, CUcontext)
DECL(cuCtxPopCurrent_v2, CUcontext*)
DECL(cuCtxSynchronize)
DECL(cuMemAlloc_v2, CUdeviceptr*, size_t)
DECL(cuMemFree_v2, CUdeviceptr)
DECL(cuMemGetInfo_v2, size_t*, size_t*)
DECL(cuMemGetAddressRange_v2, CUdeviceptr*, size_t*, CUdeviceptr)
DECL(cuPointerGetAttribute, void*, CUpointer_attribute, CUdeviceptr)
DECL(cuMemAllocAsync, CUdeviceptr*, size_t, CUstream)
DECL(cuMemFreeAsync, CUdeviceptr, CUstream)
DECL(cuStreamCreate, CUstream*, unsigned)
DECL(cuStreamDestroy_v2, CUstream)
DECL(cuStreamSynchronize, CUstream)
DECL(cuStreamQuery, CUstream)
DECL(cuLaunchHostFunc, CUstream, CUhostFn, void*)
DECL(cuEventCreate, CUevent*, unsigned)
DECL(cuEventRecord, CUevent, CUstream)
DECL(cuEventQuery, CUevent)
DECL(cuEventSynchronize, CUevent)
DECL(cuEventElapsedTime_v2, float*, CUevent, CUevent)
DECL(cuEventDestroy_v2, CUevent)
DECL(cuMemcpyHtoD_v2, CUdeviceptr, const void*, size_t)
DECL(cuMemcpyDtoH_v2, void*, CUdeviceptr, size_t)
DECL(cuMemGetAllocationGranularity, size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags)
DECL(cuMemCreate, CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long)
DECL(cuMemRelease, CUmemGenericAllocationHandle)
DECL(cuMemAddressReserve, CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long)
DECL(cuMemAddressFree, CUdeviceptr, size_t)
DECL(cuMemMap, CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long)
DECL(cuMemUnmap, CUdeviceptr, size_t)
DECL(cuMemSetAccess, CUdeviceptr, size_t, const CUmemAccessDesc*, size_t)
DECL(cuIpcGetMemHandle, CUipcMemHandle*, CUdeviceptr)
DECL(cuIpcOpenMemHandle_v2, CUdeviceptr*, CUipcMemHandle, unsigned)
DECL(cuIpcCloseMemHandle, CUdeviceptr)
DECL(cuGetProcAddress_v2, const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*)
DECL(cuGetProcAddress, const char*, void**, int, cuuint64_t)
DECL(cuMemHostAlloc, void**, size_t, unsigned)
DECL(cuMemFreeHost, void*)
DECL(cuMemAllocAsync_ptsz, CUdeviceptr*, size_t, CUstream)
DECL(cuLaunchHostFunc_ptsz, CUstream, CUhostFn, void*)
DECL(cuStreamSynchronize_ptsz, CUstream)
#undef DECL

void load_all() {
#define L(name) p_##name = sym<name##_t>(#name); if (!p_##name) { std::fprintf(stderr, "missing %s\n", #name); std::exit(2); }
    L(cuInit) L(cuDriverGetVersion) L(cuDeviceGetCount) L(cuDeviceGetName) L(cuDeviceTotalMem_v2)
    L(cuDevicePrimaryCtxRetain) L(cuDevicePrimaryCtxRelease_v2) L(cuDevicePrimaryCtxReset_v2)
    L(cuDevicePrimaryCtxGetState) L(cuCtxCreate_v4) L(cuCtxDestroy_v2) L(cuCtxSetCurrent) L(cuCtxGetCurrent)
    L(cuCtxPushCurrent_v2) L(cuCtxPopCurrent_v2) L(cuCtxSynchronize) L(cuMemAlloc_v2) L(cuMemFree_v2)
    L(cuMemGetInfo_v2) L(cuMemGetAddressRange_v2) L(cuPointerGetAttribute) L(cuMemAllocAsync) L(cuMemFreeAsync)
    L(cuStreamCreate) L(cuStreamDestroy_v2) L(cuStreamSynchronize) L(cuStreamQuery) L(cuLaunchHostFunc)
    L(cuEventCreate) L(cuEventRecord) L(cuEventQuery) L(cuEventSynchronize) L(cuEventElapsedTime_v2)
    L(cuEventDestroy_v2) L(cuMemcpyHtoD_v2) L(cuMemcpyDtoH_v2) L(cuMemGetAllocationGranularity) L(cuMemCreate)
    L(cuMemRelease) L(cuMemAddressReserve) L(cuMemAddressFree) L(cuMemMap) L(cuMemUnmap) L(cuMemSetAccess)
    L(cuIpcGetMemHandle) L(cuIpcOpenMemHandle_v2) L(cuIpcCloseMemHandle) L(cuGetProcAddress_v2) L(cuGetProcAddress)
    L(cuMemHostAlloc) L(cuMemFreeHost) L(cuMemAllocAsync_ptsz) L(cuLaunchHostFunc_ptsz) L(cuStreamSynchronize_ptsz)
#undef L
}

size_t free_mem() {
    size_t f = 0, t = 0;
    OK(p_cuMemGetInfo_v2(&f, &t));
    return f;
}

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

struct Sleeper {
    int ms;
    std::atomic<bool> done{false};
};
void CUDA_CB sleeper_fn(void* u) {
    auto* s = static_cast<Sleeper*>(u);
    sleep_ms(s->ms);
    s->done = true;
}

std::mutex g_order_mu;
std::vector<int> g_order;
struct Mark {
    int id;
};
void CUDA_CB mark_fn(void* u) {
    std::lock_guard<std::mutex> lk(g_order_mu);
    g_order.push_back(static_cast<Mark*>(u)->id);
}

void test_procaddress() {
    void* pfn = nullptr;
    CUdriverProcAddressQueryResult st{};
    OK(p_cuGetProcAddress_v2("cuMemAlloc", &pfn, 12000, 0, &st));
    CHECK(st == CU_GET_PROC_ADDRESS_SUCCESS && pfn == dlsym(g_cuda, "cuMemAlloc_v2"));
    CHECK(p_cuGetProcAddress_v2("cuMemAlloc", &pfn, 3000, 0, &st) == CUDA_ERROR_NOT_FOUND);
    CHECK(st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT && pfn == nullptr);
    CHECK(p_cuGetProcAddress_v2("cuNoSuchFunction", &pfn, 13000, 0, &st) == CUDA_ERROR_NOT_FOUND);
    CHECK(st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND && pfn == nullptr);
    OK(p_cuGetProcAddress_v2("cuMemAllocAsync", &pfn, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st));
    CHECK(pfn == dlsym(g_cuda, "cuMemAllocAsync_ptsz"));
    OK(p_cuGetProcAddress_v2("cuMemAllocAsync", &pfn, 13000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &st));
    CHECK(pfn == dlsym(g_cuda, "cuMemAllocAsync"));
    OK(p_cuGetProcAddress_v2("cuMemFreeAsync", &pfn, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st));
    CHECK(pfn == dlsym(g_cuda, "cuMemFreeAsync_ptsz"));
    OK(p_cuGetProcAddress_v2("cuMemAlloc", &pfn, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st));
    CHECK(pfn == dlsym(g_cuda, "cuMemAlloc_v2"));  // no per-thread variant: the plain one
    OK(p_cuGetProcAddress_v2("cuGetProcAddress", &pfn, 12000, 0, &st));
    CHECK(pfn == dlsym(g_cuda, "cuGetProcAddress_v2"));
    OK(p_cuGetProcAddress_v2("cuGetProcAddress", &pfn, 11030, 0, &st));
    CHECK(pfn == dlsym(g_cuda, "cuGetProcAddress"));
    OK(p_cuGetProcAddress_v2("cuStreamDestroy", &pfn, 3020, 0, &st));
    CHECK(pfn == dlsym(g_cuda, "cuStreamDestroy"));
    OK(p_cuGetProcAddress_v2("cuStreamDestroy", &pfn, 4000, 0, &st));
    CHECK(pfn == dlsym(g_cuda, "cuStreamDestroy_v2"));
    OK(p_cuGetProcAddress_v2("cuCtxCreate", &pfn, 13000, 0, &st));
    CHECK(pfn == dlsym(g_cuda, "cuCtxCreate_v4"));
    OK(p_cuGetProcAddress_v2("cuMemcpyHtoD", &pfn, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st));
    CHECK(pfn == dlsym(g_cuda, "cuMemcpyHtoD_v2_ptds"));
    OK(p_cuGetProcAddress("cuMemFree", &pfn, 12000, 0));  // old 4-argument form
    CHECK(pfn == dlsym(g_cuda, "cuMemFree_v2"));
    CHECK(p_cuGetProcAddress("cuMemFree", &pfn, 1000, 0) == CUDA_ERROR_NOT_FOUND);
}

void test_free_waits(CUstream nb) {
    CUdeviceptr a = 0, b = 0;
    OK(p_cuMemAlloc_v2(&a, 1 << 20));
    Sleeper s{200};
    auto t0 = Clock::now();
    OK(p_cuLaunchHostFunc(nb, sleeper_fn, &s));
    OK(p_cuMemAlloc_v2(&b, 1 << 20));  // does not wait
    CHECK(ms_since(t0) < 150);
    CHECK(!s.done);
    CHECK(p_cuStreamQuery(nb) == CUDA_ERROR_NOT_READY);
    OK(p_cuMemFree_v2(a));  // waits for the "kernel" on the non-blocking stream
    CHECK(s.done);
    CHECK(ms_since(t0) >= 150);
    OK(p_cuStreamQuery(nb));
    OK(p_cuMemFree_v2(b));
    CHECK(p_cuMemFree_v2(b) == CUDA_ERROR_INVALID_VALUE);  // double free

    // cuCtxSynchronize waits for every stream
    Sleeper s2{100};
    OK(p_cuLaunchHostFunc(nb, sleeper_fn, &s2));
    OK(p_cuCtxSynchronize());
    CHECK(s2.done);
}

void test_stream_order(CUstream nb) {
    CUstream blk = nullptr;
    OK(p_cuStreamCreate(&blk, CU_STREAM_DEFAULT));
    Mark m1{1}, m2{2}, m3{3}, m4{4}, m5{5};
    g_order.clear();
    // in-order within a stream
    Sleeper s{100};
    OK(p_cuLaunchHostFunc(blk, sleeper_fn, &s));
    OK(p_cuLaunchHostFunc(blk, mark_fn, &m1));
    // the legacy stream waits for earlier work on blocking streams
    OK(p_cuLaunchHostFunc(nullptr, mark_fn, &m2));
    // a non-blocking stream does not
    OK(p_cuLaunchHostFunc(nb, mark_fn, &m3));
    OK(p_cuCtxSynchronize());
    CHECK((g_order == std::vector<int>{3, 1, 2}));
    // a blocking stream waits for earlier legacy-stream work
    g_order.clear();
    Sleeper s2{100};
    OK(p_cuLaunchHostFunc(CU_STREAM_LEGACY, sleeper_fn, &s2));
    OK(p_cuLaunchHostFunc(CU_STREAM_LEGACY, mark_fn, &m4));
    OK(p_cuLaunchHostFunc(blk, mark_fn, &m5));
    OK(p_cuStreamSynchronize(blk));
    CHECK((g_order == std::vector<int>{4, 5}));

    // events
    CUevent e0 = nullptr, e1 = nullptr;
    OK(p_cuEventCreate(&e0, CU_EVENT_DEFAULT));
    OK(p_cuEventCreate(&e1, CU_EVENT_DEFAULT));
    OK(p_cuEventQuery(e1));  // never recorded: complete
    Sleeper s3{80};
    OK(p_cuEventRecord(e0, blk));
    OK(p_cuLaunchHostFunc(blk, sleeper_fn, &s3));
    OK(p_cuEventRecord(e1, blk));
    CHECK(p_cuEventQuery(e1) == CUDA_ERROR_NOT_READY);
    OK(p_cuEventSynchronize(e1));
    CHECK(s3.done);
    OK(p_cuEventQuery(e1));
    float ms = 0;
    OK(p_cuEventElapsedTime_v2(&ms, e0, e1));
    CHECK(ms >= 60.0f);
    OK(p_cuEventDestroy_v2(e0));
    OK(p_cuEventDestroy_v2(e1));
    OK(p_cuStreamDestroy_v2(blk));
}

void test_async_free(CUstream nb) {
    size_t f0 = free_mem();
    CUdeviceptr p = 0;
    OK(p_cuMemAllocAsync(&p, 4 << 20, nb));
    CHECK(free_mem() == f0 - (4 << 20));
    Sleeper s{100};
    OK(p_cuLaunchHostFunc(nb, sleeper_fn, &s));
    OK(p_cuMemFreeAsync(p, nb));
    CHECK(free_mem() == f0 - (4 << 20));  // freed only after the stream's earlier work
    OK(p_cuStreamSynchronize(nb));
    CHECK(free_mem() == f0);
}

void test_oom_and_info() {
    size_t f = 0, t = 0;
    OK(p_cuMemGetInfo_v2(&f, &t));
    CHECK(t == (1ull << 30));
    CHECK(f == t);
    CUdeviceptr a = 0, b = 0, c = 0;
    CHECK(p_cuMemAlloc_v2(&a, t + 1) == CUDA_ERROR_OUT_OF_MEMORY);
    OK(p_cuMemAlloc_v2(&a, t / 2));
    OK(p_cuMemAlloc_v2(&b, t / 2));
    CHECK(free_mem() == 0);
    CHECK(p_cuMemAlloc_v2(&c, 256) == CUDA_ERROR_OUT_OF_MEMORY);
    OK(p_cuMemFree_v2(a));
    OK(p_cuMemFree_v2(b));
    CHECK(free_mem() == t);

    // attributes / address range of an interior pointer, 256-byte alignment, contents
    CUdeviceptr p = 0;
    OK(p_cuMemAlloc_v2(&p, 1000));
    CHECK(p % 256 == 0);
    CUdeviceptr base = 0;
    size_t sz = 0;
    OK(p_cuMemGetAddressRange_v2(&base, &sz, p + 10));
    CHECK(base == p && sz == 1000);
    CUdeviceptr start = 0;
    size_t rsz = 0;
    int ord = -1;
    unsigned mt = 0;
    CUcontext ctx = nullptr, cur = nullptr;
    OK(p_cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p + 100));
    OK(p_cuPointerGetAttribute(&rsz, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p + 100));
    OK(p_cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p + 100));
    OK(p_cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p + 100));
    OK(p_cuPointerGetAttribute(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, p + 100));
    OK(p_cuCtxGetCurrent(&cur));
    CHECK(start == p && rsz == 1000 && ord == 0 && mt == CU_MEMORYTYPE_DEVICE && ctx == cur);
    int host = 0;
    CHECK(p_cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, reinterpret_cast<CUdeviceptr>(&host)) ==
          CUDA_ERROR_INVALID_VALUE);
    std::vector<unsigned char> in(1000), out(1000);
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<unsigned char>(i * 7);
    OK(p_cuMemcpyHtoD_v2(p, in.data(), in.size()));
    OK(p_cuMemcpyDtoH_v2(out.data(), p, out.size()));
    CHECK(in == out);
    CHECK(reinterpret_cast<unsigned char*>(p)[999] == in[999]);  // host-readable
    OK(p_cuMemFree_v2(p));

    // page-locked host memory: host memory type, not charged to the device
    void* hp = nullptr;
    OK(p_cuMemHostAlloc(&hp, 5000, 0));
    OK(p_cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, reinterpret_cast<CUdeviceptr>(hp)));
    CHECK(mt == CU_MEMORYTYPE_HOST);
    CHECK(free_mem() == t);
    CHECK(p_cuMemFree_v2(reinterpret_cast<CUdeviceptr>(hp)) == CUDA_ERROR_INVALID_VALUE);
    OK(p_cuMemFreeHost(hp));
}

void test_per_thread_stream() {
    // the per-thread default stream of another thread is a different stream
    Sleeper s{150};
    OK(p_cuLaunchHostFunc_ptsz(nullptr, sleeper_fn, &s));  // this thread's per-thread stream
    std::atomic<bool> other_done{false};
    CUcontext cur = nullptr;
    OK(p_cuCtxGetCurrent(&cur));
    std::thread th([&] {
        OK(p_cuCtxSetCurrent(cur));
        OK(p_cuStreamSynchronize_ptsz(nullptr));  // its own per-thread stream: empty
        other_done = true;
    });
    th.join();
    CHECK(other_done && !s.done);
    CUdeviceptr p = 0;
    OK(p_cuMemAllocAsync_ptsz(&p, 4096, nullptr));
    OK(p_cuStreamSynchronize_ptsz(nullptr));
    CHECK(s.done);
    OK(p_cuMemFree_v2(p));
}

int latency_child() {
    // run with CUPOOL_SIM_ALLOC_LATENCY_US=30000
    if (p_cuInit(0) != CUDA_SUCCESS) return 30;
    CUcontext c = nullptr;
    if (p_cuDevicePrimaryCtxRetain(&c, 0) != CUDA_SUCCESS || p_cuCtxSetCurrent(c) != CUDA_SUCCESS) return 31;
    CUdeviceptr p = 0;
    auto t0 = Clock::now();
    if (p_cuMemAlloc_v2(&p, 4096) != CUDA_SUCCESS) return 32;
    if (ms_since(t0) < 25) return 33;
    t0 = Clock::now();
    if (p_cuMemFree_v2(p) != CUDA_SUCCESS) return 34;
    if (ms_since(t0) < 25) return 35;
    return 0;
}

void test_vmm() {
    size_t f0 = free_mem();
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t g = 0;
    OK(p_cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CHECK(g == (2u << 20));
    CUmemGenericAllocationHandle h1 = 0, h2 = 0;
    CHECK(p_cuMemCreate(&h1, g + 1, &prop, 0) == CUDA_ERROR_INVALID_VALUE);
    OK(p_cuMemCreate(&h1, g, &prop, 0));
    OK(p_cuMemCreate(&h2, g, &prop, 0));
    CHECK(free_mem() == f0 - 2 * g);
    CUdeviceptr va = 0, alias = 0;
    OK(p_cuMemAddressReserve(&va, 2 * g, 0, 0, 0));
    OK(p_cuMemAddressReserve(&alias, g, 0, 0, 0));
    CHECK(va % g == 0);
    OK(p_cuMemMap(va, g, 0, h1, 0));
    OK(p_cuMemMap(va + g, g, 0, h2, 0));
    OK(p_cuMemMap(alias, g, 0, h1, 0));
    CUmemAccessDesc acc{};
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    OK(p_cuMemSetAccess(va, 2 * g, &acc, 1));
    OK(p_cuMemSetAccess(alias, g, &acc, 1));
    auto* p = reinterpret_cast<unsigned*>(va);
    for (size_t i = 0; i < 2 * g / 4; ++i) p[i] = static_cast<unsigned>(i ^ 0x5a5a5a5a);
    bool ok = true;
    for (size_t i = 0; i < 2 * g / 4; ++i) ok &= p[i] == static_cast<unsigned>(i ^ 0x5a5a5a5a);
    CHECK(ok);
    CHECK(reinterpret_cast<unsigned*>(alias)[12345] == p[12345]);  // same physical memory
    CUdeviceptr base = 0;
    size_t sz = 0;
    OK(p_cuMemGetAddressRange_v2(&base, &sz, va + g + 100));
    CHECK(base == va + g && sz == g);
    OK(p_cuMemUnmap(va, g));
    OK(p_cuMemUnmap(va + g, g));
    OK(p_cuMemRelease(h1));
    OK(p_cuMemRelease(h2));
    CHECK(free_mem() == f0 - g);  // h1 still mapped at alias
    OK(p_cuMemUnmap(alias, g));
    CHECK(free_mem() == f0);
    OK(p_cuMemAddressFree(va, 2 * g));
    OK(p_cuMemAddressFree(alias, g));
}

void test_contexts() {
    size_t f0 = free_mem();
    CUcontext prim = nullptr, c = nullptr, popped = nullptr;
    OK(p_cuCtxGetCurrent(&prim));
    OK(p_cuCtxCreate_v4(&c, nullptr, 0, 0));
    CUcontext cur = nullptr;
    OK(p_cuCtxGetCurrent(&cur));
    CHECK(cur == c && c != prim);
    CUdeviceptr p = 0;
    OK(p_cuMemAlloc_v2(&p, 8 << 20));
    CHECK(free_mem() == f0 - (8 << 20));
    OK(p_cuCtxPopCurrent_v2(&popped));
    CHECK(popped == c);
    OK(p_cuCtxGetCurrent(&cur));
    CHECK(cur == prim);
    OK(p_cuCtxDestroy_v2(c));  // frees the context's memory
    CHECK(free_mem() == f0);

    // second device: its own primary context and memory
    CUcontext p1 = nullptr;
    OK(p_cuDevicePrimaryCtxRetain(&p1, 1));
    OK(p_cuCtxPushCurrent_v2(p1));
    OK(p_cuMemAlloc_v2(&p, 1 << 20));
    int ord = -1;
    OK(p_cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p));
    CHECK(ord == 1);
    CHECK(free_mem() == (1ull << 30) - (1 << 20));
    OK(p_cuCtxPopCurrent_v2(&popped));
    CHECK(free_mem() == f0);  // device 0 unaffected
    unsigned fl = 0;
    int active = 0;
    OK(p_cuDevicePrimaryCtxGetState(1, &fl, &active));
    CHECK(active == 1);
    OK(p_cuDevicePrimaryCtxReset_v2(1));  // frees the primary context's memory
    OK(p_cuDevicePrimaryCtxGetState(1, &fl, &active));
    CHECK(active == 0);
    OK(p_cuDevicePrimaryCtxRetain(&p1, 1));
    OK(p_cuCtxPushCurrent_v2(p1));
    CHECK(free_mem() == (1ull << 30));
    OK(p_cuCtxPopCurrent_v2(&popped));
    OK(p_cuDevicePrimaryCtxRelease_v2(1));
}

int ipc_child(const char* hex) {
    CUipcMemHandle h{};
    prog::from_hex(hex, &h, sizeof h);
    if (p_cuInit(0) != CUDA_SUCCESS) return 10;
    CUcontext c = nullptr;
    if (p_cuDevicePrimaryCtxRetain(&c, 0) != CUDA_SUCCESS || p_cuCtxSetCurrent(c) != CUDA_SUCCESS) return 11;
    // As the H200's driver (580) does: a changed byte 48 is an invalid handle, bytes 56..63 are
    // not read.
    CUipcMemHandle bad = h;
    bad.reserved[48] ^= 0x5a;
    CUdeviceptr x = 0;
    if (p_cuIpcOpenMemHandle_v2(&x, bad, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != CUDA_ERROR_INVALID_HANDLE) return 15;
    CUipcMemHandle tail = h;
    tail.reserved[60] ^= 0x5a;
    CUdeviceptr p = 0, again = 0;
    if (p_cuIpcOpenMemHandle_v2(&p, tail, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != CUDA_SUCCESS) return 12;
    // The handle was taken at offset 4096, but it names the whole allocation and opens at its base.
    auto* u = reinterpret_cast<unsigned char*>(p);
    for (int i = 0; i < 3 * 4096; ++i)
        if (u[i] != static_cast<unsigned char>(i * 3)) return 13;
    std::memset(u + 4096, 0xab, 4096);
    // Opened twice in one process: the same mapping, closed once per open.
    if (p_cuIpcOpenMemHandle_v2(&again, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != CUDA_SUCCESS || again != p) return 16;
    if (p_cuIpcCloseMemHandle(p) != CUDA_SUCCESS) return 14;
    if (reinterpret_cast<unsigned char*>(again)[4096] != 0xab) return 17;  // still mapped
    if (p_cuIpcCloseMemHandle(again) != CUDA_SUCCESS) return 14;
    if (p_cuIpcCloseMemHandle(again) == CUDA_SUCCESS) return 18;
    return 0;
}

int fail_child() {
    // run with CUPOOL_SIM_FAIL_ALLOC_AFTER=3
    if (p_cuInit(0) != CUDA_SUCCESS) return 20;
    CUcontext c = nullptr;
    if (p_cuDevicePrimaryCtxRetain(&c, 0) != CUDA_SUCCESS || p_cuCtxSetCurrent(c) != CUDA_SUCCESS) return 21;
    CUdeviceptr p[4] = {};
    for (int i = 0; i < 3; ++i)
        if (p_cuMemAlloc_v2(&p[i], 4096) != CUDA_SUCCESS) return 22;
    if (p_cuMemAlloc_v2(&p[3], 4096) != CUDA_ERROR_OUT_OF_MEMORY) return 23;
    for (int i = 0; i < 3; ++i)
        if (p_cuMemFree_v2(p[i]) != CUDA_SUCCESS) return 24;
    return 0;
}

int run_child(const std::vector<std::string>& args, const char* env_kv) {
    return prog::run_self(args, [&] {
        if (env_kv) putenv(const_cast<char*>(env_kv));
    });
}

void test_ipc_and_fork() {
    CUdeviceptr p = 0;
    OK(p_cuMemAlloc_v2(&p, 3 * 4096));
    auto* u = reinterpret_cast<unsigned char*>(p);
    for (int i = 0; i < 3 * 4096; ++i) u[i] = static_cast<unsigned char>(i * 3);
    CUipcMemHandle h{};
    OK(p_cuIpcGetMemHandle(&h, p + 4096));
    const std::string hex = prog::to_hex(&h, sizeof h);
    int rc = run_child({"prog_sim_selftest", "--ipc-child", hex}, nullptr);
    CHECK(rc == 0);
    bool ok = true;
    for (int i = 4096; i < 8192; ++i) ok &= u[i] == 0xab;
    CHECK(ok);
    CHECK(u[0] == 0 && u[8192] == static_cast<unsigned char>(8192 * 3));

    // same-process open gives a second view of the same memory
    CUdeviceptr q = 0;
    OK(p_cuIpcOpenMemHandle_v2(&q, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    CHECK(q != p && reinterpret_cast<unsigned char*>(q)[4096 + 5] == 0xab);
    OK(p_cuIpcCloseMemHandle(q));
    OK(p_cuMemFree_v2(p));

    // a child forked after cuInit cannot use CUDA (as with the real driver)
    pid_t pid = fork();
    if (pid == 0) _exit(p_cuInit(0) == CUDA_ERROR_NOT_INITIALIZED ? 0 : 1);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);

    CHECK(run_child({"prog_sim_selftest", "--fail-child"}, "CUPOOL_SIM_FAIL_ALLOC_AFTER=3") == 0);
    CHECK(run_child({"prog_sim_selftest", "--latency-child"}, "CUPOOL_SIM_ALLOC_LATENCY_US=30000") == 0);
}

void test_runtime() {
    void* rt = dlopen("libcudart.so.13", RTLD_NOW);
    CHECK(rt != nullptr);
    if (!rt) return;
    auto cMalloc = reinterpret_cast<cudaError_t (*)(void**, size_t)>(dlsym(rt, "cudaMalloc"));
    auto cFree = reinterpret_cast<cudaError_t (*)(void*)>(dlsym(rt, "cudaFree"));
    auto cLast = reinterpret_cast<cudaError_t (*)()>(dlsym(rt, "cudaGetLastError"));
    auto cPeek = reinterpret_cast<cudaError_t (*)()>(dlsym(rt, "cudaPeekAtLastError"));
    auto cEntry = reinterpret_cast<cudaError_t (*)(const char*, void**, unsigned, unsigned long long,
                                                   cudaDriverEntryPointQueryResult*)>(
        dlsym(rt, "cudaGetDriverEntryPointByVersion"));
    CHECK(cMalloc && cFree && cLast && cPeek && cEntry);
    if (!(cMalloc && cFree && cLast && cPeek && cEntry)) return;
    void* p = nullptr;
    CHECK(cMalloc(&p, 12345) == cudaSuccess && p != nullptr);
    CUdeviceptr base = 0;
    size_t sz = 0;
    OK(p_cuMemGetAddressRange_v2(&base, &sz, reinterpret_cast<CUdeviceptr>(p)));  // same driver underneath
    CHECK(sz == 12345);
    CHECK(cFree(p) == cudaSuccess);
    void* big = nullptr;
    CHECK(cMalloc(&big, 1ull << 40) == cudaErrorMemoryAllocation);
    CHECK(cPeek() == cudaErrorMemoryAllocation);
    CHECK(cLast() == cudaErrorMemoryAllocation);
    CHECK(cLast() == cudaSuccess);
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult st{};
    CHECK(cEntry("cuMemCreate", &fn, 12000, cudaEnableDefault, &st) == cudaSuccess);
    CHECK(st == cudaDriverEntryPointSuccess && fn == dlsym(g_cuda, "cuMemCreate"));
    CHECK(cEntry("cuMemAllocAsync", &fn, 12000, cudaEnablePerThreadDefaultStream, &st) == cudaSuccess);
    CHECK(fn == dlsym(g_cuda, "cuMemAllocAsync_ptsz"));
    CHECK(cEntry("cuBogus", &fn, 12000, cudaEnableDefault, &st) == cudaSuccess);
    CHECK(st == cudaDriverEntryPointSymbolNotFound && fn == nullptr);
}

}  // namespace

int main(int argc, char** argv) {
    g_cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!g_cuda) {
        std::fprintf(stderr, "dlopen libcuda.so.1: %s\n", dlerror());
        return 2;
    }
    load_all();
    if (argc >= 3 && std::strcmp(argv[1], "--ipc-child") == 0) return ipc_child(argv[2]);
    if (argc >= 2 && std::strcmp(argv[1], "--fail-child") == 0) return fail_child();
    if (argc >= 2 && std::strcmp(argv[1], "--latency-child") == 0) return latency_child();

    CUdeviceptr p = 0;
    CHECK(p_cuMemAlloc_v2(&p, 256) == CUDA_ERROR_NOT_INITIALIZED);  // before cuInit
    int v = 0;
    OK(p_cuDriverGetVersion(&v));
    CHECK(v == 13000);
    test_procaddress();  // works before cuInit
    OK(p_cuInit(0));
    int n = 0;
    OK(p_cuDeviceGetCount(&n));
    CHECK(n == 2);
    char name[128];
    OK(p_cuDeviceGetName(name, sizeof name, 0));
    CHECK(std::string(name) == "cupool simulated device");
    size_t total = 0;
    OK(p_cuDeviceTotalMem_v2(&total, 0));
    CHECK(total == (1ull << 30));
    CHECK(p_cuMemAlloc_v2(&p, 256) == CUDA_ERROR_INVALID_CONTEXT);  // no context yet
    CUcontext prim = nullptr;
    OK(p_cuDevicePrimaryCtxRetain(&prim, 0));
    OK(p_cuCtxSetCurrent(prim));

    CUstream nb = nullptr;
    OK(p_cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING));
    test_free_waits(nb);
    test_stream_order(nb);
    test_async_free(nb);
    test_per_thread_stream();
    test_oom_and_info();
    test_vmm();
    test_contexts();
    test_ipc_and_fork();
    test_runtime();
    OK(p_cuStreamDestroy_v2(nb));
    OK(p_cuDevicePrimaryCtxRelease_v2(0));
    if (g_fail) {
        std::printf("sim-selftest: %d failure(s)\n", g_fail);
        return 1;
    }
    std::printf("sim-selftest: all checks passed\n");
    return 0;
}
