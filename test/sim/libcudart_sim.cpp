// Simulated CUDA runtime: a fake libcudart.so.13 (and the same source as a static library, modelling
// nvcc's default `-cudart static`).
//
// Like the real runtime it does not link libcuda: on first use it dlopen()s "libcuda.so.1", looks up
// "cuGetProcAddress_v2" with dlsym, and fetches every driver function it uses through that pointer
// (version 13000; flags CU_GET_PROC_ADDRESS_LEGACY_STREAM for the plain entry points and
// CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM for the _ptsz/_ptds ones).

#define __CUDA_API_VERSION_INTERNAL 1
#pragma GCC visibility push(default)
#include <cuda_runtime_api.h>
#pragma GCC visibility pop
#include <cuda.h>

#include <array>
#include <cstddef>
#include <cstring>
#include <mutex>

#include <dlfcn.h>

namespace {

constexpr int kVersion = CUDART_VERSION;  // 13000
constexpr int kMaxDevices = 64;

// Driver entry points, one set per stream mode (index 0: legacy stream, 1: per-thread default stream).
struct Drv {
    decltype(&cuGetProcAddress_v2) GetProcAddress;
    decltype(&cuInit) Init;
    decltype(&cuDriverGetVersion) DriverGetVersion;
    decltype(&cuDeviceGetCount) DeviceGetCount;
    decltype(&cuDevicePrimaryCtxRetain) DevicePrimaryCtxRetain;
    decltype(&cuDevicePrimaryCtxReset_v2) DevicePrimaryCtxReset;
    decltype(&cuCtxGetCurrent) CtxGetCurrent;
    decltype(&cuCtxSetCurrent) CtxSetCurrent;
    decltype(&cuCtxGetDevice) CtxGetDevice;
    decltype(&cuCtxSynchronize) CtxSynchronize;
    decltype(&cuMemAlloc_v2) MemAlloc;
    decltype(&cuMemFree_v2) MemFree;
    decltype(&cuMemAllocPitch_v2) MemAllocPitch;
    decltype(&cuMemAllocManaged) MemAllocManaged;
    decltype(&cuMemGetInfo_v2) MemGetInfo;
    decltype(&cuMemAllocAsync) MemAllocAsync;
    decltype(&cuMemAllocFromPoolAsync) MemAllocFromPoolAsync;
    decltype(&cuMemFreeAsync) MemFreeAsync;
    decltype(&cuDeviceGetDefaultMemPool) DeviceGetDefaultMemPool;
    decltype(&cuMemPoolSetAttribute) MemPoolSetAttribute;
    decltype(&cuMemPoolGetAttribute) MemPoolGetAttribute;
    decltype(&cuMemcpy) Memcpy;
    decltype(&cuMemcpyAsync) MemcpyAsync;
    decltype(&cuMemsetD8_v2) MemsetD8;
    decltype(&cuMemsetD8Async) MemsetD8Async;
    decltype(&cuStreamCreateWithPriority) StreamCreateWithPriority;
    decltype(&cuStreamDestroy_v2) StreamDestroy;
    decltype(&cuStreamSynchronize) StreamSynchronize;
    decltype(&cuStreamQuery) StreamQuery;
    decltype(&cuStreamWaitEvent) StreamWaitEvent;
    decltype(&cuLaunchHostFunc) LaunchHostFunc;
    decltype(&cuEventCreate) EventCreate;
    decltype(&cuEventRecord) EventRecord;
    decltype(&cuEventQuery) EventQuery;
    decltype(&cuEventSynchronize) EventSynchronize;
    decltype(&cuEventDestroy_v2) EventDestroy;
    decltype(&cuEventElapsedTime_v2) EventElapsedTime;
    decltype(&cuIpcGetMemHandle) IpcGetMemHandle;
    decltype(&cuIpcOpenMemHandle_v2) IpcOpenMemHandle;
    decltype(&cuIpcCloseMemHandle) IpcCloseMemHandle;
    decltype(&cuPointerGetAttributes) PointerGetAttributes;
    decltype(&cuMemHostAlloc) MemHostAlloc;
    decltype(&cuCtxEnablePeerAccess) CtxEnablePeerAccess;
    decltype(&cuCtxDisablePeerAccess) CtxDisablePeerAccess;
    decltype(&cuDeviceCanAccessPeer) DeviceCanAccessPeer;
    decltype(&cuMemFreeHost) MemFreeHost;
    decltype(&cuDeviceGetAttribute) DeviceGetAttribute;
    decltype(&cuStreamBeginCapture_v2) StreamBeginCapture;
    decltype(&cuStreamBeginCaptureToGraph) StreamBeginCaptureToGraph;
    decltype(&cuStreamEndCapture) StreamEndCapture;
    decltype(&cuStreamIsCapturing) StreamIsCapturing;
    decltype(&cuStreamGetCaptureInfo_v3) StreamGetCaptureInfo;
    decltype(&cuThreadExchangeStreamCaptureMode) ThreadExchangeStreamCaptureMode;
    decltype(&cuGraphCreate) GraphCreate;
    decltype(&cuGraphDestroy) GraphDestroy;
    decltype(&cuGraphGetNodes) GraphGetNodes;
    decltype(&cuGraphNodeGetType) GraphNodeGetType;
    decltype(&cuGraphAddHostNode) GraphAddHostNode;
    decltype(&cuGraphAddMemAllocNode) GraphAddMemAllocNode;
    decltype(&cuGraphMemAllocNodeGetParams) GraphMemAllocNodeGetParams;
    decltype(&cuGraphAddMemFreeNode) GraphAddMemFreeNode;
    decltype(&cuGraphInstantiateWithFlags) GraphInstantiateWithFlags;
    decltype(&cuGraphInstantiateWithParams) GraphInstantiateWithParams;
    decltype(&cuGraphExecDestroy) GraphExecDestroy;
    decltype(&cuGraphLaunch) GraphLaunch;
    decltype(&cuGraphUpload) GraphUpload;
    decltype(&cuDeviceGraphMemTrim) DeviceGraphMemTrim;
    decltype(&cuDeviceGetGraphMemAttribute) DeviceGetGraphMemAttribute;
    decltype(&cuDeviceSetGraphMemAttribute) DeviceSetGraphMemAttribute;
    decltype(&cuArray3DCreate_v2) Array3DCreate;
    decltype(&cuArrayDestroy) ArrayDestroy;
    decltype(&cuArray3DGetDescriptor_v2) Array3DGetDescriptor;
    decltype(&cuMipmappedArrayCreate) MipmappedArrayCreate;
    decltype(&cuMipmappedArrayGetLevel) MipmappedArrayGetLevel;
    decltype(&cuMipmappedArrayDestroy) MipmappedArrayDestroy;
};

Drv g_drv[2];
cudaError_t g_init_err = cudaErrorInitializationError;
std::once_flag g_once;
std::mutex g_mu;
std::array<CUcontext, kMaxDevices> g_primary{};  // retained primary contexts (null: not retained)

thread_local cudaError_t tl_last = cudaSuccess;
thread_local int tl_device = 0;

cudaError_t map_err(CUresult r) {
    switch (r) {
    case CUDA_SUCCESS: return cudaSuccess;
    case CUDA_ERROR_INVALID_VALUE: return cudaErrorInvalidValue;
    case CUDA_ERROR_OUT_OF_MEMORY: return cudaErrorMemoryAllocation;
    case CUDA_ERROR_NOT_INITIALIZED: return cudaErrorInitializationError;
    case CUDA_ERROR_DEINITIALIZED: return cudaErrorCudartUnloading;
    case CUDA_ERROR_NO_DEVICE: return cudaErrorNoDevice;
    case CUDA_ERROR_INVALID_DEVICE: return cudaErrorInvalidDevice;
    case CUDA_ERROR_INVALID_CONTEXT: return cudaErrorDeviceUninitialized;
    case CUDA_ERROR_CONTEXT_IS_DESTROYED: return cudaErrorContextIsDestroyed;
    case CUDA_ERROR_INVALID_HANDLE: return cudaErrorInvalidResourceHandle;
    case CUDA_ERROR_NOT_FOUND: return cudaErrorSymbolNotFound;
    case CUDA_ERROR_NOT_READY: return cudaErrorNotReady;
    case CUDA_ERROR_NOT_SUPPORTED: return cudaErrorNotSupported;
    case CUDA_ERROR_ILLEGAL_STATE: return cudaErrorIllegalState;
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: return cudaErrorStreamCaptureUnsupported;
    case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: return cudaErrorStreamCaptureInvalidated;
    case CUDA_ERROR_STREAM_CAPTURE_MERGE: return cudaErrorStreamCaptureMerge;
    case CUDA_ERROR_STREAM_CAPTURE_UNMATCHED: return cudaErrorStreamCaptureUnmatched;
    case CUDA_ERROR_STREAM_CAPTURE_UNJOINED: return cudaErrorStreamCaptureUnjoined;
    case CUDA_ERROR_STREAM_CAPTURE_ISOLATION: return cudaErrorStreamCaptureIsolation;
    case CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: return cudaErrorStreamCaptureImplicit;
    case CUDA_ERROR_CAPTURED_EVENT: return cudaErrorCapturedEvent;
    case CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD: return cudaErrorStreamCaptureWrongThread;
    default: return cudaErrorUnknown;
    }
}

// Records a failing result as the thread's last error (as the real runtime does).
cudaError_t ret(cudaError_t e) {
    if (e != cudaSuccess && e != cudaErrorNotReady) tl_last = e;
    return e;
}
cudaError_t ret(CUresult r) { return ret(map_err(r)); }

template <typename F>
bool fetch(F& f, const char* name, cuuint64_t flags) {
    void* p = nullptr;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r = g_drv[0].GetProcAddress(name, &p, kVersion, flags, &st);
    f = reinterpret_cast<F>(p);
    return r == CUDA_SUCCESS && st == CU_GET_PROC_ADDRESS_SUCCESS && p != nullptr;
}

bool fetch_all(Drv& d, cuuint64_t fl) {
    bool ok = true;
    ok &= fetch(d.GetProcAddress, "cuGetProcAddress", fl);
    ok &= fetch(d.Init, "cuInit", fl);
    ok &= fetch(d.DriverGetVersion, "cuDriverGetVersion", fl);
    ok &= fetch(d.DeviceGetCount, "cuDeviceGetCount", fl);
    ok &= fetch(d.DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", fl);
    ok &= fetch(d.DevicePrimaryCtxReset, "cuDevicePrimaryCtxReset", fl);
    ok &= fetch(d.CtxGetCurrent, "cuCtxGetCurrent", fl);
    ok &= fetch(d.CtxSetCurrent, "cuCtxSetCurrent", fl);
    ok &= fetch(d.CtxGetDevice, "cuCtxGetDevice", fl);
    ok &= fetch(d.CtxSynchronize, "cuCtxSynchronize", fl);
    ok &= fetch(d.MemAlloc, "cuMemAlloc", fl);
    ok &= fetch(d.MemFree, "cuMemFree", fl);
    ok &= fetch(d.MemAllocPitch, "cuMemAllocPitch", fl);
    ok &= fetch(d.MemAllocManaged, "cuMemAllocManaged", fl);
    ok &= fetch(d.MemGetInfo, "cuMemGetInfo", fl);
    ok &= fetch(d.MemAllocAsync, "cuMemAllocAsync", fl);
    ok &= fetch(d.MemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", fl);
    ok &= fetch(d.MemFreeAsync, "cuMemFreeAsync", fl);
    ok &= fetch(d.DeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", fl);
    ok &= fetch(d.MemPoolSetAttribute, "cuMemPoolSetAttribute", fl);
    ok &= fetch(d.MemPoolGetAttribute, "cuMemPoolGetAttribute", fl);
    ok &= fetch(d.Memcpy, "cuMemcpy", fl);
    ok &= fetch(d.MemcpyAsync, "cuMemcpyAsync", fl);
    ok &= fetch(d.MemsetD8, "cuMemsetD8", fl);
    ok &= fetch(d.MemsetD8Async, "cuMemsetD8Async", fl);
    ok &= fetch(d.StreamCreateWithPriority, "cuStreamCreateWithPriority", fl);
    ok &= fetch(d.StreamDestroy, "cuStreamDestroy", fl);
    ok &= fetch(d.StreamSynchronize, "cuStreamSynchronize", fl);
    ok &= fetch(d.StreamQuery, "cuStreamQuery", fl);
    ok &= fetch(d.StreamWaitEvent, "cuStreamWaitEvent", fl);
    ok &= fetch(d.LaunchHostFunc, "cuLaunchHostFunc", fl);
    ok &= fetch(d.EventCreate, "cuEventCreate", fl);
    ok &= fetch(d.EventRecord, "cuEventRecord", fl);
    ok &= fetch(d.EventQuery, "cuEventQuery", fl);
    ok &= fetch(d.EventSynchronize, "cuEventSynchronize", fl);
    ok &= fetch(d.EventDestroy, "cuEventDestroy", fl);
    ok &= fetch(d.EventElapsedTime, "cuEventElapsedTime", fl);
    ok &= fetch(d.IpcGetMemHandle, "cuIpcGetMemHandle", fl);
    ok &= fetch(d.IpcOpenMemHandle, "cuIpcOpenMemHandle", fl);
    ok &= fetch(d.IpcCloseMemHandle, "cuIpcCloseMemHandle", fl);
    ok &= fetch(d.PointerGetAttributes, "cuPointerGetAttributes", fl);
    ok &= fetch(d.MemHostAlloc, "cuMemHostAlloc", fl);
    ok &= fetch(d.CtxEnablePeerAccess, "cuCtxEnablePeerAccess", fl);
    ok &= fetch(d.CtxDisablePeerAccess, "cuCtxDisablePeerAccess", fl);
    ok &= fetch(d.DeviceCanAccessPeer, "cuDeviceCanAccessPeer", fl);
    ok &= fetch(d.MemFreeHost, "cuMemFreeHost", fl);
    ok &= fetch(d.DeviceGetAttribute, "cuDeviceGetAttribute", fl);
    ok &= fetch(d.StreamBeginCapture, "cuStreamBeginCapture", fl);
    ok &= fetch(d.StreamBeginCaptureToGraph, "cuStreamBeginCaptureToGraph", fl);
    ok &= fetch(d.StreamEndCapture, "cuStreamEndCapture", fl);
    ok &= fetch(d.StreamIsCapturing, "cuStreamIsCapturing", fl);
    ok &= fetch(d.StreamGetCaptureInfo, "cuStreamGetCaptureInfo", fl);
    ok &= fetch(d.ThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode", fl);
    ok &= fetch(d.GraphCreate, "cuGraphCreate", fl);
    ok &= fetch(d.GraphDestroy, "cuGraphDestroy", fl);
    ok &= fetch(d.GraphGetNodes, "cuGraphGetNodes", fl);
    ok &= fetch(d.GraphNodeGetType, "cuGraphNodeGetType", fl);
    ok &= fetch(d.GraphAddHostNode, "cuGraphAddHostNode", fl);
    ok &= fetch(d.GraphAddMemAllocNode, "cuGraphAddMemAllocNode", fl);
    ok &= fetch(d.GraphMemAllocNodeGetParams, "cuGraphMemAllocNodeGetParams", fl);
    ok &= fetch(d.GraphAddMemFreeNode, "cuGraphAddMemFreeNode", fl);
    ok &= fetch(d.GraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", fl);
    ok &= fetch(d.GraphInstantiateWithParams, "cuGraphInstantiateWithParams", fl);
    ok &= fetch(d.GraphExecDestroy, "cuGraphExecDestroy", fl);
    ok &= fetch(d.GraphLaunch, "cuGraphLaunch", fl);
    ok &= fetch(d.GraphUpload, "cuGraphUpload", fl);
    ok &= fetch(d.DeviceGraphMemTrim, "cuDeviceGraphMemTrim", fl);
    ok &= fetch(d.DeviceGetGraphMemAttribute, "cuDeviceGetGraphMemAttribute", fl);
    ok &= fetch(d.DeviceSetGraphMemAttribute, "cuDeviceSetGraphMemAttribute", fl);
    ok &= fetch(d.Array3DCreate, "cuArray3DCreate", fl);
    ok &= fetch(d.ArrayDestroy, "cuArrayDestroy", fl);
    ok &= fetch(d.Array3DGetDescriptor, "cuArray3DGetDescriptor", fl);
    ok &= fetch(d.MipmappedArrayCreate, "cuMipmappedArrayCreate", fl);
    ok &= fetch(d.MipmappedArrayGetLevel, "cuMipmappedArrayGetLevel", fl);
    ok &= fetch(d.MipmappedArrayDestroy, "cuMipmappedArrayDestroy", fl);
    return ok;
}

void load_driver() {
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (h == nullptr) {
        g_init_err = cudaErrorInsufficientDriver;
        return;
    }
    void* gpa = dlsym(h, "cuGetProcAddress_v2");
    if (gpa == nullptr) {
        g_init_err = cudaErrorInsufficientDriver;
        return;
    }
    g_drv[0].GetProcAddress = reinterpret_cast<decltype(&cuGetProcAddress_v2)>(gpa);
    if (!fetch_all(g_drv[0], CU_GET_PROC_ADDRESS_LEGACY_STREAM)) {
        g_init_err = cudaErrorInsufficientDriver;
        return;
    }
    g_drv[1].GetProcAddress = g_drv[0].GetProcAddress;
    if (!fetch_all(g_drv[1], CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)) {
        g_init_err = cudaErrorInsufficientDriver;
        return;
    }
    g_init_err = map_err(g_drv[0].Init(0));
}

// Loads the driver (no context).
cudaError_t init_rt() {
    std::call_once(g_once, load_driver);
    return g_init_err;
}

const Drv& D(bool pt = false) { return g_drv[pt ? 1 : 0]; }

cudaError_t activate(int dev) {
    CUcontext c = nullptr;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        if (dev < 0 || dev >= kMaxDevices) return cudaErrorInvalidDevice;
        if (g_primary[static_cast<size_t>(dev)] == nullptr) {
            CUresult r = D().DevicePrimaryCtxRetain(&c, dev);
            if (r != CUDA_SUCCESS) return map_err(r);
            g_primary[static_cast<size_t>(dev)] = c;
        }
        c = g_primary[static_cast<size_t>(dev)];
    }
    return map_err(D().CtxSetCurrent(c));
}

// Lazy context creation: a valid driver context current on the thread is used, otherwise the primary
// context of the thread's runtime device is retained and made current.
cudaError_t ensure_ctx() {
    if (cudaError_t e = init_rt(); e != cudaSuccess) return e;
    CUcontext cur = nullptr;
    if (D().CtxGetCurrent(&cur) == CUDA_SUCCESS && cur != nullptr) {
        CUdevice d = 0;
        if (D().CtxGetDevice(&d) == CUDA_SUCCESS) return cudaSuccess;
    }
    return activate(tl_device);
}

#define ENSURE()                                          \
    do {                                                  \
        if (cudaError_t e_ = ensure_ctx(); e_ != cudaSuccess) return ret(e_); \
    } while (0)

CUdeviceptr dp(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }
CUstream cs(cudaStream_t s) { return reinterpret_cast<CUstream>(s); }
CUevent ce(cudaEvent_t e) { return reinterpret_cast<CUevent>(e); }

cudaError_t malloc_async(void** p, size_t size, cudaStream_t s, bool pt) {
    ENSURE();
    if (p == nullptr) return ret(cudaErrorInvalidValue);
    if (size == 0) {
        *p = nullptr;
        return cudaSuccess;
    }
    CUdeviceptr d = 0;
    CUresult r = D(pt).MemAllocAsync(&d, size, cs(s));
    if (r == CUDA_SUCCESS) *p = reinterpret_cast<void*>(d);
    return ret(r);
}

cudaError_t malloc_from_pool_async(void** p, size_t size, cudaMemPool_t pool, cudaStream_t s, bool pt) {
    ENSURE();
    if (p == nullptr) return ret(cudaErrorInvalidValue);
    CUdeviceptr d = 0;
    CUresult r = D(pt).MemAllocFromPoolAsync(&d, size, reinterpret_cast<CUmemoryPool>(pool), cs(s));
    if (r == CUDA_SUCCESS) *p = reinterpret_cast<void*>(d);
    return ret(r);
}

cudaError_t free_async(void* p, cudaStream_t s, bool pt) {
    ENSURE();
    if (p == nullptr) return cudaSuccess;
    return ret(D(pt).MemFreeAsync(dp(p), cs(s)));
}

cudaError_t memcpy_rt(void* dst, const void* src, size_t n, cudaMemcpyKind kind, bool pt) {
    ENSURE();
    if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) return ret(cudaErrorInvalidMemcpyDirection);
    return ret(D(pt).Memcpy(dp(dst), dp(src), n));
}

cudaError_t memcpy_async_rt(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t s, bool pt) {
    ENSURE();
    if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) return ret(cudaErrorInvalidMemcpyDirection);
    return ret(D(pt).MemcpyAsync(dp(dst), dp(src), n, cs(s)));
}

cudaError_t entry_point(const char* symbol, void** funcPtr, unsigned int version, unsigned long long flags,
                        cudaDriverEntryPointQueryResult* status, bool pt) {
    if (cudaError_t e = init_rt(); e != cudaSuccess) return ret(e);
    if (symbol == nullptr || funcPtr == nullptr) return ret(cudaErrorInvalidValue);
    cuuint64_t fl = 0;
    if (flags == cudaEnableDefault) fl = pt ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_LEGACY_STREAM;
    else if (flags == cudaEnableLegacyStream) fl = CU_GET_PROC_ADDRESS_LEGACY_STREAM;
    else if (flags == cudaEnablePerThreadDefaultStream) fl = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    else return ret(cudaErrorInvalidValue);
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    *funcPtr = nullptr;
    CUresult r = D().GetProcAddress(symbol, funcPtr, static_cast<int>(version), fl, &st);
    if (status) *status = static_cast<cudaDriverEntryPointQueryResult>(st);
    if (r == CUDA_SUCCESS) return cudaSuccess;
    if (r == CUDA_ERROR_NOT_FOUND) return status ? cudaSuccess : ret(cudaErrorSymbolNotFound);
    return ret(r);
}

// The runtime's graph and capture types are the driver's, as in the real runtime.
static_assert(sizeof(cudaMemAllocNodeParams) == sizeof(CUDA_MEM_ALLOC_NODE_PARAMS));
static_assert(offsetof(cudaMemAllocNodeParams, dptr) == offsetof(CUDA_MEM_ALLOC_NODE_PARAMS, dptr));
static_assert(sizeof(cudaHostNodeParams) == sizeof(CUDA_HOST_NODE_PARAMS));
static_assert(sizeof(cudaGraphInstantiateParams) == sizeof(CUDA_GRAPH_INSTANTIATE_PARAMS));
static_assert(sizeof(cudaGraphEdgeData) == sizeof(CUgraphEdgeData));
static_assert(static_cast<int>(cudaGraphNodeTypeMemAlloc) == CU_GRAPH_NODE_TYPE_MEM_ALLOC);
static_assert(static_cast<int>(cudaGraphMemAttrReservedMemHigh) == CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH);
static_assert(static_cast<int>(cudaStreamCaptureModeRelaxed) == CU_STREAM_CAPTURE_MODE_RELAXED);
static_assert(static_cast<int>(cudaStreamCaptureStatusInvalidated) == CU_STREAM_CAPTURE_STATUS_INVALIDATED);

CUgraph cg(cudaGraph_t g) { return reinterpret_cast<CUgraph>(g); }
CUgraphExec cx(cudaGraphExec_t g) { return reinterpret_cast<CUgraphExec>(g); }
const CUgraphNode* cn(const cudaGraphNode_t* n) { return reinterpret_cast<const CUgraphNode*>(n); }

cudaError_t begin_capture(cudaStream_t s, cudaStreamCaptureMode mode, bool pt) {
    ENSURE();
    return ret(D(pt).StreamBeginCapture(cs(s), static_cast<CUstreamCaptureMode>(mode)));
}

cudaError_t begin_capture_to_graph(cudaStream_t s, cudaGraph_t g, const cudaGraphNode_t* deps,
                                   const cudaGraphEdgeData* edges, size_t n, cudaStreamCaptureMode mode, bool pt) {
    ENSURE();
    return ret(D(pt).StreamBeginCaptureToGraph(cs(s), cg(g), cn(deps), reinterpret_cast<const CUgraphEdgeData*>(edges),
                                               n, static_cast<CUstreamCaptureMode>(mode)));
}

cudaError_t end_capture(cudaStream_t s, cudaGraph_t* g, bool pt) {
    ENSURE();
    return ret(D(pt).StreamEndCapture(cs(s), reinterpret_cast<CUgraph*>(g)));
}

cudaError_t is_capturing(cudaStream_t s, cudaStreamCaptureStatus* st, bool pt) {
    ENSURE();
    return ret(D(pt).StreamIsCapturing(cs(s), reinterpret_cast<CUstreamCaptureStatus*>(st)));
}

cudaError_t capture_info(cudaStream_t s, cudaStreamCaptureStatus* st, unsigned long long* id, cudaGraph_t* g,
                         const cudaGraphNode_t** deps, const cudaGraphEdgeData** edges, size_t* n, bool pt) {
    ENSURE();
    static_assert(sizeof(unsigned long long) == sizeof(cuuint64_t));
    return ret(D(pt).StreamGetCaptureInfo(cs(s), reinterpret_cast<CUstreamCaptureStatus*>(st),
                                          reinterpret_cast<cuuint64_t*>(id),
                                          reinterpret_cast<CUgraph*>(g), reinterpret_cast<const CUgraphNode**>(deps),
                                          reinterpret_cast<const CUgraphEdgeData**>(edges), n));
}

cudaError_t instantiate_with_params(cudaGraphExec_t* e, cudaGraph_t g, cudaGraphInstantiateParams* p, bool pt) {
    ENSURE();
    return ret(D(pt).GraphInstantiateWithParams(reinterpret_cast<CUgraphExec*>(e), cg(g),
                                                reinterpret_cast<CUDA_GRAPH_INSTANTIATE_PARAMS*>(p)));
}

// A runtime channel format (bits per channel, kind) as the driver's array format and channel count.
bool to_format(const cudaChannelFormatDesc& d, CUarray_format* f, unsigned* channels) {
    int bits[4] = {d.x, d.y, d.z, d.w};
    unsigned n = 0;
    for (int b : bits)
        if (b != 0) {
            if (b != d.x) return false;
            ++n;
        }
    if (n != 1 && n != 2 && n != 4) return false;
    *channels = n;
    switch (d.f) {
    case cudaChannelFormatKindSigned:
        *f = d.x == 8 ? CU_AD_FORMAT_SIGNED_INT8 : d.x == 16 ? CU_AD_FORMAT_SIGNED_INT16 : CU_AD_FORMAT_SIGNED_INT32;
        return d.x == 8 || d.x == 16 || d.x == 32;
    case cudaChannelFormatKindUnsigned:
        *f = d.x == 8 ? CU_AD_FORMAT_UNSIGNED_INT8 : d.x == 16 ? CU_AD_FORMAT_UNSIGNED_INT16 : CU_AD_FORMAT_UNSIGNED_INT32;
        return d.x == 8 || d.x == 16 || d.x == 32;
    case cudaChannelFormatKindFloat:
        *f = d.x == 16 ? CU_AD_FORMAT_HALF : CU_AD_FORMAT_FLOAT;
        return d.x == 16 || d.x == 32;
    default:
        return false;
    }
}

cudaError_t array_desc(const cudaChannelFormatDesc* desc, cudaExtent ext, unsigned flags, CUDA_ARRAY3D_DESCRIPTOR* out) {
    if (desc == nullptr) return cudaErrorInvalidValue;
    std::memset(out, 0, sizeof *out);
    if (!to_format(*desc, &out->Format, &out->NumChannels)) return cudaErrorInvalidChannelDescriptor;
    out->Width = ext.width;
    out->Height = ext.height;
    out->Depth = ext.depth;
    out->Flags = flags;  // cudaArrayLayered, SurfaceLoadStore, Cubemap, TextureGather: the driver's bits
    return cudaSuccess;
}

cudaError_t malloc_array(cudaArray_t* array, const cudaChannelFormatDesc* desc, cudaExtent ext, unsigned flags) {
    ENSURE();
    if (array == nullptr) return ret(cudaErrorInvalidValue);
    CUDA_ARRAY3D_DESCRIPTOR d;
    if (cudaError_t e = array_desc(desc, ext, flags, &d); e != cudaSuccess) return ret(e);
    return ret(D().Array3DCreate(reinterpret_cast<CUarray*>(array), &d));
}

}  // namespace

extern "C" {

// ---------------------------------------------------------------- devices

cudaError_t cudaGetDeviceCount(int* count) {
    if (count == nullptr) return ret(cudaErrorInvalidValue);
    *count = 0;
    if (cudaError_t e = init_rt(); e != cudaSuccess) return ret(e);
    int n = 0;
    if (CUresult r = D().DeviceGetCount(&n); r != CUDA_SUCCESS) return ret(r);
    *count = n;
    return n == 0 ? ret(cudaErrorNoDevice) : cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
    if (cudaError_t e = init_rt(); e != cudaSuccess) return ret(e);
    int n = 0;
    D().DeviceGetCount(&n);
    if (device < 0 || device >= n) return ret(cudaErrorInvalidDevice);
    tl_device = device;
    return ret(activate(device));
}

cudaError_t cudaGetDevice(int* device) {
    if (device == nullptr) return ret(cudaErrorInvalidValue);
    if (cudaError_t e = init_rt(); e != cudaSuccess) return ret(e);
    CUcontext cur = nullptr;
    CUdevice d = 0;
    if (D().CtxGetCurrent(&cur) == CUDA_SUCCESS && cur != nullptr && D().CtxGetDevice(&d) == CUDA_SUCCESS) {
        *device = d;
        return cudaSuccess;
    }
    *device = tl_device;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    ENSURE();
    return ret(D().CtxSynchronize());
}

cudaError_t cudaDeviceReset(void) {
    if (cudaError_t e = init_rt(); e != cudaSuccess) return ret(e);
    int dev = 0;
    cudaGetDevice(&dev);
    {
        std::lock_guard<std::mutex> lk(g_mu);
        if (dev >= 0 && dev < kMaxDevices) g_primary[static_cast<size_t>(dev)] = nullptr;
    }
    return ret(D().DevicePrimaryCtxReset(dev));
}

cudaError_t cudaRuntimeGetVersion(int* runtimeVersion) {
    if (runtimeVersion == nullptr) return ret(cudaErrorInvalidValue);
    *runtimeVersion = kVersion;
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* driverVersion) {
    if (driverVersion == nullptr) return ret(cudaErrorInvalidValue);
    *driverVersion = 0;
    std::call_once(g_once, load_driver);
    if (g_drv[0].DriverGetVersion == nullptr) return cudaSuccess;  // no driver: version 0
    return ret(D().DriverGetVersion(driverVersion));
}

// ---------------------------------------------------------------- memory

// Peer access, as the runtime does it: the peer device's primary context, through the driver's
// context calls (found by cuGetProcAddress, like every driver call of the runtime).
CUcontext peer_primary(int peerDevice, cudaError_t* e) {
    CUcontext c = nullptr;
    std::lock_guard<std::mutex> lk(g_mu);
    if (peerDevice < 0 || peerDevice >= kMaxDevices) {
        *e = cudaErrorInvalidDevice;
        return nullptr;
    }
    if (g_primary[static_cast<size_t>(peerDevice)] == nullptr) {
        if (CUresult r = D().DevicePrimaryCtxRetain(&c, peerDevice); r != CUDA_SUCCESS) {
            *e = map_err(r);
            return nullptr;
        }
        g_primary[static_cast<size_t>(peerDevice)] = c;
    }
    *e = cudaSuccess;
    return g_primary[static_cast<size_t>(peerDevice)];
}

cudaError_t cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags) {
    ENSURE();
    cudaError_t e = cudaSuccess;
    CUcontext peer = peer_primary(peerDevice, &e);
    if (peer == nullptr) return ret(e);
    const CUresult r = D().CtxEnablePeerAccess(peer, flags);
    return ret(r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED ? cudaErrorPeerAccessAlreadyEnabled : map_err(r));
}

cudaError_t cudaDeviceDisablePeerAccess(int peerDevice) {
    ENSURE();
    cudaError_t e = cudaSuccess;
    CUcontext peer = peer_primary(peerDevice, &e);
    if (peer == nullptr) return ret(e);
    const CUresult r = D().CtxDisablePeerAccess(peer);
    return ret(r == CUDA_ERROR_PEER_ACCESS_NOT_ENABLED ? cudaErrorPeerAccessNotEnabled : map_err(r));
}

cudaError_t cudaDeviceCanAccessPeer(int* canAccessPeer, int device, int peerDevice) {
    if (cudaError_t e = init_rt(); e != cudaSuccess) return ret(e);
    return ret(D().DeviceCanAccessPeer(canAccessPeer, device, peerDevice));
}

cudaError_t cudaMalloc(void** devPtr, size_t size) {
    ENSURE();
    if (devPtr == nullptr) return ret(cudaErrorInvalidValue);
    if (size == 0) {
        *devPtr = nullptr;
        return cudaSuccess;
    }
    CUdeviceptr d = 0;
    CUresult r = D().MemAlloc(&d, size);
    *devPtr = r == CUDA_SUCCESS ? reinterpret_cast<void*>(d) : nullptr;
    return ret(r);
}

cudaError_t cudaFree(void* devPtr) {
    ENSURE();  // cudaFree(NULL) only initializes the context
    if (devPtr == nullptr) return cudaSuccess;
    return ret(D().MemFree(dp(devPtr)));
}

cudaError_t cudaMallocPitch(void** devPtr, size_t* pitch, size_t width, size_t height) {
    ENSURE();
    if (devPtr == nullptr || pitch == nullptr) return ret(cudaErrorInvalidValue);
    if (width == 0 || height == 0) {
        *devPtr = nullptr;
        *pitch = 0;
        return cudaSuccess;
    }
    CUdeviceptr d = 0;
    size_t pp = 0;
    CUresult r = D().MemAllocPitch(&d, &pp, width, height, 4);
    if (r == CUDA_SUCCESS) {
        *devPtr = reinterpret_cast<void*>(d);
        *pitch = pp;
    }
    return ret(r);
}

cudaError_t cudaMallocManaged(void** devPtr, size_t size, unsigned int flags) {
    ENSURE();
    if (devPtr == nullptr) return ret(cudaErrorInvalidValue);
    if (size == 0) {
        *devPtr = nullptr;
        return cudaSuccess;
    }
    CUdeviceptr d = 0;
    CUresult r = D().MemAllocManaged(&d, size, flags);
    if (r == CUDA_SUCCESS) *devPtr = reinterpret_cast<void*>(d);
    return ret(r);
}

cudaError_t cudaMallocAsync(void** devPtr, size_t size, cudaStream_t hStream) { return malloc_async(devPtr, size, hStream, false); }
cudaError_t cudaMallocAsync_ptsz(void** devPtr, size_t size, cudaStream_t hStream) { return malloc_async(devPtr, size, hStream, true); }
cudaError_t cudaMallocFromPoolAsync(void** ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream) {
    return malloc_from_pool_async(ptr, size, memPool, stream, false);
}
cudaError_t cudaMallocFromPoolAsync_ptsz(void** ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream) {
    return malloc_from_pool_async(ptr, size, memPool, stream, true);
}
cudaError_t cudaFreeAsync(void* devPtr, cudaStream_t hStream) { return free_async(devPtr, hStream, false); }
cudaError_t cudaFreeAsync_ptsz(void* devPtr, cudaStream_t hStream) { return free_async(devPtr, hStream, true); }

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* memPool, int device) {
    if (cudaError_t e = init_rt(); e != cudaSuccess) return ret(e);
    if (memPool == nullptr) return ret(cudaErrorInvalidValue);
    CUmemoryPool p = nullptr;
    CUresult r = D().DeviceGetDefaultMemPool(&p, device);
    if (r == CUDA_SUCCESS) *memPool = reinterpret_cast<cudaMemPool_t>(p);
    return ret(r);
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr, void* value) {
    if (cudaError_t e = init_rt(); e != cudaSuccess) return ret(e);
    return ret(D().MemPoolSetAttribute(reinterpret_cast<CUmemoryPool>(memPool), static_cast<CUmemPool_attribute>(attr), value));
}

cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr, void* value) {
    if (cudaError_t e = init_rt(); e != cudaSuccess) return ret(e);
    return ret(D().MemPoolGetAttribute(reinterpret_cast<CUmemoryPool>(memPool), static_cast<CUmemPool_attribute>(attr), value));
}

