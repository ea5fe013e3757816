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
DECL(cuMemExportToShareableHandle, void*, CUmemGenericAllocationHandle, CUmemAllocationHandleType, unsigned long long)
DECL(cuMemImportFromShareableHandle, CUmemGenericAllocationHandle*, void*, CUmemAllocationHandleType)
DECL(cuMemGetAllocationPropertiesFromHandle, CUmemAllocationProp*, CUmemGenericAllocationHandle)
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
DECL(cuMemAllocPitch_v2, CUdeviceptr*, size_t*, size_t, size_t, unsigned)
DECL(cuMemAllocManaged, CUdeviceptr*, size_t, unsigned)
DECL(cuMemsetD8_v2, CUdeviceptr, unsigned char, size_t)
DECL(cuMemsetD8Async, CUdeviceptr, unsigned char, size_t, CUstream)
DECL(cuMemcpyHtoDAsync_v2, CUdeviceptr, const void*, size_t, CUstream)
DECL(cuStreamWaitEvent, CUstream, CUevent, unsigned)
DECL(cuStreamBeginCapture, CUstream)
DECL(cuStreamBeginCapture_v2, CUstream, CUstreamCaptureMode)
DECL(cuStreamBeginCapture_v2_ptsz, CUstream, CUstreamCaptureMode)
DECL(cuStreamBeginCaptureToGraph, CUstream, CUgraph, const CUgraphNode*, const CUgraphEdgeData*, size_t,
     CUstreamCaptureMode)
DECL(cuStreamEndCapture, CUstream, CUgraph*)
DECL(cuStreamEndCapture_ptsz, CUstream, CUgraph*)
DECL(cuStreamIsCapturing, CUstream, CUstreamCaptureStatus*)
DECL(cuStreamGetCaptureInfo, CUstream, CUstreamCaptureStatus*, cuuint64_t*)
DECL(cuStreamGetCaptureInfo_v3, CUstream, CUstreamCaptureStatus*, cuuint64_t*, CUgraph*, const CUgraphNode**,
     const CUgraphEdgeData**, size_t*)
DECL(cuThreadExchangeStreamCaptureMode, CUstreamCaptureMode*)
DECL(cuGraphCreate, CUgraph*, unsigned)
DECL(cuGraphDestroy, CUgraph)
DECL(cuGraphGetNodes, CUgraph, CUgraphNode*, size_t*)
DECL(cuGraphNodeGetType, CUgraphNode, CUgraphNodeType*)
DECL(cuGraphAddHostNode, CUgraphNode*, CUgraph, const CUgraphNode*, size_t, const CUDA_HOST_NODE_PARAMS*)
DECL(cuGraphAddMemAllocNode, CUgraphNode*, CUgraph, const CUgraphNode*, size_t, CUDA_MEM_ALLOC_NODE_PARAMS*)
DECL(cuGraphAddMemFreeNode, CUgraphNode*, CUgraph, const CUgraphNode*, size_t, CUdeviceptr)
DECL(cuGraphMemAllocNodeGetParams, CUgraphNode, CUDA_MEM_ALLOC_NODE_PARAMS*)
DECL(cuGraphInstantiateWithFlags, CUgraphExec*, CUgraph, unsigned long long)
DECL(cuGraphInstantiateWithParams, CUgraphExec*, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS*)
DECL(cuGraphExecDestroy, CUgraphExec)
DECL(cuGraphLaunch, CUgraphExec, CUstream)
DECL(cuGraphUpload, CUgraphExec, CUstream)
DECL(cuDeviceGraphMemTrim, CUdevice)
DECL(cuDeviceGetGraphMemAttribute, CUdevice, CUgraphMem_attribute, void*)
DECL(cuDeviceSetGraphMemAttribute, CUdevice, CUgraphMem_attribute, void*)
DECL(cuArrayCreate_v2, CUarray*, const CUDA_ARRAY_DESCRIPTOR*)
DECL(cuArray3DCreate_v2, CUarray*, const CUDA_ARRAY3D_DESCRIPTOR*)
DECL(cuArrayDestroy, CUarray)
DECL(cuArrayGetDescriptor_v2, CUDA_ARRAY_DESCRIPTOR*, CUarray)
DECL(cuArray3DGetDescriptor_v2, CUDA_ARRAY3D_DESCRIPTOR*, CUarray)
DECL(cuMipmappedArrayCreate, CUmipmappedArray*, const CUDA_ARRAY3D_DESCRIPTOR*, unsigned)
DECL(cuMipmappedArrayGetLevel, CUarray*, CUmipmappedArray, unsigned)
DECL(cuMipmappedArrayDestroy, CUmipmappedArray)
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
    L(cuMemExportToShareableHandle) L(cuMemImportFromShareableHandle) L(cuMemGetAllocationPropertiesFromHandle)
    L(cuIpcGetMemHandle) L(cuIpcOpenMemHandle_v2) L(cuIpcCloseMemHandle) L(cuGetProcAddress_v2) L(cuGetProcAddress)
    L(cuMemHostAlloc) L(cuMemFreeHost) L(cuMemAllocAsync_ptsz) L(cuLaunchHostFunc_ptsz) L(cuStreamSynchronize_ptsz)
    L(cuMemAllocPitch_v2) L(cuMemAllocManaged) L(cuMemsetD8_v2) L(cuMemsetD8Async) L(cuMemcpyHtoDAsync_v2)
    L(cuStreamWaitEvent) L(cuStreamBeginCapture) L(cuStreamBeginCapture_v2) L(cuStreamBeginCapture_v2_ptsz)
    L(cuStreamBeginCaptureToGraph) L(cuStreamEndCapture) L(cuStreamEndCapture_ptsz) L(cuStreamIsCapturing)
    L(cuStreamGetCaptureInfo) L(cuStreamGetCaptureInfo_v3) L(cuThreadExchangeStreamCaptureMode) L(cuGraphCreate)
    L(cuGraphDestroy) L(cuGraphGetNodes) L(cuGraphNodeGetType) L(cuGraphAddHostNode) L(cuGraphAddMemAllocNode)
    L(cuGraphAddMemFreeNode) L(cuGraphMemAllocNodeGetParams) L(cuGraphInstantiateWithFlags)
    L(cuGraphInstantiateWithParams) L(cuGraphExecDestroy) L(cuGraphLaunch) L(cuGraphUpload) L(cuDeviceGraphMemTrim)
    L(cuDeviceGetGraphMemAttribute) L(cuDeviceSetGraphMemAttribute) L(cuArrayCreate_v2) L(cuArray3DCreate_v2)
    L(cuArrayDestroy) L(cuArrayGetDescriptor_v2) L(cuArray3DGetDescriptor_v2) L(cuMipmappedArrayCreate)
    L(cuMipmappedArrayGetLevel) L(cuMipmappedArrayDestroy)
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

