#include "shim_state.h"

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <ctime>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "device_pool.h"
#include "event_clock.h"
#include "hook_table.h"
#include "log.h"
#include "options.h"
#include "streams.h"
#include "trace_writer.h"

extern char** environ;

namespace cupool::shim {

thread_local int HookScope::depth_ = 0;

namespace {

enum InitState : int { kUninitialized = 0, kInitializing = 1, kReady = 2 };
std::atomic<int> g_init{kUninitialized};
std::atomic<bool> g_exiting{false};
Config* g_config = nullptr;                     // never destroyed: hooks may run during exit
std::atomic<TraceWriter*> g_writer{nullptr};

// One slot per context that ever allocated; read without a lock on the hot path.
constexpr int kMaxContexts = 64;
std::atomic<CUcontext> g_slot_ctx[kMaxContexts];
ContextPool* g_slot_pool[kMaxContexts];
std::atomic<int> g_slot_count{0};
std::mutex g_pools_mutex;  // creating and dropping pools only

struct ExternalAllocation {
  std::uint64_t bytes;
  ContextPool* owner;
};
std::mutex g_external_mutex;
std::unordered_map<std::uint64_t, ExternalAllocation>* g_external = nullptr;

// A context handle never handed out by the driver marks a dropped slot.
CUcontext const kDroppedContext = reinterpret_cast<CUcontext>(~std::uintptr_t{0});

void at_exit() {
  g_exiting.store(true, std::memory_order_release);
  // Chunks are not given back: the driver may already be shutting down, and exit frees them.
  for (int i = 0; i < g_slot_count.load(std::memory_order_acquire); ++i)
    if (g_slot_pool[i]) g_slot_pool[i]->upstream->detach();
  if (TraceWriter* w = g_writer.exchange(nullptr)) w->close();  // footer; the object stays
}

void fork_prepare() {
  g_pools_mutex.lock();
  g_external_mutex.lock();
  streams().prepare_fork();
  captures().prepare_fork();
  if (TraceWriter* w = g_writer.load()) w->prepare_fork();
}
void fork_parent() {
  if (TraceWriter* w = g_writer.load()) w->parent_after_fork();
  captures().parent_after_fork();
  streams().parent_after_fork();
  g_external_mutex.unlock();
  g_pools_mutex.unlock();
}
void fork_child() {
  EventClock::after_fork_in_child();
  if (TraceWriter* w = g_writer.load()) w->child_after_fork();
  captures().child_after_fork();
  streams().child_after_fork();
  // CUDA contexts do not survive fork: the child starts with no pools and no driver memory.
  DevicePool::after_fork_in_child();
  for (int i = 0; i < g_slot_count.load(); ++i) {
    if (!g_slot_pool[i]) continue;
    g_slot_pool[i]->upstream->detach();
    g_slot_pool[i]->pool->abandon_after_fork();
    g_slot_ctx[i].store(kDroppedContext);
  }
  vmm_after_fork_child();
  g_external->clear();
  g_external_mutex.unlock();
  g_pools_mutex.unlock();
}

// At load, before the program's own code: what a process that never uses CUDA pays too, so only
// what must happen then. A configuration error stops the process here, before it starts.
void load_once() {
  auto parsed = parse_options([](const char* name) { return std::getenv(name); });
  if (auto* error = std::get_if<OptionError>(&parsed)) {
    // Refuse to start: the user asked for something cupool cannot do.
    std::fprintf(stderr, "%s\n", error->message.c_str());
    std::fflush(stderr);
    _exit(kConfigErrorExitCode);
  }
  g_config = new Config(std::get<Config>(parsed));
  log_init(g_config->log_level);
  g_external = new std::unordered_map<std::uint64_t, ExternalAllocation>;
  if (!g_config->trace_path.empty()) {
    // No file yet (it is made at the first event), but the process's place among traced
    // processes is settled now, for the children it starts.
    std::string error;
    std::unique_ptr<TraceWriter> writer = TraceWriter::open(*g_config, &error);
    if (!writer) {
      std::fprintf(stderr, "%s\n", error.c_str());
      std::fflush(stderr);
      _exit(kConfigErrorExitCode);
    }
    g_writer.store(writer.release(), std::memory_order_release);
  }
  pthread_atfork(fork_prepare, fork_parent, fork_child);
  std::atexit(at_exit);
}

// When the process first reaches CUDA (a hook, not a lookup): now cupool may speak. Users preload
// the library into whole job scripts; a banner from every `ls` is noise.
void activate_once() {
  for (const std::string& warning : unknown_variables(environ)) log_warn(warning);
  log_info(describe(*g_config));
}

// Runs `once` exactly once, whichever thread comes first; the others wait for it to finish. A
// hook re-entered from inside `once` (on its own thread) cannot wait, and goes on.
void run_once(std::atomic<int>& state, void (*once)()) {
  if (state.load(std::memory_order_acquire) == kReady) return;
  int expected = kUninitialized;
  if (state.compare_exchange_strong(expected, kInitializing, std::memory_order_acq_rel)) {
    once();
    state.store(kReady, std::memory_order_release);
    return;
  }
  static thread_local bool waiting = false;
  if (waiting) return;
  waiting = true;
  while (state.load(std::memory_order_acquire) != kReady) sched_yield();
  waiting = false;
}

std::atomic<int> g_active{kUninitialized};

__attribute__((constructor)) void initialize_at_load() { run_once(g_init, load_once); }

}  // namespace

void initialize() {
  if (g_active.load(std::memory_order_acquire) == kReady) [[likely]]
    return;
  run_once(g_init, load_once);
  run_once(g_active, activate_once);
}

const Config& config() { return *g_config; }
bool exiting() { return g_exiting.load(std::memory_order_acquire); }

bool tracing() { return g_writer.load(std::memory_order_relaxed) != nullptr; }

std::uint64_t now_ns() { return EventClock::now(); }

void emit(const trace::Record& record) {
  if (TraceWriter* w = g_writer.load(std::memory_order_acquire)) w->record(record);
}

namespace {

ContextPool* find_slot(CUcontext ctx) {
  const int n = g_slot_count.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i)
    if (g_slot_ctx[i].load(std::memory_order_acquire) == ctx) return g_slot_pool[i];
  return nullptr;
}

ContextPool* create_pool(CUcontext ctx, CUresult* rc) {
  std::lock_guard lock(g_pools_mutex);
  if (ContextPool* existing = find_slot(ctx)) return existing;
  const DriverCalls& d = driver();
  CUdevice device = 0;
  if (CUresult r = d.ctx_get_device(&device); r != CUDA_SUCCESS) {
    *rc = r;
    return nullptr;
  }
  auto* cp = new ContextPool;
  cp->ctx = ctx;
  cp->device = device;
  if (d.primary_ctx_retain(&cp->primary, device) == CUDA_SUCCESS) d.primary_ctx_release(device);
  cp->upstream = new DriverUpstream(ctx, device);
  cp->pool = new DevicePool(*g_config, device, *cp->upstream, g_writer.load());

  bool device_known = false;
  const int n = g_slot_count.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i)
    if (g_slot_pool[i] && g_slot_pool[i]->device == device) device_known = true;
  if (!device_known) {
    char name[256] = {};
    std::size_t total = 0;
    d.device_get_name(name, sizeof name, device);
    d.device_total_mem(&total, device);
    if (TraceWriter* w = g_writer.load()) w->write_device(device, name, total);
    if (log_debug_enabled()) log_debug(std::string("device ") + std::to_string(device) + ": " + name);
  }