cudaError_t cudaHostAlloc(void** pHost, size_t size, unsigned int flags) {
    ENSURE();
    if (pHost == nullptr) return ret(cudaErrorInvalidValue);
    return ret(D().MemHostAlloc(pHost, size, flags));
}

cudaError_t cudaMallocHost(void** ptr, size_t size) { return cudaHostAlloc(ptr, size, cudaHostAllocDefault); }

cudaError_t cudaFreeHost(void* ptr) {
    ENSURE();
    if (ptr == nullptr) return cudaSuccess;
    return ret(D().MemFreeHost(ptr));
}

cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int device) {
    if (cudaError_t e = init_rt(); e != cudaSuccess) return ret(e);
    return ret(D().DeviceGetAttribute(value, static_cast<CUdevice_attribute>(attr), device));
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
    ENSURE();
    return ret(D().MemGetInfo(free, total));
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind) {
    return memcpy_rt(dst, src, count, kind, false);
}
cudaError_t cudaMemcpy_ptds(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind) {
    return memcpy_rt(dst, src, count, kind, true);
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream) {
    return memcpy_async_rt(dst, src, count, kind, stream, false);
}
cudaError_t cudaMemcpyAsync_ptsz(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream) {
    return memcpy_async_rt(dst, src, count, kind, stream, true);
}