// Shareable handles, as the driver: only memory created asking for the POSIX fd type exports;
// an imported handle names the exporter's device and keeps the memory after the exporter's release
// (what cupool's IPC of vmm blocks relies on, shim/ipc_vmm.cpp).
void test_vmm_shareable() {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 1;
    const size_t g = 2u << 20;
    CUmemGenericAllocationHandle plain = 0, shared = 0, imported = 0;
    OK(p_cuMemCreate(&plain, g, &prop, 0));
    int fd = -1;
    CHECK(p_cuMemExportToShareableHandle(&fd, plain, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) == CUDA_ERROR_INVALID_VALUE);
    OK(p_cuMemRelease(plain));
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    OK(p_cuMemCreate(&shared, g, &prop, 0));
    CUdeviceptr va = 0, va2 = 0;
    OK(p_cuMemAddressReserve(&va, g, 0, 0, 0));
    OK(p_cuMemMap(va, g, 0, shared, 0));
    CUmemAccessDesc acc{};
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    OK(p_cuMemSetAccess(va, g, &acc, 1));
    reinterpret_cast<unsigned*>(va)[7] = 0xfeedu;
    OK(p_cuMemExportToShareableHandle(&fd, shared, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    OK(p_cuMemImportFromShareableHandle(&imported, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    close(fd);
    CUmemAllocationProp got{};
    OK(p_cuMemGetAllocationPropertiesFromHandle(&got, imported));
    CHECK(got.location.id == 1);
    OK(p_cuMemUnmap(va, g));  // the exporter lets go of all it had
    OK(p_cuMemRelease(shared));
    OK(p_cuMemAddressFree(va, g));
    OK(p_cuMemAddressReserve(&va2, g, 0, 0, 0));
    OK(p_cuMemMap(va2, g, 0, imported, 0));
    OK(p_cuMemSetAccess(va2, g, &acc, 1));
    CHECK(reinterpret_cast<unsigned*>(va2)[7] == 0xfeedu);
    OK(p_cuMemUnmap(va2, g));
    OK(p_cuMemRelease(imported));
    OK(p_cuMemAddressFree(va2, g));
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

// ---------------------------------------------------------------- capture, graphs, arrays

// The runtime, for the checks that go through it (as the probe did).
struct Rt {
    cudaError_t (*Malloc)(void**, size_t);
    cudaError_t (*Free)(void*);
    cudaError_t (*MallocAsync)(void**, size_t, cudaStream_t);
    cudaError_t (*FreeAsync)(void*, cudaStream_t);
    cudaError_t (*MallocManaged)(void**, size_t, unsigned);
    cudaError_t (*MallocPitch)(void**, size_t*, size_t, size_t);
    cudaError_t (*MallocArray)(cudaArray_t*, const cudaChannelFormatDesc*, size_t, size_t, unsigned);
    cudaError_t (*Malloc3DArray)(cudaArray_t*, const cudaChannelFormatDesc*, cudaExtent, unsigned);
    cudaError_t (*MallocMipmappedArray)(cudaMipmappedArray_t*, const cudaChannelFormatDesc*, cudaExtent, unsigned,
                                        unsigned);
    cudaError_t (*FreeArray)(cudaArray_t);
    cudaError_t (*FreeMipmappedArray)(cudaMipmappedArray_t);
    cudaError_t (*ArrayGetInfo)(cudaChannelFormatDesc*, cudaExtent*, unsigned*, cudaArray_t);
    cudaError_t (*GetLastError)();
    cudaError_t (*PeekAtLastError)();
    cudaError_t (*MemGetInfo)(size_t*, size_t*);
    cudaError_t (*StreamBeginCapture)(cudaStream_t, cudaStreamCaptureMode);
    cudaError_t (*StreamEndCapture)(cudaStream_t, cudaGraph_t*);
    cudaError_t (*StreamIsCapturing)(cudaStream_t, cudaStreamCaptureStatus*);
    cudaError_t (*ThreadExchangeStreamCaptureMode)(cudaStreamCaptureMode*);
    cudaError_t (*GraphInstantiate)(cudaGraphExec_t*, cudaGraph_t, unsigned long long);
    cudaError_t (*GraphLaunch)(cudaGraphExec_t, cudaStream_t);
    cudaError_t (*GraphExecDestroy)(cudaGraphExec_t);
    cudaError_t (*GraphDestroy)(cudaGraph_t);
    cudaError_t (*DeviceGetGraphMemAttribute)(int, cudaGraphMemAttributeType, void*);
    cudaError_t (*DeviceGraphMemTrim)(int);
    cudaError_t (*StreamSynchronize)(cudaStream_t);
    cudaError_t (*StreamCreateWithFlags)(cudaStream_t*, unsigned);
    cudaError_t (*StreamDestroy)(cudaStream_t);
    cudaError_t (*LaunchHostFunc)(cudaStream_t, cudaHostFn_t, void*);
};
Rt g_rt{};

bool load_rt() {
    void* h = dlopen("libcudart.so.13", RTLD_NOW);
    if (!h) return false;
    bool ok = true;
#define R(field, name) ok &= (g_rt.field = reinterpret_cast<decltype(g_rt.field)>(dlsym(h, name))) != nullptr;
    R(Malloc, "cudaMalloc") R(Free, "cudaFree") R(MallocAsync, "cudaMallocAsync") R(FreeAsync, "cudaFreeAsync")
    R(MallocManaged, "cudaMallocManaged") R(MallocPitch, "cudaMallocPitch") R(MallocArray, "cudaMallocArray")
    R(Malloc3DArray, "cudaMalloc3DArray") R(MallocMipmappedArray, "cudaMallocMipmappedArray")
    R(FreeArray, "cudaFreeArray") R(FreeMipmappedArray, "cudaFreeMipmappedArray") R(ArrayGetInfo, "cudaArrayGetInfo")
    R(GetLastError, "cudaGetLastError") R(PeekAtLastError, "cudaPeekAtLastError") R(MemGetInfo, "cudaMemGetInfo")
    R(StreamBeginCapture, "cudaStreamBeginCapture") R(StreamEndCapture, "cudaStreamEndCapture")
    R(StreamIsCapturing, "cudaStreamIsCapturing") R(ThreadExchangeStreamCaptureMode, "cudaThreadExchangeStreamCaptureMode")
    R(GraphInstantiate, "cudaGraphInstantiate") R(GraphLaunch, "cudaGraphLaunch")
    R(GraphExecDestroy, "cudaGraphExecDestroy") R(GraphDestroy, "cudaGraphDestroy")
    R(DeviceGetGraphMemAttribute, "cudaDeviceGetGraphMemAttribute") R(DeviceGraphMemTrim, "cudaDeviceGraphMemTrim")
    R(StreamSynchronize, "cudaStreamSynchronize") R(StreamCreateWithFlags, "cudaStreamCreateWithFlags")
    R(StreamDestroy, "cudaStreamDestroy") R(LaunchHostFunc, "cudaLaunchHostFunc")
#undef R
    return ok;
}

cudaStream_t rs(CUstream s) { return reinterpret_cast<cudaStream_t>(s); }

void CUDA_CB noop_fn(void*) {}
void CUDA_CB count_fn(void* u) { ++*static_cast<std::atomic<int>*>(u); }

CUcontext g_prim = nullptr;

unsigned long long graph_attr(CUgraphMem_attribute a, CUdevice dev = 0) {
    cuuint64_t v = ~0ull;
    OK(p_cuDeviceGetGraphMemAttribute(dev, a, &v));
    return v;
}

void test_procaddress_capture() {
    void* pfn = nullptr;
    CUdriverProcAddressQueryResult st{};
    auto get = [&](const char* name, int ver, cuuint64_t fl) {
        pfn = nullptr;
        return p_cuGetProcAddress_v2(name, &pfn, ver, fl, &st) == CUDA_SUCCESS ? pfn : nullptr;
    };
    const cuuint64_t PT = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    CHECK(get("cuStreamBeginCapture", 10000, 0) == dlsym(g_cuda, "cuStreamBeginCapture"));
    CHECK(get("cuStreamBeginCapture", 10000, PT) == dlsym(g_cuda, "cuStreamBeginCapture_ptsz"));
    CHECK(get("cuStreamBeginCapture", 13000, 0) == dlsym(g_cuda, "cuStreamBeginCapture_v2"));
    CHECK(get("cuStreamBeginCapture", 13000, PT) == dlsym(g_cuda, "cuStreamBeginCapture_v2_ptsz"));
    CHECK(get("cuStreamGetCaptureInfo", 10010, 0) == dlsym(g_cuda, "cuStreamGetCaptureInfo"));
    CHECK(get("cuStreamGetCaptureInfo", 11030, PT) == dlsym(g_cuda, "cuStreamGetCaptureInfo_v2_ptsz"));
    CHECK(get("cuStreamGetCaptureInfo", 13000, 0) == dlsym(g_cuda, "cuStreamGetCaptureInfo_v3"));
    CHECK(get("cuStreamGetCaptureInfo", 13000, PT) == dlsym(g_cuda, "cuStreamGetCaptureInfo_v3_ptsz"));
    CHECK(get("cuStreamEndCapture", 13000, PT) == dlsym(g_cuda, "cuStreamEndCapture_ptsz"));
    CHECK(get("cuStreamIsCapturing", 13000, 0) == dlsym(g_cuda, "cuStreamIsCapturing"));
    CHECK(get("cuStreamBeginCaptureToGraph", 13000, PT) == dlsym(g_cuda, "cuStreamBeginCaptureToGraph_ptsz"));
    CHECK(get("cuThreadExchangeStreamCaptureMode", 13000, PT) == dlsym(g_cuda, "cuThreadExchangeStreamCaptureMode"));
    CHECK(get("cuGraphInstantiate", 10000, 0) == dlsym(g_cuda, "cuGraphInstantiate"));
    CHECK(get("cuGraphInstantiate", 11000, 0) == dlsym(g_cuda, "cuGraphInstantiate_v2"));
    CHECK(get("cuGraphInstantiate", 13000, 0) == dlsym(g_cuda, "cuGraphInstantiateWithFlags"));
    CHECK(get("cuGraphInstantiateWithParams", 13000, PT) == dlsym(g_cuda, "cuGraphInstantiateWithParams_ptsz"));
    CHECK(get("cuGraphLaunch", 13000, PT) == dlsym(g_cuda, "cuGraphLaunch_ptsz"));
    CHECK(get("cuGraphLaunch", 13000, 0) == dlsym(g_cuda, "cuGraphLaunch"));
    CHECK(get("cuGraphUpload", 13000, PT) == dlsym(g_cuda, "cuGraphUpload_ptsz"));
    CHECK(get("cuGraphAddMemAllocNode", 11030, 0) == nullptr && st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    CHECK(get("cuDeviceGraphMemTrim", 13000, 0) == dlsym(g_cuda, "cuDeviceGraphMemTrim"));
    CHECK(get("cuArrayCreate", 13000, 0) == dlsym(g_cuda, "cuArrayCreate_v2"));
    CHECK(get("cuArray3DGetDescriptor", 13000, 0) == dlsym(g_cuda, "cuArray3DGetDescriptor_v2"));
    CHECK(get("cuMipmappedArrayGetLevel", 13000, 0) == dlsym(g_cuda, "cuMipmappedArrayGetLevel"));
}

// Replays docs/gpu-runs/2026-12-01-capture-probe.txt (the H200's answers) against the sim: each
// case begins a capture, records a host function, makes one call (on this thread or another,
// in a given interaction mode), records another, ends the capture and launches the graph.
struct ProbeFx {
    CUstream other = nullptr;  // idle non-blocking stream, never captured
    CUevent done = nullptr;    // recorded on `other`, complete
    CUevent fresh = nullptr;
    CUdeviceptr spare = 0;     // freed by the free cases
};

int probe_call(const std::string& name, ProbeFx& fx, CUstream s) {
    if (name == "cudaMalloc") {
        void* p = nullptr;
        int r = g_rt.Malloc(&p, 1 << 20);
        if (r == 0) g_rt.Free(p);
        return r;
    }
    if (name == "cudaFree" || name == "cuMemFree" || name == "cudaFree_busy_other") {
        int r = name == "cuMemFree" ? static_cast<int>(p_cuMemFree_v2(fx.spare))
                                    : static_cast<int>(g_rt.Free(reinterpret_cast<void*>(fx.spare)));
        if (r == 0) fx.spare = 0;
        return r;
    }
    if (name == "cuMemAlloc") {
        CUdeviceptr p = 0;
        int r = p_cuMemAlloc_v2(&p, 1 << 20);
        if (r == 0) p_cuMemFree_v2(p);
        return r;
    }
    if (name == "cuCtxSynchronize") return p_cuCtxSynchronize();
    if (name == "cuStreamQuery_other") return p_cuStreamQuery(fx.other);
    if (name == "cuStreamQuery_capturing") return p_cuStreamQuery(s);
    if (name == "cuEventQuery_done") return p_cuEventQuery(fx.done);
    if (name == "cuEventSynchronize_done") return p_cuEventSynchronize(fx.done);
    if (name == "cuEventRecord_legacy") return p_cuEventRecord(fx.fresh, CU_STREAM_LEGACY);
    if (name == "cuEventRecord_other") return p_cuEventRecord(fx.fresh, fx.other);
    if (name == "cuStreamSynchronize_other") return p_cuStreamSynchronize(fx.other);
    CUstreamCaptureStatus st{};
    if (name == "cuStreamIsCapturing_legacy") return p_cuStreamIsCapturing(CU_STREAM_LEGACY, &st);
    if (name == "cuStreamGetCaptureInfo_legacy")
        return p_cuStreamGetCaptureInfo_v3(CU_STREAM_LEGACY, &st, nullptr, nullptr, nullptr, nullptr, nullptr);
    if (name == "cuStreamCreate") {
        CUstream t = nullptr;
        int r = p_cuStreamCreate(&t, CU_STREAM_NON_BLOCKING);
        if (r == 0) p_cuStreamDestroy_v2(t);
        return r;
    }
    if (name == "cuThreadExchangeStreamCaptureMode") {
        CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
        int r = p_cuThreadExchangeStreamCaptureMode(&m);
        p_cuThreadExchangeStreamCaptureMode(&m);
        return r;
    }
    if (name == "cudaMallocAsync_capturing") {
        void* p = nullptr;
        int r = g_rt.MallocAsync(&p, 1 << 20, rs(s));
        if (r == 0) g_rt.FreeAsync(p, rs(s));
        return r;
    }
    return -1;
}

CUstreamCaptureMode mode_of(const std::string& m) {
    return m == "global" ? CU_STREAM_CAPTURE_MODE_GLOBAL
           : m == "thread_local" ? CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
                                 : CU_STREAM_CAPTURE_MODE_RELAXED;
}

void test_capture_probe_table() {
    const char* path = std::getenv("CUPOOL_SIM_PROBE");
    if (path == nullptr) {
        std::printf("sim-selftest: CUPOOL_SIM_PROBE not set, probe table not replayed\n");
        return;
    }
    FILE* f = std::fopen(path, "r");
    CHECK(f != nullptr);
    if (!f) return;
    constexpr int kSpinMs = 40;  // the probe's 50 ms kernel on another stream, shorter
    ProbeFx fx;
    OK(p_cuStreamCreate(&fx.other, CU_STREAM_NON_BLOCKING));
    OK(p_cuEventCreate(&fx.done, CU_EVENT_DISABLE_TIMING));
    OK(p_cuEventCreate(&fx.fresh, CU_EVENT_DISABLE_TIMING));
    OK(p_cuEventRecord(fx.done, fx.other));
    OK(p_cuEventSynchronize(fx.done));
    int cases = 0, mismatches = 0;
    char line[512];
    while (std::fgets(line, sizeof line, f)) {
        char name[96], mode[32], stream[8], where[16], tmode[32], end[64], launch[64];
        int begin = 0, rc = 0, status = 0;
        double ms = 0;
        if (std::sscanf(line, "case=%95s mode=%31s stream=%7s thread=%15[^:]:%31s begin=%d rc=%d status=%d end=%63s "
                              "launch=%63s ms=%lf",
                        name, mode, stream, where, tmode, &begin, &rc, &status, end, launch, &ms) != 11)
            continue;
        ++cases;
        const bool blocking = std::string(stream) == "blk", other_thread = std::string(where) == "other";
        CUstream s = nullptr;
        OK(p_cuStreamCreate(&s, blocking ? CU_STREAM_DEFAULT : CU_STREAM_NON_BLOCKING));
        OK(p_cuMemAlloc_v2(&fx.spare, 1 << 20));
        OK(p_cuCtxSynchronize());
        int got_begin = p_cuStreamBeginCapture_v2(s, mode_of(mode));
        OK(p_cuLaunchHostFunc(s, noop_fn, nullptr));
        Sleeper busy{kSpinMs};
        int got = -1;
        double took = 0;
        auto body = [&] {
            if (other_thread) p_cuCtxSetCurrent(g_prim);
            CUstreamCaptureMode m = mode_of(tmode);
            p_cuThreadExchangeStreamCaptureMode(&m);
            if (std::string(name) == "cudaFree_busy_other") p_cuLaunchHostFunc(fx.other, sleeper_fn, &busy);
            auto t0 = Clock::now();
            got = probe_call(name, fx, s);
            took = ms_since(t0);
            p_cuThreadExchangeStreamCaptureMode(&m);
        };
        if (other_thread) std::thread(body).join();
        else body();
        CUstreamCaptureStatus got_status{};
        p_cuStreamIsCapturing(s, &got_status);
        p_cuLaunchHostFunc(s, noop_fn, nullptr);
        CUgraph g = nullptr;
        int got_end = p_cuStreamEndCapture(s, &g);
        bool launched = false;
        if (got_end == CUDA_SUCCESS && g) {
            CUgraphExec ge = nullptr;
            launched = p_cuGraphInstantiateWithFlags(&ge, g, 0) == CUDA_SUCCESS && p_cuGraphLaunch(ge, s) == CUDA_SUCCESS &&
                       p_cuStreamSynchronize(s) == CUDA_SUCCESS;
            if (ge) p_cuGraphExecDestroy(ge);
            p_cuGraphDestroy(g);
        }
        g_rt.GetLastError();
        OK(p_cuCtxSynchronize());
        if (fx.spare) OK(p_cuMemFree_v2(fx.spare));
        fx.spare = 0;
        g_rt.GetLastError();
        OK(p_cuStreamDestroy_v2(s));
        const int want_end = std::string(end) == "cudaSuccess" ? 0 : std::string(end) == "cudaErrorStreamCaptureInvalidated" ? 901 : -1;
        const bool want_launch = std::string(launch) == "cudaSuccess";
        bool ok = got_begin == begin && got == rc && static_cast<int>(got_status) == status && got_end == want_end &&
                  launched == want_launch;
        // A permitted free waits for the work on the other stream, a refused one does not.
        if (std::string(name) == "cudaFree_busy_other") ok &= rc == 0 ? took >= kSpinMs * 0.8 : took < kSpinMs * 0.8;
        if (!ok) {
            ++mismatches;
            std::fprintf(stderr, "probe mismatch: %s -> begin=%d rc=%d status=%d end=%d launch=%d ms=%.2f\n",
                         std::string(line).substr(0, std::strlen(line) - 1).c_str(), got_begin, got,
                         static_cast<int>(got_status), got_end, launched, took);
        }
    }
    std::fclose(f);
    CHECK(cases >= 540);
    CHECK(mismatches == 0);
    OK(p_cuEventDestroy_v2(fx.done));
    OK(p_cuEventDestroy_v2(fx.fresh));
    OK(p_cuStreamDestroy_v2(fx.other));
    OK(p_cuDeviceGraphMemTrim(0));
    std::printf("sim-selftest: %d probe cases replayed, %d mismatches\n", cases, mismatches);
}

std::vector<CUgraphNodeType> node_types(CUgraph g) {
    size_t n = 0;
    OK(p_cuGraphGetNodes(g, nullptr, &n));
    std::vector<CUgraphNode> nodes(n);
    OK(p_cuGraphGetNodes(g, nodes.data(), &n));
    std::vector<CUgraphNodeType> t(n);
    for (size_t i = 0; i < n; ++i) OK(p_cuGraphNodeGetType(nodes[i], &t[i]));
    return t;
}

void test_capture_graph() {
    CUstream s = nullptr, side = nullptr;
    OK(p_cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    OK(p_cuStreamCreate(&side, CU_STREAM_NON_BLOCKING));
    CUdeviceptr buf = 0;
    OK(p_cuMemAlloc_v2(&buf, 4096));
    OK(p_cuMemsetD8_v2(buf, 0, 4096));
    std::atomic<int> count{0};
    Mark m1{1}, m2{2}, m3{3};
    g_order.clear();

    // Captured work is recorded, not run; the graph runs it in order, once per launch.
    CUstreamCaptureStatus st{};
    OK(p_cuStreamIsCapturing(s, &st));
    CHECK(st == CU_STREAM_CAPTURE_STATUS_NONE);
    OK(p_cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(p_cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_ERROR_ILLEGAL_STATE);
    OK(p_cuStreamIsCapturing(s, &st));
    CHECK(st == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    cuuint64_t id = 0, id1 = 0;
    CUgraph cg = nullptr;
    const CUgraphNode* deps = nullptr;
    const CUgraphEdgeData* edges = nullptr;
    size_t ndeps = 99;
    OK(p_cuStreamGetCaptureInfo_v3(s, &st, &id, &cg, &deps, &edges, &ndeps));
    CHECK(st == CU_STREAM_CAPTURE_STATUS_ACTIVE && id != 0 && cg != nullptr && ndeps == 0);
    OK(p_cuStreamGetCaptureInfo(s, &st, &id1));
    CHECK(id1 == id);
    OK(p_cuLaunchHostFunc(s, mark_fn, &m1));
    const unsigned char pattern[4] = {1, 2, 3, 4};
    OK(p_cuMemcpyHtoDAsync_v2(buf, pattern, 4, s));
    OK(p_cuMemsetD8Async(buf + 8, 7, 8, s));
    // fork/join: a side stream joins by waiting on an event of the capturing stream
    CUevent fork = nullptr, join = nullptr;
    OK(p_cuEventCreate(&fork, CU_EVENT_DISABLE_TIMING));
    OK(p_cuEventCreate(&join, CU_EVENT_DISABLE_TIMING));
    OK(p_cuEventRecord(fork, s));
    CUstreamCaptureMode relaxed = CU_STREAM_CAPTURE_MODE_RELAXED;
    OK(p_cuThreadExchangeStreamCaptureMode(&relaxed));
    CHECK(relaxed == CU_STREAM_CAPTURE_MODE_GLOBAL);  // the previous mode
    CHECK(p_cuEventQuery(fork) == CUDA_ERROR_CAPTURED_EVENT);
    OK(p_cuThreadExchangeStreamCaptureMode(&relaxed));
    OK(p_cuStreamWaitEvent(side, fork, 0));
    OK(p_cuStreamIsCapturing(side, &st));
    CHECK(st == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    OK(p_cuLaunchHostFunc(side, mark_fn, &m2));
    OK(p_cuLaunchHostFunc(side, count_fn, &count));
    OK(p_cuEventRecord(join, side));
    OK(p_cuStreamWaitEvent(s, join, 0));
    OK(p_cuStreamGetCaptureInfo_v3(s, &st, &id, &cg, &deps, &edges, &ndeps));
    CHECK(ndeps == 2);  // after the join: its own last node and the side stream's
    OK(p_cuLaunchHostFunc(s, mark_fn, &m3));
    OK(p_cuStreamGetCaptureInfo_v3(s, &st, &id, &cg, &deps, &edges, &ndeps));
    CHECK(ndeps == 1 && deps != nullptr && edges != nullptr);
    sleep_ms(20);
    CHECK(g_order.empty() && count == 0 && reinterpret_cast<unsigned char*>(buf)[0] == 0);  // nothing ran
    CUgraph g = nullptr;
    CHECK(p_cuStreamEndCapture(side, &g) == CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);  // not its origin
    // the unmatched end invalidated the capture
    OK(p_cuStreamIsCapturing(s, &st));
    CHECK(st == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    CHECK(p_cuLaunchHostFunc(s, mark_fn, &m3) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    CHECK(p_cuStreamEndCapture(s, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED && g == nullptr);
    OK(p_cuStreamIsCapturing(side, &st));
    CHECK(st == CU_STREAM_CAPTURE_STATUS_NONE);  // the joined stream left the capture too

    // again, properly ended
    OK(p_cuStreamBeginCapture(s));  // v1: global mode
    OK(p_cuLaunchHostFunc(s, mark_fn, &m1));
    OK(p_cuMemcpyHtoDAsync_v2(buf, pattern, 4, s));
    OK(p_cuMemsetD8Async(buf + 8, 7, 8, s));
    OK(p_cuEventRecord(fork, s));
    OK(p_cuStreamWaitEvent(side, fork, 0));
    OK(p_cuLaunchHostFunc(side, mark_fn, &m2));
    OK(p_cuLaunchHostFunc(side, count_fn, &count));
    OK(p_cuEventRecord(join, side));
    OK(p_cuStreamWaitEvent(s, join, 0));
    OK(p_cuLaunchHostFunc(s, mark_fn, &m3));
    std::thread([&] {  // not from another thread (global mode)
        CUgraph g2 = nullptr;
        CHECK(p_cuStreamEndCapture(s, &g2) == CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
    }).join();
    OK(p_cuStreamEndCapture(s, &g));
    CHECK(g != nullptr);
    CHECK((node_types(g) == std::vector<CUgraphNodeType>{CU_GRAPH_NODE_TYPE_HOST, CU_GRAPH_NODE_TYPE_MEMCPY,
                                                          CU_GRAPH_NODE_TYPE_MEMSET, CU_GRAPH_NODE_TYPE_HOST,
                                                          CU_GRAPH_NODE_TYPE_HOST, CU_GRAPH_NODE_TYPE_HOST}));
    CUgraphExec ge = nullptr;
    OK(p_cuGraphInstantiateWithFlags(&ge, g, 0));
    OK(p_cuGraphLaunch(ge, s));
    OK(p_cuGraphLaunch(ge, side));  // follows the first launch
    OK(p_cuStreamSynchronize(side));
    CHECK(count == 2);
    CHECK((g_order == std::vector<int>{1, 2, 3, 1, 2, 3}));
    auto* b = reinterpret_cast<unsigned char*>(buf);
    CHECK(b[0] == 1 && b[3] == 4 && b[8] == 7 && b[15] == 7 && b[16] == 0);
    OK(p_cuGraphExecDestroy(ge));
    OK(p_cuGraphDestroy(g));

    // a joined stream that is not joined back: unjoined work
    OK(p_cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    OK(p_cuEventRecord(fork, s));
    OK(p_cuStreamWaitEvent(side, fork, 0));
    OK(p_cuLaunchHostFunc(side, noop_fn, nullptr));
    CHECK(p_cuStreamEndCapture(s, &g) == CUDA_ERROR_STREAM_CAPTURE_UNJOINED && g == nullptr);
    OK(p_cuStreamIsCapturing(side, &st));
    CHECK(st == CU_STREAM_CAPTURE_STATUS_NONE);

    // a capturing stream may not wait on uncaptured work, nor merge two captures
    OK(p_cuEventRecord(fork, side));
    OK(p_cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    CHECK(p_cuStreamWaitEvent(s, fork, 0) == CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
    CHECK(p_cuStreamEndCapture(s, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    OK(p_cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    OK(p_cuStreamBeginCapture_v2(side, CU_STREAM_CAPTURE_MODE_RELAXED));
    OK(p_cuEventRecord(fork, side));
    CHECK(p_cuStreamWaitEvent(s, fork, 0) == CUDA_ERROR_STREAM_CAPTURE_MERGE);
    CHECK(p_cuStreamEndCapture(s, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    CHECK(p_cuStreamEndCapture(side, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

    // the legacy stream cannot be captured; ending a capture that never began is an illegal state
    CHECK(p_cuStreamBeginCapture_v2(CU_STREAM_LEGACY, CU_STREAM_CAPTURE_MODE_GLOBAL) ==
          CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CHECK(p_cuStreamEndCapture(s, &g) == CUDA_ERROR_ILLEGAL_STATE);

    // the per-thread default stream is a blocking stream: capturing it makes the legacy stream unusable
    OK(p_cuStreamBeginCapture_v2_ptsz(nullptr, CU_STREAM_CAPTURE_MODE_RELAXED));
    CHECK(p_cuStreamIsCapturing(nullptr, &st) == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    CHECK(p_cuLaunchHostFunc_ptsz(nullptr, noop_fn, nullptr) == CUDA_SUCCESS);  // captured
    CHECK(p_cuLaunchHostFunc(nullptr, noop_fn, nullptr) == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    CHECK(p_cuStreamEndCapture_ptsz(nullptr, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    OK(p_cuLaunchHostFunc(nullptr, noop_fn, nullptr));  // usable again

    // capture into an existing graph, after a node of it
    OK(p_cuGraphCreate(&g, 0));
    CUgraphNode first = nullptr;
    CUDA_HOST_NODE_PARAMS hp{mark_fn, &m1};
    OK(p_cuGraphAddHostNode(&first, g, nullptr, 0, &hp));
    OK(p_cuStreamBeginCaptureToGraph(s, g, &first, nullptr, 1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(p_cuLaunchHostFunc(s, mark_fn, &m2));
    CHECK(p_cuGraphDestroy(g) == CUDA_ERROR_INVALID_VALUE);  // being captured into
    CUgraph g3 = nullptr;
    OK(p_cuStreamEndCapture(s, &g3));
    CHECK(g3 == g && node_types(g).size() == 2);
    g_order.clear();
    OK(p_cuGraphInstantiateWithFlags(&ge, g, 0));
    OK(p_cuGraphInstantiateWithFlags(&ge, g, 0));  // no memory nodes: may be instantiated again
    OK(p_cuGraphLaunch(ge, s));
    OK(p_cuStreamSynchronize(s));
    CHECK((g_order == std::vector<int>{1, 2}));
    OK(p_cuGraphExecDestroy(ge));
    OK(p_cuGraphDestroy(g));

    // a stream destroyed during its capture ends it: other threads are no longer prohibited
    CUstream t = nullptr;
    OK(p_cuStreamCreate(&t, CU_STREAM_NON_BLOCKING));
    OK(p_cuStreamBeginCapture_v2(t, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OK(p_cuStreamDestroy_v2(t));
    CUdeviceptr p = 0;
    OK(p_cuMemAlloc_v2(&p, 256));
    OK(p_cuMemFree_v2(p));
    // so does a thread's exit during a capture of its per-thread stream
    std::thread([] {
        OK(p_cuCtxSetCurrent(g_prim));
        OK(p_cuStreamBeginCapture_v2_ptsz(nullptr, CU_STREAM_CAPTURE_MODE_GLOBAL));
    }).join();
    OK(p_cuMemAlloc_v2(&p, 256));
    OK(p_cuMemFree_v2(p));

    OK(p_cuEventDestroy_v2(fork));
    OK(p_cuEventDestroy_v2(join));
    OK(p_cuMemFree_v2(buf));
    OK(p_cuStreamDestroy_v2(side));
    OK(p_cuStreamDestroy_v2(s));
}

void test_graph_memory() {
    CUstream s = nullptr;
    OK(p_cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    const size_t f0 = free_mem();
    const size_t mb = 1 << 20;
    CHECK(graph_attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) == 0);
    // captured cuMemAllocAsync/cuMemFreeAsync: memory nodes with an address fixed at capture
    OK(p_cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CUdeviceptr p = 0;
    OK(p_cuMemAllocAsync(&p, 63 * mb + 5, s));
    CHECK(p != 0 && free_mem() == f0);  // nothing taken yet
    OK(p_cuMemsetD8Async(p, 0x5a, 63 * mb + 5, s));
    std::atomic<int> seen{0};
    struct Probe {
        CUdeviceptr p;
        std::atomic<int>* seen;
    } probe{p, &seen};
    OK(p_cuLaunchHostFunc(s, [](void* u) {
        auto* pr = static_cast<Probe*>(u);
        if (reinterpret_cast<unsigned char*>(pr->p)[63 * (1 << 20) + 4] == 0x5a) ++*pr->seen;
    }, &probe));
    OK(p_cuMemFreeAsync(p, s));
    CHECK(p_cuMemFreeAsync(p, s) == CUDA_ERROR_INVALID_VALUE);  // freed twice in the graph
    CUgraph g = nullptr;
    OK(p_cuStreamEndCapture(s, &g));
    auto types = node_types(g);
    CHECK(types.size() == 4 && types[0] == CU_GRAPH_NODE_TYPE_MEM_ALLOC && types[3] == CU_GRAPH_NODE_TYPE_MEM_FREE);
    size_t n = 4;
    std::vector<CUgraphNode> nodes(4);
    OK(p_cuGraphGetNodes(g, nodes.data(), &n));
    CUDA_MEM_ALLOC_NODE_PARAMS ap{};
    OK(p_cuGraphMemAllocNodeGetParams(nodes[0], &ap));
    CHECK(ap.dptr == p && ap.bytesize == 63 * mb + 5 && ap.poolProps.location.id == 0);
    CUgraphExec ge = nullptr, ge2 = nullptr;
    OK(p_cuGraphInstantiateWithFlags(&ge, g, 0));
    CHECK(p_cuGraphInstantiateWithFlags(&ge2, g, 0) == CUDA_ERROR_INVALID_VALUE);  // one at a time
    CHECK(graph_attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) == 0 && free_mem() == f0);
    // launch: the pool reserves the allocation rounded to 2 MiB, charged to the device, kept after
    // the graph's free node
    OK(p_cuGraphLaunch(ge, s));
    OK(p_cuStreamSynchronize(s));
    CHECK(seen == 1);
    CHECK(graph_attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) == 64 * mb);
    CHECK(graph_attr(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT) == 64 * mb);
    CHECK(free_mem() == f0 - 64 * mb);
    OK(p_cuGraphLaunch(ge, s));  // again: no new memory
    OK(p_cuStreamSynchronize(s));
    CHECK(seen == 2 && free_mem() == f0 - 64 * mb);
    CUdeviceptr base = 0;
    size_t sz = 0;
    CHECK(p_cuMemGetAddressRange_v2(&base, &sz, p) == CUDA_ERROR_NOT_FOUND);  // freed by the graph
    OK(p_cuDeviceGraphMemTrim(0));
    CHECK(graph_attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) == 0 && graph_attr(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT) == 0);
    CHECK(free_mem() == f0);
    CHECK(graph_attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH) == 64 * mb);
    cuuint64_t zero = 0;
    OK(p_cuDeviceSetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH, &zero));
    OK(p_cuDeviceSetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &zero));
    CHECK(graph_attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH) == 0 && graph_attr(CU_GRAPH_MEM_ATTR_USED_MEM_HIGH) == 0);
    // upload reserves too
    OK(p_cuGraphUpload(ge, s));
    CHECK(graph_attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) == 64 * mb && free_mem() == f0 - 64 * mb);
    OK(p_cuGraphExecDestroy(ge));
    CHECK(graph_attr(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT) == 0 && graph_attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) == 64 * mb);
    OK(p_cuGraphDestroy(g));

    // an allocation the graph does not free: live after the launch, until freed outside it; the
    // pool memory it left unused serves it (no new reservation)
    OK(p_cuGraphCreate(&g, 0));
    CUDA_MEM_ALLOC_NODE_PARAMS np{};
    np.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    np.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    np.poolProps.location.id = 0;
    np.bytesize = 3 * mb;
    CUgraphNode an = nullptr;
    OK(p_cuGraphAddMemAllocNode(&an, g, nullptr, 0, &np));
    CHECK(np.dptr != 0);
    OK(p_cuGraphInstantiateWithFlags(&ge, g, 0));
    OK(p_cuGraphLaunch(ge, s));
    CHECK(graph_attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) == 64 * mb && graph_attr(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT) == 4 * mb);
    OK(p_cuStreamSynchronize(s));
    OK(p_cuMemGetAddressRange_v2(&base, &sz, np.dptr + 10));
    CHECK(base == np.dptr && sz == 3 * mb);
    reinterpret_cast<unsigned char*>(np.dptr)[3 * mb - 1] = 9;  // host-accessible while allocated
    CHECK(p_cuGraphLaunch(ge, s) == CUDA_ERROR_INVALID_VALUE);  // still allocated from the last launch
    OK(p_cuDeviceGraphMemTrim(0));  // keeps what a live allocation uses
    CHECK(graph_attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) == 4 * mb && free_mem() == f0 - 4 * mb);
    OK(p_cuMemFreeAsync(np.dptr, s));
    OK(p_cuGraphLaunch(ge, s));  // freed in stream order: may launch again
    OK(p_cuStreamSynchronize(s));
    OK(p_cuMemFree_v2(np.dptr));
    CHECK(p_cuMemFree_v2(np.dptr) == CUDA_ERROR_INVALID_VALUE);
    // a free node in another graph frees it too
    OK(p_cuGraphLaunch(ge, s));
    CUgraph gf = nullptr;
    CUgraphNode fn = nullptr;
    CUgraphExec gfe = nullptr;
    OK(p_cuGraphCreate(&gf, 0));
    OK(p_cuGraphAddMemFreeNode(&fn, gf, nullptr, 0, np.dptr));
    CHECK(p_cuGraphAddMemFreeNode(&fn, gf, nullptr, 0, np.dptr) == CUDA_ERROR_INVALID_VALUE);
    CHECK(p_cuGraphAddMemFreeNode(&fn, gf, nullptr, 0, np.dptr + 256) == CUDA_ERROR_INVALID_VALUE);
    OK(p_cuGraphInstantiateWithFlags(&gfe, gf, 0));
    OK(p_cuGraphLaunch(gfe, s));
    CHECK(p_cuGraphLaunch(gfe, s) == CUDA_ERROR_INVALID_VALUE);  // nothing left to free
    OK(p_cuStreamSynchronize(s));
    CHECK(p_cuMemGetAddressRange_v2(&base, &sz, np.dptr) == CUDA_ERROR_NOT_FOUND);
    OK(p_cuGraphExecDestroy(gfe));
    OK(p_cuGraphDestroy(gf));
    OK(p_cuGraphExecDestroy(ge));
    // AUTO_FREE_ON_LAUNCH frees the last launch's allocation before the next
    OK(p_cuGraphInstantiateWithFlags(&ge, g, CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH));
    OK(p_cuGraphLaunch(ge, s));
    OK(p_cuGraphLaunch(ge, s));
    OK(p_cuStreamSynchronize(s));
    OK(p_cuMemFree_v2(np.dptr));
    OK(p_cuGraphExecDestroy(ge));
    OK(p_cuGraphDestroy(g));
    OK(p_cuDeviceGraphMemTrim(0));
    CHECK(free_mem() == f0 && graph_attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) == 0);

    // no room on the device: the launch fails with out-of-memory
    OK(p_cuGraphCreate(&g, 0));
    np.bytesize = 2ull << 30;
    OK(p_cuGraphAddMemAllocNode(&an, g, nullptr, 0, &np));
    CUDA_GRAPH_INSTANTIATE_PARAMS ip{};
    ip.flags = CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD;
    ip.hUploadStream = s;
    CHECK(p_cuGraphInstantiateWithParams(&ge, g, &ip) == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(ip.result_out == CUDA_GRAPH_INSTANTIATE_ERROR);
    OK(p_cuGraphInstantiateWithFlags(&ge, g, 0));
    CHECK(p_cuGraphLaunch(ge, s) == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(free_mem() == f0 && graph_attr(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) == 0);
    OK(p_cuGraphExecDestroy(ge));
    OK(p_cuGraphDestroy(g));
    OK(p_cuStreamDestroy_v2(s));
}

int graph_fail_child() {
    // run with CUPOOL_SIM_FAIL_ALLOC_AFTER=1: the graph pool's reservation and arrays count
    if (p_cuInit(0) != CUDA_SUCCESS) return 40;
    CUcontext c = nullptr;
    if (p_cuDevicePrimaryCtxRetain(&c, 0) != CUDA_SUCCESS || p_cuCtxSetCurrent(c) != CUDA_SUCCESS) return 41;
    CUstream s = nullptr;
    if (p_cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) return 42;
    CUdeviceptr p = 0, q = 0;
    if (p_cuMemAlloc_v2(&p, 4096) != CUDA_SUCCESS) return 43;  // the one allowed
    if (p_cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL) != CUDA_SUCCESS) return 44;
    if (p_cuMemAllocAsync(&q, 4096, s) != CUDA_SUCCESS) return 45;  // captured: not an allocation yet
    if (p_cuMemFreeAsync(q, s) != CUDA_SUCCESS) return 46;
    CUgraph g = nullptr;
    CUgraphExec ge = nullptr;
    if (p_cuStreamEndCapture(s, &g) != CUDA_SUCCESS || p_cuGraphInstantiateWithFlags(&ge, g, 0) != CUDA_SUCCESS)
        return 47;
    if (p_cuGraphLaunch(ge, s) != CUDA_ERROR_OUT_OF_MEMORY) return 48;
    CUarray a = nullptr;
    CUDA_ARRAY_DESCRIPTOR d{16, 16, CU_AD_FORMAT_FLOAT, 1};
    if (p_cuArrayCreate_v2(&a, &d) != CUDA_ERROR_OUT_OF_MEMORY) return 49;
    return 0;
}

void test_arrays() {
    const size_t f0 = free_mem();
    const size_t mb = 1 << 20;
    CUarray a = nullptr, b = nullptr;
    // as the H200: 8192x8192 floats take 256 MiB, 1000x1000 floats 4 MiB (2 MiB pages)
    CUDA_ARRAY3D_DESCRIPTOR d3{};
    d3.Width = 8192;
    d3.Height = 8192;
    d3.Format = CU_AD_FORMAT_FLOAT;
    d3.NumChannels = 1;
    OK(p_cuArray3DCreate_v2(&a, &d3));
    CHECK(free_mem() == f0 - 256 * mb);
    CUDA_ARRAY_DESCRIPTOR d2{1000, 1000, CU_AD_FORMAT_FLOAT, 1};
    OK(p_cuArrayCreate_v2(&b, &d2));
    CHECK(free_mem() == f0 - 260 * mb);
    CUDA_ARRAY_DESCRIPTOR g2{};
    OK(p_cuArrayGetDescriptor_v2(&g2, b));
    CHECK(g2.Width == 1000 && g2.Height == 1000 && g2.Format == CU_AD_FORMAT_FLOAT && g2.NumChannels == 1);
    CUDA_ARRAY3D_DESCRIPTOR g3{};
    OK(p_cuArray3DGetDescriptor_v2(&g3, a));
    CHECK(g3.Width == 8192 && g3.Height == 8192 && g3.Depth == 0);
    OK(p_cuArrayDestroy(a));
    OK(p_cuArrayDestroy(b));
    CHECK(free_mem() == f0);
    CHECK(p_cuArrayDestroy(b) == CUDA_ERROR_INVALID_HANDLE);
    // layered: element x width x height x layers (4 x 2 x 512 x 512 x 8 = 16 MiB)
    d3.Width = 512;
    d3.Height = 512;
    d3.Depth = 8;
    d3.Format = CU_AD_FORMAT_HALF;
    d3.NumChannels = 4;
    d3.Flags = CUDA_ARRAY3D_LAYERED;
    OK(p_cuArray3DCreate_v2(&a, &d3));
    CHECK(free_mem() == f0 - 16 * mb);
    OK(p_cuArrayDestroy(a));
    // mipmapped: the sum over levels (1024^2 + 512^2 + 256^2 floats = 5.25 MiB -> 6 MiB)
    CUDA_ARRAY3D_DESCRIPTOR dm{};
    dm.Width = 1024;
    dm.Height = 1024;
    dm.Format = CU_AD_FORMAT_FLOAT;
    dm.NumChannels = 1;
    CUmipmappedArray m = nullptr;
    CHECK(p_cuMipmappedArrayCreate(&m, &dm, 12) == CUDA_ERROR_INVALID_VALUE);  // at most 11 levels
    OK(p_cuMipmappedArrayCreate(&m, &dm, 3));
    CHECK(free_mem() == f0 - 6 * mb);
    CUarray lvl = nullptr;
    OK(p_cuMipmappedArrayGetLevel(&lvl, m, 2));
    OK(p_cuArray3DGetDescriptor_v2(&g3, lvl));
    CHECK(g3.Width == 256 && g3.Height == 256);
    CHECK(p_cuMipmappedArrayGetLevel(&lvl, m, 3) == CUDA_ERROR_INVALID_VALUE);
    CHECK(p_cuArrayDestroy(lvl) == CUDA_ERROR_INVALID_VALUE);  // owned by the mipmapped array
    OK(p_cuMipmappedArrayDestroy(m));
    CHECK(free_mem() == f0);
    // refused: no room, bad descriptors
    d3 = CUDA_ARRAY3D_DESCRIPTOR{};
    d3.Width = 16384;
    d3.Height = 16384;
    d3.Depth = 2;
    d3.Format = CU_AD_FORMAT_FLOAT;
    d3.NumChannels = 1;
    CHECK(p_cuArray3DCreate_v2(&a, &d3) == CUDA_ERROR_OUT_OF_MEMORY);
    d3.NumChannels = 3;
    CHECK(p_cuArray3DCreate_v2(&a, &d3) == CUDA_ERROR_INVALID_VALUE);
    d3.NumChannels = 1;
    d3.Width = 0;
    CHECK(p_cuArray3DCreate_v2(&a, &d3) == CUDA_ERROR_INVALID_VALUE);
    CHECK(free_mem() == f0);

    // the runtime: cudaMallocArray / cudaMalloc3DArray / cudaArrayGetInfo
    cudaChannelFormatDesc fd{32, 0, 0, 0, cudaChannelFormatKindFloat};
    cudaArray_t ra = nullptr;
    CHECK(g_rt.MallocArray(&ra, &fd, 1000, 1000, 0) == cudaSuccess);
    CHECK(free_mem() == f0 - 4 * mb);
    cudaChannelFormatDesc gd{};
    cudaExtent ge{};
    unsigned fl = 99;
    CHECK(g_rt.ArrayGetInfo(&gd, &ge, &fl, ra) == cudaSuccess);
    CHECK(gd.x == 32 && gd.y == 0 && gd.f == cudaChannelFormatKindFloat && ge.width == 1000 && ge.height == 1000 &&
          ge.depth == 0 && fl == 0);
    CHECK(g_rt.FreeArray(ra) == cudaSuccess);
    cudaChannelFormatDesc u4{8, 8, 8, 8, cudaChannelFormatKindUnsigned};
    CHECK(g_rt.Malloc3DArray(&ra, &u4, cudaExtent{256, 256, 64}, 0) == cudaSuccess);
    CHECK(free_mem() == f0 - 16 * mb);
    CHECK(g_rt.FreeArray(ra) == cudaSuccess);
    cudaMipmappedArray_t rm = nullptr;
    CHECK(g_rt.MallocMipmappedArray(&rm, &fd, cudaExtent{1024, 1024, 0}, 3, 0) == cudaSuccess);
    CHECK(free_mem() == f0 - 6 * mb);
    CHECK(g_rt.FreeMipmappedArray(rm) == cudaSuccess);
    CHECK(free_mem() == f0);
    g_rt.GetLastError();
    CHECK(g_rt.Malloc3DArray(&ra, &fd, cudaExtent{16384, 16384, 2048}, 0) == cudaErrorMemoryAllocation);
    CHECK(g_rt.PeekAtLastError() == cudaErrorMemoryAllocation);
    CHECK(g_rt.GetLastError() == cudaErrorMemoryAllocation && g_rt.GetLastError() == cudaSuccess);
    cudaChannelFormatDesc bad{32, 16, 0, 0, cudaChannelFormatKindFloat};
    CHECK(g_rt.MallocArray(&ra, &bad, 16, 16, 0) == cudaErrorInvalidChannelDescriptor);
    g_rt.GetLastError();
}

void test_destroyed_streams() {
    // As measured: an event recorded on the legacy stream after a stream with queued work was
    // destroyed waits for that work if the stream was blocking, not if it was non-blocking.
    CUevent e = nullptr;
    OK(p_cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
    for (bool blocking : {false, true}) {
        CUstream s = nullptr;
        OK(p_cuStreamCreate(&s, blocking ? CU_STREAM_DEFAULT : CU_STREAM_NON_BLOCKING));
        Sleeper sl{200};
        OK(p_cuLaunchHostFunc(s, sleeper_fn, &sl));
        auto t0 = Clock::now();
        OK(p_cuStreamDestroy_v2(s));
        CHECK(ms_since(t0) < 100);  // returns at once
        OK(p_cuEventRecord(e, CU_STREAM_LEGACY));
        OK(p_cuEventSynchronize(e));
        if (blocking) CHECK(sl.done && ms_since(t0) >= 150);
        else CHECK(!sl.done && ms_since(t0) < 100);
        OK(p_cuCtxSynchronize());
        CHECK(sl.done);
    }
    // cuMemFree still waits for a destroyed stream's work
    CUstream s = nullptr;
    CUdeviceptr p = 0;
    OK(p_cuMemAlloc_v2(&p, 4096));
    OK(p_cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    Sleeper sl{80};
    OK(p_cuLaunchHostFunc(s, sleeper_fn, &sl));
    OK(p_cuStreamDestroy_v2(s));
    OK(p_cuMemFree_v2(p));
    CHECK(sl.done);
    OK(p_cuEventDestroy_v2(e));
}

void test_per_thread_legacy() {
    // The legacy stream waits for every thread's per-thread stream (measured: 100 ms), even after
    // that thread exited; two threads' per-thread streams do not wait for each other.
    CUevent e = nullptr;
    OK(p_cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
    Sleeper a{100};
    auto t0 = Clock::now();
    std::thread([&] {
        OK(p_cuCtxSetCurrent(g_prim));
        OK(p_cuLaunchHostFunc_ptsz(nullptr, sleeper_fn, &a));
    }).join();
    OK(p_cuEventRecord(e, CU_STREAM_LEGACY));
    OK(p_cuEventSynchronize(e));
    CHECK(a.done && ms_since(t0) >= 80);
    Sleeper b{200};
    std::thread([&] {
        OK(p_cuCtxSetCurrent(g_prim));
        OK(p_cuLaunchHostFunc_ptsz(nullptr, sleeper_fn, &b));
    }).join();
    double waited = 0;
    std::thread([&] {
        OK(p_cuCtxSetCurrent(g_prim));
        auto t1 = Clock::now();
        OK(p_cuLaunchHostFunc_ptsz(nullptr, noop_fn, nullptr));
        OK(p_cuStreamSynchronize_ptsz(nullptr));
        waited = ms_since(t1);
    }).join();
    CHECK(waited < 100 && !b.done);
    OK(p_cuCtxSynchronize());
    OK(p_cuEventDestroy_v2(e));
}

void test_runtime_errors() {
    // As measured: each refused allocation leaves cudaErrorMemoryAllocation as the thread's last
    // error; cudaPeekAtLastError keeps it, cudaGetLastError clears it.
    void* p = nullptr;
    size_t pitch = 0;
    const size_t huge = size_t{1} << 50;
    g_rt.GetLastError();
    CHECK(g_rt.Malloc(&p, huge) == cudaErrorMemoryAllocation && g_rt.GetLastError() == cudaErrorMemoryAllocation);
    CHECK(g_rt.MallocManaged(&p, huge, cudaMemAttachGlobal) == cudaErrorMemoryAllocation &&
          g_rt.GetLastError() == cudaErrorMemoryAllocation);
    CHECK(g_rt.MallocAsync(&p, huge, nullptr) == cudaErrorMemoryAllocation &&
          g_rt.GetLastError() == cudaErrorMemoryAllocation);
    CHECK(g_rt.MallocPitch(&p, &pitch, size_t{1} << 25, size_t{1} << 25) == cudaErrorMemoryAllocation &&
          g_rt.GetLastError() == cudaErrorMemoryAllocation);
    CHECK(g_rt.Malloc(&p, huge) == cudaErrorMemoryAllocation);
    CHECK(g_rt.PeekAtLastError() == cudaErrorMemoryAllocation && g_rt.PeekAtLastError() == cudaErrorMemoryAllocation);
    cudaError_t other = cudaErrorUnknown;
    std::thread([&] { other = g_rt.PeekAtLastError(); }).join();
    CHECK(other == cudaSuccess);  // per thread
    CHECK(g_rt.GetLastError() == cudaErrorMemoryAllocation && g_rt.GetLastError() == cudaSuccess);

    // capture errors, mapped and recorded
    cudaStream_t s = nullptr, blk = nullptr;
    CHECK(g_rt.StreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(g_rt.StreamCreateWithFlags(&blk, cudaStreamDefault) == cudaSuccess);
    CHECK(g_rt.StreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    CHECK(g_rt.Malloc(&p, 256) == cudaErrorStreamCaptureUnsupported);
    CHECK(g_rt.GetLastError() == cudaErrorStreamCaptureUnsupported);
    cudaStreamCaptureStatus st{};
    CHECK(g_rt.StreamIsCapturing(s, &st) == cudaSuccess && st == cudaStreamCaptureStatusInvalidated);
    cudaGraph_t g = nullptr;
    CHECK(g_rt.StreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated && g == nullptr);
    CHECK(g_rt.GetLastError() == cudaErrorStreamCaptureInvalidated);
    CHECK(g_rt.StreamBeginCapture(blk, cudaStreamCaptureModeRelaxed) == cudaSuccess);
    CHECK(g_rt.LaunchHostFunc(nullptr, noop_fn, nullptr) == cudaErrorStreamCaptureImplicit);  // legacy stream
    CHECK(g_rt.GetLastError() == cudaErrorStreamCaptureImplicit);
    CHECK(g_rt.StreamEndCapture(blk, &g) == cudaErrorStreamCaptureInvalidated);
    g_rt.GetLastError();

    // a graph through the runtime, with graph memory (the probe's 64 MiB case)
    size_t f0 = 0, f1 = 0, t = 0;
    CHECK(g_rt.MemGetInfo(&f0, &t) == cudaSuccess);
    CHECK(g_rt.StreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    CHECK(g_rt.MallocAsync(&p, 64 << 20, s) == cudaSuccess);
    std::atomic<int> count{0};
    CHECK(g_rt.LaunchHostFunc(s, count_fn, &count) == cudaSuccess);
    CHECK(g_rt.FreeAsync(p, s) == cudaSuccess);
    CHECK(g_rt.StreamEndCapture(s, &g) == cudaSuccess && g != nullptr);
    cudaGraphExec_t ge = nullptr;
    CHECK(g_rt.GraphInstantiate(&ge, g, 0) == cudaSuccess);
    CHECK(g_rt.GraphLaunch(ge, s) == cudaSuccess && g_rt.StreamSynchronize(s) == cudaSuccess);
    CHECK(count == 1);
    unsigned long long reserved = 0, used = 0;
    CHECK(g_rt.DeviceGetGraphMemAttribute(0, cudaGraphMemAttrReservedMemCurrent, &reserved) == cudaSuccess);
    CHECK(g_rt.DeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemCurrent, &used) == cudaSuccess);
    CHECK(g_rt.MemGetInfo(&f1, &t) == cudaSuccess);
    CHECK(reserved == 64ull << 20 && used == 64ull << 20 && f0 - f1 == 64ull << 20);
    CHECK(g_rt.DeviceGraphMemTrim(0) == cudaSuccess);
    CHECK(g_rt.DeviceGetGraphMemAttribute(0, cudaGraphMemAttrReservedMemCurrent, &reserved) == cudaSuccess);
    CHECK(g_rt.MemGetInfo(&f1, &t) == cudaSuccess);
    CHECK(reserved == 0 && f1 == f0);
    CHECK(g_rt.GraphExecDestroy(ge) == cudaSuccess && g_rt.GraphDestroy(g) == cudaSuccess);
    CHECK(g_rt.StreamDestroy(s) == cudaSuccess && g_rt.StreamDestroy(blk) == cudaSuccess);
    CHECK(g_rt.GetLastError() == cudaSuccess);
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
    if (argc >= 2 && std::strcmp(argv[1], "--graph-fail-child") == 0) return graph_fail_child();

    CUdeviceptr p = 0;
    CHECK(p_cuMemAlloc_v2(&p, 256) == CUDA_ERROR_NOT_INITIALIZED);  // before cuInit
    int v = 0;
    OK(p_cuDriverGetVersion(&v));
    CHECK(v == 13000);
    test_procaddress();  // works before cuInit
    test_procaddress_capture();
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
    test_vmm_shareable();
    test_contexts();
    test_ipc_and_fork();
    test_runtime();
    g_prim = prim;
    CHECK(load_rt());
    if (g_rt.Malloc) {
        test_capture_probe_table();
        test_capture_graph();
        test_graph_memory();
        test_arrays();
        test_destroyed_streams();
        test_per_thread_legacy();
        test_runtime_errors();
        CHECK(run_child({"prog_sim_selftest", "--graph-fail-child"}, "CUPOOL_SIM_FAIL_ALLOC_AFTER=1") == 0);
    }
    OK(p_cuStreamDestroy_v2(nb));
    OK(p_cuDevicePrimaryCtxRelease_v2(0));
    if (g_fail) {
        std::printf("sim-selftest: %d failure(s)\n", g_fail);
        return 1;
    }
    std::printf("sim-selftest: all checks passed\n");
    return 0;
}
