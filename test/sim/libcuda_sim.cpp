// Simulated CUDA driver: a fake libcuda.so.1 for CI machines without a GPU.
//
// Device memory is host memory (memfd-backed MAP_SHARED mappings, so another process can map it for
// IPC), streams are host worker threads, and the driver entry points carry their real ABI names
// (cuMemAlloc_v2, cuMemAllocAsync_ptsz, cuGetProcAddress_v2 ...). cuGetProcAddress(_v2) picks the
// ABI variant by version and per-thread-default-stream flag from one table (kProcTable, at the end).
//
// Environment:
//   CUPOOL_SIM_DEVICES            number of devices (default 1)
//   CUPOOL_SIM_TOTAL_MEM          memory per device, bytes or with suffix KiB/MiB/GiB (default 16GiB)
//   CUPOOL_SIM_ALLOC_LATENCY_US   sleep in cuMemAlloc_v2/cuMemAllocPitch_v2/cuMemAllocManaged/cuMemFree_v2
//   CUPOOL_SIM_FAIL_ALLOC_AFTER   allocations (any kind) after the Nth fail with CUDA_ERROR_OUT_OF_MEMORY
//   CUPOOL_SIM_IPC_HANDLE_TAIL    IPC handles use bytes 56..63 too (as the H200's did for a 42 GB allocation)

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
};

struct Context {
    int dev = 0;
    bool primary = false;
    std::atomic<bool> alive{false};
    int refcount = 0;     // primary only
    unsigned flags = 0;
    std::shared_ptr<Stream> legacy;
    std::vector<std::shared_ptr<Stream>> streams;  // every non-legacy stream, including per-thread ones
    unsigned long long id = 0;
};

struct MemPool {
    int dev = 0;
    std::map<int, uint64_t> attrs;
    uint64_t used = 0, used_high = 0;
};

enum Kind { KIND_DEVICE, KIND_PITCH, KIND_MANAGED, KIND_ASYNC, KIND_IPC, KIND_HOST };

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
};

struct Event {
    unsigned flags = 0;
    std::shared_ptr<Stream> s;
    uint64_t seq = 0;
    uint64_t gen = 0;
    bool recorded = false;
    bool have_time = false;
    std::chrono::steady_clock::time_point t;
};