cudaError_t cudaMemset(void* devPtr, int value, size_t count) {
    ENSURE();
    return ret(D().MemsetD8(dp(devPtr), static_cast<unsigned char>(value), count));
}
cudaError_t cudaMemset_ptds(void* devPtr, int value, size_t count) {
    ENSURE();
    return ret(D(true).MemsetD8(dp(devPtr), static_cast<unsigned char>(value), count));
}
cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t stream) {
    ENSURE();
    return ret(D().MemsetD8Async(dp(devPtr), static_cast<unsigned char>(value), count, cs(stream)));
}
cudaError_t cudaMemsetAsync_ptsz(void* devPtr, int value, size_t count, cudaStream_t stream) {
    ENSURE();
    return ret(D(true).MemsetD8Async(dp(devPtr), static_cast<unsigned char>(value), count, cs(stream)));
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes* attributes, const void* ptr) {
    ENSURE();
    if (attributes == nullptr) return ret(cudaErrorInvalidValue);
    CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                   CU_POINTER_ATTRIBUTE_IS_MANAGED};
    unsigned int memtype = 0;
    int ordinal = -2;
    bool managed = false;
    void* data[] = {&memtype, &ordinal, &managed};
    if (CUresult r = D().PointerGetAttributes(3, attrs, data, dp(ptr)); r != CUDA_SUCCESS) return ret(r);
    std::memset(attributes, 0, sizeof *attributes);
    void* p = const_cast<void*>(ptr);
    if (managed) {
        attributes->type = cudaMemoryTypeManaged;
        attributes->devicePointer = p;
        attributes->hostPointer = p;
    } else if (memtype == CU_MEMORYTYPE_DEVICE) {
        attributes->type = cudaMemoryTypeDevice;
        attributes->devicePointer = p;
    } else if (memtype == CU_MEMORYTYPE_HOST) {
        attributes->type = cudaMemoryTypeHost;
        attributes->hostPointer = p;
    } else {
        attributes->type = cudaMemoryTypeUnregistered;
        attributes->hostPointer = p;
    }
    attributes->device = ordinal;
    return cudaSuccess;
}