  // Reuse a dropped slot if there is one; else append.
  int slot = -1;
  for (int i = 0; i < n; ++i)
    if (g_slot_ctx[i].load() == kDroppedContext) slot = i;
  if (slot < 0) {
    if (n == kMaxContexts) {
      log_error("more than 64 CUDA contexts in one process; allocations in the others go to the driver");
      *rc = CUDA_ERROR_OUT_OF_MEMORY;
      return nullptr;
    }
    slot = n;
  }
  g_slot_pool[slot] = cp;
  g_slot_ctx[slot].store(ctx, std::memory_order_release);
  if (slot == n) g_slot_count.store(n + 1, std::memory_order_release);
  return cp;
}

}  // namespace

ContextPool* existing_pool(CUcontext ctx) { return ctx ? find_slot(ctx) : nullptr; }

ContextPool* current_pool(CUresult* rc) {
  const DriverCalls& d = driver();
  if (!d.ok) {
    *rc = CUDA_ERROR_NOT_INITIALIZED;
    return nullptr;
  }
  CUcontext ctx = nullptr;
  if (CUresult r = d.ctx_get_current(&ctx); r != CUDA_SUCCESS || ctx == nullptr) {
    *rc = r != CUDA_SUCCESS ? r : CUDA_ERROR_INVALID_CONTEXT;
    return nullptr;
  }
  if (ContextPool* cp = find_slot(ctx)) return cp;
  return create_pool(ctx, rc);
}