struct Device {
    uint64_t total = 0;
    uint64_t used = 0;
    Context* primary = nullptr;
    MemPool* default_pool = nullptr;
    MemPool* current_pool = nullptr;
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

struct TlsStreams {
    uint64_t gen = 0;
    std::vector<std::shared_ptr<Stream>> v;
    ~TlsStreams() {
        if (v.empty() || g_poisoned) return;
        std::lock_guard<std::mutex> lk(g_mu);
        for (auto& s : v) s->destroyed = true;
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

// Runs fn in stream order and waits for it (synchronous memcpy/memset).
CUresult run_sync(CUstream h, bool ptds, std::function<void()> fn) {
    std::unique_lock<std::mutex> lk(g_mu);
    std::shared_ptr<Stream> s;
    if (CUresult r = resolve_stream_locked(h, ptds, &s); r != CUDA_SUCCESS) return r;
    uint64_t seq = enqueue_locked(s, std::move(fn));
    wait_seq_locked(lk, s, seq);
    return CUDA_SUCCESS;
}

CUresult run_async(CUstream h, bool ptsz, std::function<void()> fn) {
    std::unique_lock<std::mutex> lk(g_mu);
    std::shared_ptr<Stream> s;
    if (CUresult r = resolve_stream_locked(h, ptsz, &s); r != CUDA_SUCCESS) return r;
    enqueue_locked(s, std::move(fn));
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

Unmap erase_alloc_locked(std::map<uintptr_t, Alloc>::iterator it) {
    Alloc& a = it->second;
    if (a.kind != KIND_IPC && a.kind != KIND_HOST) g_st->devs[static_cast<size_t>(a.dev)].used -= a.accounted;
    if (a.pool) a.pool->used -= a.accounted;
    Unmap u{a.base, a.map_size, a.fd};
    g_st->allocs.erase(it);
    return u;
}

void do_unmap(const Unmap& u) {
    munmap(reinterpret_cast<void*>(u.base), u.size);
    if (u.fd >= 0) close(u.fd);
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

CUresult alloc_async(CUdeviceptr* dptr, size_t bytesize, MemPool* pool, CUstream h, bool ptsz) {
    CHECK_INIT();
    if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    Context* c = nullptr;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        std::shared_ptr<Stream> s;
        if (CUresult r = resolve_stream_locked(h, ptsz, &s); r != CUDA_SUCCESS) return r;
        c = s->ctx;
        if (pool == nullptr) pool = g_st->devs[static_cast<size_t>(c->dev)].current_pool;
    }
    return alloc_mem(c, bytesize, KIND_ASYNC, pool, dptr);
}

CUresult free_async(CUdeviceptr dptr, CUstream h, bool ptsz) {
    CHECK_INIT();
    std::unique_lock<std::mutex> lk(g_mu);
    std::shared_ptr<Stream> s;
    if (CUresult r = resolve_stream_locked(h, ptsz, &s); r != CUDA_SUCCESS) return r;
    auto it = g_st->allocs.find(static_cast<uintptr_t>(dptr));
    if (it == g_st->allocs.end() || it->second.kind == KIND_IPC || it->second.kind == KIND_HOST ||
        it->second.free_pending)
        return CUDA_ERROR_INVALID_VALUE;
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
    return sync ? run_sync(h, ptsz, fn) : run_async(h, ptsz, fn);
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
    return sync ? run_sync(h, ptsz, fn) : run_async(h, ptsz, fn);
}

CUresult stream_sync(CUstream h, bool ptsz) {
    CHECK_INIT();
    std::unique_lock<std::mutex> lk(g_mu);
    std::shared_ptr<Stream> s;
    if (CUresult r = resolve_stream_locked(h, ptsz, &s); r != CUDA_SUCCESS) return r;
    wait_seq_locked(lk, s, s->submitted);
    return CUDA_SUCCESS;
}

CUresult stream_query(CUstream h, bool ptsz) {
    CHECK_INIT();
    std::lock_guard<std::mutex> lk(g_mu);
    std::shared_ptr<Stream> s;
    if (CUresult r = resolve_stream_locked(h, ptsz, &s); r != CUDA_SUCCESS) return r;
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
    return run_async(h, ptsz, [fn, user] { fn(user); });
}

CUresult stream_wait_event(CUstream h, CUevent ev, bool ptsz) {
    CHECK_INIT();
    std::lock_guard<std::mutex> lk(g_mu);
    std::shared_ptr<Stream> s;
    if (CUresult r = resolve_stream_locked(h, ptsz, &s); r != CUDA_SUCCESS) return r;
    auto it = g_st->events.find(ev);
    if (it == g_st->events.end()) return CUDA_ERROR_INVALID_HANDLE;
    Event& e = *it->second;
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
    if (CUresult r = resolve_stream_locked(h, ptsz, &s); r != CUDA_SUCCESS) return r;
    std::shared_ptr<Event> e = it->second;
    uint64_t gen = ++e->gen;
    e->recorded = true;
    e->have_time = false;
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
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED:
        v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES: v = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR; break;
    default: v = 0; break;
    }
    *pi = v;
    return CUDA_SUCCESS;
}

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
    *granularity = kGranularity;
    return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                     unsigned long long flags) {
    CHECK_INIT();
    g_vmm_calls.fetch_add(1);
    if (handle == nullptr || prop == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (size == 0 || size % kGranularity != 0) return CUDA_ERROR_INVALID_VALUE;
    if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (check_dev(prop->location.id) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_DEVICE;
    if (injected_failure()) return CUDA_ERROR_OUT_OF_MEMORY;
    int fd = static_cast<int>(syscall(SYS_memfd_create, "cupool-sim-phys", 1u));
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
    for (auto jt = it; jt != g_st->mappings.end() && jt->first < end; ++jt) jt->second.access = fl;
    return CUDA_SUCCESS;
}

CUresult cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location, CUdeviceptr ptr) {
    CHECK_INIT();
    if (flags == nullptr || location == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lk(g_mu);
    auto mt = find_mapping_locked(static_cast<uintptr_t>(ptr));
    if (mt == g_st->mappings.end()) return CUDA_ERROR_INVALID_VALUE;
    *flags = mt->second.access;
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
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    std::lock_guard<std::mutex> lk(g_mu);
    Phys ph;
    ph.fd = fd;
    ph.size = static_cast<size_t>(st.st_size);
    ph.dev = 0;
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
    // As the real driver: returns at once; queued work still runs, then the stream goes away.
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
CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int) { return stream_wait_event(hStream, hEvent, false); }
CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int) { return stream_wait_event(hStream, hEvent, true); }

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
    auto it = g_st->events.find(hEvent);
    if (it == g_st->events.end()) return CUDA_ERROR_INVALID_HANDLE;
    Event& e = *it->second;
    if (!e.recorded || !e.s) return CUDA_SUCCESS;
    return e.s->completed >= e.seq ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuEventSynchronize(CUevent hEvent) {
    CHECK_INIT();
    std::unique_lock<std::mutex> lk(g_mu);
    auto it = g_st->events.find(hEvent);
    if (it == g_st->events.end()) return CUDA_ERROR_INVALID_HANDLE;
    std::shared_ptr<Event> e = it->second;
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