// ---------------------------------------------------------------- streams and events

cudaError_t cudaStreamCreate(cudaStream_t* pStream) {
    ENSURE();
    if (pStream == nullptr) return ret(cudaErrorInvalidValue);
    return ret(D().StreamCreateWithPriority(reinterpret_cast<CUstream*>(pStream), CU_STREAM_DEFAULT, 0));
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int flags) {
    ENSURE();
    if (pStream == nullptr) return ret(cudaErrorInvalidValue);
    return ret(D().StreamCreateWithPriority(reinterpret_cast<CUstream*>(pStream), flags, 0));
}
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* pStream, unsigned int flags, int priority) {
    ENSURE();
    if (pStream == nullptr) return ret(cudaErrorInvalidValue);
    return ret(D().StreamCreateWithPriority(reinterpret_cast<CUstream*>(pStream), flags, priority));
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    ENSURE();
    return ret(D().StreamDestroy(cs(stream)));
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    ENSURE();
    return ret(D().StreamSynchronize(cs(stream)));
}
cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t stream) {
    ENSURE();
    return ret(D(true).StreamSynchronize(cs(stream)));
}
cudaError_t cudaStreamQuery(cudaStream_t stream) {
    ENSURE();
    return ret(D().StreamQuery(cs(stream)));
}
cudaError_t cudaStreamQuery_ptsz(cudaStream_t stream) {
    ENSURE();
    return ret(D(true).StreamQuery(cs(stream)));
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
    ENSURE();
    return ret(D().StreamWaitEvent(cs(stream), ce(event), flags));
}
cudaError_t cudaStreamWaitEvent_ptsz(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
    ENSURE();
    return ret(D(true).StreamWaitEvent(cs(stream), ce(event), flags));
}
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* userData) {
    ENSURE();
    return ret(D().LaunchHostFunc(cs(stream), fn, userData));
}
cudaError_t cudaLaunchHostFunc_ptsz(cudaStream_t stream, cudaHostFn_t fn, void* userData) {
    ENSURE();
    return ret(D(true).LaunchHostFunc(cs(stream), fn, userData));
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
    ENSURE();
    if (event == nullptr) return ret(cudaErrorInvalidValue);
    return ret(D().EventCreate(reinterpret_cast<CUevent*>(event), CU_EVENT_DEFAULT));
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
    ENSURE();
    if (event == nullptr) return ret(cudaErrorInvalidValue);
    return ret(D().EventCreate(reinterpret_cast<CUevent*>(event), flags));
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    ENSURE();
    return ret(D().EventRecord(ce(event), cs(stream)));
}
cudaError_t cudaEventRecord_ptsz(cudaEvent_t event, cudaStream_t stream) {
    ENSURE();
    return ret(D(true).EventRecord(ce(event), cs(stream)));
}
cudaError_t cudaEventQuery(cudaEvent_t event) {
    ENSURE();
    return ret(D().EventQuery(ce(event)));
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    ENSURE();
    return ret(D().EventSynchronize(ce(event)));
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
    ENSURE();
    return ret(D().EventDestroy(ce(event)));
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
    ENSURE();
    return ret(D().EventElapsedTime(ms, ce(start), ce(end)));
}

