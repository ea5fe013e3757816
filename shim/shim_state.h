// Process-wide state of the shim: configuration, trace writer, and the process's memory (one
// ProcessMemory, policy/process_memory.h). Hooks reach it only through here.
#pragma once

#include <atomic>
#include <cstdint>

#include "config.h"
#include "cuda_api.h"
#include "driver_calls.h"
#include "driver_upstream.h"
#include "process_memory.h"
#include "trace_schema.h"

namespace cupool {
class TraceWriter;
}

namespace cupool::shim {

// Set up, in two steps: at load (options, log level, the trace writer without its file, fork
// handlers; a configuration error ends the process before user code runs), and when a hook first
// runs, i.e. the process reaches CUDA (the configuration banner, warnings about unknown
// variables). Safe to call from any hook at any time; after the first call, one load.
void initialize();  // inline, below
// Has a hook run initialize(), i.e. has the process reached CUDA? Until then it has no pools.
bool reached_cuda();
const Config& config();
bool exiting();

// The hot paths' view of the state above: inline loads of hidden globals (shim_state.cpp), not
// calls (every hook asks initialize() and tracing(), and the pool's process_memory()).
namespace detail {
extern std::atomic<int> g_active;  // kActive once initialize() has run
constexpr int kActive = 2;
extern std::atomic<TraceWriter*> g_writer;
extern ProcessMemory* g_memory;
void initialize_slow();
}  // namespace detail
inline void initialize() {
  if (detail::g_active.load(std::memory_order_acquire) == detail::kActive) [[likely]]
    return;
  detail::initialize_slow();
}

// Guards against re-entry: the runtime calling the driver, or cupool calling either, while an
// intercepted call is served. Only the outermost call is routed and recorded.
class HookScope {
 public:
  HookScope() : outermost_(depth_++ == 0) {}
  ~HookScope() { --depth_; }
  HookScope(const HookScope&) = delete;
  HookScope& operator=(const HookScope&) = delete;
  bool outermost() const { return outermost_; }

 private:
  static thread_local int depth_;
  bool outermost_;
};

// Tracing. `tracing()` is one load; events are only built when it is true.
inline bool tracing() { return detail::g_writer.load(std::memory_order_relaxed) != nullptr; }
std::uint64_t now_ns();
void emit(const trace::Record& record);
// The calling thread's trace ring is full: its next event would be dropped (TraceWriter::full_here).
bool trace_full_here();
void drop_here();  // one event of this thread dropped instead of emitted
// CUPOOL_TRACE_STACKS: one allocation in this many has its stack recorded (0: none; tracing only).
std::uint32_t stack_sampling();
// The calling thread's stack, interned by the trace writer: the id for Record::stack (0: none).
std::uint32_t record_stack();

// The memory of one context (policy/process_memory.h). Its upstream is the shim's DriverUpstream.
inline DriverUpstream& driver_upstream(const ContextMemory& cp) { return *static_cast<DriverUpstream*>(cp.upstream); }

// The process's memory: every pool, the memory outside them, the cap, the VMM cache.
inline ProcessMemory& process_memory() { return *detail::g_memory; }

// The pool of the context current on this thread; nullptr with *rc set when there is none.
// Inline as far as a known context's record (every allocation asks it); made in current_pool_new.
ContextMemory* current_pool_new(CUcontext ctx, CUresult* rc);
inline ContextMemory* current_pool(CUresult* rc) {
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
  if (ContextMemory* cp = process_memory().find(reinterpret_cast<std::uintptr_t>(ctx))) return cp;
  return current_pool_new(ctx, rc);
}
// The pool of `ctx` if one exists (none is made).
ContextMemory* existing_pool(CUcontext ctx);
// The pool that handed out `ptr`, searching every live context.
inline ContextMemory* pool_owning(std::uint64_t ptr) { return process_memory().owning(ptr); }
// A context went away: its pool forgets its memory without touching the driver.
void drop_context(CUcontext ctx, const char* api);
// A context of device `accessor` may now reach `owner`'s memory (cuCtxEnablePeerAccess): owner's
// pool, now or when it is made, grants that device access to what it maps (DriverUpstream::grant_peer).
void peer_access_enabled(CUcontext owner, CUdevice accessor);
// Waits for all work of every context that has a pool (once, when streams first overlap).
void synchronize_all_pools();
void drop_primary_context(int device, const char* api);
// The context's graph memory went with it: its charge against the cap and the shared budget
// goes too (shim/hooks_graphs.cpp).
void drop_graph_memory(ContextMemory& cp);

}  // namespace cupool::shim
