// Simulated CUDA driver: a fake libcuda.so.1 for CI machines without a GPU.
//
// Device memory is host memory (memfd-backed MAP_SHARED mappings, so another process can map it for
// IPC), streams are host worker threads, and the driver entry points carry their real ABI names
// (cuMemAlloc_v2, cuMemAllocAsync_ptsz, cuGetProcAddress_v2 ...). cuGetProcAddress(_v2) picks the
// ABI variant by version and per-thread-default-stream flag from one table (kProcTable, at the end).
// Stream capture, graphs, the graph-memory pool, arrays, destroyed and per-thread streams follow what
// an H200 did (docs/gpu-runs/2026-12-01-capture-probe.txt; test/sim/README.md).
//
// Environment:
//   CUPOOL_SIM_DEVICES            number of devices (default 1)
//   CUPOOL_SIM_TOTAL_MEM          memory per device, bytes or with suffix KiB/MiB/GiB (default 16GiB)
//   CUPOOL_SIM_ALLOC_LATENCY_US   sleep in cuMemAlloc_v2/cuMemAllocPitch_v2/cuMemAllocManaged/cuMemFree_v2
//   CUPOOL_SIM_FAIL_ALLOC_AFTER   allocations (any kind) after the Nth fail with CUDA_ERROR_OUT_OF_MEMORY
//   CUPOOL_SIM_IPC_HANDLE_TAIL    IPC handles use bytes 56..63 too (as the H200's did for a 42 GB allocation)
//   CUPOOL_SIM_NO_VMM             1: no virtual memory management; create: cuMemCreate refuses (see no_vmm())
//   CUPOOL_SIM_NO_FD_HANDLES      "attribute": the device says it has no POSIX fd handles; "create":
//                                 it says it has, but cuMemCreate refuses that handle type

// Gives us the declarations of every ABI variant (_v2, _ptsz, _ptds and the legacy v1 names).
#define __CUDA_API_VERSION_INTERNAL 1
#pragma GCC visibility push(default)
#include <cuda.h>
#pragma GCC visibility pop

#include "sim_common.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

using namespace cupool_sim;