// ---------------------------------------------------------------- IPC

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* devPtr) {
    ENSURE();
    if (handle == nullptr) return ret(cudaErrorInvalidValue);
    static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(CUipcMemHandle));
    return ret(D().IpcGetMemHandle(reinterpret_cast<CUipcMemHandle*>(handle), dp(devPtr)));
}
cudaError_t cudaIpcOpenMemHandle(void** devPtr, cudaIpcMemHandle_t handle, unsigned int flags) {
    ENSURE();
    if (devPtr == nullptr) return ret(cudaErrorInvalidValue);
    CUipcMemHandle h;
    std::memcpy(&h, &handle, sizeof h);
    CUdeviceptr d = 0;
    CUresult r = D().IpcOpenMemHandle(&d, h, flags);
    if (r == CUDA_SUCCESS) *devPtr = reinterpret_cast<void*>(d);
    return ret(r);
}
cudaError_t cudaIpcCloseMemHandle(void* devPtr) {
    ENSURE();
    return ret(D().IpcCloseMemHandle(dp(devPtr)));
}

// ---------------------------------------------------------------- stream capture and graphs

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
    return begin_capture(stream, mode, false);
}
cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
    return begin_capture(stream, mode, true);
}
cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t stream, cudaGraph_t graph, const cudaGraphNode_t* dependencies,
                                          const cudaGraphEdgeData* dependencyData, size_t numDependencies,
                                          enum cudaStreamCaptureMode mode) {
    return begin_capture_to_graph(stream, graph, dependencies, dependencyData, numDependencies, mode, false);
}
cudaError_t cudaStreamBeginCaptureToGraph_ptsz(cudaStream_t stream, cudaGraph_t graph,
                                               const cudaGraphNode_t* dependencies,
                                               const cudaGraphEdgeData* dependencyData, size_t numDependencies,
                                               enum cudaStreamCaptureMode mode) {
    return begin_capture_to_graph(stream, graph, dependencies, dependencyData, numDependencies, mode, true);
}
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* pGraph) { return end_capture(stream, pGraph, false); }
cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t* pGraph) { return end_capture(stream, pGraph, true); }
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus* pCaptureStatus) {
    return is_capturing(stream, pCaptureStatus, false);
}
cudaError_t cudaStreamIsCapturing_ptsz(cudaStream_t stream, enum cudaStreamCaptureStatus* pCaptureStatus) {
    return is_capturing(stream, pCaptureStatus, true);
}
cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, enum cudaStreamCaptureStatus* captureStatus_out,
                                     unsigned long long* id_out, cudaGraph_t* graph_out,
                                     const cudaGraphNode_t** dependencies_out, const cudaGraphEdgeData** edgeData_out,
                                     size_t* numDependencies_out) {
    return capture_info(stream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,
                        numDependencies_out, false);
}
cudaError_t cudaStreamGetCaptureInfo_ptsz(cudaStream_t stream, enum cudaStreamCaptureStatus* captureStatus_out,
                                          unsigned long long* id_out, cudaGraph_t* graph_out,
                                          const cudaGraphNode_t** dependencies_out,
                                          const cudaGraphEdgeData** edgeData_out, size_t* numDependencies_out) {
    return capture_info(stream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,
                        numDependencies_out, true);
}
cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode* mode) {
    if (cudaError_t e = init_rt(); e != cudaSuccess) return ret(e);
    return ret(D().ThreadExchangeStreamCaptureMode(reinterpret_cast<CUstreamCaptureMode*>(mode)));
}

