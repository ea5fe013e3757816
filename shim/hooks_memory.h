// What the memory hooks share (hooks_alloc.cpp, hooks_vmm.cpp): the event each outermost call
// records, the way to the process's memory (policy/process_memory.h), and the traits that let one
// body serve a runtime hook and its driver twin.
#pragma once

#include <cstdint>
#include <optional>

#include "cuda_api.h"
#include "event_clock.h"
#include "process_memory.h"
#include "shim_state.h"
#include "thread_id.h"
#include "trace_schema.h"

namespace cupool::shim {

// True for one call in kCacheTimingSample, at random: a counter would time only allocs, or only
// frees, of a program that alternates them. xorshift32 per thread.
inline bool sampled() {
  thread_local std::uint32_t x = 0;
  if (x == 0) x = current_thread_id() << 1 | 1;  // distinct per thread, never 0
  x ^= x << 13;
  x ^= x >> 17;
  x ^= x << 5;
  static_assert((trace::kCacheTimingSample & (trace::kCacheTimingSample - 1)) == 0);
  return (x & (trace::kCacheTimingSample - 1)) == 0;
}

// CUPOOL_TRACE_STACKS=N: true for one call in `every`, at random (its own xorshift32, so that the
// allocations whose stacks are taken are not those whose time is taken).
inline bool stack_sampled(std::uint32_t every) {
  if (every == 1) return true;
  thread_local std::uint32_t x = 0;
  if (x == 0) x = current_thread_id() * 2654435761u | 1;
  x ^= x << 13;
  x ^= x >> 17;
  x ^= x << 5;
  return x % every == 0;
}

// One event, timed from construction; emitted only when tracing (its record is built only then:
// the pair of a pool hit is ~60 ns, and zeroing a record for nothing was a few of them). When the
// thread's trace ring is full the event would be dropped anyway: it is counted as dropped, and
// neither timed nor filled in (on the H200 host a stamp costs ~30 ns, and a program that
// allocates faster than the writer writes makes most of its calls in that state).
class HookEvent {
 public:
  HookEvent(trace::EventKind kind, const char* api, trace::Path path) {
    if (!tracing()) return;
    if (trace_full_here()) [[unlikely]] {
      dropped_ = true;
      return;
    }
    trace::Record& r = r_.emplace();
    r.t_ns = EventClock::stamp();  // converted by the trace writer, off this thread
    r.stamped = true;
    r.kind = kind;
    r.api = api;
    r.path = path;
  }
  // Where the pool writes its state after serving the call (nothing when not tracing).
  trace::PoolState* pool_state() {
    if (!r_) return nullptr;
    r_->has_pool = true;
    return &r_->pool;
  }
  void stream(const void* s) {
    if (!r_) return;
    r_->has_stream = true;
    r_->stream = reinterpret_cast<std::uintptr_t>(s);
  }
  void device(int d) {
    if (r_) r_->device = static_cast<std::int16_t>(d);
  }
  void oom(OomClass c) {
    if (r_) r_->oom_class = c;
  }
  void recycled() {  // served by cupool's VMM mapping cache
    if (r_) r_->recycled = true;
  }
  void mapped(std::uint64_t handle, std::uint64_t offset) {  // cuMemMap: what is mapped, and where in it
    if (!r_) return;
    r_->has_handle = true;
    r_->handle = handle;
    r_->offset = offset;
  }
  // The pool state, if the pool served the call, is already in the record (has_pool set).
  void done(int rc, std::uint64_t size, std::uint64_t ptr, const ContextMemory* cp) {
    if (!r_) {
      if (dropped_) drop_here();
      return;
    }
    trace::Record& r = *r_;
    if (r.has_pool && r.pool.cache_delta != 0)  // the thread's cache served it: timed 1 in kCacheTimingSample
      r.timed_for = sampled() ? trace::kCacheTimingSample : 0;
    if (r.timed_for != 0) {
      const std::uint64_t end = EventClock::stamp();
      r.dur_ns = end - r.t_ns;
      // `t` orders events across threads: memory is handed out by the time an allocation
      // returns and given back no earlier than its free was called, so (alloc: end, free:
      // start) is a consistent order for every reuse of an address. An untimed alloc keeps its
      // start: its block came from the thread's own cache, where no other thread could reach it.
      if (trace::timed_at_end(r.kind)) r.t_ns = end;
    }
    r.rc = rc;
    r.size = size;
    r.ptr = ptr;
    r.tid = current_thread_id();
    // After the timing: a stack costs microseconds, which are the trace's, not the call's. A
    // refused allocation always gets one: it is the one a user asks about.
    // The program's allocations (cuMemCreate is not one yet: no tool would show its stack).
    if (r.kind == trace::EventKind::alloc)
      if (const std::uint32_t every = stack_sampling(); every != 0 && (rc != 0 || stack_sampled(every)))
        r.stack = record_stack();
    if (cp) r.device = static_cast<std::int16_t>(cp->device);
    emit(r);
  }