namespace {

constexpr size_t kAlign = 256;                // allocation accounting / alignment unit
constexpr size_t kGranularity = 2ull << 20;   // VMM granularity
constexpr size_t kPitchAlign = 512;

struct Context;
struct Stream;
struct MemPool;
struct Capture;
struct Node;
struct GraphAlloc;

struct Dep {
    std::shared_ptr<Stream> s;
    uint64_t seq;
};

struct Work {
    std::function<void()> fn;
    std::vector<Dep> deps;
};

struct Stream {
    Context* ctx = nullptr;
    unsigned flags = 0;
    int priority = 0;
    bool legacy = false;
    bool per_thread = false;
    std::deque<Work> q;
    uint64_t submitted = 0;
    uint64_t completed = 0;
    bool destroyed = false;
    bool exited = false;
    unsigned long long id = 0;
    // Stream capture: the capture this stream belongs to (began on it, or joined by waiting on one of
    // its events), and the nodes the next captured operation depends on.
    std::shared_ptr<Capture> cap;
    std::vector<Node*> deps;
    std::vector<CUgraphNode> deps_view;  // what cuStreamGetCaptureInfo hands out
    std::vector<CUgraphEdgeData> edge_view;
};

struct Context {
    int dev = 0;
    bool primary = false;
    std::atomic<bool> alive{false};
    int refcount = 0;     // primary only
    unsigned flags = 0;
    std::vector<int> peers;  // devices whose memory this context may access (cuCtxEnablePeerAccess)
    std::shared_ptr<Stream> legacy;
    std::vector<std::shared_ptr<Stream>> streams;  // every non-legacy stream, including per-thread ones
    unsigned long long id = 0;
};

struct MemPool {
    int dev = 0;
    std::map<int, uint64_t> attrs;
    uint64_t used = 0, used_high = 0;
};

enum Kind { KIND_DEVICE, KIND_PITCH, KIND_MANAGED, KIND_ASYNC, KIND_IPC, KIND_HOST, KIND_GRAPH };

struct Alloc {
    uintptr_t base = 0;
    size_t size = 0;       // requested bytes (pitch*height for pitch allocations)
    size_t map_size = 0;   // bytes mapped
    size_t accounted = 0;  // bytes charged to the device
    int fd = -1;
    Context* ctx = nullptr;
    int dev = 0;
    Kind kind = KIND_DEVICE;
    MemPool* pool = nullptr;
    bool free_pending = false;
    unsigned long long buffer_id = 0;
    // KIND_IPC: the exporter's allocation, and how many opens of its handle this mapping serves.
    int ipc_pid = 0;
    unsigned long long ipc_buffer = 0;
    int ipc_opens = 0;
    // KIND_GRAPH: a graph allocation between its launch and its free (not charged here: the
    // device's graph-memory pool is).
    std::shared_ptr<GraphAlloc> galloc;
};

struct Phys {  // cuMemCreate
    int fd = -1;
    size_t size = 0;
    int dev = 0;
    int maps = 0;
    bool released = false;
    bool charged = true;  // counted in the device's used bytes (not for imported handles)
    CUmemAllocationProp prop{};
};

struct Mapping {  // cuMemMap
    size_t size = 0;
    CUmemGenericAllocationHandle handle = 0;
    size_t offset = 0;
    unsigned long long access = 0;
    unsigned long long access_devices = 0;  // bit d: device d was given `access` (cuMemSetAccess)
};

struct Event {
    unsigned flags = 0;
    std::shared_ptr<Stream> s;
    uint64_t seq = 0;
    uint64_t gen = 0;
    bool recorded = false;
    bool have_time = false;
    std::chrono::steady_clock::time_point t;
    // Last recorded in a capturing stream: the capture and the nodes a waiting stream will depend on.
    std::shared_ptr<Capture> cap;
    std::vector<Node*> cap_nodes;
};

struct Graph;
struct Exec;

// A stream capture sequence (cuStreamBeginCapture .. cuStreamEndCapture).
struct Capture {
    unsigned long long id = 0;
    Graph* graph = nullptr;
    bool owns_graph = true;  // false: cuStreamBeginCaptureToGraph (the caller's graph)
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
    bool invalidated = false;
    std::thread::id thread;  // the thread that began it
    Context* ctx = nullptr;
    std::shared_ptr<Stream> origin;
    std::vector<std::shared_ptr<Stream>> streams;  // the origin and every stream that joined
};

// The memory of one graph allocation node. Its address is fixed when the node is made (as the
// driver's): host memory mapped from then on, so work of a graph may use it while the graph runs.
struct GraphAlloc {
    uintptr_t va = 0;
    size_t size = 0;
    size_t map_size = 0;
    size_t rounded = 0;      // what it takes of the graph-memory pool (2 MiB granularity)
    int dev = 0;
    bool live = false;       // launched and not yet freed (API order)
    bool mapped = false;     // pool memory is associated with it (counted in USED_MEM_CURRENT)
    bool free_node = false;  // some graph holds a free node for it
    Exec* exec = nullptr;    // the executable graph holding its alloc node, if any
    ~GraphAlloc() {
        if (va) munmap(reinterpret_cast<void*>(va), map_size);
    }
};

struct Node {
    Graph* graph = nullptr;
    CUgraphNodeType type = CU_GRAPH_NODE_TYPE_EMPTY;
    std::function<void()> fn;  // what the node does when the graph runs (none for memory nodes)
    std::vector<Node*> deps;
    std::shared_ptr<GraphAlloc> ga;  // MEM_ALLOC: its allocation; MEM_FREE: the one it frees
    CUDA_MEM_ALLOC_NODE_PARAMS alloc_params{};
    std::vector<CUmemAccessDesc> access;
};

struct Graph {
    unsigned long long id = 0;
    std::vector<std::unique_ptr<Node>> nodes;  // creation order: every node after its dependencies
    int instances = 0;                         // executable graphs made from it that still exist
    Capture* capture = nullptr;                // being captured into
    bool has_mem_nodes() const {
        for (auto& n : nodes)
            if (n->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC || n->type == CU_GRAPH_NODE_TYPE_MEM_FREE) return true;
        return false;
    }
};

struct Exec {
    unsigned long long graph_id = 0;
    unsigned long long flags = 0;
    std::shared_ptr<const std::vector<std::function<void()>>> fns;  // shared with launches in flight
    std::vector<std::pair<bool, std::shared_ptr<GraphAlloc>>> memops;  // (alloc?, allocation), node order
    std::shared_ptr<Stream> last_stream;  // the last launch, which the next one follows
    uint64_t last_seq = 0;
};

struct Array {
    CUDA_ARRAY3D_DESCRIPTOR desc{};
    size_t charged = 0;
    int dev = 0;
    Context* ctx = nullptr;
    bool level = false;  // a level of a mipmapped array (owned by it)
};

struct Mipmap {
    CUDA_ARRAY3D_DESCRIPTOR desc{};
    unsigned levels = 0;
    size_t charged = 0;
    int dev = 0;
    Context* ctx = nullptr;
    std::vector<Array*> level_arrays;
};

struct Device {
    uint64_t total = 0;
    uint64_t used = 0;
    Context* primary = nullptr;
    MemPool* default_pool = nullptr;
    MemPool* current_pool = nullptr;
    // The device's graph-memory pool: physical memory reserved for graph allocations (charged in
    // `used`), and the part of it associated with graph allocations.
    uint64_t gp_reserved = 0, gp_reserved_high = 0, gp_used = 0, gp_used_high = 0;
    std::vector<GraphAlloc*> gp_mapped;
};

struct State {
    std::vector<Device> devs;
    std::map<uintptr_t, Alloc> allocs;  // by base
    std::map<uintptr_t, size_t> reservations;
    std::map<uintptr_t, Mapping> mappings;
    std::unordered_map<CUmemGenericAllocationHandle, Phys> phys;
    std::unordered_map<void*, std::shared_ptr<Stream>> streams;
    std::unordered_map<void*, std::shared_ptr<Event>> events;
    std::vector<MemPool*> pools;
    std::vector<Context*> contexts;  // every context ever created (handles stay identifiable)
    std::vector<std::shared_ptr<Capture>> captures;  // in progress
    std::unordered_map<void*, std::unique_ptr<Graph>> graphs;
    std::unordered_map<void*, std::unique_ptr<Exec>> execs;
    std::unordered_map<const void*, Node*> nodes;
    std::map<uintptr_t, std::weak_ptr<GraphAlloc>> gallocs;  // every graph allocation's address
    std::unordered_map<void*, std::unique_ptr<Array>> arrays;  // including mipmap levels
    std::unordered_map<void*, std::unique_ptr<Mipmap>> mipmaps;
    CUmemGenericAllocationHandle next_handle = 1;
    unsigned long long next_id = 1;
    uint64_t latency_us = 0;
    long fail_after = -1;
    uint64_t generation = 0;
};

// Never destroyed: worker threads may still run while the process exits.
std::mutex& g_mu = *new std::mutex;
std::condition_variable& g_cv = *new std::condition_variable;
State* g_st = new State;
std::atomic<bool> g_init{false};
std::atomic<bool> g_poisoned{false};  // forked child of an initialized parent: CUDA unusable
std::atomic<long> g_alloc_calls{0};
std::atomic<unsigned long long> g_vmm_calls{0};  // cupoolSimVmmCalls(): VMM driver calls so far
std::once_flag g_init_once;

thread_local std::vector<Context*> tl_stack;
thread_local CUstreamCaptureMode tl_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;  // cuThreadExchangeStreamCaptureMode

void stream_leaves_capture_locked(const std::shared_ptr<Stream>& s);

struct TlsStreams {
    uint64_t gen = 0;
    std::vector<std::shared_ptr<Stream>> v;
    ~TlsStreams() {
        if (v.empty() || g_poisoned) return;
        std::lock_guard<std::mutex> lk(g_mu);
        for (auto& s : v) {
            stream_leaves_capture_locked(s);
            s->destroyed = true;
        }
        g_cv.notify_all();
    }
};
thread_local TlsStreams tl_streams;

void atfork_prepare() { g_mu.lock(); }
void atfork_parent() { g_mu.unlock(); }
void atfork_child() {
    // As with the real driver, a child forked after CUDA was initialized cannot use CUDA.
    g_mu.unlock();
    if (g_init) g_poisoned = true;
    tl_stack.clear();
    tl_streams.v.clear();
}

#define CHECK_INIT()                                               \
    do {                                                           \
        if (!g_init || g_poisoned) return CUDA_ERROR_NOT_INITIALIZED; \
    } while (0)

Context* current_ctx() { return tl_stack.empty() ? nullptr : tl_stack.back(); }

// Current context, alive, or an error.
CUresult need_ctx(Context** out) {
    Context* c = current_ctx();
    if (c == nullptr || !c->alive) return CUDA_ERROR_INVALID_CONTEXT;
    *out = c;
    return CUDA_SUCCESS;
}

// ---------------------------------------------------------------- streams (lock held)

void worker_main(std::shared_ptr<Stream> s) {
    std::unique_lock<std::mutex> lk(g_mu);
    for (;;) {
        g_cv.wait(lk, [&] { return !s->q.empty() || s->destroyed; });
        if (s->q.empty()) break;
        Work& w = s->q.front();
        g_cv.wait(lk, [&] {
            for (auto& d : w.deps)
                if (d.s->completed < d.seq) return false;
            return true;
        });
        auto fn = std::move(w.fn);
        w.deps.clear();
        lk.unlock();
        if (fn) fn();
        lk.lock();
        s->q.pop_front();
        s->completed++;
        g_cv.notify_all();
    }
    auto& v = s->ctx->streams;
    v.erase(std::remove(v.begin(), v.end(), s), v.end());
    s->exited = true;
    g_cv.notify_all();
}

std::shared_ptr<Stream> new_stream_locked(Context* c, unsigned flags, int prio, bool legacy, bool per_thread) {
    auto s = std::make_shared<Stream>();
    s->ctx = c;
    s->flags = flags;
    s->priority = prio;
    s->legacy = legacy;
    s->per_thread = per_thread;
    s->id = g_st->next_id++;
    if (!legacy) c->streams.push_back(s);
    std::thread(worker_main, s).detach();
    return s;
}

std::shared_ptr<Stream> legacy_locked(Context* c) {
    if (!c->legacy) c->legacy = new_stream_locked(c, 0, 0, true, false);
    return c->legacy;
}

std::shared_ptr<Stream> per_thread_locked(Context* c) {
    if (tl_streams.gen != g_st->generation) {
        tl_streams.v.clear();
        tl_streams.gen = g_st->generation;
    }
    for (auto it = tl_streams.v.begin(); it != tl_streams.v.end();) {
        if ((*it)->destroyed) {
            it = tl_streams.v.erase(it);
            continue;
        }
        if ((*it)->ctx == c) return *it;
        ++it;
    }
    auto s = new_stream_locked(c, 0, 0, false, true);
    tl_streams.v.push_back(s);
    return s;
}

// Resolves a stream handle. ptsz: the _ptsz/_ptds entry point (handle 0 means per-thread stream).
CUresult resolve_stream_locked(CUstream h, bool ptsz, std::shared_ptr<Stream>* out) {
    if (h == nullptr || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
        Context* c = nullptr;
        if (CUresult r = need_ctx(&c); r != CUDA_SUCCESS) return r;
        bool pt = (h == CU_STREAM_PER_THREAD) || (h == nullptr && ptsz);
        *out = pt ? per_thread_locked(c) : legacy_locked(c);
        return CUDA_SUCCESS;
    }
    auto it = g_st->streams.find(h);
    if (it == g_st->streams.end() || it->second->destroyed) return CUDA_ERROR_INVALID_HANDLE;
    if (!it->second->ctx->alive) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    *out = it->second;
    return CUDA_SUCCESS;
}

uint64_t enqueue_locked(const std::shared_ptr<Stream>& s, std::function<void()> fn, std::vector<Dep> deps = {}) {
    Context* c = s->ctx;
    if (s->legacy) {
        for (auto& b : c->streams)
            if (!(b->flags & CU_STREAM_NON_BLOCKING) && b->submitted > b->completed) deps.push_back({b, b->submitted});
    } else if (!(s->flags & CU_STREAM_NON_BLOCKING)) {
        auto& l = c->legacy;
        if (l && l->submitted > l->completed) deps.push_back({l, l->submitted});
    }
    s->q.push_back(Work{std::move(fn), std::move(deps)});
    uint64_t seq = ++s->submitted;
    g_cv.notify_all();
    return seq;
}

void wait_seq_locked(std::unique_lock<std::mutex>& lk, const std::shared_ptr<Stream>& s, uint64_t seq) {
    g_cv.wait(lk, [&] { return s->completed >= seq; });
}

void sync_ctx_locked(std::unique_lock<std::mutex>& lk, Context* c) {
    std::vector<Dep> targets;
    if (c->legacy) targets.push_back({c->legacy, c->legacy->submitted});
    for (auto& s : c->streams) targets.push_back({s, s->submitted});
    for (auto& d : targets) wait_seq_locked(lk, d.s, d.seq);
}

// ---------------------------------------------------------------- stream capture (lock held)
//
// As measured on the H200 (docs/gpu-runs/2026-12-01-capture-probe.txt): a thread is prohibited from
// potentially unsafe calls when its own interaction mode is not relaxed and either it began a capture
// still in progress that was not begun relaxed, or its mode is global and another thread has a
// global-mode capture in progress. A prohibited call fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
// and invalidates the captures that prohibited it.

std::vector<std::shared_ptr<Capture>> prohibitors_locked() {
    std::vector<std::shared_ptr<Capture>> v;
    if (tl_capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED) return v;
    const auto me = std::this_thread::get_id();
    for (auto& c : g_st->captures) {
        bool mine = c->thread == me;
        if ((mine && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED) ||
            (!mine && tl_capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL && c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL))
            v.push_back(c);
    }
    return v;
}

// A potentially unsafe call (allocation, free, synchronization, query, synchronous copy).
CUresult unsafe_locked() {
    auto v = prohibitors_locked();
    for (auto& c : v) c->invalidated = true;
    return v.empty() ? CUDA_SUCCESS : CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

CUresult unsafe_call() {
    std::lock_guard<std::mutex> lk(g_mu);
    return unsafe_locked();
}

// Captures in c with a blocking stream: the legacy stream would depend on their uncaptured work.
std::vector<std::shared_ptr<Capture>> blocking_captures_locked(Context* c) {
    std::vector<std::shared_ptr<Capture>> v;
    for (auto& cap : g_st->captures) {
        if (cap->ctx != c) continue;
        for (auto& s : cap->streams)
            if (!(s->flags & CU_STREAM_NON_BLOCKING)) {
                v.push_back(cap);
                break;
            }
    }
    return v;
}

// A use of c's legacy stream: refused (and the captures invalidated) while a blocking stream captures.
CUresult legacy_use_locked(Context* c) {
    auto v = blocking_captures_locked(c);
    for (auto& cap : v) cap->invalidated = true;
    return v.empty() ? CUDA_SUCCESS : CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
}

// Resolves the stream of a stream-ordered call and checks it against capture: on a capturing stream
// ((*s)->cap set) the call is to be recorded, not run; an invalidated capture refuses it.
CUresult route_locked(CUstream h, bool ptsz, std::shared_ptr<Stream>* s) {
    if (CUresult r = resolve_stream_locked(h, ptsz, s); r != CUDA_SUCCESS) return r;
    if ((*s)->cap) return (*s)->cap->invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
    if ((*s)->legacy) return legacy_use_locked((*s)->ctx);
    return CUDA_SUCCESS;
}

Node* add_node_locked(Graph* g, CUgraphNodeType type, std::function<void()> fn, std::vector<Node*> deps) {
    auto n = std::make_unique<Node>();
    n->graph = g;
    n->type = type;
    n->fn = std::move(fn);
    n->deps = std::move(deps);
    Node* raw = n.get();
    g->nodes.push_back(std::move(n));
    g_st->nodes[raw] = raw;
    return raw;
}

// Records an operation of a capturing stream: a node after the stream's current dependencies.
Node* capture_node_locked(Stream& s, CUgraphNodeType type, std::function<void()> fn) {
    Node* n = add_node_locked(s.cap->graph, type, std::move(fn), s.deps);
    s.deps = {n};
    return n;
}

void destroy_graph_locked(Graph* g) {
    for (auto& n : g->nodes) g_st->nodes.erase(n.get());
    g_st->graphs.erase(g);
}

// Ends a capture sequence: its streams leave it; an owned graph is destroyed unless kept.
void end_capture_locked(const std::shared_ptr<Capture>& cap, bool keep_graph) {
    auto& v = g_st->captures;
    v.erase(std::remove(v.begin(), v.end(), cap), v.end());
    for (auto& s : cap->streams) {
        if (s->cap == cap) s->cap.reset();
        s->deps.clear();
    }
    cap->streams.clear();
    cap->origin.reset();
    if (cap->graph) cap->graph->capture = nullptr;
    if (!keep_graph && cap->owns_graph && cap->graph) destroy_graph_locked(cap->graph);
    cap->graph = nullptr;
}

// A stream leaves capture because it is destroyed: the origin ends (abandons) its capture, a joined
// stream invalidates it.
void stream_leaves_capture_locked(const std::shared_ptr<Stream>& s) {
    std::shared_ptr<Capture> cap = s->cap;
    if (!cap) return;
    if (cap->origin == s) {
        end_capture_locked(cap, false);
        return;
    }
    cap->invalidated = true;
    s->cap.reset();
    s->deps.clear();
    auto& v = cap->streams;
    v.erase(std::remove(v.begin(), v.end(), s), v.end());
}

// Is this event's last record one inside a capture still in progress?
bool captured_event_locked(const Event& e) {
    return e.cap && std::find(g_st->captures.begin(), g_st->captures.end(), e.cap) != g_st->captures.end();
}

// Runs fn in stream order and waits for it (synchronous memcpy/memset).
CUresult run_sync(CUstream h, bool ptds, std::function<void()> fn) {
    std::unique_lock<std::mutex> lk(g_mu);
    if (CUresult r = unsafe_locked(); r != CUDA_SUCCESS) return r;
    std::shared_ptr<Stream> s;
    if (CUresult r = resolve_stream_locked(h, ptds, &s); r != CUDA_SUCCESS) return r;
    if (s->cap) {  // a synchronous operation cannot be captured
        s->cap->invalidated = true;
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if (s->legacy)
        if (CUresult r = legacy_use_locked(s->ctx); r != CUDA_SUCCESS) return r;
    uint64_t seq = enqueue_locked(s, std::move(fn));
    wait_seq_locked(lk, s, seq);
    return CUDA_SUCCESS;
}

// Runs fn in stream order, or records it as a node of type `type` on a capturing stream.
CUresult run_async(CUstream h, bool ptsz, std::function<void()> fn, CUgraphNodeType type) {
    std::unique_lock<std::mutex> lk(g_mu);
    std::shared_ptr<Stream> s;
    if (CUresult r = route_locked(h, ptsz, &s); r != CUDA_SUCCESS) return r;
    if (s->cap) capture_node_locked(*s, type, std::move(fn));
    else enqueue_locked(s, std::move(fn));
    return CUDA_SUCCESS;
}

// ---------------------------------------------------------------- memory

void latency() {
    if (g_st->latency_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(g_st->latency_us));
}

bool injected_failure() {
    long n = g_alloc_calls.fetch_add(1) + 1;
    return g_st->fail_after >= 0 && n > g_st->fail_after;
}

// Maps `bytes` of fresh memfd-backed memory. Returns false on failure.
bool map_new(size_t bytes, uintptr_t* base, size_t* map_size, int* fd_out) {
    size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    size_t ms = round_up(bytes == 0 ? 1 : bytes, page);
    int fd = static_cast<int>(syscall(SYS_memfd_create, "cupool-sim-device", 1u /*MFD_CLOEXEC*/));
    if (fd < 0) return false;
    if (ftruncate(fd, static_cast<off_t>(ms)) != 0) {
        close(fd);
        return false;
    }
    void* p = mmap(nullptr, ms, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return false;
    }
    *base = reinterpret_cast<uintptr_t>(p);
    *map_size = ms;
    *fd_out = fd;
    return true;
}

CUresult alloc_mem(Context* c, size_t bytes, Kind kind, MemPool* pool, CUdeviceptr* out) {
    if (injected_failure()) return CUDA_ERROR_OUT_OF_MEMORY;
    size_t acc = round_up(bytes, kAlign);
    {
        std::lock_guard<std::mutex> lk(g_mu);
        Device& d = g_st->devs[static_cast<size_t>(c->dev)];
        if (acc > d.total || d.used + acc > d.total) return CUDA_ERROR_OUT_OF_MEMORY;
        d.used += acc;
    }
    Alloc a;
    if (!map_new(bytes, &a.base, &a.map_size, &a.fd)) {
        std::lock_guard<std::mutex> lk(g_mu);
        g_st->devs[static_cast<size_t>(c->dev)].used -= acc;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a.size = bytes;
    a.accounted = acc;
    a.ctx = c;
    a.dev = c->dev;
    a.kind = kind;
    a.pool = pool;
    std::lock_guard<std::mutex> lk(g_mu);
    a.buffer_id = g_st->next_id++;
    if (pool) {
        pool->used += acc;
        pool->used_high = std::max(pool->used_high, pool->used);
    }
    g_st->allocs[a.base] = a;
    *out = static_cast<CUdeviceptr>(a.base);
    return CUDA_SUCCESS;
}

// Removes an allocation (lock held) and returns what must be unmapped outside the lock.
struct Unmap {
    uintptr_t base;
    size_t size;
    int fd;
};

// Graph-memory pool bookkeeping (lock held).
void unmap_galloc_locked(GraphAlloc* ga) {
    if (!ga->mapped) return;
    Device& d = g_st->devs[static_cast<size_t>(ga->dev)];
    ga->mapped = false;
    d.gp_used -= ga->rounded;
    d.gp_mapped.erase(std::remove(d.gp_mapped.begin(), d.gp_mapped.end(), ga), d.gp_mapped.end());
}

void map_galloc_locked(GraphAlloc* ga) {
    if (ga->mapped) return;
    Device& d = g_st->devs[static_cast<size_t>(ga->dev)];
    ga->mapped = true;
    d.gp_used += ga->rounded;
    d.gp_used_high = std::max(d.gp_used_high, d.gp_used);
    d.gp_mapped.push_back(ga);
}

// A graph allocation was freed: its pool memory stays associated with its executable graph (the
// driver keeps it mapped there), or becomes unused if that graph is gone.
void galloc_freed_locked(GraphAlloc* ga) {
    ga->live = false;
    if (ga->exec == nullptr) unmap_galloc_locked(ga);
}

Unmap erase_alloc_locked(std::map<uintptr_t, Alloc>::iterator it) {
    Alloc& a = it->second;
    if (a.kind != KIND_IPC && a.kind != KIND_HOST) g_st->devs[static_cast<size_t>(a.dev)].used -= a.accounted;
    if (a.pool) a.pool->used -= a.accounted;
    Unmap u{a.base, a.map_size, a.fd};
    if (a.kind == KIND_GRAPH) {  // the memory belongs to the graph allocation, which stays mapped
        galloc_freed_locked(a.galloc.get());
        u = Unmap{0, 0, -1};
    }
    g_st->allocs.erase(it);
    return u;
}

void do_unmap(const Unmap& u) {
    if (u.base == 0) return;
    munmap(reinterpret_cast<void*>(u.base), u.size);
    if (u.fd >= 0) close(u.fd);
}

// The graph allocation whose address range holds p (lock held), or null.
std::shared_ptr<GraphAlloc> find_galloc_locked(uintptr_t p) {
    auto& m = g_st->gallocs;
    auto it = m.upper_bound(p);
    if (it == m.begin()) return nullptr;
    --it;
    auto ga = it->second.lock();
    if (!ga || p >= ga->va + std::max<size_t>(ga->size, 1)) return nullptr;
    return ga;
}

// Allocation containing p (lock held), or end().
std::map<uintptr_t, Alloc>::iterator find_alloc_locked(uintptr_t p) {
    auto& m = g_st->allocs;
    auto it = m.upper_bound(p);
    if (it == m.begin()) return m.end();
    --it;
    if (p >= it->first && p < it->first + std::max<size_t>(it->second.size, 1)) return it;
    return m.end();
}

std::map<uintptr_t, Mapping>::iterator find_mapping_locked(uintptr_t p) {
    auto& m = g_st->mappings;
    auto it = m.upper_bound(p);
    if (it == m.begin()) return m.end();
    --it;
    if (p >= it->first && p < it->first + it->second.size) return it;
    return m.end();
}

// Is [p, p+n) device memory we know? (allocation or accessible VMM mapping)
bool is_device_range_locked(uintptr_t p, size_t n) {
    auto it = find_alloc_locked(p);
    if (it != g_st->allocs.end()) return p + n <= it->first + std::max(it->second.size, it->second.map_size);
    // a graph allocation's address is valid from its node's creation (work of the graph uses it)
    if (auto ga = find_galloc_locked(p)) return p + n <= ga->va + ga->size;
    // VMM: [p, p+n) may span consecutive mappings of one reserved range
    auto mt = find_mapping_locked(p);
    uintptr_t end = p + n;
    while (mt != g_st->mappings.end()) {
        uintptr_t mend = mt->first + mt->second.size;
        if (end <= mend) return true;
        auto next = std::next(mt);
        if (next == g_st->mappings.end() || next->first != mend) return false;
        mt = next;
    }
    return false;
}

CUresult check_dev_range(CUdeviceptr p, size_t n) {
    std::lock_guard<std::mutex> lk(g_mu);
    return is_device_range_locked(static_cast<uintptr_t>(p), n) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

// Destroys a context's streams and memory (cuCtxDestroy, primary release/reset).
void teardown_ctx(Context* c) {
    std::vector<Unmap> um;
    {
        std::unique_lock<std::mutex> lk(g_mu);
        sync_ctx_locked(lk, c);
        std::vector<std::shared_ptr<Stream>> all = c->streams;
        if (c->legacy) all.push_back(c->legacy);
        for (auto cap : std::vector<std::shared_ptr<Capture>>(g_st->captures))
            if (cap->ctx == c) end_capture_locked(cap, false);
        for (auto& s : all) {
            s->destroyed = true;
            for (auto it = g_st->streams.begin(); it != g_st->streams.end();)
                it = (it->second == s) ? g_st->streams.erase(it) : std::next(it);
        }
        g_cv.notify_all();
        g_cv.wait(lk, [&] {
            for (auto& s : all)
                if (!s->exited) return false;
            return true;
        });
        c->legacy.reset();
        c->streams.clear();
        for (auto it = g_st->allocs.begin(); it != g_st->allocs.end();) {
            if (it->second.ctx == c) {
                auto next = std::next(it);
                um.push_back(erase_alloc_locked(it));
                it = next;
            } else {
                ++it;
            }
        }
        // arrays die with their context too
        for (auto it = g_st->mipmaps.begin(); it != g_st->mipmaps.end();) {
            if (it->second->ctx != c) {
                ++it;
                continue;
            }
            g_st->devs[static_cast<size_t>(c->dev)].used -= it->second->charged;
            for (Array* a : it->second->level_arrays) g_st->arrays.erase(a);
            it = g_st->mipmaps.erase(it);
        }
        for (auto it = g_st->arrays.begin(); it != g_st->arrays.end();) {
            if (it->second->ctx != c) {
                ++it;
                continue;
            }
            g_st->devs[static_cast<size_t>(c->dev)].used -= it->second->charged;
            it = g_st->arrays.erase(it);
        }
    }
    for (auto& u : um) do_unmap(u);
}

void raise_fd_limit() {
    struct rlimit rl{};
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

void do_init() {
    long n = env_long("CUPOOL_SIM_DEVICES", 1);
    if (n < 0) n = 0;
    if (n > 64) n = 64;
    uint64_t total = parse_bytes(std::getenv("CUPOOL_SIM_TOTAL_MEM"), 16ull << 30);
    g_st->devs.resize(static_cast<size_t>(n));
    for (long i = 0; i < n; ++i) {
        Device& d = g_st->devs[static_cast<size_t>(i)];
        d.total = total;
        auto* c = new Context;
        c->dev = static_cast<int>(i);
        c->primary = true;
        c->id = g_st->next_id++;
        d.primary = c;
        g_st->contexts.push_back(c);
        auto* p = new MemPool;
        p->dev = static_cast<int>(i);
        d.default_pool = d.current_pool = p;
        g_st->pools.push_back(p);
    }
    long lat = env_long("CUPOOL_SIM_ALLOC_LATENCY_US", 0);
    g_st->latency_us = lat > 0 ? static_cast<uint64_t>(lat) : 0;
    g_st->fail_after = env_long("CUPOOL_SIM_FAIL_ALLOC_AFTER", -1);
    raise_fd_limit();
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

// CUPOOL_SIM_NO_FD_HANDLES names how the device lacks exportable (POSIX fd) memory, if it does.
// CUPOOL_SIM_NO_VMM=1: a device without virtual memory management, as older GPUs and some
// virtualized ones are: its attribute says 0, and the calls answer CUDA_ERROR_NOT_SUPPORTED.
// CUPOOL_SIM_NO_VMM=create: the attribute says 1 and addresses are reserved, but cuMemCreate
// answers CUDA_ERROR_NOT_SUPPORTED (a driver that refuses the granule itself).
bool no_vmm() {
    const char* v = std::getenv("CUPOOL_SIM_NO_VMM");
    return v && std::strcmp(v, "1") == 0;
}
bool no_vmm_memory() {
    const char* v = std::getenv("CUPOOL_SIM_NO_VMM");
    return v && std::strcmp(v, "create") == 0;
}

bool no_fd_handles(const char* how) {
    const char* v = std::getenv("CUPOOL_SIM_NO_FD_HANDLES");
    return v && std::strcmp(v, how) == 0;
}

CUresult check_dev(CUdevice d) {
    if (d < 0 || static_cast<size_t>(d) >= g_st->devs.size()) return CUDA_ERROR_INVALID_DEVICE;
    return CUDA_SUCCESS;
}

Context* ctx_of(CUcontext c) { return reinterpret_cast<Context*>(c); }
CUcontext handle_of(Context* c) { return reinterpret_cast<CUcontext>(c); }

CUresult ctx_create(CUcontext* pctx, unsigned flags, CUdevice dev) {
    CHECK_INIT();
    if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = check_dev(dev); r != CUDA_SUCCESS) return r;
    auto* c = new Context;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        c->dev = dev;
        c->alive = true;
        c->flags = flags;
        c->id = g_st->next_id++;
        g_st->contexts.push_back(c);
    }
    tl_stack.push_back(c);
    *pctx = handle_of(c);
    return CUDA_SUCCESS;
}

CUresult ctx_destroy(CUcontext h) {
    CHECK_INIT();
    Context* c = ctx_of(h);
    if (c == nullptr || !c->alive || c->primary) return CUDA_ERROR_INVALID_CONTEXT;
    teardown_ctx(c);
    c->alive = false;
    tl_stack.erase(std::remove(tl_stack.begin(), tl_stack.end(), c), tl_stack.end());
    return CUDA_SUCCESS;
}

CUresult primary_release(CUdevice dev) {
    CHECK_INIT();
    if (CUresult r = check_dev(dev); r != CUDA_SUCCESS) return r;
    Context* c = g_st->devs[static_cast<size_t>(dev)].primary;
    bool last = false;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        if (c->refcount <= 0) return CUDA_ERROR_INVALID_CONTEXT;
        last = --c->refcount == 0;
    }
    if (last) {
        teardown_ctx(c);
        c->alive = false;
    }
    return CUDA_SUCCESS;
}

CUresult primary_reset(CUdevice dev) {
    CHECK_INIT();
    if (CUresult r = check_dev(dev); r != CUDA_SUCCESS) return r;
    Context* c = g_st->devs[static_cast<size_t>(dev)].primary;
    teardown_ctx(c);
    std::lock_guard<std::mutex> lk(g_mu);
    c->refcount = 0;
    c->alive = false;
    c->flags = 0;
    return CUDA_SUCCESS;
}

CUresult free_sync(CUdeviceptr dptr) {
    CHECK_INIT();
    Context* cur = nullptr;
    if (CUresult r = need_ctx(&cur); r != CUDA_SUCCESS) return r;
    if (dptr == 0) return CUDA_SUCCESS;
    if (CUresult r = unsafe_call(); r != CUDA_SUCCESS) return r;
    latency();
    Unmap u{};
    {
        std::unique_lock<std::mutex> lk(g_mu);
        auto it = g_st->allocs.find(static_cast<uintptr_t>(dptr));
        if (it == g_st->allocs.end() || it->second.kind == KIND_IPC || it->second.kind == KIND_HOST ||
            it->second.free_pending)
            return CUDA_ERROR_INVALID_VALUE;
        // As the real driver: cuMemFree waits for all outstanding work of the context.
        Context* c = it->second.ctx;
        it->second.free_pending = true;
        sync_ctx_locked(lk, c);
        if (c != cur) sync_ctx_locked(lk, cur);
        it = g_st->allocs.find(static_cast<uintptr_t>(dptr));
        if (it == g_st->allocs.end()) return CUDA_ERROR_INVALID_VALUE;
        u = erase_alloc_locked(it);
    }
    do_unmap(u);
    return CUDA_SUCCESS;
}

// A new graph allocation of `bytes` on device dev: its address range, mapped now (lock held).
std::shared_ptr<GraphAlloc> new_galloc_locked(size_t bytes, int dev) {
    size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    size_t ms = round_up(bytes, page);
    void* p = mmap(nullptr, ms, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    auto& m = g_st->gallocs;  // forget the addresses of graph allocations that are gone
    for (auto it = m.begin(); it != m.end();) it = it->second.expired() ? m.erase(it) : std::next(it);
    auto ga = std::make_shared<GraphAlloc>();
    ga->va = reinterpret_cast<uintptr_t>(p);
    ga->size = bytes;
    ga->map_size = ms;
    ga->rounded = round_up(bytes, kGranularity);
    ga->dev = dev;
    g_st->gallocs[ga->va] = ga;
    return ga;
}

Node* add_alloc_node_locked(Graph* g, std::vector<Node*> deps, size_t bytes, int dev) {
    auto ga = new_galloc_locked(bytes, dev);
    if (!ga) return nullptr;
    Node* n = add_node_locked(g, CU_GRAPH_NODE_TYPE_MEM_ALLOC, nullptr, std::move(deps));
    n->ga = ga;
    n->alloc_params.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    n->alloc_params.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    n->alloc_params.poolProps.location.id = dev;
    n->alloc_params.bytesize = bytes;
    n->alloc_params.dptr = static_cast<CUdeviceptr>(ga->va);
    return n;
}

// A free node for the graph allocation at dptr (its base): refused for an unknown address or one
// that some graph already frees, as the driver does.
CUresult add_free_node_locked(Graph* g, std::vector<Node*> deps, CUdeviceptr dptr, Node** out) {
    auto it = g_st->gallocs.find(static_cast<uintptr_t>(dptr));
    std::shared_ptr<GraphAlloc> ga = it == g_st->gallocs.end() ? nullptr : it->second.lock();
    if (!ga || ga->free_node) return CUDA_ERROR_INVALID_VALUE;
    ga->free_node = true;
    Node* n = add_node_locked(g, CU_GRAPH_NODE_TYPE_MEM_FREE, nullptr, std::move(deps));
    n->ga = ga;
    *out = n;
    return CUDA_SUCCESS;
}

CUresult alloc_async(CUdeviceptr* dptr, size_t bytesize, MemPool* pool, CUstream h, bool ptsz) {
    CHECK_INIT();
    if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    Context* c = nullptr;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        std::shared_ptr<Stream> s;
        if (CUresult r = route_locked(h, ptsz, &s); r != CUDA_SUCCESS) return r;
        c = s->ctx;
        if (pool == nullptr) pool = g_st->devs[static_cast<size_t>(c->dev)].current_pool;
        if (s->cap) {
            // Captured: an allocation node whose address is fixed now; memory comes at launch.
            std::vector<Node*> deps = s->deps;
            Node* n = add_alloc_node_locked(s->cap->graph, std::move(deps), bytesize, pool->dev);
            if (n == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
            s->deps = {n};
            *dptr = n->alloc_params.dptr;
            return CUDA_SUCCESS;
        }
    }
    return alloc_mem(c, bytesize, KIND_ASYNC, pool, dptr);
}

CUresult free_async(CUdeviceptr dptr, CUstream h, bool ptsz) {
    CHECK_INIT();
    std::unique_lock<std::mutex> lk(g_mu);
    std::shared_ptr<Stream> s;
    if (CUresult r = route_locked(h, ptsz, &s); r != CUDA_SUCCESS) return r;
    if (s->cap) {  // captured: a free node, for a graph allocation only
        Node* n = nullptr;
        if (CUresult r = add_free_node_locked(s->cap->graph, s->deps, dptr, &n); r != CUDA_SUCCESS) return r;
        s->deps = {n};
        return CUDA_SUCCESS;
    }
    auto it = g_st->allocs.find(static_cast<uintptr_t>(dptr));
    if (it == g_st->allocs.end() || it->second.kind == KIND_IPC || it->second.kind == KIND_HOST ||
        it->second.free_pending)
        return CUDA_ERROR_INVALID_VALUE;
    if (it->second.kind == KIND_GRAPH) {
        // Graph allocations are tracked in API order (a relaunch may follow at once); the memory
        // stays mapped, so stream work before this free still finds it.
        erase_alloc_locked(it);
        return CUDA_SUCCESS;
    }
    it->second.free_pending = true;
    uintptr_t base = it->first;
    enqueue_locked(s, [base] {
        Unmap u{};
        {
            std::lock_guard<std::mutex> l2(g_mu);
            auto i2 = g_st->allocs.find(base);
            if (i2 == g_st->allocs.end()) return;
            u = erase_alloc_locked(i2);
        }
        do_unmap(u);
    });
    return CUDA_SUCCESS;
}

CUresult memcpy_impl(void* dst, const void* src, size_t n, CUstream h, bool ptsz, bool sync) {
    CHECK_INIT();
    if (n == 0) return CUDA_SUCCESS;
    if (dst == nullptr || src == nullptr) return CUDA_ERROR_INVALID_VALUE;
    auto fn = [dst, src, n] { std::memmove(dst, src, n); };
    return sync ? run_sync(h, ptsz, fn) : run_async(h, ptsz, fn, CU_GRAPH_NODE_TYPE_MEMCPY);
}

template <typename T>
CUresult memset_impl(CUdeviceptr d, T v, size_t n, CUstream h, bool ptsz, bool sync) {
    CHECK_INIT();
    if (n == 0) return CUDA_SUCCESS;
    if (CUresult r = check_dev_range(d, n * sizeof(T)); r != CUDA_SUCCESS) return r;
    auto fn = [d, v, n] {
        T* p = reinterpret_cast<T*>(d);
        if constexpr (sizeof(T) == 1) std::memset(p, v, n);
        else std::fill(p, p + n, v);
    };
    return sync ? run_sync(h, ptsz, fn) : run_async(h, ptsz, fn, CU_GRAPH_NODE_TYPE_MEMSET);
}

// cuStreamSynchronize / cuStreamQuery under capture: unsafe calls; on the capturing stream itself
// always refused (and its capture invalidated), whatever the thread's mode.
CUresult sync_query_check_locked(CUstream h, bool ptsz, std::shared_ptr<Stream>* s) {
    if (CUresult r = unsafe_locked(); r != CUDA_SUCCESS) return r;
    if (CUresult r = resolve_stream_locked(h, ptsz, s); r != CUDA_SUCCESS) return r;
    if ((*s)->cap) {
        (*s)->cap->invalidated = true;
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if ((*s)->legacy) return legacy_use_locked((*s)->ctx);
    return CUDA_SUCCESS;
}

CUresult stream_sync(CUstream h, bool ptsz) {
    CHECK_INIT();
    std::unique_lock<std::mutex> lk(g_mu);
    std::shared_ptr<Stream> s;
    if (CUresult r = sync_query_check_locked(h, ptsz, &s); r != CUDA_SUCCESS) return r;
    wait_seq_locked(lk, s, s->submitted);
    return CUDA_SUCCESS;
}

CUresult stream_query(CUstream h, bool ptsz) {
    CHECK_INIT();
    std::lock_guard<std::mutex> lk(g_mu);
    std::shared_ptr<Stream> s;
    if (CUresult r = sync_query_check_locked(h, ptsz, &s); r != CUDA_SUCCESS) return r;
    return s->completed >= s->submitted ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult stream_flags(CUstream h, unsigned* flags, bool ptsz) {
    CHECK_INIT();
    if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    std::shared_ptr<Stream> s;
    if (CUresult r = resolve_stream_locked(h, ptsz, &s); r != CUDA_SUCCESS) return r;
    *flags = s->flags;
    return CUDA_SUCCESS;
}

CUresult stream_priority(CUstream h, int* prio, bool ptsz) {
    CHECK_INIT();
    if (prio == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    std::shared_ptr<Stream> s;
    if (CUresult r = resolve_stream_locked(h, ptsz, &s); r != CUDA_SUCCESS) return r;
    *prio = s->priority;
    return CUDA_SUCCESS;
}

CUresult stream_ctx(CUstream h, CUcontext* pctx, bool ptsz) {
    CHECK_INIT();
    if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    std::shared_ptr<Stream> s;
    if (CUresult r = resolve_stream_locked(h, ptsz, &s); r != CUDA_SUCCESS) return r;
    *pctx = handle_of(s->ctx);
    return CUDA_SUCCESS;
}

CUresult host_func(CUstream h, CUhostFn fn, void* user, bool ptsz) {
    CHECK_INIT();
    if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return run_async(h, ptsz, [fn, user] { fn(user); }, CU_GRAPH_NODE_TYPE_HOST);
}

CUresult stream_wait_event(CUstream h, CUevent ev, unsigned flags, bool ptsz) {
    CHECK_INIT();
    std::lock_guard<std::mutex> lk(g_mu);
    std::shared_ptr<Stream> s;
    if (CUresult r = resolve_stream_locked(h, ptsz, &s); r != CUDA_SUCCESS) return r;
    auto it = g_st->events.find(ev);
    if (it == g_st->events.end()) return CUDA_ERROR_INVALID_HANDLE;
    Event& e = *it->second;
    if (captured_event_locked(e)) {
        const std::shared_ptr<Capture>& cap = e.cap;
        if (s->cap == cap) {  // join within the capture: the next node also follows the event's nodes
            for (Node* n : e.cap_nodes)
                if (std::find(s->deps.begin(), s->deps.end(), n) == s->deps.end()) s->deps.push_back(n);
        } else if (s->cap) {  // would merge two capture sequences
            s->cap->invalidated = true;
            cap->invalidated = true;
            return CUDA_ERROR_STREAM_CAPTURE_MERGE;
        } else if (s->legacy) {  // the legacy stream cannot join a capture
            legacy_use_locked(s->ctx);
            cap->invalidated = true;
            return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
        } else {  // fork: the stream joins the capture (as PyTorch's side streams do)
            s->cap = cap;
            s->deps = e.cap_nodes;
            cap->streams.push_back(s);
        }
        return cap->invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
    }
    if (s->cap) {
        if (s->cap->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        if (!e.recorded || !e.s) return CUDA_SUCCESS;  // nothing to wait for
        if (!(flags & CU_EVENT_WAIT_EXTERNAL)) {
            // A captured stream may not depend on uncaptured work (unless the wait is external).
            s->cap->invalidated = true;
            return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
        }
        // An external wait node: waits, when the graph runs, for the event's last record then.
        capture_node_locked(*s, CU_GRAPH_NODE_TYPE_WAIT_EVENT, [ev] {
            std::unique_lock<std::mutex> l2(g_mu);
            auto i2 = g_st->events.find(ev);
            if (i2 == g_st->events.end() || !i2->second->recorded || !i2->second->s) return;
            std::shared_ptr<Event> e2 = i2->second;
            wait_seq_locked(l2, e2->s, e2->seq);
        });
        return CUDA_SUCCESS;
    }
    if (s->legacy)
        if (CUresult r = legacy_use_locked(s->ctx); r != CUDA_SUCCESS) return r;
    std::vector<Dep> deps;
    if (e.recorded && e.s) deps.push_back({e.s, e.seq});
    enqueue_locked(s, nullptr, std::move(deps));
    return CUDA_SUCCESS;
}

CUresult event_record(CUevent ev, CUstream h, bool ptsz) {
    CHECK_INIT();
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_st->events.find(ev);
    if (it == g_st->events.end()) return CUDA_ERROR_INVALID_HANDLE;
    std::shared_ptr<Stream> s;
    if (CUresult r = route_locked(h, ptsz, &s); r != CUDA_SUCCESS) return r;
    std::shared_ptr<Event> e = it->second;
    uint64_t gen = ++e->gen;
    e->recorded = true;
    e->have_time = false;
    if (s->cap) {  // no node: the event marks the stream's place in the capture (fork/join)
        e->s = nullptr;
        e->cap = s->cap;
        e->cap_nodes = s->deps;
        return CUDA_SUCCESS;
    }
    e->cap.reset();
    e->cap_nodes.clear();
    e->s = s;
    e->seq = enqueue_locked(s, [e, gen] {
        auto t = std::chrono::steady_clock::now();
        std::lock_guard<std::mutex> l2(g_mu);
        if (e->gen == gen) {
            e->t = t;
            e->have_time = true;
        }
    });
    return CUDA_SUCCESS;
}

CUresult ipc_open(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned) {
    CHECK_INIT();
    if (pdptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Context* c = nullptr;
    if (CUresult r = need_ctx(&c); r != CUDA_SUCCESS) return r;
    IpcHandle h{};
    std::memcpy(&h, handle.reserved, sizeof h);
    if (h.magic != kIpcMagic || h.size == 0) return CUDA_ERROR_INVALID_VALUE;
    // As the H200's driver (580): bytes 48..55 are checked (a changed one is an invalid handle),
    // bytes 56..63 are not read at all.
    for (size_t i = sizeof h; i < 56; ++i)
        if (handle.reserved[i] != 0) return CUDA_ERROR_INVALID_HANDLE;
    // The same handle opened again in this process: the same mapping, counted (lock held).
    auto reuse_locked = [&]() -> bool {
        for (auto& [base, a] : g_st->allocs)
            if (a.kind == KIND_IPC && a.ipc_pid == h.pid && a.ipc_buffer == h.buffer_id && a.ctx == c) {
                ++a.ipc_opens;
                *pdptr = static_cast<CUdeviceptr>(a.base + h.offset);
                return true;
            }
        return false;
    };
    {
        std::lock_guard<std::mutex> lk(g_mu);
        if (reuse_locked()) return CUDA_SUCCESS;
    }
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%d/fd/%d", h.pid, h.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        // Fall back to pidfd_getfd (needs ptrace rights on the exporter).
        long pidfd = syscall(434 /*SYS_pidfd_open*/, h.pid, 0);
        if (pidfd >= 0) {
            fd = static_cast<int>(syscall(438 /*SYS_pidfd_getfd*/, static_cast<int>(pidfd), h.fd, 0));
            close(static_cast<int>(pidfd));
        }
    }
    if (fd < 0) return CUDA_ERROR_INVALID_HANDLE;
    void* p = mmap(nullptr, h.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return CUDA_ERROR_INVALID_HANDLE;
    Alloc a;
    a.base = reinterpret_cast<uintptr_t>(p);
    a.size = h.size;
    a.map_size = h.size;
    a.accounted = 0;
    a.ctx = c;
    a.dev = c->dev;
    a.kind = KIND_IPC;
    a.ipc_pid = h.pid;
    a.ipc_buffer = h.buffer_id;
    a.ipc_opens = 1;
    std::lock_guard<std::mutex> lk(g_mu);
    if (reuse_locked()) {  // another thread opened it meanwhile
        munmap(p, h.size);
        return CUDA_SUCCESS;
    }
    a.buffer_id = g_st->next_id++;
    g_st->allocs[a.base] = a;
    *pdptr = static_cast<CUdeviceptr>(a.base + h.offset);
    return CUDA_SUCCESS;
}

// Writes one pointer attribute. a: allocation, m: VMM mapping (either may be null: unknown pointer).
CUresult write_attr(CUpointer_attribute attr, void* data, uintptr_t ptr, const Alloc* a, uintptr_t mbase,
                    const Mapping* m, bool for_attributes) {
    bool known = a != nullptr || m != nullptr;
    if (!known && !for_attributes) return CUDA_ERROR_INVALID_VALUE;
    int dev = -2;
    if (a) dev = a->dev;
    else if (m) {
        auto pt = g_st->phys.find(m->handle);
        dev = pt != g_st->phys.end() ? pt->second.dev : 0;
    }
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        *static_cast<CUcontext*>(data) = a ? handle_of(a->ctx) : nullptr;
        break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *static_cast<unsigned int*>(data) =
            !known ? 0u : static_cast<unsigned>((a && a->kind == KIND_HOST) ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE);
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        if (!known && !for_attributes) return CUDA_ERROR_INVALID_VALUE;
        *static_cast<CUdeviceptr*>(data) = known ? static_cast<CUdeviceptr>(ptr) : 0;
        break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (!(a && (a->kind == KIND_MANAGED || a->kind == KIND_HOST))) {
            if (!for_attributes) return CUDA_ERROR_INVALID_VALUE;
            *static_cast<void**>(data) = nullptr;
        } else {
            *static_cast<void**>(data) = reinterpret_cast<void*>(ptr);
        }
        break;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
    case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE:
        *static_cast<bool*>(data) = false;
        break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
        *static_cast<unsigned long long*>(data) = a ? a->buffer_id : (m ? m->handle : 0);
        break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *static_cast<bool*>(data) = a && a->kind == KIND_MANAGED;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *static_cast<int*>(data) = dev;
        break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
        *static_cast<bool*>(data) = a && (a->kind == KIND_DEVICE || a->kind == KIND_PITCH);
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
        *static_cast<CUdeviceptr*>(data) = a ? a->base : (m ? mbase : 0);
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
        *static_cast<size_t*>(data) = a ? a->size : (m ? m->size : 0);
        break;
    case CU_POINTER_ATTRIBUTE_MAPPED:
        *static_cast<bool*>(data) = known;
        break;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
        *static_cast<unsigned long long*>(data) = m ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : 0;
        break;
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
        *static_cast<unsigned int*>(data) = known ? CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE : 0;
        break;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
        *static_cast<CUmemoryPool*>(data) = a ? reinterpret_cast<CUmemoryPool>(a->pool) : nullptr;
        break;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

CUresult lookup_ptr_locked(uintptr_t p, const Alloc** a, uintptr_t* mbase, const Mapping** m) {
    *a = nullptr;
    *m = nullptr;
    auto it = find_alloc_locked(p);
    if (it != g_st->allocs.end()) {
        *a = &it->second;
        return CUDA_SUCCESS;
    }
    auto mt = find_mapping_locked(p);
    if (mt != g_st->mappings.end()) {
        *m = &mt->second;
        *mbase = mt->first;
        return CUDA_SUCCESS;
    }
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult create_phys(int fd, size_t size, const CUmemAllocationProp& prop, CUmemGenericAllocationHandle* handle) {
    int dev = prop.location.id;
    std::lock_guard<std::mutex> lk(g_mu);
    Device& d = g_st->devs[static_cast<size_t>(dev)];
    if (size > d.total || d.used + size > d.total) return CUDA_ERROR_OUT_OF_MEMORY;
    d.used += size;
    Phys ph;
    ph.fd = fd;
    ph.size = size;
    ph.dev = dev;
    ph.prop = prop;
    CUmemGenericAllocationHandle h = g_st->next_handle++;
    g_st->phys[h] = ph;
    *handle = h;
    return CUDA_SUCCESS;
}

void maybe_free_phys_locked(CUmemGenericAllocationHandle h) {
    auto it = g_st->phys.find(h);
    if (it == g_st->phys.end()) return;
    if (it->second.released && it->second.maps == 0) {
        if (it->second.charged) g_st->devs[static_cast<size_t>(it->second.dev)].used -= it->second.size;
        close(it->second.fd);
        g_st->phys.erase(it);
    }
}

// ---------------------------------------------------------------- capture, graphs, arrays

Graph* new_graph_locked() {
    auto g = std::make_unique<Graph>();
    g->id = g_st->next_id++;
    Graph* raw = g.get();
    g_st->graphs[raw] = std::move(g);
    return raw;
}

Graph* find_graph_locked(CUgraph h) {
    auto it = g_st->graphs.find(h);
    return it == g_st->graphs.end() ? nullptr : it->second.get();
}

// Dependencies given by handle: nodes of g, or false.
bool nodes_of_locked(Graph* g, const CUgraphNode* deps, size_t n, std::vector<Node*>* out) {
    if (n > 0 && deps == nullptr) return false;
    for (size_t i = 0; i < n; ++i) {
        auto it = g_st->nodes.find(deps[i]);
        if (it == g_st->nodes.end() || it->second->graph != g) return false;
        out->push_back(it->second);
    }
    return true;
}

bool valid_mode(CUstreamCaptureMode m) {
    return m == CU_STREAM_CAPTURE_MODE_GLOBAL || m == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL ||
           m == CU_STREAM_CAPTURE_MODE_RELAXED;
}

CUresult begin_capture(CUstream h, CUstreamCaptureMode mode, bool ptsz, CUgraph into, const CUgraphNode* deps,
                       size_t ndeps) {
    CHECK_INIT();
    if (!valid_mode(mode)) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    std::shared_ptr<Stream> s;
    if (CUresult r = resolve_stream_locked(h, ptsz, &s); r != CUDA_SUCCESS) return r;
    if (s->legacy) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;  // the legacy stream cannot be captured
    if (s->cap) return CUDA_ERROR_ILLEGAL_STATE;
    Graph* g = nullptr;
    std::vector<Node*> start;
    if (into) {
        g = find_graph_locked(into);
        if (g == nullptr || g->capture || !nodes_of_locked(g, deps, ndeps, &start)) return CUDA_ERROR_INVALID_VALUE;
    } else {
        g = new_graph_locked();
    }
    auto cap = std::make_shared<Capture>();
    cap->id = g_st->next_id++;
    cap->graph = g;
    cap->owns_graph = into == nullptr;
    cap->mode = mode;
    cap->thread = std::this_thread::get_id();
    cap->ctx = s->ctx;
    cap->origin = s;
    cap->streams.push_back(s);
    g->capture = cap.get();
    s->cap = cap;
    s->deps = std::move(start);
    g_st->captures.push_back(cap);
    return CUDA_SUCCESS;
}

CUresult end_capture(CUstream h, CUgraph* phGraph, bool ptsz) {
    CHECK_INIT();
    if (phGraph == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    std::shared_ptr<Stream> s;
    if (CUresult r = resolve_stream_locked(h, ptsz, &s); r != CUDA_SUCCESS) return r;
    std::shared_ptr<Capture> cap = s->cap;
    if (!cap) return CUDA_ERROR_ILLEGAL_STATE;
    if (cap->origin != s) {
        cap->invalidated = true;
        return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
    }
    if (cap->mode != CU_STREAM_CAPTURE_MODE_RELAXED && cap->thread != std::this_thread::get_id())
        return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    *phGraph = nullptr;
    if (cap->invalidated) {
        end_capture_locked(cap, false);
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    // Every stream that joined must have been joined back: its last nodes precede the origin's.
    std::vector<Node*> todo = s->deps;
    std::unordered_map<Node*, bool> seen;
    while (!todo.empty()) {
        Node* n = todo.back();
        todo.pop_back();
        if (seen[n]) continue;
        seen[n] = true;
        todo.insert(todo.end(), n->deps.begin(), n->deps.end());
    }
    for (auto& st : cap->streams)
        for (Node* n : st->deps)
            if (st != s && !seen[n]) {
                end_capture_locked(cap, false);
                return CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
            }
    Graph* g = cap->graph;
    end_capture_locked(cap, true);
    *phGraph = reinterpret_cast<CUgraph>(g);
    return CUDA_SUCCESS;
}

// cuStreamIsCapturing / cuStreamGetCaptureInfo: on the legacy stream while a blocking stream
// captures, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT without invalidating anything (as measured).
CUresult capture_info(CUstream h, bool ptsz, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
                      const CUgraphNode** deps, const CUgraphEdgeData** edges, size_t* ndeps) {
    CHECK_INIT();
    if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    std::shared_ptr<Stream> s;
    if (CUresult r = resolve_stream_locked(h, ptsz, &s); r != CUDA_SUCCESS) return r;
    if (s->legacy && !blocking_captures_locked(s->ctx).empty()) return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    const std::shared_ptr<Capture>& cap = s->cap;
    if (!cap) {
        *status = CU_STREAM_CAPTURE_STATUS_NONE;
        return CUDA_SUCCESS;
    }
    *status = cap->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    if (cap->invalidated) return CUDA_SUCCESS;
    if (id) *id = cap->id;
    if (graph) *graph = reinterpret_cast<CUgraph>(cap->graph);
    s->deps_view.clear();
    for (Node* n : s->deps) s->deps_view.push_back(reinterpret_cast<CUgraphNode>(n));
    s->edge_view.assign(s->deps.size(), CUgraphEdgeData{});
    if (deps) *deps = s->deps_view.empty() ? nullptr : s->deps_view.data();
    if (edges) *edges = s->edge_view.empty() ? nullptr : s->edge_view.data();
    if (ndeps) *ndeps = s->deps.size();
    return CUDA_SUCCESS;
}

bool exec_running_locked(const Exec* e) {
    return e && e->last_stream && e->last_stream->completed < e->last_seq;
}

// Makes room in device dev's graph-memory pool for `need` more bytes of graph allocations: takes
// back memory associated with allocations that are neither live nor in a running graph (nor in
// `except`), then reserves the rest from the device, as the graph-memory pool grows.
CUresult pool_room_locked(int dev, uint64_t need, const Exec* except) {
    Device& d = g_st->devs[static_cast<size_t>(dev)];
    auto unused = [&] { return d.gp_reserved - d.gp_used; };
    for (size_t i = 0; i < d.gp_mapped.size() && need > unused();) {
        GraphAlloc* ga = d.gp_mapped[i];
        if (ga->live || ga->exec == except || exec_running_locked(ga->exec)) ++i;
        else unmap_galloc_locked(ga);
    }
    if (need <= unused()) return CUDA_SUCCESS;
    uint64_t extra = need - unused();
    if (injected_failure()) return CUDA_ERROR_OUT_OF_MEMORY;
    if (extra > d.total || d.used + extra > d.total) return CUDA_ERROR_OUT_OF_MEMORY;
    d.used += extra;
    d.gp_reserved += extra;
    d.gp_reserved_high = std::max(d.gp_reserved_high, d.gp_reserved);
    return CUDA_SUCCESS;
}

// Associates pool memory with every allocation of e (launch or upload).
CUresult map_exec_locked(Exec* e) {
    std::map<int, uint64_t> need;
    for (auto& [is_alloc, ga] : e->memops)
        if (is_alloc && !ga->mapped) need[ga->dev] += ga->rounded;
    for (auto& [dev, n] : need)
        if (CUresult r = pool_room_locked(dev, n, e); r != CUDA_SUCCESS) return r;
    for (auto& [is_alloc, ga] : e->memops)
        if (is_alloc) map_galloc_locked(ga.get());
    return CUDA_SUCCESS;
}

Exec* find_exec_locked(CUgraphExec h) {
    auto it = g_st->execs.find(h);
    return it == g_st->execs.end() ? nullptr : it->second.get();
}

constexpr unsigned long long kInstantiateFlags =
    CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH | CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD |
    CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH | CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;

CUresult instantiate(CUgraphExec* out, CUgraph hg, unsigned long long flags) {
    CHECK_INIT();
    if (out == nullptr || (flags & ~kInstantiateFlags) != 0) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    Graph* g = find_graph_locked(hg);
    if (g == nullptr || g->capture) return CUDA_ERROR_INVALID_VALUE;
    // As documented: a graph with memory nodes has at most one executable graph at a time.
    if (g->has_mem_nodes() && g->instances > 0) return CUDA_ERROR_INVALID_VALUE;
    auto e = std::make_unique<Exec>();
    e->graph_id = g->id;
    e->flags = flags;
    auto fns = std::make_shared<std::vector<std::function<void()>>>();
    for (auto& n : g->nodes) {
        if (n->fn) fns->push_back(n->fn);
        if (n->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
            n->ga->exec = e.get();
            e->memops.emplace_back(true, n->ga);
        } else if (n->type == CU_GRAPH_NODE_TYPE_MEM_FREE) {
            e->memops.emplace_back(false, n->ga);
        }
    }
    e->fns = std::move(fns);
    g->instances++;
    *out = reinterpret_cast<CUgraphExec>(e.get());
    g_st->execs[e.get()] = std::move(e);
    return CUDA_SUCCESS;
}

CUresult exec_destroy(CUgraphExec h) {
    CHECK_INIT();
    std::lock_guard<std::mutex> lk(g_mu);
    Exec* e = find_exec_locked(h);
    if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
    for (auto& [is_alloc, ga] : e->memops) {
        if (!is_alloc || ga->exec != e) continue;
        ga->exec = nullptr;
        if (!ga->live) unmap_galloc_locked(ga.get());  // pool memory stays reserved, now unused
    }
    for (auto& [p, g] : g_st->graphs)
        if (g->id == e->graph_id) g->instances--;
    g_st->execs.erase(e);  // a launch in flight keeps its functions
    return CUDA_SUCCESS;
}

CUresult graph_upload(CUgraphExec h, CUstream hs, bool ptsz) {
    CHECK_INIT();
    std::lock_guard<std::mutex> lk(g_mu);
    Exec* e = find_exec_locked(h);
    if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::shared_ptr<Stream> s;
    if (CUresult r = route_locked(hs, ptsz, &s); r != CUDA_SUCCESS) return r;
    if (s->cap) return CUDA_ERROR_NOT_SUPPORTED;  // the sim does not capture graph uploads/launches
    return map_exec_locked(e);
}

CUresult graph_launch(CUgraphExec h, CUstream hs, bool ptsz) {
    CHECK_INIT();
    std::lock_guard<std::mutex> lk(g_mu);
    Exec* e = find_exec_locked(h);
    if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::shared_ptr<Stream> s;
    if (CUresult r = route_locked(hs, ptsz, &s); r != CUDA_SUCCESS) return r;
    if (s->cap) return CUDA_ERROR_NOT_SUPPORTED;
    // Graph allocations, in API order: an allocation still live from a previous launch refuses the
    // launch (unless AUTO_FREE_ON_LAUNCH), a free node needs its allocation live.
    std::unordered_map<GraphAlloc*, bool> live;
    auto is_live = [&](GraphAlloc* ga) {
        auto it = live.find(ga);
        return it == live.end() ? ga->live : it->second;
    };
    std::vector<GraphAlloc*> auto_free;
    for (auto& [is_alloc, ga] : e->memops) {
        if (is_alloc) {
            if (is_live(ga.get())) {
                if (!(e->flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)) return CUDA_ERROR_INVALID_VALUE;
                auto_free.push_back(ga.get());
            }
            live[ga.get()] = true;
        } else {
            if (!is_live(ga.get())) return CUDA_ERROR_INVALID_VALUE;
            live[ga.get()] = false;
        }
    }
    if (CUresult r = map_exec_locked(e); r != CUDA_SUCCESS) return r;
    for (GraphAlloc* ga : auto_free) {
        auto it = g_st->allocs.find(ga->va);
        if (it != g_st->allocs.end()) erase_alloc_locked(it);
    }
    for (auto& [is_alloc, ga] : e->memops) {
        if (is_alloc) {
            Alloc a;
            a.base = ga->va;
            a.size = ga->size;
            a.ctx = s->ctx;
            a.dev = ga->dev;
            a.kind = KIND_GRAPH;
            a.galloc = ga;
            a.buffer_id = g_st->next_id++;
            g_st->allocs[a.base] = a;
            ga->live = true;
        } else {
            auto it = g_st->allocs.find(ga->va);
            if (it != g_st->allocs.end()) erase_alloc_locked(it);
        }
    }
    // Nodes run in creation order (a topological order) on the launch stream, after the previous
    // launch of the same executable graph.
    std::vector<Dep> deps;
    if (e->last_stream && e->last_stream != s) deps.push_back({e->last_stream, e->last_seq});
    auto fns = e->fns;
    e->last_seq = enqueue_locked(s, [fns] {
        for (auto& f : *fns) f();
    }, std::move(deps));
    e->last_stream = s;
    return CUDA_SUCCESS;
}

// ---- arrays

// Bytes of one element of format f with n channels; 0 for formats the sim does not model.
size_t elem_bytes(CUarray_format f, unsigned n) {
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return n;
    case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF: return 2 * n;
    case CU_AD_FORMAT_UNSIGNED_INT32: case CU_AD_FORMAT_SIGNED_INT32: case CU_AD_FORMAT_FLOAT: return 4 * n;
    case CU_AD_FORMAT_UNORM_INT8X1: case CU_AD_FORMAT_SNORM_INT8X1: return 1;
    case CU_AD_FORMAT_UNORM_INT8X2: case CU_AD_FORMAT_SNORM_INT8X2: return 2;
    case CU_AD_FORMAT_UNORM_INT8X4: case CU_AD_FORMAT_SNORM_INT8X4: return 4;
    case CU_AD_FORMAT_UNORM_INT16X1: case CU_AD_FORMAT_SNORM_INT16X1: return 2;
    case CU_AD_FORMAT_UNORM_INT16X2: case CU_AD_FORMAT_SNORM_INT16X2: return 4;
    case CU_AD_FORMAT_UNORM_INT16X4: case CU_AD_FORMAT_SNORM_INT16X4: return 8;
    case CU_AD_FORMAT_UNORM_INT_101010_2: return 4;
    default: return 0;
    }
}

constexpr unsigned kArrayFlags = CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_SURFACE_LDST | CUDA_ARRAY3D_CUBEMAP |
                                 CUDA_ARRAY3D_TEXTURE_GATHER | CUDA_ARRAY3D_DEPTH_TEXTURE |
                                 CUDA_ARRAY3D_COLOR_ATTACHMENT | CUDA_ARRAY3D_SPARSE |
                                 CUDA_ARRAY3D_DEFERRED_MAPPING | CUDA_ARRAY3D_VIDEO_ENCODE_DECODE;

CUresult check_desc(const CUDA_ARRAY3D_DESCRIPTOR& d) {
    if (d.Width == 0 || (d.Flags & ~kArrayFlags) != 0) return CUDA_ERROR_INVALID_VALUE;
    if (d.NumChannels != 1 && d.NumChannels != 2 && d.NumChannels != 4) return CUDA_ERROR_INVALID_VALUE;
    if (elem_bytes(d.Format, d.NumChannels) == 0) return CUDA_ERROR_NOT_SUPPORTED;
    if (d.Height == 0 && d.Depth > 0 && !(d.Flags & CUDA_ARRAY3D_LAYERED)) return CUDA_ERROR_INVALID_VALUE;
    if ((d.Flags & CUDA_ARRAY3D_CUBEMAP) && (d.Width != d.Height || d.Depth == 0 || d.Depth % 6 != 0))
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

// What an array takes on the device: element bytes x width x height x depth (layers included in
// depth); the H200 charged whole 2 MiB pages (256 MiB for 8192x8192 floats, 4 MiB for 1000x1000).
size_t level_bytes(const CUDA_ARRAY3D_DESCRIPTOR& d) {
    return elem_bytes(d.Format, d.NumChannels) * d.Width * std::max<size_t>(d.Height, 1) *
           std::max<size_t>(d.Depth, 1);
}

bool unbacked(const CUDA_ARRAY3D_DESCRIPTOR& d) {
    return (d.Flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING)) != 0;
}

CUresult charge_locked(int dev, size_t bytes) {
    if (injected_failure()) return CUDA_ERROR_OUT_OF_MEMORY;
    Device& d = g_st->devs[static_cast<size_t>(dev)];
    if (bytes > d.total || d.used + bytes > d.total) return CUDA_ERROR_OUT_OF_MEMORY;
    d.used += bytes;
    return CUDA_SUCCESS;
}

CUresult array_create(CUarray* h, const CUDA_ARRAY3D_DESCRIPTOR& d) {
    if (h == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Context* c = nullptr;
    if (CUresult r = need_ctx(&c); r != CUDA_SUCCESS) return r;
    if (CUresult r = check_desc(d); r != CUDA_SUCCESS) return r;
    size_t bytes = unbacked(d) ? 0 : round_up(level_bytes(d), kGranularity);
    std::lock_guard<std::mutex> lk(g_mu);
    if (CUresult r = charge_locked(c->dev, bytes); r != CUDA_SUCCESS) return r;
    auto a = std::make_unique<Array>();
    a->desc = d;
    a->charged = bytes;
    a->dev = c->dev;
    a->ctx = c;
    *h = reinterpret_cast<CUarray>(a.get());
    g_st->arrays[a.get()] = std::move(a);
    return CUDA_SUCCESS;
}

// Level l of a mipmapped array: each dimension halves, down to 1 (layers do not).
CUDA_ARRAY3D_DESCRIPTOR level_desc(const CUDA_ARRAY3D_DESCRIPTOR& d, unsigned l) {
    CUDA_ARRAY3D_DESCRIPTOR r = d;
    auto half = [l](size_t v) { return v == 0 ? size_t{0} : std::max<size_t>(v >> l, 1); };
    r.Width = half(d.Width);
    r.Height = half(d.Height);
    if (!(d.Flags & CUDA_ARRAY3D_LAYERED)) r.Depth = half(d.Depth);
    return r;
}

}  // namespace

// ======================================================================== exported API
extern "C" {

CUresult cuInit(unsigned int Flags) {
    if (g_poisoned) return CUDA_ERROR_NOT_INITIALIZED;
    if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    std::call_once(g_init_once, do_init);
    g_init = true;
    if (g_st->devs.empty()) return CUDA_ERROR_NO_DEVICE;
    return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int* driverVersion) {
    if (driverVersion == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = CUDA_VERSION;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice* device, int ordinal) {
    CHECK_INIT();
    if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = check_dev(ordinal); r != CUDA_SUCCESS) return r;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int* count) {
    CHECK_INIT();
    if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *count = static_cast<int>(g_st->devs.size());
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
    CHECK_INIT();
    if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = check_dev(dev); r != CUDA_SUCCESS) return r;
    std::snprintf(name, static_cast<size_t>(len), "%s", "cupool simulated device");
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
    CHECK_INIT();
    if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = check_dev(dev); r != CUDA_SUCCESS) return r;
    *bytes = g_st->devs[static_cast<size_t>(dev)].total;
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem(unsigned int* bytes, CUdevice dev) {
    size_t b = 0;
    CUresult r = cuDeviceTotalMem_v2(&b, dev);
    if (r == CUDA_SUCCESS) *bytes = static_cast<unsigned int>(std::min<size_t>(b, 0xffffffffu));
    return r;
}

CUresult cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
    CHECK_INIT();
    if (pi == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = check_dev(dev); r != CUDA_SUCCESS) return r;
    if (attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
    int v = 0;
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: v = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: v = 132; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: v = 2048; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: v = 64; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: v = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: v = 65535; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: v = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: v = 49152; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: v = 232448; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: v = 65536; break;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: v = 65536; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: v = 1980000; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: v = 2619000; break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: v = 5120; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: v = 50 << 20; break;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: v = 512; break;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT: v = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: v = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: v = dev + 1; break;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: v = 3; break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: v = no_vmm() ? 0 : 1; break;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
        v = no_fd_handles("attribute") || no_vmm() ? 0 : 1; break;
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED:
        v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES: v = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR; break;
    default: v = 0; break;
    }
    *pi = v;
    return CUDA_SUCCESS;
}

// cuda.h (CUDA 13) declares only the plain name, which the driver's table maps to this one.
__attribute__((visibility("default"))) CUresult cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {
    CHECK_INIT();
    if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = check_dev(dev); r != CUDA_SUCCESS) return r;
    device_uuid(dev, reinterpret_cast<unsigned char*>(uuid->bytes));
    return CUDA_SUCCESS;
}

// No MIG in the sim: the device's UUID, as _v2 gives it.
CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) { return cuDeviceGetUuid_v2(uuid, dev); }

// ---------------------------------------------------------------- contexts

CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
    CHECK_INIT();
    if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = check_dev(dev); r != CUDA_SUCCESS) return r;
    Context* c = g_st->devs[static_cast<size_t>(dev)].primary;
    std::lock_guard<std::mutex> lk(g_mu);
    c->refcount++;
    c->alive = true;
    *pctx = handle_of(c);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) { return primary_release(dev); }
CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { return primary_release(dev); }
CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) { return primary_reset(dev); }
CUresult cuDevicePrimaryCtxReset(CUdevice dev) { return primary_reset(dev); }

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
    CHECK_INIT();
    if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = check_dev(dev); r != CUDA_SUCCESS) return r;
    Context* c = g_st->devs[static_cast<size_t>(dev)].primary;
    std::lock_guard<std::mutex> lk(g_mu);
    *flags = c->flags;
    *active = c->refcount > 0 ? 1 : 0;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) {
    CHECK_INIT();
    if (CUresult r = check_dev(dev); r != CUDA_SUCCESS) return r;
    std::lock_guard<std::mutex> lk(g_mu);
    g_st->devs[static_cast<size_t>(dev)].primary->flags = flags;
    return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags) { return cuDevicePrimaryCtxSetFlags_v2(dev, flags); }

CUresult cuCtxCreate(CUcontext* pctx, unsigned int flags, CUdevice dev) { return ctx_create(pctx, flags, dev); }
CUresult cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev) { return ctx_create(pctx, flags, dev); }
CUresult cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam*, int, unsigned int flags, CUdevice dev) {
    return ctx_create(pctx, flags, dev);
}
CUresult cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams*, unsigned int flags, CUdevice dev) {
    return ctx_create(pctx, flags, dev);
}
CUresult cuCtxDestroy_v2(CUcontext ctx) { return ctx_destroy(ctx); }
CUresult cuCtxDestroy(CUcontext ctx) { return ctx_destroy(ctx); }

CUresult cuCtxGetCurrent(CUcontext* pctx) {
    CHECK_INIT();
    if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *pctx = handle_of(current_ctx());
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
    CHECK_INIT();
    Context* c = ctx_of(ctx);
    if (c == nullptr) {
        if (!tl_stack.empty()) tl_stack.pop_back();
        return CUDA_SUCCESS;
    }
    if (!c->alive) return CUDA_ERROR_INVALID_CONTEXT;
    if (tl_stack.empty()) tl_stack.push_back(c);
    else tl_stack.back() = c;
    return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
    CHECK_INIT();
    Context* c = ctx_of(ctx);
    if (c == nullptr || !c->alive) return CUDA_ERROR_INVALID_CONTEXT;
    tl_stack.push_back(c);
    return CUDA_SUCCESS;
}
CUresult cuCtxPushCurrent(CUcontext ctx) { return cuCtxPushCurrent_v2(ctx); }

CUresult cuCtxPopCurrent_v2(CUcontext* pctx) {
    CHECK_INIT();
    if (tl_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
    if (pctx) *pctx = handle_of(tl_stack.back());
    tl_stack.pop_back();
    return CUDA_SUCCESS;
}
CUresult cuCtxPopCurrent(CUcontext* pctx) { return cuCtxPopCurrent_v2(pctx); }

CUresult cuCtxGetDevice(CUdevice* device) {
    CHECK_INIT();
    if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Context* c = nullptr;
    if (CUresult r = need_ctx(&c); r != CUDA_SUCCESS) return r;
    *device = c->dev;
    return CUDA_SUCCESS;
}

// Peer access: the current context may then reach the peer context's device memory. The
// simulated devices share the host's memory, so the record is all there is: what a program (or
// cupool) asks, and what cuDeviceCanAccessPeer says, are checked as the driver checks them.
CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags) {
    CHECK_INIT();
    if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    Context* c = nullptr;
    if (CUresult r = need_ctx(&c); r != CUDA_SUCCESS) return r;
    Context* peer = peerContext ? ctx_of(peerContext) : nullptr;
    if (peer == nullptr || !peer->alive) return CUDA_ERROR_INVALID_CONTEXT;
    if (peer->dev == c->dev) return CUDA_ERROR_INVALID_DEVICE;
    std::lock_guard<std::mutex> lk(g_mu);
    if (std::find(c->peers.begin(), c->peers.end(), peer->dev) != c->peers.end()) return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
    c->peers.push_back(peer->dev);
    return CUDA_SUCCESS;
}

CUresult cuCtxDisablePeerAccess(CUcontext peerContext) {
    CHECK_INIT();
    Context* c = nullptr;
    if (CUresult r = need_ctx(&c); r != CUDA_SUCCESS) return r;
    Context* peer = peerContext ? ctx_of(peerContext) : nullptr;
    if (peer == nullptr || !peer->alive) return CUDA_ERROR_INVALID_CONTEXT;
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = std::find(c->peers.begin(), c->peers.end(), peer->dev);
    if (it == c->peers.end()) return CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
    c->peers.erase(it);
    return CUDA_SUCCESS;
}

CUresult cuDeviceCanAccessPeer(int* canAccessPeer, CUdevice dev, CUdevice peerDev) {
    CHECK_INIT();
    if (canAccessPeer == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (check_dev(dev) != CUDA_SUCCESS || check_dev(peerDev) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_DEVICE;
    *canAccessPeer = dev != peerDev;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetFlags(unsigned int* flags) {
    CHECK_INIT();
    if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Context* c = nullptr;
    if (CUresult r = need_ctx(&c); r != CUDA_SUCCESS) return r;
    *flags = c->flags;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetId(CUcontext ctx, unsigned long long* ctxId) {
    CHECK_INIT();
    if (ctxId == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Context* c = ctx ? ctx_of(ctx) : current_ctx();
    if (c == nullptr || !c->alive) return CUDA_ERROR_INVALID_CONTEXT;
    *ctxId = c->id;
    return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) {
    CHECK_INIT();
    Context* c = nullptr;
    if (CUresult r = need_ctx(&c); r != CUDA_SUCCESS) return r;
    std::unique_lock<std::mutex> lk(g_mu);
    // As measured: refused during any capture in the context, whatever the modes (and unsafe).
    auto v = prohibitors_locked();
    for (auto& cap : g_st->captures)
        if (cap->ctx == c) v.push_back(cap);
    for (auto& cap : v) cap->invalidated = true;
    if (!v.empty()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    sync_ctx_locked(lk, c);
    return CUDA_SUCCESS;
}

CUresult cuCtxGetStreamPriorityRange(int* leastPriority, int* greatestPriority) {
    CHECK_INIT();
    if (leastPriority) *leastPriority = 0;
    if (greatestPriority) *greatestPriority = -5;
    return CUDA_SUCCESS;
}

// ---------------------------------------------------------------- memory

CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
    CHECK_INIT();
    if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    Context* c = nullptr;
    if (CUresult r = need_ctx(&c); r != CUDA_SUCCESS) return r;
    if (CUresult r = unsafe_call(); r != CUDA_SUCCESS) return r;
    latency();
    return alloc_mem(c, bytesize, KIND_DEVICE, nullptr, dptr);
}

CUresult cuMemFree_v2(CUdeviceptr dptr) { return free_sync(dptr); }

CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pPitch, size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes) {
    CHECK_INIT();
    if (dptr == nullptr || pPitch == nullptr || WidthInBytes == 0 || Height == 0) return CUDA_ERROR_INVALID_VALUE;
    if (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16) return CUDA_ERROR_INVALID_VALUE;
    Context* c = nullptr;
    if (CUresult r = need_ctx(&c); r != CUDA_SUCCESS) return r;
    if (CUresult r = unsafe_call(); r != CUDA_SUCCESS) return r;
    latency();
    size_t pitch = round_up(WidthInBytes, kPitchAlign);
    CUresult r = alloc_mem(c, pitch * Height, KIND_PITCH, nullptr, dptr);
    if (r == CUDA_SUCCESS) *pPitch = pitch;
    return r;
}

CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
    CHECK_INIT();
    if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST) return CUDA_ERROR_INVALID_VALUE;
    Context* c = nullptr;
    if (CUresult r = need_ctx(&c); r != CUDA_SUCCESS) return r;
    if (CUresult r = unsafe_call(); r != CUDA_SUCCESS) return r;
    latency();
    return alloc_mem(c, bytesize, KIND_MANAGED, nullptr, dptr);
}

CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
    CHECK_INIT();
    Context* c = nullptr;
    if (CUresult r = need_ctx(&c); r != CUDA_SUCCESS) return r;
    std::lock_guard<std::mutex> lk(g_mu);
    const Device& d = g_st->devs[static_cast<size_t>(c->dev)];
    if (free) *free = d.total - d.used;
    if (total) *total = d.total;
    return CUDA_SUCCESS;
}

CUresult cuMemGetInfo(unsigned int* free, unsigned int* total) {
    size_t f = 0, t = 0;
    CUresult r = cuMemGetInfo_v2(&f, &t);
    if (r == CUDA_SUCCESS) {
        if (free) *free = static_cast<unsigned int>(std::min<size_t>(f, 0xffffffffu));
        if (total) *total = static_cast<unsigned int>(std::min<size_t>(t, 0xffffffffu));
    }
    return r;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
    CHECK_INIT();
    Context* c = nullptr;  // as the driver: a thread with no current context is refused
    if (CUresult r = need_ctx(&c); r != CUDA_SUCCESS) return r;
    std::lock_guard<std::mutex> lk(g_mu);
    const Alloc* a = nullptr;
    const Mapping* m = nullptr;
    uintptr_t mbase = 0;
    if (lookup_ptr_locked(static_cast<uintptr_t>(dptr), &a, &mbase, &m) != CUDA_SUCCESS) return CUDA_ERROR_NOT_FOUND;
    if (pbase) *pbase = a ? a->base : mbase;
    if (psize) *psize = a ? a->size : m->size;
    return CUDA_SUCCESS;
}

CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
    CHECK_INIT();
    if (data == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    const Alloc* a = nullptr;
    const Mapping* m = nullptr;
    uintptr_t mbase = 0;
    lookup_ptr_locked(static_cast<uintptr_t>(ptr), &a, &mbase, &m);
    return write_attr(attribute, data, static_cast<uintptr_t>(ptr), a, mbase, m, false);
}

CUresult cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute* attributes, void** data, CUdeviceptr ptr) {
    CHECK_INIT();
    if (attributes == nullptr || data == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    const Alloc* a = nullptr;
    const Mapping* m = nullptr;
    uintptr_t mbase = 0;
    lookup_ptr_locked(static_cast<uintptr_t>(ptr), &a, &mbase, &m);
    for (unsigned i = 0; i < numAttributes; ++i) {
        if (data[i] == nullptr) continue;
        if (CUresult r = write_attr(attributes[i], data[i], static_cast<uintptr_t>(ptr), a, mbase, m, true);
            r != CUDA_SUCCESS)
            return r;
    }
    return CUDA_SUCCESS;
}

// ---------------------------------------------------------------- stream-ordered allocation

CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
    return alloc_async(dptr, bytesize, nullptr, hStream, false);
}
CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
    return alloc_async(dptr, bytesize, nullptr, hStream, true);
}
CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) {
    if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return alloc_async(dptr, bytesize, reinterpret_cast<MemPool*>(pool), hStream, false);
}
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) {
    if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return alloc_async(dptr, bytesize, reinterpret_cast<MemPool*>(pool), hStream, true);
}
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) { return free_async(dptr, hStream, false); }
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) { return free_async(dptr, hStream, true); }

CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool_out, CUdevice dev) {
    CHECK_INIT();
    if (pool_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = check_dev(dev); r != CUDA_SUCCESS) return r;
    *pool_out = reinterpret_cast<CUmemoryPool>(g_st->devs[static_cast<size_t>(dev)].default_pool);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice dev) {
    CHECK_INIT();
    if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = check_dev(dev); r != CUDA_SUCCESS) return r;
    std::lock_guard<std::mutex> lk(g_mu);
    *pool = reinterpret_cast<CUmemoryPool>(g_st->devs[static_cast<size_t>(dev)].current_pool);
    return CUDA_SUCCESS;
}

CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
    CHECK_INIT();
    if (CUresult r = check_dev(dev); r != CUDA_SUCCESS) return r;
    if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    g_st->devs[static_cast<size_t>(dev)].current_pool = reinterpret_cast<MemPool*>(pool);
    return CUDA_SUCCESS;
}

CUresult cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* poolProps) {
    CHECK_INIT();
    if (pool == nullptr || poolProps == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = check_dev(poolProps->location.id); r != CUDA_SUCCESS) return CUDA_ERROR_INVALID_VALUE;
    auto* p = new MemPool;
    p->dev = poolProps->location.id;
    std::lock_guard<std::mutex> lk(g_mu);
    g_st->pools.push_back(p);
    *pool = reinterpret_cast<CUmemoryPool>(p);
    return CUDA_SUCCESS;
}

CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    CHECK_INIT();
    if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;  // the pool object is kept (allocations may still refer to it)
}

CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t) {
    CHECK_INIT();
    return pool ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
    CHECK_INIT();
    if (pool == nullptr || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
    auto* p = reinterpret_cast<MemPool*>(pool);
    std::lock_guard<std::mutex> lk(g_mu);
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        p->attrs[attr] = static_cast<uint64_t>(*static_cast<int*>(value));
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        p->attrs[attr] = *static_cast<cuuint64_t*>(value);
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        if (*static_cast<cuuint64_t*>(value) != 0) return CUDA_ERROR_INVALID_VALUE;
        p->used_high = p->used;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
    CHECK_INIT();
    if (pool == nullptr || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
    auto* p = reinterpret_cast<MemPool*>(pool);
    std::lock_guard<std::mutex> lk(g_mu);
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: {
        auto it = p->attrs.find(attr);
        *static_cast<int*>(value) = it == p->attrs.end() ? 1 : static_cast<int>(it->second);
        return CUDA_SUCCESS;
    }
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: {
        auto it = p->attrs.find(attr);
        *static_cast<cuuint64_t*>(value) = it == p->attrs.end() ? 0 : it->second;
        return CUDA_SUCCESS;
    }
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
        *static_cast<cuuint64_t*>(value) = p->used;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        *static_cast<cuuint64_t*>(value) = p->used_high;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

// ---------------------------------------------------------------- virtual memory management

CUresult cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                       CUmemAllocationGranularity_flags) {
    CHECK_INIT();
    if (granularity == nullptr || prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (no_vmm()) return CUDA_ERROR_NOT_SUPPORTED;
    *granularity = kGranularity;
    return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                     unsigned long long flags) {
    CHECK_INIT();
    g_vmm_calls.fetch_add(1);
    if (handle == nullptr || prop == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (no_vmm() || no_vmm_memory()) return CUDA_ERROR_NOT_SUPPORTED;
    if (size == 0 || size % kGranularity != 0) return CUDA_ERROR_INVALID_VALUE;
    if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (check_dev(prop->location.id) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_DEVICE;
    if ((prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) && no_fd_handles("create"))
        return CUDA_ERROR_NOT_SUPPORTED;
    if (injected_failure()) return CUDA_ERROR_OUT_OF_MEMORY;
    // The device in the name: an importing process reads it back (cuMemImportFromShareableHandle).
    char name[48];
    std::snprintf(name, sizeof name, "cupool-sim-phys-dev%d", prop->location.id);
    int fd = static_cast<int>(syscall(SYS_memfd_create, name, 1u));
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult r = create_phys(fd, size, *prop, handle);
    if (r != CUDA_SUCCESS) close(fd);
    return r;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    CHECK_INIT();
    g_vmm_calls.fetch_add(1);
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_st->phys.find(handle);
    if (it == g_st->phys.end() || it->second.released) return CUDA_ERROR_INVALID_VALUE;
    it->second.released = true;
    maybe_free_phys_locked(handle);
    return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags) {
    CHECK_INIT();
    g_vmm_calls.fetch_add(1);
    if (no_vmm()) return CUDA_ERROR_NOT_SUPPORTED;
    if (ptr == nullptr || size == 0 || size % kGranularity != 0 || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (alignment == 0) alignment = kGranularity;
    if ((alignment & (alignment - 1)) != 0) return CUDA_ERROR_INVALID_VALUE;
    void* p = MAP_FAILED;
    if (addr != 0 && addr % alignment == 0) {
        p = mmap(reinterpret_cast<void*>(addr), size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
        if (p != MAP_FAILED && reinterpret_cast<uintptr_t>(p) != addr) {
            munmap(p, size);
            p = MAP_FAILED;
        }
    }
    if (p == MAP_FAILED) {
        size_t span = size + alignment;
        void* q = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (q == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
        uintptr_t s = reinterpret_cast<uintptr_t>(q);
        uintptr_t a = round_up(s, alignment);
        if (a > s) munmap(q, a - s);
        uintptr_t end = s + span;
        if (end > a + size) munmap(reinterpret_cast<void*>(a + size), end - (a + size));
        p = reinterpret_cast<void*>(a);
    }
    std::lock_guard<std::mutex> lk(g_mu);
    g_st->reservations[reinterpret_cast<uintptr_t>(p)] = size;
    *ptr = reinterpret_cast<CUdeviceptr>(p);
    return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    CHECK_INIT();
    g_vmm_calls.fetch_add(1);
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_st->reservations.find(static_cast<uintptr_t>(ptr));
    if (it == g_st->reservations.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
    auto mt = g_st->mappings.lower_bound(static_cast<uintptr_t>(ptr));
    if (mt != g_st->mappings.end() && mt->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;  // still mapped
    munmap(reinterpret_cast<void*>(ptr), size);
    g_st->reservations.erase(it);
    return CUDA_SUCCESS;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, unsigned long long flags) {
    CHECK_INIT();
    g_vmm_calls.fetch_add(1);
    if (flags != 0 || size == 0 || size % kGranularity != 0 || ptr % kGranularity != 0 || offset % kGranularity != 0)
        return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    auto pt = g_st->phys.find(handle);
    if (pt == g_st->phys.end() || pt->second.released) return CUDA_ERROR_INVALID_HANDLE;
    if (offset + size > pt->second.size) return CUDA_ERROR_INVALID_VALUE;
    // must lie inside one reservation, and not overlap another mapping
    auto rt = g_st->reservations.upper_bound(static_cast<uintptr_t>(ptr));
    if (rt == g_st->reservations.begin()) return CUDA_ERROR_INVALID_VALUE;
    --rt;
    if (ptr < rt->first || ptr + size > rt->first + rt->second) return CUDA_ERROR_INVALID_VALUE;
    auto mt = g_st->mappings.lower_bound(static_cast<uintptr_t>(ptr));
    if (mt != g_st->mappings.end() && mt->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;
    if (mt != g_st->mappings.begin()) {
        auto pv = std::prev(mt);
        if (pv->first + pv->second.size > ptr) return CUDA_ERROR_INVALID_VALUE;
    }
    void* p = mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE, MAP_SHARED | MAP_FIXED, pt->second.fd,
                   static_cast<off_t>(offset));
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    g_st->mappings[static_cast<uintptr_t>(ptr)] = Mapping{size, handle, offset, 0};
    pt->second.maps++;
    return CUDA_SUCCESS;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    CHECK_INIT();
    g_vmm_calls.fetch_add(1);
    std::lock_guard<std::mutex> lk(g_mu);
    // [ptr, ptr+size) must be exactly covered by whole mappings
    auto it = g_st->mappings.find(static_cast<uintptr_t>(ptr));
    if (it == g_st->mappings.end()) return CUDA_ERROR_INVALID_VALUE;
    uintptr_t end = ptr + size;
    uintptr_t cur = ptr;
    auto jt = it;
    while (cur < end) {
        if (jt == g_st->mappings.end() || jt->first != cur) return CUDA_ERROR_INVALID_VALUE;
        cur += jt->second.size;
        ++jt;
    }
    if (cur != end) return CUDA_ERROR_INVALID_VALUE;
    mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    std::vector<CUmemGenericAllocationHandle> hs;
    for (auto kt = it; kt != jt;) {
        hs.push_back(kt->second.handle);
        kt = g_st->mappings.erase(kt);
    }
    for (auto h : hs) {
        auto pt = g_st->phys.find(h);
        if (pt != g_st->phys.end()) pt->second.maps--;
        maybe_free_phys_locked(h);
    }
    return CUDA_SUCCESS;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
    CHECK_INIT();
    g_vmm_calls.fetch_add(1);
    if (desc == nullptr || count == 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
    unsigned long long fl = CU_MEM_ACCESS_FLAGS_PROT_NONE;
    for (size_t i = 0; i < count; ++i) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || check_dev(desc[i].location.id) != CUDA_SUCCESS)
            return CUDA_ERROR_INVALID_DEVICE;
        fl |= desc[i].flags;
    }
    std::lock_guard<std::mutex> lk(g_mu);
    uintptr_t end = ptr + size, cur = ptr;
    auto it = g_st->mappings.find(static_cast<uintptr_t>(ptr));
    if (it == g_st->mappings.end()) return CUDA_ERROR_INVALID_VALUE;
    for (auto jt = it; cur < end; ++jt) {
        if (jt == g_st->mappings.end() || jt->first != cur) return CUDA_ERROR_INVALID_VALUE;
        cur += jt->second.size;
    }
    if (cur != end) return CUDA_ERROR_INVALID_VALUE;
    int prot = PROT_NONE;
    if (fl & CU_MEM_ACCESS_FLAGS_PROT_READ) prot |= PROT_READ;
    if ((fl & CU_MEM_ACCESS_FLAGS_PROT_READWRITE) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) prot |= PROT_WRITE;
    if (mprotect(reinterpret_cast<void*>(ptr), size, prot) != 0) return CUDA_ERROR_INVALID_VALUE;
    for (auto jt = it; jt != g_st->mappings.end() && jt->first < end; ++jt) {
        jt->second.access = fl;
        for (size_t i = 0; i < count; ++i) {
            const unsigned long long bit = 1ull << desc[i].location.id;
            if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_NONE) jt->second.access_devices &= ~bit;
            else jt->second.access_devices |= bit;
        }
    }
    return CUDA_SUCCESS;
}

CUresult cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location, CUdeviceptr ptr) {
    CHECK_INIT();
    if (flags == nullptr || location == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    auto mt = find_mapping_locked(static_cast<uintptr_t>(ptr));
    if (mt == g_st->mappings.end()) return CUDA_ERROR_INVALID_VALUE;
    if (location->type != CU_MEM_LOCATION_TYPE_DEVICE || check_dev(location->id) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_DEVICE;
    // Per device, as the driver answers: the devices a cuMemSetAccess named have its flags.
    *flags = (mt->second.access_devices >> location->id & 1) ? mt->second.access : static_cast<unsigned long long>(CU_MEM_ACCESS_FLAGS_PROT_NONE);
    return CUDA_SUCCESS;
}

CUresult cuMemExportToShareableHandle(void* shareableHandle, CUmemGenericAllocationHandle handle,
                                      CUmemAllocationHandleType handleType, unsigned long long flags) {
    CHECK_INIT();
    if (shareableHandle == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_st->phys.find(handle);
    if (it == g_st->phys.end()) return CUDA_ERROR_INVALID_VALUE;
    // As the driver: only memory created asking for that handle type can be exported.
    if (!(it->second.prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) return CUDA_ERROR_INVALID_VALUE;
    int fd = fcntl(it->second.fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    *static_cast<int*>(shareableHandle) = fd;
    return CUDA_SUCCESS;
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* osHandle,
                                        CUmemAllocationHandleType shHandleType) {
    CHECK_INIT();
    if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
    // As the real driver, the fd is passed by value in the pointer argument.
    int src = static_cast<int>(reinterpret_cast<uintptr_t>(osHandle));
    struct stat st{};
    if (fstat(src, &st) != 0 || st.st_size <= 0) return CUDA_ERROR_INVALID_VALUE;
    int fd = fcntl(src, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return CUDA_ERROR_INVALID_VALUE;
    // The exporter's device, from the memory's name (cuMemCreate writes it there); 0 if absent.
    int dev = 0;
    char link[64], target[256];
    std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    const ssize_t n = readlink(link, target, sizeof target - 1);
    if (n > 0) {
        target[n] = 0;
        if (const char* d = std::strstr(target, "-dev")) dev = std::atoi(d + 4);
    }
    if (check_dev(dev) != CUDA_SUCCESS) dev = 0;
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    std::lock_guard<std::mutex> lk(g_mu);
    Phys ph;
    ph.fd = fd;
    ph.size = static_cast<size_t>(st.st_size);
    ph.dev = dev;
    ph.prop = prop;
    ph.charged = false;  // imported memory belongs to the exporter
    CUmemGenericAllocationHandle h = g_st->next_handle++;
    g_st->phys[h] = ph;
    *handle = h;
    return CUDA_SUCCESS;
}

CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle) {
    CHECK_INIT();
    if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_st->phys.find(handle);
    if (it == g_st->phys.end()) return CUDA_ERROR_INVALID_VALUE;
    *prop = it->second.prop;
    return CUDA_SUCCESS;
}

CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
    CHECK_INIT();
    if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    auto mt = find_mapping_locked(reinterpret_cast<uintptr_t>(addr));
    if (mt == g_st->mappings.end()) return CUDA_ERROR_INVALID_VALUE;
    *handle = mt->second.handle;
    return CUDA_SUCCESS;  // the sim does not count the extra reference
}

// Test hook (not a CUDA function): how many VMM calls (cuMemCreate, cuMemRelease, cuMemAddressReserve,
// cuMemAddressFree, cuMemMap, cuMemUnmap, cuMemSetAccess) reached the simulated driver.
__attribute__((visibility("default"))) unsigned long long cupoolSimVmmCalls(void) { return g_vmm_calls.load(); }

// Test hook (not a CUDA function): device `ordinal`'s memory as the whole device sees it, what the
// simulated NVML (libnvml_sim.cpp) reports. Works before cuInit, as NVML needs no CUDA. 0, or -1
// when there is no such device.
__attribute__((visibility("default"))) int cupoolSimDeviceMemory(int ordinal, unsigned long long* total,
                                                                 unsigned long long* used) {
    std::call_once(g_init_once, do_init);
    std::lock_guard<std::mutex> lk(g_mu);
    if (ordinal < 0 || static_cast<size_t>(ordinal) >= g_st->devs.size()) return -1;
    const Device& d = g_st->devs[static_cast<size_t>(ordinal)];
    *total = d.total;
    *used = d.used;
    return 0;
}

// ---------------------------------------------------------------- streams

CUresult cuStreamCreateWithPriority(CUstream* phStream, unsigned int flags, int priority) {
    CHECK_INIT();
    if (phStream == nullptr || (flags & ~static_cast<unsigned>(CU_STREAM_NON_BLOCKING)) != 0) return CUDA_ERROR_INVALID_VALUE;
    Context* c = nullptr;
    if (CUresult r = need_ctx(&c); r != CUDA_SUCCESS) return r;
    std::lock_guard<std::mutex> lk(g_mu);
    auto s = new_stream_locked(c, flags, std::clamp(priority, -5, 0), false, false);
    g_st->streams[s.get()] = s;
    *phStream = reinterpret_cast<CUstream>(s.get());
    return CUDA_SUCCESS;
}

CUresult cuStreamCreate(CUstream* phStream, unsigned int Flags) { return cuStreamCreateWithPriority(phStream, Flags, 0); }

CUresult cuStreamDestroy_v2(CUstream hStream) {
    CHECK_INIT();
    if (hStream == nullptr || hStream == CU_STREAM_LEGACY || hStream == CU_STREAM_PER_THREAD) return CUDA_ERROR_INVALID_HANDLE;
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_st->streams.find(hStream);
    if (it == g_st->streams.end()) return CUDA_ERROR_INVALID_HANDLE;
    stream_leaves_capture_locked(it->second);
    // As the real driver: returns at once; queued work still runs, then the stream goes away (the
    // legacy stream still waits for a destroyed blocking stream's work, cuMemFree for any).
    it->second->destroyed = true;
    g_st->streams.erase(it);
    g_cv.notify_all();
    return CUDA_SUCCESS;
}
CUresult cuStreamDestroy(CUstream hStream) { return cuStreamDestroy_v2(hStream); }

CUresult cuStreamSynchronize(CUstream hStream) { return stream_sync(hStream, false); }
CUresult cuStreamSynchronize_ptsz(CUstream hStream) { return stream_sync(hStream, true); }
CUresult cuStreamQuery(CUstream hStream) { return stream_query(hStream, false); }
CUresult cuStreamQuery_ptsz(CUstream hStream) { return stream_query(hStream, true); }
CUresult cuStreamGetFlags(CUstream hStream, unsigned int* flags) { return stream_flags(hStream, flags, false); }
CUresult cuStreamGetFlags_ptsz(CUstream hStream, unsigned int* flags) { return stream_flags(hStream, flags, true); }
CUresult cuStreamGetPriority(CUstream hStream, int* priority) { return stream_priority(hStream, priority, false); }
CUresult cuStreamGetPriority_ptsz(CUstream hStream, int* priority) { return stream_priority(hStream, priority, true); }
CUresult cuStreamGetCtx(CUstream hStream, CUcontext* pctx) { return stream_ctx(hStream, pctx, false); }
CUresult cuStreamGetCtx_ptsz(CUstream hStream, CUcontext* pctx) { return stream_ctx(hStream, pctx, true); }
CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void* userData) { return host_func(hStream, fn, userData, false); }
CUresult cuLaunchHostFunc_ptsz(CUstream hStream, CUhostFn fn, void* userData) { return host_func(hStream, fn, userData, true); }
CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
    return stream_wait_event(hStream, hEvent, Flags, false);
}
CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags) {
    return stream_wait_event(hStream, hEvent, Flags, true);
}

// ---------------------------------------------------------------- events

CUresult cuEventCreate(CUevent* phEvent, unsigned int Flags) {
    CHECK_INIT();
    if (phEvent == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Context* c = nullptr;
    if (CUresult r = need_ctx(&c); r != CUDA_SUCCESS) return r;
    auto e = std::make_shared<Event>();
    e->flags = Flags;
    std::lock_guard<std::mutex> lk(g_mu);
    g_st->events[e.get()] = e;
    *phEvent = reinterpret_cast<CUevent>(e.get());
    return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent hEvent, CUstream hStream) { return event_record(hEvent, hStream, false); }
CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream) { return event_record(hEvent, hStream, true); }

CUresult cuEventQuery(CUevent hEvent) {
    CHECK_INIT();
    std::lock_guard<std::mutex> lk(g_mu);
    if (CUresult r = unsafe_locked(); r != CUDA_SUCCESS) return r;
    auto it = g_st->events.find(hEvent);
    if (it == g_st->events.end()) return CUDA_ERROR_INVALID_HANDLE;
    Event& e = *it->second;
    if (captured_event_locked(e)) return CUDA_ERROR_CAPTURED_EVENT;
    if (!e.recorded || !e.s) return CUDA_SUCCESS;
    return e.s->completed >= e.seq ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuEventSynchronize(CUevent hEvent) {
    CHECK_INIT();
    std::unique_lock<std::mutex> lk(g_mu);
    if (CUresult r = unsafe_locked(); r != CUDA_SUCCESS) return r;
    auto it = g_st->events.find(hEvent);
    if (it == g_st->events.end()) return CUDA_ERROR_INVALID_HANDLE;
    std::shared_ptr<Event> e = it->second;
    if (captured_event_locked(*e)) return CUDA_ERROR_CAPTURED_EVENT;
    if (!e->recorded || !e->s) return CUDA_SUCCESS;
    wait_seq_locked(lk, e->s, e->seq);
    return CUDA_SUCCESS;
}

CUresult cuEventDestroy_v2(CUevent hEvent) {
    CHECK_INIT();
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_st->events.find(hEvent);
    if (it == g_st->events.end()) return CUDA_ERROR_INVALID_HANDLE;
    g_st->events.erase(it);
    return CUDA_SUCCESS;
}
CUresult cuEventDestroy(CUevent hEvent) { return cuEventDestroy_v2(hEvent); }

CUresult cuEventElapsedTime_v2(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
    CHECK_INIT();
    if (pMilliseconds == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    auto a = g_st->events.find(hStart), b = g_st->events.find(hEnd);
    if (a == g_st->events.end() || b == g_st->events.end()) return CUDA_ERROR_INVALID_HANDLE;
    if ((a->second->flags | b->second->flags) & CU_EVENT_DISABLE_TIMING) return CUDA_ERROR_INVALID_HANDLE;
    if (!a->second->recorded || !b->second->recorded) return CUDA_ERROR_INVALID_HANDLE;
    if (!a->second->have_time || !b->second->have_time) return CUDA_ERROR_NOT_READY;
    *pMilliseconds = std::chrono::duration<float, std::milli>(b->second->t - a->second->t).count();
    return CUDA_SUCCESS;
}
CUresult cuEventElapsedTime(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
    return cuEventElapsedTime_v2(pMilliseconds, hStart, hEnd);
}

// ---------------------------------------------------------------- copies and sets

#define SIM_COPY_PAIR(NAME, SYNC_SUFFIX_PTDS, DSTT, SRCT, CHECK)                                      \
    CUresult NAME(DSTT dst, SRCT src, size_t n) {                                                    \
        CHECK_INIT();                                                                                 \
        CHECK;                                                                                        \
        return memcpy_impl(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n, nullptr, false, true); \
    }                                                                                                 \
    CUresult SYNC_SUFFIX_PTDS(DSTT dst, SRCT src, size_t n) {                                        \
        CHECK_INIT();                                                                                 \
        CHECK;                                                                                        \
        return memcpy_impl(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n, nullptr, true, true); \
    }

SIM_COPY_PAIR(cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds, CUdeviceptr, const void*,
              if (CUresult r = check_dev_range(dst, n); r != CUDA_SUCCESS) return r)
SIM_COPY_PAIR(cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds, void*, CUdeviceptr,
              if (CUresult r = check_dev_range(src, n); r != CUDA_SUCCESS) return r)
SIM_COPY_PAIR(cuMemcpyDtoD_v2, cuMemcpyDtoD_v2_ptds, CUdeviceptr, CUdeviceptr,
              if (CUresult r = check_dev_range(dst, n); r != CUDA_SUCCESS) return r;
              if (CUresult r = check_dev_range(src, n); r != CUDA_SUCCESS) return r)
SIM_COPY_PAIR(cuMemcpy, cuMemcpy_ptds, CUdeviceptr, CUdeviceptr, (void)0)
#undef SIM_COPY_PAIR

#define SIM_COPY_ASYNC_PAIR(NAME, PTSZ, DSTT, SRCT, CHECK)                                             \
    CUresult NAME(DSTT dst, SRCT src, size_t n, CUstream h) {                                        \
        CHECK_INIT();                                                                                 \
        CHECK;                                                                                        \
        return memcpy_impl(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n, h, false, false); \
    }                                                                                                 \
    CUresult PTSZ(DSTT dst, SRCT src, size_t n, CUstream h) {                                        \
        CHECK_INIT();                                                                                 \
        CHECK;                                                                                        \
        return memcpy_impl(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n, h, true, false); \
    }

SIM_COPY_ASYNC_PAIR(cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_ptsz, CUdeviceptr, const void*,
                    if (CUresult r = check_dev_range(dst, n); r != CUDA_SUCCESS) return r)
SIM_COPY_ASYNC_PAIR(cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz, void*, CUdeviceptr,
                    if (CUresult r = check_dev_range(src, n); r != CUDA_SUCCESS) return r)
SIM_COPY_ASYNC_PAIR(cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2_ptsz, CUdeviceptr, CUdeviceptr,
                    if (CUresult r = check_dev_range(dst, n); r != CUDA_SUCCESS) return r;
                    if (CUresult r = check_dev_range(src, n); r != CUDA_SUCCESS) return r)
SIM_COPY_ASYNC_PAIR(cuMemcpyAsync, cuMemcpyAsync_ptsz, CUdeviceptr, CUdeviceptr, (void)0)
#undef SIM_COPY_ASYNC_PAIR

CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char uc, size_t N) { return memset_impl(d, uc, N, nullptr, false, true); }
CUresult cuMemsetD8_v2_ptds(CUdeviceptr d, unsigned char uc, size_t N) { return memset_impl(d, uc, N, nullptr, true, true); }
CUresult cuMemsetD32_v2(CUdeviceptr d, unsigned int ui, size_t N) { return memset_impl(d, ui, N, nullptr, false, true); }
CUresult cuMemsetD32_v2_ptds(CUdeviceptr d, unsigned int ui, size_t N) { return memset_impl(d, ui, N, nullptr, true, true); }
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char uc, size_t N, CUstream h) { return memset_impl(d, uc, N, h, false, false); }
CUresult cuMemsetD8Async_ptsz(CUdeviceptr d, unsigned char uc, size_t N, CUstream h) { return memset_impl(d, uc, N, h, true, false); }
CUresult cuMemsetD32Async(CUdeviceptr d, unsigned int ui, size_t N, CUstream h) { return memset_impl(d, ui, N, h, false, false); }
CUresult cuMemsetD32Async_ptsz(CUdeviceptr d, unsigned int ui, size_t N, CUstream h) { return memset_impl(d, ui, N, h, true, false); }

// ---------------------------------------------------------------- page-locked host memory

CUresult cuMemHostAlloc(void** pp, size_t bytesize, unsigned int Flags) {
    CHECK_INIT();
    (void)Flags;
    if (pp == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    Context* c = nullptr;
    if (CUresult r = need_ctx(&c); r != CUDA_SUCCESS) return r;
    size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    size_t ms = round_up(bytesize, page);
    void* p = mmap(nullptr, ms, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    Alloc a;
    a.base = reinterpret_cast<uintptr_t>(p);
    a.size = bytesize;
    a.map_size = ms;
    a.ctx = c;
    a.dev = c->dev;
    a.kind = KIND_HOST;
    std::lock_guard<std::mutex> lk(g_mu);
    a.buffer_id = g_st->next_id++;
    g_st->allocs[a.base] = a;
    *pp = p;
    return CUDA_SUCCESS;
}

CUresult cuMemAllocHost_v2(void** pp, size_t bytesize) { return cuMemHostAlloc(pp, bytesize, 0); }

CUresult cuMemFreeHost(void* p) {
    CHECK_INIT();
    Unmap u{};
    {
        std::unique_lock<std::mutex> lk(g_mu);
        auto it = g_st->allocs.find(reinterpret_cast<uintptr_t>(p));
        if (it == g_st->allocs.end() || it->second.kind != KIND_HOST) return CUDA_ERROR_INVALID_VALUE;
        sync_ctx_locked(lk, it->second.ctx);  // as cudaFreeHost, an implicit synchronization
        it = g_st->allocs.find(reinterpret_cast<uintptr_t>(p));
        if (it == g_st->allocs.end()) return CUDA_ERROR_INVALID_VALUE;
        u = erase_alloc_locked(it);
    }
    do_unmap(u);
    return CUDA_SUCCESS;
}

CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* pdptr, void* p, unsigned int Flags) {
    CHECK_INIT();
    if (pdptr == nullptr || Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = find_alloc_locked(reinterpret_cast<uintptr_t>(p));
    if (it == g_st->allocs.end() || it->second.kind != KIND_HOST) return CUDA_ERROR_INVALID_VALUE;
    *pdptr = reinterpret_cast<CUdeviceptr>(p);
    return CUDA_SUCCESS;
}

// ---------------------------------------------------------------- IPC

CUresult cuIpcGetMemHandle(CUipcMemHandle* pHandle, CUdeviceptr dptr) {
    CHECK_INIT();
    if (pHandle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = find_alloc_locked(static_cast<uintptr_t>(dptr));
    if (it == g_st->allocs.end()) return CUDA_ERROR_INVALID_VALUE;
    const Alloc& a = it->second;
    if (a.kind != KIND_DEVICE && a.kind != KIND_PITCH) return CUDA_ERROR_INVALID_VALUE;
    IpcHandle h{};
    h.magic = kIpcMagic;
    h.pid = getpid();
    h.fd = a.fd;
    h.device = a.dev;
    h.offset = 0;  // as the H200's driver: any address inside gives the allocation's handle
    h.size = a.map_size;
    h.base = a.base;
    h.buffer_id = a.buffer_id;
    std::memset(pHandle, 0, sizeof *pHandle);
    std::memcpy(pHandle->reserved, &h, sizeof h);
    if (std::getenv("CUPOOL_SIM_IPC_HANDLE_TAIL")) pHandle->reserved[60] = 1;  // not read on open
    return CUDA_SUCCESS;
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int Flags) {
    return ipc_open(pdptr, handle, Flags);
}
CUresult cuIpcOpenMemHandle(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int Flags) {
    return ipc_open(pdptr, handle, Flags);
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
    CHECK_INIT();
    Unmap u{};
    {
        std::lock_guard<std::mutex> lk(g_mu);
        auto it = find_alloc_locked(static_cast<uintptr_t>(dptr));
        // As the driver: the address the open returned, not one inside it.
        if (it == g_st->allocs.end() || it->second.kind != KIND_IPC || it->first != static_cast<uintptr_t>(dptr))
            return CUDA_ERROR_INVALID_VALUE;
        if (--it->second.ipc_opens > 0) return CUDA_SUCCESS;
        u = erase_alloc_locked(it);
    }
    do_unmap(u);
    return CUDA_SUCCESS;
}

// ---------------------------------------------------------------- stream capture

CUresult cuStreamBeginCapture(CUstream hStream) {  // v1: no mode argument, global
    return begin_capture(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL, false, nullptr, nullptr, 0);
}
CUresult cuStreamBeginCapture_ptsz(CUstream hStream) {
    return begin_capture(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL, true, nullptr, nullptr, 0);
}
CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
    return begin_capture(hStream, mode, false, nullptr, nullptr, 0);
}
CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode) {
    return begin_capture(hStream, mode, true, nullptr, nullptr, 0);
}
CUresult cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph, const CUgraphNode* dependencies,
                                     const CUgraphEdgeData*, size_t numDependencies, CUstreamCaptureMode mode) {
    if (hGraph == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return begin_capture(hStream, mode, false, hGraph, dependencies, numDependencies);
}
CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph, const CUgraphNode* dependencies,
                                          const CUgraphEdgeData*, size_t numDependencies, CUstreamCaptureMode mode) {
    if (hGraph == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return begin_capture(hStream, mode, true, hGraph, dependencies, numDependencies);
}
CUresult cuStreamEndCapture(CUstream hStream, CUgraph* phGraph) { return end_capture(hStream, phGraph, false); }
CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph* phGraph) { return end_capture(hStream, phGraph, true); }
CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus* captureStatus) {
    return capture_info(hStream, false, captureStatus, nullptr, nullptr, nullptr, nullptr, nullptr);
}
CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus* captureStatus) {
    return capture_info(hStream, true, captureStatus, nullptr, nullptr, nullptr, nullptr, nullptr);
}
CUresult cuStreamGetCaptureInfo(CUstream hStream, CUstreamCaptureStatus* captureStatus_out, cuuint64_t* id_out) {
    return capture_info(hStream, false, captureStatus_out, id_out, nullptr, nullptr, nullptr, nullptr);
}
CUresult cuStreamGetCaptureInfo_ptsz(CUstream hStream, CUstreamCaptureStatus* captureStatus_out, cuuint64_t* id_out) {
    return capture_info(hStream, true, captureStatus_out, id_out, nullptr, nullptr, nullptr, nullptr);
}
CUresult cuStreamGetCaptureInfo_v2(CUstream hStream, CUstreamCaptureStatus* captureStatus_out, cuuint64_t* id_out,
                                   CUgraph* graph_out, const CUgraphNode** dependencies_out,
                                   size_t* numDependencies_out) {
    return capture_info(hStream, false, captureStatus_out, id_out, graph_out, dependencies_out, nullptr,
                        numDependencies_out);
}
CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream hStream, CUstreamCaptureStatus* captureStatus_out, cuuint64_t* id_out,
                                        CUgraph* graph_out, const CUgraphNode** dependencies_out,
                                        size_t* numDependencies_out) {
    return capture_info(hStream, true, captureStatus_out, id_out, graph_out, dependencies_out, nullptr,
                        numDependencies_out);
}
CUresult cuStreamGetCaptureInfo_v3(CUstream hStream, CUstreamCaptureStatus* captureStatus_out, cuuint64_t* id_out,
                                   CUgraph* graph_out, const CUgraphNode** dependencies_out,
                                   const CUgraphEdgeData** edgeData_out, size_t* numDependencies_out) {
    if (edgeData_out && !dependencies_out) return CUDA_ERROR_INVALID_VALUE;
    return capture_info(hStream, false, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,
                        numDependencies_out);
}
CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream hStream, CUstreamCaptureStatus* captureStatus_out,
                                        cuuint64_t* id_out, CUgraph* graph_out,
                                        const CUgraphNode** dependencies_out, const CUgraphEdgeData** edgeData_out,
                                        size_t* numDependencies_out) {
    if (edgeData_out && !dependencies_out) return CUDA_ERROR_INVALID_VALUE;
    return capture_info(hStream, true, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,
                        numDependencies_out);
}

CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
    CHECK_INIT();
    if (mode == nullptr || !valid_mode(*mode)) return CUDA_ERROR_INVALID_VALUE;
    std::swap(*mode, tl_capture_mode);
    return CUDA_SUCCESS;
}

// ---------------------------------------------------------------- graphs

CUresult cuGraphCreate(CUgraph* phGraph, unsigned int flags) {
    CHECK_INIT();
    if (phGraph == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    *phGraph = reinterpret_cast<CUgraph>(new_graph_locked());
    return CUDA_SUCCESS;
}

CUresult cuGraphDestroy(CUgraph hGraph) {
    CHECK_INIT();
    std::lock_guard<std::mutex> lk(g_mu);
    Graph* g = find_graph_locked(hGraph);
    if (g == nullptr || g->capture) return CUDA_ERROR_INVALID_VALUE;
    destroy_graph_locked(g);  // executable graphs made from it live on
    return CUDA_SUCCESS;
}

CUresult cuGraphGetNodes(CUgraph hGraph, CUgraphNode* nodes, size_t* numNodes) {
    CHECK_INIT();
    if (numNodes == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    Graph* g = find_graph_locked(hGraph);
    if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (nodes == nullptr) {
        *numNodes = g->nodes.size();
        return CUDA_SUCCESS;
    }
    size_t n = std::min(*numNodes, g->nodes.size());
    for (size_t i = 0; i < *numNodes; ++i) nodes[i] = i < n ? reinterpret_cast<CUgraphNode>(g->nodes[i].get()) : nullptr;
    *numNodes = n;
    return CUDA_SUCCESS;
}

CUresult cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType* type) {
    CHECK_INIT();
    if (type == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_st->nodes.find(hNode);
    if (it == g_st->nodes.end()) return CUDA_ERROR_INVALID_VALUE;
    *type = it->second->type;
    return CUDA_SUCCESS;
}

CUresult cuGraphAddHostNode(CUgraphNode* phGraphNode, CUgraph hGraph, const CUgraphNode* dependencies,
                            size_t numDependencies, const CUDA_HOST_NODE_PARAMS* nodeParams) {
    CHECK_INIT();
    if (phGraphNode == nullptr || nodeParams == nullptr || nodeParams->fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    Graph* g = find_graph_locked(hGraph);
    std::vector<Node*> deps;
    if (g == nullptr || !nodes_of_locked(g, dependencies, numDependencies, &deps)) return CUDA_ERROR_INVALID_VALUE;
    CUhostFn fn = nodeParams->fn;
    void* user = nodeParams->userData;
    *phGraphNode = reinterpret_cast<CUgraphNode>(
        add_node_locked(g, CU_GRAPH_NODE_TYPE_HOST, [fn, user] { fn(user); }, std::move(deps)));
    return CUDA_SUCCESS;
}

CUresult cuGraphAddMemAllocNode(CUgraphNode* phGraphNode, CUgraph hGraph, const CUgraphNode* dependencies,
                                size_t numDependencies, CUDA_MEM_ALLOC_NODE_PARAMS* nodeParams) {
    CHECK_INIT();
    if (phGraphNode == nullptr || nodeParams == nullptr || nodeParams->bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    const CUmemPoolProps& pp = nodeParams->poolProps;
    if (pp.allocType != CU_MEM_ALLOCATION_TYPE_PINNED || pp.location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        check_dev(pp.location.id) != CUDA_SUCCESS || pp.handleTypes != CU_MEM_HANDLE_TYPE_NONE ||
        nodeParams->accessDescCount > g_st->devs.size() || (nodeParams->accessDescCount && !nodeParams->accessDescs))
        return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    Graph* g = find_graph_locked(hGraph);
    std::vector<Node*> deps;
    if (g == nullptr || !nodes_of_locked(g, dependencies, numDependencies, &deps)) return CUDA_ERROR_INVALID_VALUE;
    Node* n = add_alloc_node_locked(g, std::move(deps), nodeParams->bytesize, pp.location.id);
    if (n == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
    n->alloc_params.poolProps = pp;
    n->access.assign(nodeParams->accessDescs, nodeParams->accessDescs + nodeParams->accessDescCount);
    n->alloc_params.accessDescs = n->access.empty() ? nullptr : n->access.data();
    n->alloc_params.accessDescCount = n->access.size();
    nodeParams->dptr = n->alloc_params.dptr;
    *phGraphNode = reinterpret_cast<CUgraphNode>(n);
    return CUDA_SUCCESS;
}

CUresult cuGraphMemAllocNodeGetParams(CUgraphNode hNode, CUDA_MEM_ALLOC_NODE_PARAMS* params_out) {
    CHECK_INIT();
    if (params_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_st->nodes.find(hNode);
    if (it == g_st->nodes.end() || it->second->type != CU_GRAPH_NODE_TYPE_MEM_ALLOC) return CUDA_ERROR_INVALID_VALUE;
    *params_out = it->second->alloc_params;
    return CUDA_SUCCESS;
}

CUresult cuGraphAddMemFreeNode(CUgraphNode* phGraphNode, CUgraph hGraph, const CUgraphNode* dependencies,
                               size_t numDependencies, CUdeviceptr dptr) {
    CHECK_INIT();
    if (phGraphNode == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    Graph* g = find_graph_locked(hGraph);
    std::vector<Node*> deps;
    if (g == nullptr || !nodes_of_locked(g, dependencies, numDependencies, &deps)) return CUDA_ERROR_INVALID_VALUE;
    Node* n = nullptr;
    if (CUresult r = add_free_node_locked(g, std::move(deps), dptr, &n); r != CUDA_SUCCESS) return r;
    *phGraphNode = reinterpret_cast<CUgraphNode>(n);
    return CUDA_SUCCESS;
}

CUresult cuGraphMemFreeNodeGetParams(CUgraphNode hNode, CUdeviceptr* dptr_out) {
    CHECK_INIT();
    if (dptr_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_st->nodes.find(hNode);
    if (it == g_st->nodes.end() || it->second->type != CU_GRAPH_NODE_TYPE_MEM_FREE) return CUDA_ERROR_INVALID_VALUE;
    *dptr_out = static_cast<CUdeviceptr>(it->second->ga->va);
    return CUDA_SUCCESS;
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec* phGraphExec, CUgraph hGraph, unsigned long long flags) {
    return instantiate(phGraphExec, hGraph, flags);
}

// The CUDA 10/11 forms (error node and log buffer).
CUresult cuGraphInstantiate(CUgraphExec* phGraphExec, CUgraph hGraph, CUgraphNode* phErrorNode, char* logBuffer,
                            size_t bufferSize) {
    if (phErrorNode) *phErrorNode = nullptr;
    if (logBuffer && bufferSize) logBuffer[0] = '\0';
    return instantiate(phGraphExec, hGraph, 0);
}
CUresult cuGraphInstantiate_v2(CUgraphExec* phGraphExec, CUgraph hGraph, CUgraphNode* phErrorNode, char* logBuffer,
                               size_t bufferSize) {
    return cuGraphInstantiate(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize);
}

static CUresult instantiate_with_params(CUgraphExec* phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS* p,
                                        bool ptsz) {
    if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
    p->hErrNode_out = nullptr;
    CUresult r = instantiate(phGraphExec, hGraph, p->flags);
    if (r == CUDA_SUCCESS && (p->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD)) {
        r = graph_upload(*phGraphExec, p->hUploadStream, ptsz);
        if (r != CUDA_SUCCESS) exec_destroy(*phGraphExec);
    }
    p->result_out = r == CUDA_SUCCESS ? CUDA_GRAPH_INSTANTIATE_SUCCESS : CUDA_GRAPH_INSTANTIATE_ERROR;
    return r;
}
CUresult cuGraphInstantiateWithParams(CUgraphExec* phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS* p) {
    return instantiate_with_params(phGraphExec, hGraph, p, false);
}
CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec* phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS* p) {
    return instantiate_with_params(phGraphExec, hGraph, p, true);
}

CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) { return exec_destroy(hGraphExec); }
CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) { return graph_launch(hGraphExec, hStream, false); }
CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) { return graph_launch(hGraphExec, hStream, true); }
CUresult cuGraphUpload(CUgraphExec hGraphExec, CUstream hStream) { return graph_upload(hGraphExec, hStream, false); }
CUresult cuGraphUpload_ptsz(CUgraphExec hGraphExec, CUstream hStream) { return graph_upload(hGraphExec, hStream, true); }

// ---------------------------------------------------------------- graph memory

CUresult cuDeviceGraphMemTrim(CUdevice device) {
    CHECK_INIT();
    if (CUresult r = check_dev(device); r != CUDA_SUCCESS) return r;
    std::lock_guard<std::mutex> lk(g_mu);
    Device& d = g_st->devs[static_cast<size_t>(device)];
    // Memory of allocations that are neither live nor in a graph that is running goes back.
    for (size_t i = 0; i < d.gp_mapped.size();) {
        GraphAlloc* ga = d.gp_mapped[i];
        if (ga->live || exec_running_locked(ga->exec)) {
            ++i;
            continue;
        }
        madvise(reinterpret_cast<void*>(ga->va), ga->map_size, MADV_DONTNEED);  // contents are gone
        unmap_galloc_locked(ga);
    }
    d.used -= d.gp_reserved - d.gp_used;
    d.gp_reserved = d.gp_used;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void* value) {
    CHECK_INIT();
    if (CUresult r = check_dev(device); r != CUDA_SUCCESS) return r;
    if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    const Device& d = g_st->devs[static_cast<size_t>(device)];
    cuuint64_t v = 0;
    switch (attr) {
    case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT: v = d.gp_used; break;
    case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH: v = d.gp_used_high; break;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: v = d.gp_reserved; break;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH: v = d.gp_reserved_high; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    *static_cast<cuuint64_t*>(value) = v;
    return CUDA_SUCCESS;
}

CUresult cuDeviceSetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void* value) {
    CHECK_INIT();
    if (CUresult r = check_dev(device); r != CUDA_SUCCESS) return r;
    if (value == nullptr || *static_cast<cuuint64_t*>(value) != 0) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    Device& d = g_st->devs[static_cast<size_t>(device)];
    switch (attr) {  // a high watermark can only be reset (to the current value)
    case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH: d.gp_used_high = d.gp_used; return CUDA_SUCCESS;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH: d.gp_reserved_high = d.gp_reserved; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
}

// ---------------------------------------------------------------- arrays (memory is charged, holds no data)

CUresult cuArrayCreate_v2(CUarray* pHandle, const CUDA_ARRAY_DESCRIPTOR* pAllocateArray) {
    CHECK_INIT();
    if (pAllocateArray == nullptr) return CUDA_ERROR_INVALID_VALUE;
    CUDA_ARRAY3D_DESCRIPTOR d{};
    d.Width = pAllocateArray->Width;
    d.Height = pAllocateArray->Height;
    d.Format = pAllocateArray->Format;
    d.NumChannels = pAllocateArray->NumChannels;
    return array_create(pHandle, d);
}

CUresult cuArray3DCreate_v2(CUarray* pHandle, const CUDA_ARRAY3D_DESCRIPTOR* pAllocateArray) {
    CHECK_INIT();
    if (pAllocateArray == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return array_create(pHandle, *pAllocateArray);
}

CUresult cuArrayDestroy(CUarray hArray) {
    CHECK_INIT();
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_st->arrays.find(hArray);
    if (it == g_st->arrays.end()) return CUDA_ERROR_INVALID_HANDLE;
    if (it->second->level) return CUDA_ERROR_INVALID_VALUE;  // owned by its mipmapped array
    g_st->devs[static_cast<size_t>(it->second->dev)].used -= it->second->charged;
    g_st->arrays.erase(it);
    return CUDA_SUCCESS;
}

CUresult cuArrayGetDescriptor_v2(CUDA_ARRAY_DESCRIPTOR* pArrayDescriptor, CUarray hArray) {
    CHECK_INIT();
    if (pArrayDescriptor == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_st->arrays.find(hArray);
    if (it == g_st->arrays.end()) return CUDA_ERROR_INVALID_HANDLE;
    const CUDA_ARRAY3D_DESCRIPTOR& d = it->second->desc;
    pArrayDescriptor->Width = d.Width;
    pArrayDescriptor->Height = d.Height;
    pArrayDescriptor->Format = d.Format;
    pArrayDescriptor->NumChannels = d.NumChannels;
    return CUDA_SUCCESS;
}

CUresult cuArray3DGetDescriptor_v2(CUDA_ARRAY3D_DESCRIPTOR* pArrayDescriptor, CUarray hArray) {
    CHECK_INIT();
    if (pArrayDescriptor == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_st->arrays.find(hArray);
    if (it == g_st->arrays.end()) return CUDA_ERROR_INVALID_HANDLE;
    *pArrayDescriptor = it->second->desc;
    return CUDA_SUCCESS;
}

CUresult cuMipmappedArrayCreate(CUmipmappedArray* pHandle, const CUDA_ARRAY3D_DESCRIPTOR* pMipmappedArrayDesc,
                                unsigned int numMipmapLevels) {
    CHECK_INIT();
    if (pHandle == nullptr || pMipmappedArrayDesc == nullptr || numMipmapLevels == 0) return CUDA_ERROR_INVALID_VALUE;
    Context* c = nullptr;
    if (CUresult r = need_ctx(&c); r != CUDA_SUCCESS) return r;
    const CUDA_ARRAY3D_DESCRIPTOR& d = *pMipmappedArrayDesc;
    if (CUresult r = check_desc(d); r != CUDA_SUCCESS) return r;
    size_t extent = std::max<size_t>(d.Width, d.Height);
    if (!(d.Flags & CUDA_ARRAY3D_LAYERED)) extent = std::max<size_t>(extent, d.Depth);
    unsigned max_levels = 1;
    while ((extent >> max_levels) > 0) ++max_levels;
    if (numMipmapLevels > max_levels) return CUDA_ERROR_INVALID_VALUE;
    size_t bytes = 0;  // the sum over levels
    for (unsigned l = 0; l < numMipmapLevels; ++l) bytes += level_bytes(level_desc(d, l));
    bytes = unbacked(d) ? 0 : round_up(bytes, kGranularity);
    std::lock_guard<std::mutex> lk(g_mu);
    if (CUresult r = charge_locked(c->dev, bytes); r != CUDA_SUCCESS) return r;
    auto m = std::make_unique<Mipmap>();
    m->desc = d;
    m->levels = numMipmapLevels;
    m->charged = bytes;
    m->dev = c->dev;
    m->ctx = c;
    for (unsigned l = 0; l < numMipmapLevels; ++l) {
        auto a = std::make_unique<Array>();
        a->desc = level_desc(d, l);
        a->dev = c->dev;
        a->ctx = c;
        a->level = true;
        m->level_arrays.push_back(a.get());
        g_st->arrays[a.get()] = std::move(a);
    }
    *pHandle = reinterpret_cast<CUmipmappedArray>(m.get());
    g_st->mipmaps[m.get()] = std::move(m);
    return CUDA_SUCCESS;
}

CUresult cuMipmappedArrayGetLevel(CUarray* pLevelArray, CUmipmappedArray hMipmappedArray, unsigned int level) {
    CHECK_INIT();
    if (pLevelArray == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_st->mipmaps.find(hMipmappedArray);
    if (it == g_st->mipmaps.end()) return CUDA_ERROR_INVALID_HANDLE;
    if (level >= it->second->levels) return CUDA_ERROR_INVALID_VALUE;
    *pLevelArray = reinterpret_cast<CUarray>(it->second->level_arrays[level]);
    return CUDA_SUCCESS;
}

CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray) {
    CHECK_INIT();
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_st->mipmaps.find(hMipmappedArray);
    if (it == g_st->mipmaps.end()) return CUDA_ERROR_INVALID_HANDLE;
    g_st->devs[static_cast<size_t>(it->second->dev)].used -= it->second->charged;
    for (Array* a : it->second->level_arrays) g_st->arrays.erase(a);
    g_st->mipmaps.erase(it);
    return CUDA_SUCCESS;
}

// ---------------------------------------------------------------- errors

CUresult cuGetErrorName(CUresult error, const char** pStr);
CUresult cuGetErrorString(CUresult error, const char** pStr);

}  // extern "C"

namespace {
struct ErrInfo {
    CUresult code;
    const char* name;
    const char* text;
};
constexpr ErrInfo kErrors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
     "operation not permitted when stream is capturing"},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
     "operation failed due to a previous error during capture"},
    {CUDA_ERROR_STREAM_CAPTURE_MERGE, "CUDA_ERROR_STREAM_CAPTURE_MERGE",
     "operation would result in a merge of separate capture sequences"},
    {CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", "capture was not ended in the same stream as it began"},
    {CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED", "capturing stream has unjoined work"},
    {CUDA_ERROR_STREAM_CAPTURE_ISOLATION, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
     "dependency created on uncaptured work in another stream"},
    {CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {CUDA_ERROR_CAPTURED_EVENT, "CUDA_ERROR_CAPTURED_EVENT",
     "operation not permitted on an event last recorded in a capturing stream"},
    {CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
     "attempt to terminate a thread-local capture sequence from another thread"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};
}  // namespace

extern "C" {

CUresult cuGetErrorName(CUresult error, const char** pStr) {
    if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
    for (const auto& e : kErrors)
        if (e.code == error) {
            *pStr = e.name;
            return CUDA_SUCCESS;
        }
    *pStr = nullptr;
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char** pStr) {
    if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
    for (const auto& e : kErrors)
        if (e.code == error) {
            *pStr = e.text;
            return CUDA_SUCCESS;
        }
    *pStr = nullptr;
    return CUDA_ERROR_INVALID_VALUE;
}

// ---------------------------------------------------------------- cuGetProcAddress

CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult* symbolStatus);
CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags);

}  // extern "C"

namespace {

// One row per ABI variant: base name, the CUDA version that introduced it, the legacy-stream entry,
// and the per-thread-default-stream entry (_ptsz/_ptds) where one exists.
struct ProcEntry {
    const char* name;
    int version;
    void* fn;
    void* fn_ptsz;
};

#define P(name, ver, fn) {name, ver, reinterpret_cast<void*>(&fn), nullptr}
#define PT(name, ver, fn, ptsz) {name, ver, reinterpret_cast<void*>(&fn), reinterpret_cast<void*>(&ptsz)}

const ProcEntry kProcTable[] = {
    P("cuInit", 2000, cuInit),
    P("cuDriverGetVersion", 2020, cuDriverGetVersion),
    P("cuGetErrorString", 6000, cuGetErrorString),
    P("cuGetErrorName", 6000, cuGetErrorName),
    P("cuGetProcAddress", 11030, cuGetProcAddress),
    P("cuGetProcAddress", 12000, cuGetProcAddress_v2),
    P("cuDeviceGet", 2000, cuDeviceGet),
    P("cuDeviceGetCount", 2000, cuDeviceGetCount),
    P("cuDeviceGetName", 2000, cuDeviceGetName),
    P("cuDeviceTotalMem", 2000, cuDeviceTotalMem),
    P("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
    P("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute),
    P("cuDeviceGetUuid", 9020, cuDeviceGetUuid),
    P("cuDeviceGetUuid", 11040, cuDeviceGetUuid_v2),
    P("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
    P("cuDevicePrimaryCtxRelease", 7000, cuDevicePrimaryCtxRelease),
    P("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
    P("cuDevicePrimaryCtxReset", 7000, cuDevicePrimaryCtxReset),
    P("cuDevicePrimaryCtxReset", 11000, cuDevicePrimaryCtxReset_v2),
    P("cuDevicePrimaryCtxSetFlags", 7000, cuDevicePrimaryCtxSetFlags),
    P("cuDevicePrimaryCtxSetFlags", 11000, cuDevicePrimaryCtxSetFlags_v2),
    P("cuDevicePrimaryCtxGetState", 7000, cuDevicePrimaryCtxGetState),
    P("cuCtxCreate", 2000, cuCtxCreate),
    P("cuCtxCreate", 3020, cuCtxCreate_v2),
    P("cuCtxCreate", 11040, cuCtxCreate_v3),
    P("cuCtxCreate", 12050, cuCtxCreate_v4),
    P("cuCtxDestroy", 2000, cuCtxDestroy),
    P("cuCtxDestroy", 4000, cuCtxDestroy_v2),
    P("cuCtxEnablePeerAccess", 4000, cuCtxEnablePeerAccess),
    P("cuCtxDisablePeerAccess", 4000, cuCtxDisablePeerAccess),
    P("cuDeviceCanAccessPeer", 4000, cuDeviceCanAccessPeer),
    P("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
    P("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
    P("cuCtxPushCurrent", 2000, cuCtxPushCurrent),
    P("cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2),
    P("cuCtxPopCurrent", 2000, cuCtxPopCurrent),
    P("cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2),
    P("cuCtxGetDevice", 2000, cuCtxGetDevice),
    P("cuCtxGetFlags", 7000, cuCtxGetFlags),
    P("cuCtxGetId", 12000, cuCtxGetId),
    P("cuCtxSynchronize", 2000, cuCtxSynchronize),
    P("cuCtxGetStreamPriorityRange", 5050, cuCtxGetStreamPriorityRange),
    P("cuMemAlloc", 3020, cuMemAlloc_v2),
    P("cuMemFree", 3020, cuMemFree_v2),
    P("cuMemAllocPitch", 3020, cuMemAllocPitch_v2),
    P("cuMemGetInfo", 2000, cuMemGetInfo),
    P("cuMemGetInfo", 3020, cuMemGetInfo_v2),
    P("cuMemGetAddressRange", 3020, cuMemGetAddressRange_v2),
    P("cuMemAllocManaged", 6000, cuMemAllocManaged),
    P("cuMemHostAlloc", 2020, cuMemHostAlloc),
    P("cuMemAllocHost", 3020, cuMemAllocHost_v2),
    P("cuMemFreeHost", 2000, cuMemFreeHost),
    P("cuMemHostGetDevicePointer", 3020, cuMemHostGetDevicePointer_v2),
    P("cuPointerGetAttribute", 4000, cuPointerGetAttribute),
    P("cuPointerGetAttributes", 7000, cuPointerGetAttributes),
    PT("cuMemAllocAsync", 11020, cuMemAllocAsync, cuMemAllocAsync_ptsz),
    PT("cuMemFreeAsync", 11020, cuMemFreeAsync, cuMemFreeAsync_ptsz),
    PT("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz),
    P("cuDeviceGetDefaultMemPool", 11020, cuDeviceGetDefaultMemPool),
    P("cuDeviceGetMemPool", 11020, cuDeviceGetMemPool),
    P("cuDeviceSetMemPool", 11020, cuDeviceSetMemPool),
    P("cuMemPoolCreate", 11020, cuMemPoolCreate),
    P("cuMemPoolDestroy", 11020, cuMemPoolDestroy),
    P("cuMemPoolTrimTo", 11020, cuMemPoolTrimTo),
    P("cuMemPoolSetAttribute", 11020, cuMemPoolSetAttribute),
    P("cuMemPoolGetAttribute", 11020, cuMemPoolGetAttribute),
    P("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity),
    P("cuMemCreate", 10020, cuMemCreate),
    P("cuMemRelease", 10020, cuMemRelease),
    P("cuMemAddressReserve", 10020, cuMemAddressReserve),
    P("cuMemAddressFree", 10020, cuMemAddressFree),
    P("cuMemMap", 10020, cuMemMap),
    P("cuMemUnmap", 10020, cuMemUnmap),
    P("cuMemSetAccess", 10020, cuMemSetAccess),
    P("cuMemGetAccess", 10020, cuMemGetAccess),
    P("cuMemExportToShareableHandle", 10020, cuMemExportToShareableHandle),
    P("cuMemImportFromShareableHandle", 10020, cuMemImportFromShareableHandle),
    P("cuMemGetAllocationPropertiesFromHandle", 10020, cuMemGetAllocationPropertiesFromHandle),
    P("cuMemRetainAllocationHandle", 11000, cuMemRetainAllocationHandle),
    P("cuStreamCreate", 2000, cuStreamCreate),
    P("cuStreamCreateWithPriority", 5050, cuStreamCreateWithPriority),
    P("cuStreamDestroy", 2000, cuStreamDestroy),
    P("cuStreamDestroy", 4000, cuStreamDestroy_v2),
    PT("cuStreamSynchronize", 2000, cuStreamSynchronize, cuStreamSynchronize_ptsz),
    PT("cuStreamQuery", 2000, cuStreamQuery, cuStreamQuery_ptsz),
    PT("cuStreamGetFlags", 5050, cuStreamGetFlags, cuStreamGetFlags_ptsz),
    PT("cuStreamGetPriority", 5050, cuStreamGetPriority, cuStreamGetPriority_ptsz),
    PT("cuStreamGetCtx", 9020, cuStreamGetCtx, cuStreamGetCtx_ptsz),
    PT("cuStreamWaitEvent", 3020, cuStreamWaitEvent, cuStreamWaitEvent_ptsz),
    PT("cuLaunchHostFunc", 10000, cuLaunchHostFunc, cuLaunchHostFunc_ptsz),
    P("cuEventCreate", 2000, cuEventCreate),
    PT("cuEventRecord", 2000, cuEventRecord, cuEventRecord_ptsz),
    P("cuEventQuery", 2000, cuEventQuery),
    P("cuEventSynchronize", 2000, cuEventSynchronize),
    P("cuEventDestroy", 2000, cuEventDestroy),
    P("cuEventDestroy", 4000, cuEventDestroy_v2),
    P("cuEventElapsedTime", 2000, cuEventElapsedTime),
    P("cuEventElapsedTime", 12080, cuEventElapsedTime_v2),
    PT("cuMemcpy", 4000, cuMemcpy, cuMemcpy_ptds),
    PT("cuMemcpyAsync", 4000, cuMemcpyAsync, cuMemcpyAsync_ptsz),
    PT("cuMemcpyHtoD", 3020, cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds),
    PT("cuMemcpyDtoH", 3020, cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds),
    PT("cuMemcpyDtoD", 3020, cuMemcpyDtoD_v2, cuMemcpyDtoD_v2_ptds),
    PT("cuMemcpyHtoDAsync", 3020, cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_ptsz),
    PT("cuMemcpyDtoHAsync", 3020, cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz),
    PT("cuMemcpyDtoDAsync", 3020, cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2_ptsz),
    PT("cuMemsetD8", 3020, cuMemsetD8_v2, cuMemsetD8_v2_ptds),
    PT("cuMemsetD32", 3020, cuMemsetD32_v2, cuMemsetD32_v2_ptds),
    PT("cuMemsetD8Async", 3020, cuMemsetD8Async, cuMemsetD8Async_ptsz),
    PT("cuMemsetD32Async", 3020, cuMemsetD32Async, cuMemsetD32Async_ptsz),
    P("cuIpcGetMemHandle", 4010, cuIpcGetMemHandle),
    P("cuIpcOpenMemHandle", 4010, cuIpcOpenMemHandle),
    P("cuIpcOpenMemHandle", 11000, cuIpcOpenMemHandle_v2),
    P("cuIpcCloseMemHandle", 4010, cuIpcCloseMemHandle),
    PT("cuStreamBeginCapture", 10000, cuStreamBeginCapture, cuStreamBeginCapture_ptsz),
    PT("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2, cuStreamBeginCapture_v2_ptsz),
    PT("cuStreamBeginCaptureToGraph", 12030, cuStreamBeginCaptureToGraph, cuStreamBeginCaptureToGraph_ptsz),
    PT("cuStreamEndCapture", 10000, cuStreamEndCapture, cuStreamEndCapture_ptsz),
    PT("cuStreamIsCapturing", 10000, cuStreamIsCapturing, cuStreamIsCapturing_ptsz),
    PT("cuStreamGetCaptureInfo", 10010, cuStreamGetCaptureInfo, cuStreamGetCaptureInfo_ptsz),
    PT("cuStreamGetCaptureInfo", 11030, cuStreamGetCaptureInfo_v2, cuStreamGetCaptureInfo_v2_ptsz),
    PT("cuStreamGetCaptureInfo", 12030, cuStreamGetCaptureInfo_v3, cuStreamGetCaptureInfo_v3_ptsz),
    P("cuThreadExchangeStreamCaptureMode", 10010, cuThreadExchangeStreamCaptureMode),
    P("cuGraphCreate", 10000, cuGraphCreate),
    P("cuGraphDestroy", 10000, cuGraphDestroy),
    P("cuGraphGetNodes", 10000, cuGraphGetNodes),
    P("cuGraphNodeGetType", 10000, cuGraphNodeGetType),
    P("cuGraphAddHostNode", 10000, cuGraphAddHostNode),
    P("cuGraphAddMemAllocNode", 11040, cuGraphAddMemAllocNode),
    P("cuGraphMemAllocNodeGetParams", 11040, cuGraphMemAllocNodeGetParams),
    P("cuGraphAddMemFreeNode", 11040, cuGraphAddMemFreeNode),
    P("cuGraphMemFreeNodeGetParams", 11040, cuGraphMemFreeNodeGetParams),
    // as cuda.h's #define cuGraphInstantiate cuGraphInstantiateWithFlags from CUDA 12
    P("cuGraphInstantiate", 10000, cuGraphInstantiate),
    P("cuGraphInstantiate", 11000, cuGraphInstantiate_v2),
    P("cuGraphInstantiate", 12000, cuGraphInstantiateWithFlags),
    P("cuGraphInstantiateWithFlags", 11040, cuGraphInstantiateWithFlags),
    PT("cuGraphInstantiateWithParams", 12000, cuGraphInstantiateWithParams, cuGraphInstantiateWithParams_ptsz),
    P("cuGraphExecDestroy", 10000, cuGraphExecDestroy),
    PT("cuGraphLaunch", 10000, cuGraphLaunch, cuGraphLaunch_ptsz),
    PT("cuGraphUpload", 11010, cuGraphUpload, cuGraphUpload_ptsz),
    P("cuDeviceGraphMemTrim", 11040, cuDeviceGraphMemTrim),
    P("cuDeviceGetGraphMemAttribute", 11040, cuDeviceGetGraphMemAttribute),
    P("cuDeviceSetGraphMemAttribute", 11040, cuDeviceSetGraphMemAttribute),
    P("cuArrayCreate", 3020, cuArrayCreate_v2),
    P("cuArray3DCreate", 3020, cuArray3DCreate_v2),
    P("cuArrayDestroy", 2000, cuArrayDestroy),
    P("cuArrayGetDescriptor", 3020, cuArrayGetDescriptor_v2),
    P("cuArray3DGetDescriptor", 3020, cuArray3DGetDescriptor_v2),
    P("cuMipmappedArrayCreate", 5000, cuMipmappedArrayCreate),
    P("cuMipmappedArrayGetLevel", 5000, cuMipmappedArrayGetLevel),
    P("cuMipmappedArrayDestroy", 5000, cuMipmappedArrayDestroy),
};
#undef P
#undef PT

CUresult proc_lookup(const char* symbol, void** pfn, int version, cuuint64_t flags, CUdriverProcAddressQueryResult* st) {
    if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (flags & ~static_cast<cuuint64_t>(CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = nullptr;
    const ProcEntry* best = nullptr;
    bool found = false;
    for (const auto& e : kProcTable) {
        if (std::strcmp(e.name, symbol) != 0) continue;
        found = true;
        if (e.version <= version && (best == nullptr || e.version > best->version)) best = &e;
    }
    if (!found) {
        if (st) *st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    if (best == nullptr) {
        if (st) *st = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
        return CUDA_ERROR_NOT_FOUND;
    }
    bool ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    *pfn = (ptsz && best->fn_ptsz) ? best->fn_ptsz : best->fn;
    if (st) *st = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

}  // namespace

extern "C" {

CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult* symbolStatus) {
    return proc_lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
}

CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
    return proc_lookup(symbol, pfn, cudaVersion, flags, nullptr);
}

}  // extern "C"