void synchronize_all_pools() {
  const int n = g_slot_count.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    CUcontext c = g_slot_ctx[i].load(std::memory_order_acquire);
    if (c != kDroppedContext && g_slot_pool[i]) g_slot_pool[i]->upstream->synchronize();
  }
}

ContextPool* pool_owning(std::uint64_t ptr) {
  const int n = g_slot_count.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    CUcontext c = g_slot_ctx[i].load(std::memory_order_acquire);
    if (c != kDroppedContext && g_slot_pool[i]->pool->owns(ptr)) return g_slot_pool[i];
  }
  return nullptr;
}

namespace {
void drop_slot(int i, const char* api) {
  ContextPool* cp = g_slot_pool[i];
  g_slot_ctx[i].store(kDroppedContext, std::memory_order_release);
  cp->upstream->detach();
  cp->pool->abandon();
  vmm_drop_context(cp);
  if (tracing()) {
    trace::Record r;
    r.t_ns = now_ns();
    r.kind = trace::EventKind::context_reset;
    r.api = api;
    r.device = static_cast<std::int16_t>(cp->device);
    r.tid = static_cast<std::uint32_t>(syscall(SYS_gettid));
    emit(r);
  }
  // The ContextPool is leaked on purpose: another thread may still hold a pointer to it.
  std::lock_guard lock(g_external_mutex);
  for (auto it = g_external->begin(); it != g_external->end();)
    it = it->second.owner == cp ? g_external->erase(it) : std::next(it);
}
}  // namespace

void drop_context(CUcontext ctx, const char* api) {
  std::lock_guard lock(g_pools_mutex);
  const int n = g_slot_count.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i)
    if (g_slot_ctx[i].load() == ctx) drop_slot(i, api);
}

void drop_primary_context(int device, const char* api) {
  std::lock_guard lock(g_pools_mutex);
  const int n = g_slot_count.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    CUcontext c = g_slot_ctx[i].load();
    if (c != kDroppedContext && g_slot_pool[i]->device == device && g_slot_pool[i]->primary == c)
      drop_slot(i, api);
  }
}

void external_add(std::uint64_t key, std::uint64_t bytes, ContextPool* owner) {
  std::lock_guard lock(g_external_mutex);
  (*g_external)[key] = ExternalAllocation{bytes, owner};
}

bool external_remove(std::uint64_t key, std::uint64_t* bytes, ContextPool** owner) {
  std::lock_guard lock(g_external_mutex);
  auto it = g_external->find(key);
  if (it == g_external->end()) return false;
  *bytes = it->second.bytes;
  *owner = it->second.owner;
  g_external->erase(it);
  return true;
}

}  // namespace cupool::shim