cudaError_t cudaGraphCreate(cudaGraph_t* pGraph, unsigned int flags) {
    ENSURE();
    return ret(D().GraphCreate(reinterpret_cast<CUgraph*>(pGraph), flags));
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    ENSURE();
    return ret(D().GraphDestroy(cg(graph)));
}
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, size_t* numNodes) {
    ENSURE();
    return ret(D().GraphGetNodes(cg(graph), reinterpret_cast<CUgraphNode*>(nodes), numNodes));
}
cudaError_t cudaGraphNodeGetType(cudaGraphNode_t node, enum cudaGraphNodeType* pType) {
    ENSURE();
    return ret(D().GraphNodeGetType(reinterpret_cast<CUgraphNode>(node), reinterpret_cast<CUgraphNodeType*>(pType)));
}
cudaError_t cudaGraphAddHostNode(cudaGraphNode_t* pGraphNode, cudaGraph_t graph, const cudaGraphNode_t* pDependencies,
                                 size_t numDependencies, const struct cudaHostNodeParams* pNodeParams) {
    ENSURE();
    return ret(D().GraphAddHostNode(reinterpret_cast<CUgraphNode*>(pGraphNode), cg(graph), cn(pDependencies),
                                    numDependencies, reinterpret_cast<const CUDA_HOST_NODE_PARAMS*>(pNodeParams)));
}
cudaError_t cudaGraphAddMemAllocNode(cudaGraphNode_t* pGraphNode, cudaGraph_t graph,
                                     const cudaGraphNode_t* pDependencies, size_t numDependencies,
                                     struct cudaMemAllocNodeParams* nodeParams) {
    ENSURE();
    return ret(D().GraphAddMemAllocNode(reinterpret_cast<CUgraphNode*>(pGraphNode), cg(graph), cn(pDependencies),
                                        numDependencies, reinterpret_cast<CUDA_MEM_ALLOC_NODE_PARAMS*>(nodeParams)));
}
cudaError_t cudaGraphMemAllocNodeGetParams(cudaGraphNode_t node, struct cudaMemAllocNodeParams* params_out) {
    ENSURE();
    return ret(D().GraphMemAllocNodeGetParams(reinterpret_cast<CUgraphNode>(node),
                                              reinterpret_cast<CUDA_MEM_ALLOC_NODE_PARAMS*>(params_out)));
}
cudaError_t cudaGraphAddMemFreeNode(cudaGraphNode_t* pGraphNode, cudaGraph_t graph,
                                    const cudaGraphNode_t* pDependencies, size_t numDependencies, void* dptr) {
    ENSURE();
    return ret(D().GraphAddMemFreeNode(reinterpret_cast<CUgraphNode*>(pGraphNode), cg(graph), cn(pDependencies),
                                       numDependencies, dp(dptr)));
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* pGraphExec, cudaGraph_t graph, unsigned long long flags) {
    ENSURE();
    return ret(D().GraphInstantiateWithFlags(reinterpret_cast<CUgraphExec*>(pGraphExec), cg(graph), flags));
}
cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* pGraphExec, cudaGraph_t graph, unsigned long long flags) {
    return cudaGraphInstantiate(pGraphExec, graph, flags);
}
cudaError_t cudaGraphInstantiateWithParams(cudaGraphExec_t* pGraphExec, cudaGraph_t graph,
                                           cudaGraphInstantiateParams* instantiateParams) {
    return instantiate_with_params(pGraphExec, graph, instantiateParams, false);
}
cudaError_t cudaGraphInstantiateWithParams_ptsz(cudaGraphExec_t* pGraphExec, cudaGraph_t graph,
                                                cudaGraphInstantiateParams* instantiateParams) {
    return instantiate_with_params(pGraphExec, graph, instantiateParams, true);
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec) {
    ENSURE();
    return ret(D().GraphExecDestroy(cx(graphExec)));
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) {
    ENSURE();
    return ret(D().GraphLaunch(cx(graphExec), cs(stream)));
}
cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t graphExec, cudaStream_t stream) {
    ENSURE();
    return ret(D(true).GraphLaunch(cx(graphExec), cs(stream)));
}
cudaError_t cudaGraphUpload(cudaGraphExec_t graphExec, cudaStream_t stream) {
    ENSURE();
    return ret(D().GraphUpload(cx(graphExec), cs(stream)));
}
cudaError_t cudaGraphUpload_ptsz(cudaGraphExec_t graphExec, cudaStream_t stream) {
    ENSURE();
    return ret(D(true).GraphUpload(cx(graphExec), cs(stream)));
}
cudaError_t cudaDeviceGraphMemTrim(int device) {
    if (cudaError_t e = init_rt(); e != cudaSuccess) return ret(e);
    return ret(D().DeviceGraphMemTrim(device));
}
cudaError_t cudaDeviceGetGraphMemAttribute(int device, enum cudaGraphMemAttributeType attr, void* value) {
    if (cudaError_t e = init_rt(); e != cudaSuccess) return ret(e);
    return ret(D().DeviceGetGraphMemAttribute(device, static_cast<CUgraphMem_attribute>(attr), value));
}
cudaError_t cudaDeviceSetGraphMemAttribute(int device, enum cudaGraphMemAttributeType attr, void* value) {
    if (cudaError_t e = init_rt(); e != cudaSuccess) return ret(e);
    return ret(D().DeviceSetGraphMemAttribute(device, static_cast<CUgraphMem_attribute>(attr), value));
}

