// The shim's process-wide state (shim_state.h): configuration, the trace writer and the process's
// memory, and how each is set up and torn down.
#include "shim_state.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <ctime>
#include <memory>
#include <mutex>
#include <string>
#include <functional>

#include "event_clock.h"
#include "hook_table.h"
#include "ipc_vmm.h"
#include "log.h"
#include "options.h"
#include "process_memory.h"
#include "stack_capture.h"
#include "streams.h"
#include "thread_id.h"
#include "trace_writer.h"

extern char** environ;

namespace cupool::shim {

thread_local int HookScope::depth_ = 0;

namespace detail {
std::atomic<TraceWriter*> g_writer{nullptr};
ProcessMemory* g_memory = nullptr;  // never destroyed: hooks may run during exit
std::atomic<int> g_active{0};       // an InitState
}  // namespace detail
using detail::g_active;
using detail::g_memory;
using detail::g_writer;

namespace {

enum InitState : int { kUninitialized = 0, kInitializing = 1, kReady = 2 };
std::atomic<int> g_init{kUninitialized};
std::atomic<bool> g_exiting{false};
Config* g_config = nullptr;                     // never destroyed: hooks may run during exit
std::uint32_t g_stack_sampling = 0;  // set once at load, before any hook runs


// The real calls the VMM mapping cache makes itself: giving a kept mapping back, or making the
// driver's state match what the program believes.
class RealVmm final : public VmmDriver {
 public:
  void unmap(std::uint64_t va, std::uint64_t size) override {
    if (auto f = CUPOOL_REAL(cuMemUnmap)) f(va, size);
  }
  bool release(std::uint64_t handle) override {
    auto f = CUPOOL_REAL(cuMemRelease);
    return f && f(handle) == CUDA_SUCCESS;
  }
  void address_free(std::uint64_t va, std::uint64_t size) override {
    if (auto f = CUPOOL_REAL(cuMemAddressFree)) f(va, size);
  }
};

std::uint64_t key_of(CUcontext ctx) { return reinterpret_cast<std::uintptr_t>(ctx); }

void at_exit() {
  g_exiting.store(true, std::memory_order_release);
  // Chunks are not given back: the driver may already be shutting down, and exit frees them.
  if (g_memory) g_memory->for_each([](ContextMemory& cp) { driver_upstream(cp).detach(); });
  if (TraceWriter* w = g_writer.exchange(nullptr)) {  // footer; the object stays
    std::optional<TraceWriter::ShareWaits> waits;
    if (SharedBudget* share = g_memory ? g_memory->share() : nullptr) waits = {share->waits(), share->waited_ns()};
    w->close(waits);
  }
  // The last member of a shared budget out removes its segment (issue 26: leftovers piled up).
  if (SharedBudget* share = g_memory ? g_memory->share() : nullptr) share->leave();
}

void fork_prepare() {
  g_memory->prepare_fork();
  streams().prepare_fork();
  captures().prepare_fork();
  if (TraceWriter* w = g_writer.load()) w->prepare_fork();
}
void fork_parent() {
  if (TraceWriter* w = g_writer.load()) w->parent_after_fork();
  captures().parent_after_fork();
  streams().parent_after_fork();
  g_memory->parent_after_fork();
}
void fork_child() {
  EventClock::after_fork_in_child();
  if (TraceWriter* w = g_writer.load()) w->child_after_fork();
  captures().child_after_fork();
  streams().child_after_fork();
  // CUDA contexts do not survive fork: the child starts with no pools and no driver memory, and
  // is a member of the shared budget of its own.
  g_memory->child_after_fork([](ContextMemory& cp) { driver_upstream(cp).detach(); });
  if (SharedBudget* share = g_memory->share()) share->after_fork_in_child();
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
    g_stack_sampling = g_config->trace_stacks;
    g_writer.store(writer.release(), std::memory_order_release);
  }
  // The shared budget is joined now (a wrong CUPOOL_SHARE_LIMIT stops the process like any other
  // configuration error); a slot in it is claimed only at the first allocation.
  SharedBudget* share = nullptr;
  if (!g_config->share.empty()) {
    std::string error;
    std::unique_ptr<SharedBudget> joined =
        SharedBudget::join(g_config->share, g_config->share_limit, g_config->share_group, &error);
    if (!joined) {
      std::fprintf(stderr, "%s\n", error.c_str());
      std::fflush(stderr);
      _exit(kConfigErrorExitCode);
    }
    share = joined.release();  // never destroyed: hooks may run during exit
  }
  static RealVmm real_vmm;  // no destructor to run at exit: it holds nothing
  // Pool events on the trace's clock, as the hooks' own (trace/event_clock.h).
  g_memory = new ProcessMemory(*g_config, g_writer.load(), &real_vmm, share, [](void*) { return EventClock::now(); });
  pthread_atfork(fork_prepare, fork_parent, fork_child);
  std::atexit(at_exit);
}

// When the process first reaches CUDA (a hook, not a lookup): now cupool may speak. Users preload
// the library into whole job scripts; a banner from every `ls` is noise.
void activate_once() {
  for (const std::string& warning : unknown_variables(environ)) log_warn(warning);
  log_info(describe(*g_config));
  // When another member of the budget waits for room, this process gives back what it holds idle.
  if (SharedBudget* share = g_memory->share())
    share->serve_give_back([] { g_memory->give_back(); }, [] { g_memory->publish_share(); });
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

__attribute__((constructor)) void initialize_at_load() { run_once(g_init, load_once); }

}  // namespace

static_assert(kReady == detail::kActive);

void detail::initialize_slow() {
  run_once(g_init, load_once);
  run_once(g_active, activate_once);
}

bool reached_cuda() { return g_active.load(std::memory_order_acquire) == kReady; }

const Config& config() { return *g_config; }
bool exiting() { return g_exiting.load(std::memory_order_acquire); }

std::uint64_t now_ns() { return EventClock::now(); }

void emit(const trace::Record& record) {
  if (TraceWriter* w = g_writer.load(std::memory_order_acquire)) w->record(record);
}

bool trace_full_here() {
  TraceWriter* w = g_writer.load(std::memory_order_acquire);
  return w != nullptr && w->full_here();
}

void drop_here() {
  if (TraceWriter* w = g_writer.load(std::memory_order_acquire)) w->drop_here();
}

std::uint32_t stack_sampling() { return g_stack_sampling; }

std::uint32_t record_stack() {
  TraceWriter* w = g_writer.load(std::memory_order_acquire);
  if (w == nullptr) return 0;
  std::uintptr_t pcs[StackTable::kMaxFrames];
  return w->intern_stack(pcs, capture_stack(pcs, StackTable::kMaxFrames));
}


namespace {

// Peer access granted to each context's memory (by context), for pools made after the grant.
// Never destroyed: hooks may run during exit.
std::mutex g_peers_mu;
auto* g_peers = new std::unordered_map<std::uint64_t, std::vector<CUdevice>>;

std::vector<CUdevice> peers_of(CUcontext ctx) {
  std::lock_guard lock(g_peers_mu);
  auto it = g_peers->find(key_of(ctx));
  return it == g_peers->end() ? std::vector<CUdevice>{} : it->second;
}

// Describes a new context's memory: its device, primary context and driver upstream. Called once
// per context, under the contexts' lock.
bool describe_context(CUcontext ctx, ContextMemory& cp, CUresult* rc) {
  const DriverCalls& d = driver();
  CUdevice device = 0;
  if (CUresult r = d.ctx_get_device(&device); r != CUDA_SUCCESS) {
    *rc = r;
    return false;
  }
  cp.device = device;
  CUcontext primary = nullptr;
  if (d.primary_ctx_retain(&primary, device) == CUDA_SUCCESS) d.primary_ctx_release(device);
  cp.primary = key_of(primary);
  cp.upstream = new DriverUpstream(ctx, device);  // leaked with the record: hooks may run during exit
  if (!g_memory->device_known(device)) {
    char name[256] = {};
    std::size_t total = 0;
    d.device_get_name(name, sizeof name, device);
    d.device_total_mem(&total, device);
    if (TraceWriter* w = g_writer.load()) w->write_device(device, name, total);
    if (log_debug_enabled()) log_debug(std::string("device ") + std::to_string(device) + ": " + name);
  }
  return true;
}

}  // namespace

ContextMemory* existing_pool(CUcontext ctx) { return ctx ? g_memory->find(key_of(ctx)) : nullptr; }

ContextMemory* current_pool_new(CUcontext ctx, CUresult* rc) {
  if (ContextMemory* cp = g_memory->find(key_of(ctx))) return cp;
  *rc = CUDA_ERROR_OUT_OF_MEMORY;  // unless describe_context says otherwise
  ContextMemory* cp = g_memory->find_or_add(key_of(ctx), [&](ContextMemory& fresh) { return describe_context(ctx, fresh, rc); });
  if (cp) {
    *rc = CUDA_SUCCESS;
    // Peers granted before the pool existed, or while it was being published (such a grant found
    // no pool): given now that the pool is visible. Idempotent.
    for (CUdevice peer : peers_of(ctx)) driver_upstream(*cp).grant_peer(peer);
  }
  return cp;
}

void synchronize_all_pools() {
  g_memory->for_each([](ContextMemory& cp) { driver_upstream(cp).synchronize(); });
}


namespace {
// Before a context's memory is forgotten: its upstream makes no more driver calls, and the trace
// says so.
std::function<void(ContextMemory&)> dropping(const char* api) {
  return [api](ContextMemory& cp) {
    // cuMemCreate memory outlives its context: what cupool holds of it goes back first (the VMM
    // cache's kept mappings, the vmm policy's granules), or the device loses it for good.
    g_memory->vmm_evict(&cp);
    ipc_vmm::context_dropped(cp);  // importers keep their own handles to what it shared
    driver_upstream(cp).release_virtual_memory();
    driver_upstream(cp).detach();
    drop_graph_memory(cp);
    if (tracing()) {
      trace::Record r;
      r.t_ns = now_ns();
      r.kind = trace::EventKind::context_reset;
      r.api = api;
      r.device = static_cast<std::int16_t>(cp.device);
      r.tid = current_thread_id();
      emit(r);
    }
  };
}
}  // namespace

void drop_context(CUcontext ctx, const char* api) {
  {
    std::lock_guard lock(g_peers_mu);  // a later context at the same address starts with none
    g_peers->erase(key_of(ctx));
  }
  g_memory->drop(key_of(ctx), dropping(api));
}

void peer_access_enabled(CUcontext owner, CUdevice accessor) {
  {
    std::lock_guard lock(g_peers_mu);
    std::vector<CUdevice>& peers = (*g_peers)[key_of(owner)];
    if (std::find(peers.begin(), peers.end(), accessor) == peers.end()) peers.push_back(accessor);
  }
  if (ContextMemory* cp = g_memory->find(key_of(owner))) driver_upstream(*cp).grant_peer(accessor);
}

void drop_primary_context(int device, const char* api) {
  g_memory->drop_if([device](const ContextMemory& cp) { return cp.device == device && cp.primary == cp.ctx; },
                    dropping(api));
}

}  // namespace cupool::shim