 private:
  std::optional<trace::Record> r_;
  bool dropped_ = false;
};

inline ProcessMemory& memory() { return process_memory(); }
inline bool pooled() { return memory().pooled(); }

// The context the runtime would allocate in. Like the runtime's own cudaMalloc, the first call
// on a thread with no context creates the device's primary context (cudaFree(NULL) does that).
ContextMemory* runtime_pool();
ContextMemory* driver_pool();
// The pool of `ctx`, which need not be current on this thread (made if need be); nullptr if the
// driver does not know the context.
ContextMemory* pool_of_context(CUcontext ctx);

// A stream capture in progress forbids this thread "unsafe" calls (cudaMalloc, cudaFree and
// their driver twins among them): the driver would refuse the program's own call and invalidate
// the capture. cupool must do the same rather than serve it from a pool.
bool capture_forbids_here();

// After a refusal of cupool's own in a runtime hook, the runtime's sticky error (cudaGetLastError,
// cudaPeekAtLastError) must say what the driver's refusal would have left there.
void set_runtime_last_error_oom();

// A pointer or handle cupool did not hand out and the driver has freed: uncharged if it was counted.
// `device`: where it was charged (-1: not known, or not charged).
inline void forget_outside(std::uint64_t key, std::uint64_t* bytes, ContextMemory** owner, int* device = nullptr) {
  memory().forget_outside(key, bytes, owner, device);
}

// Where an allocation outside the pools is charged. A call that names its device (cuMemCreate's
// location, a memory pool's device, a stream's context) is charged there whatever context the
// calling thread has, or none (issue 25): to `cp` when a context of the process on that device
// is known, else to the device's account alone (`device`). Neither: not charged (host memory, or
// a call the driver will refuse).
struct Placement {
  ContextMemory* cp = nullptr;
  int device = -1;
  Placement() = default;
  Placement(ContextMemory* c) : cp(c), device(c ? c->device : -1) {}  // NOLINT: a context names its device
  static Placement on_device(int d) {
    Placement p;
    p.device = d;
    return p;
  }
};
// The calling thread's context if it is on `device`, else the device's account.
Placement placed_on_device(int device);
// The device's memory in bytes (cuDeviceTotalMem_v2, which needs no context): a percent cap's base.
std::uint64_t device_total_memory(int device);

// The API a hook implements, as the one body of a runtime hook and its driver twin needs it:
// its result type and codes, where its context comes from, and what a refusal of cupool's own
// must leave behind.
struct RuntimeApi {
  using Code = cudaError_t;
  static constexpr Code ok = cudaSuccess;
  static constexpr Code out_of_memory = cudaErrorMemoryAllocation;
  static constexpr Code invalid = cudaErrorInvalidValue;
  static constexpr Code no_library = cudaErrorInitializationError;
  // cudaMalloc(&p, 0) succeeds with p = NULL (the driver's cuMemAlloc refuses size 0).
  static constexpr bool zero_size_gives_null = true;
  static ContextMemory* context(std::uint64_t) { return runtime_pool(); }
  static void refused_here() { set_runtime_last_error_oom(); }
};
struct DriverApi {
  using Code = CUresult;
  static constexpr Code ok = CUDA_SUCCESS;
  static constexpr Code out_of_memory = CUDA_ERROR_OUT_OF_MEMORY;
  static constexpr Code invalid = CUDA_ERROR_INVALID_VALUE;
  static constexpr Code no_library = CUDA_ERROR_NOT_INITIALIZED;
  static constexpr bool zero_size_gives_null = false;
  // No context for size 0: the driver refuses it itself (CUDA_ERROR_INVALID_VALUE).
  static ContextMemory* context(std::uint64_t bytes) { return bytes ? driver_pool() : nullptr; }
  static void refused_here() {}
};

// Runs a driver allocation outside the pools (managed, stream-ordered, VMM, arrays, passthrough)
// through ProcessMemory, which charges the cap first (`where`: see Placement). `call` returns
// the API's code and leaves the new pointer or handle in *key. A refusal of cupool's own (the cap, the shared budget) is the API's
// out-of-memory, with what Api::refused_here leaves behind.
template <typename Api, typename Call>
typename Api::Code outside_allocate(Placement where, std::uint64_t bytes, const char* api, std::uint64_t* key,
                                     Call&& call) {
  typename Api::Code rc = Api::out_of_memory;
  auto made = [&](std::uint64_t* out) {
    rc = call();
    *out = *key;
    return rc == Api::ok ? OutsideAnswer::ok
                         : rc == Api::out_of_memory ? OutsideAnswer::out_of_memory : OutsideAnswer::failed;
  };
  // A device the driver cannot size is one it will refuse: nothing to charge.
  const std::uint64_t device_total = where.cp == nullptr && where.device >= 0 ? device_total_memory(where.device) : 0;
  const OutsideAnswer answer = device_total > 0
                                   ? memory().allocate_on_device(where.device, device_total, bytes, api, made)
                                   : memory().allocate_outside(where.cp, bytes, api, made);
  if (answer == OutsideAnswer::refused_by_cap || answer == OutsideAnswer::refused_by_share) {
    Api::refused_here();
    return Api::out_of_memory;
  }
  return rc;
}

}  // namespace cupool::shim