// ---------------------------------------------------------------- arrays

cudaError_t cudaMallocArray(cudaArray_t* array, const struct cudaChannelFormatDesc* desc, size_t width, size_t height,
                            unsigned int flags) {
    return malloc_array(array, desc, cudaExtent{width, height, 0}, flags);
}
cudaError_t cudaMalloc3DArray(cudaArray_t* array, const struct cudaChannelFormatDesc* desc, struct cudaExtent extent,
                              unsigned int flags) {
    return malloc_array(array, desc, extent, flags);
}
cudaError_t cudaMallocMipmappedArray(cudaMipmappedArray_t* mipmappedArray, const struct cudaChannelFormatDesc* desc,
                                     struct cudaExtent extent, unsigned int numLevels, unsigned int flags) {
    ENSURE();
    if (mipmappedArray == nullptr) return ret(cudaErrorInvalidValue);
    CUDA_ARRAY3D_DESCRIPTOR d;
    if (cudaError_t e = array_desc(desc, extent, flags, &d); e != cudaSuccess) return ret(e);
    return ret(D().MipmappedArrayCreate(reinterpret_cast<CUmipmappedArray*>(mipmappedArray), &d, numLevels));
}
cudaError_t cudaGetMipmappedArrayLevel(cudaArray_t* levelArray, cudaMipmappedArray_const_t mipmappedArray,
                                       unsigned int level) {
    ENSURE();
    return ret(D().MipmappedArrayGetLevel(reinterpret_cast<CUarray*>(levelArray),
                                          reinterpret_cast<CUmipmappedArray>(const_cast<cudaMipmappedArray*>(mipmappedArray)),
                                          level));
}
cudaError_t cudaFreeArray(cudaArray_t array) {
    ENSURE();
    if (array == nullptr) return cudaSuccess;
    return ret(D().ArrayDestroy(reinterpret_cast<CUarray>(array)));
}
cudaError_t cudaFreeMipmappedArray(cudaMipmappedArray_t mipmappedArray) {
    ENSURE();
    if (mipmappedArray == nullptr) return cudaSuccess;
    return ret(D().MipmappedArrayDestroy(reinterpret_cast<CUmipmappedArray>(mipmappedArray)));
}
cudaError_t cudaArrayGetInfo(struct cudaChannelFormatDesc* desc, struct cudaExtent* extent, unsigned int* flags,
                             cudaArray_t array) {
    ENSURE();
    CUDA_ARRAY3D_DESCRIPTOR d{};
    if (CUresult r = D().Array3DGetDescriptor(&d, reinterpret_cast<CUarray>(array)); r != CUDA_SUCCESS) return ret(r);
    if (desc) {
        int bits = 32;
        cudaChannelFormatKind kind = cudaChannelFormatKindFloat;
        switch (d.Format) {
        case CU_AD_FORMAT_UNSIGNED_INT8: bits = 8; kind = cudaChannelFormatKindUnsigned; break;
        case CU_AD_FORMAT_UNSIGNED_INT16: bits = 16; kind = cudaChannelFormatKindUnsigned; break;
        case CU_AD_FORMAT_UNSIGNED_INT32: bits = 32; kind = cudaChannelFormatKindUnsigned; break;
        case CU_AD_FORMAT_SIGNED_INT8: bits = 8; kind = cudaChannelFormatKindSigned; break;
        case CU_AD_FORMAT_SIGNED_INT16: bits = 16; kind = cudaChannelFormatKindSigned; break;
        case CU_AD_FORMAT_SIGNED_INT32: bits = 32; kind = cudaChannelFormatKindSigned; break;
        case CU_AD_FORMAT_HALF: bits = 16; break;
        default: break;
        }
        *desc = cudaChannelFormatDesc{bits, d.NumChannels > 1 ? bits : 0, d.NumChannels > 2 ? bits : 0,
                                      d.NumChannels > 3 ? bits : 0, kind};
    }
    if (extent) *extent = cudaExtent{d.Width, d.Height, d.Depth};
    if (flags) *flags = d.Flags;
    return cudaSuccess;
}

// ---------------------------------------------------------------- errors and entry points

cudaError_t cudaGetLastError(void) {
    cudaError_t e = tl_last;
    tl_last = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return tl_last; }

}  // extern "C"

namespace {
struct RtErr {
    cudaError_t code;
    const char* name;
    const char* text;
};
constexpr RtErr kRtErrors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorCudartUnloading, "cudaErrorCudartUnloading", "driver shutting down"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver", "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorDeviceUninitialized, "cudaErrorDeviceUninitialized", "invalid device context"},
    {cudaErrorContextIsDestroyed, "cudaErrorContextIsDestroyed", "context is destroyed"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorSymbolNotFound, "cudaErrorSymbolNotFound", "named symbol not found"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorInvalidChannelDescriptor, "cudaErrorInvalidChannelDescriptor", "invalid channel descriptor"},
    {cudaErrorIllegalState, "cudaErrorIllegalState", "the operation cannot be performed in the present state"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureMerge, "cudaErrorStreamCaptureMerge",
     "operation would result in a merge of separate capture sequences"},
    {cudaErrorStreamCaptureUnmatched, "cudaErrorStreamCaptureUnmatched", "capture was not ended in the same stream as it began"},
    {cudaErrorStreamCaptureUnjoined, "cudaErrorStreamCaptureUnjoined", "capturing stream has unjoined work"},
    {cudaErrorStreamCaptureIsolation, "cudaErrorStreamCaptureIsolation",
     "dependency created on uncaptured work in another stream"},
    {cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit",
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {cudaErrorCapturedEvent, "cudaErrorCapturedEvent",
     "operation not permitted on an event last recorded in a capturing stream"},
    {cudaErrorStreamCaptureWrongThread, "cudaErrorStreamCaptureWrongThread",
     "attempt to terminate a thread-local capture sequence from another thread"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};
}  // namespace

extern "C" {

const char* cudaGetErrorName(cudaError_t error) {
    for (const auto& e : kRtErrors)
        if (e.code == error) return e.name;
    return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t error) {
    for (const auto& e : kRtErrors)
        if (e.code == error) return e.text;
    return "unrecognized error code";
}

cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** funcPtr, unsigned long long flags,
                                    enum cudaDriverEntryPointQueryResult* driverStatus) {
    return entry_point(symbol, funcPtr, kVersion, flags, driverStatus, false);
}
cudaError_t cudaGetDriverEntryPoint_ptsz(const char* symbol, void** funcPtr, unsigned long long flags,
                                         enum cudaDriverEntryPointQueryResult* driverStatus) {
    return entry_point(symbol, funcPtr, kVersion, flags, driverStatus, true);
}
cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** funcPtr, unsigned int cudaVersion,
                                             unsigned long long flags, enum cudaDriverEntryPointQueryResult* driverStatus) {
    return entry_point(symbol, funcPtr, cudaVersion, flags, driverStatus, false);
}
cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char* symbol, void** funcPtr, unsigned int cudaVersion,
                                                  unsigned long long flags,
                                                  enum cudaDriverEntryPointQueryResult* driverStatus) {
    return entry_point(symbol, funcPtr, cudaVersion, flags, driverStatus, true);
}

}  // extern "C"
