// ContextPool: the memory of one device context, handed out from chunks taken through an Upstream
// (the real driver in the shim, SimUpstream in tests and replay). Thread-safe: one mutex per
// pool, never held across an upstream call that can take long (reserve, release, synchronize,
// wait_fence). The policies (growth, preallocate; vmm in VmmRange, vmm_range.h), free modes and
// OOM classification live here; what it takes from the upstream passes the device's admission
// first (the cap, then the shared budget: device_admission.h). docs/design.md ("The pool")
// explains the rules.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>  // condition_variable_any
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "clock.h"
#include "config.h"
#include "device_admission.h"
#include "growth_rule.h"
#include "pool_events.h"
#include "quarantine.h"
#include "spin_lock.h"
#include "suballocator.h"
#include "thread_cache.h"
#include "upstream.h"

namespace cupool {

class VmmRange;  // vmm_range.h

struct AllocResult {
  std::uint64_t ptr = 0;
  OomClass oom = OomClass::none;
  int driver_code = 0;  // the driver's error code when oom == device
};

enum class FreeResult {
  freed,
  not_owned,    // outside the pool's chunks, or inside a live block but not at its start
  double_free,  // inside the pool but not a live block (already freed, or still in quarantine)
};

class ContextPool final : public ThreadCacheOwner, public MemoryHolder {
 public:
  // A time source (ns). Default: CLOCK_MONOTONIC (policy/clock.h); ProcessMemory hands its pools
  // its own, tests and replay theirs.
  using Clock = cupool::Clock;

  // `admission`: the device's (ProcessMemory's), shared with the device's other pools and the
  // memory outside them; nullptr: the pool has one of its own (the cap from cfg, no shared budget).
  ContextPool(const Config& cfg, int device, Upstream& upstream, PoolObserver* observer,
             DeviceAdmission* admission = nullptr);
  ~ContextPool();
  ContextPool(const ContextPool&) = delete;
  ContextPool& operator=(const ContextPool&) = delete;

  // size 0: ptr 0, no error. `state`, if given, receives the pool state after the call, read
  // under the same lock (the trace wants it, and a second lock round-trip costs). `wait`: the
  // deadline of the allocation's waits for the shared budget, when it spans several calls
  // (nullptr: this call's own).
  AllocResult allocate(std::size_t size, PoolStats* state = nullptr, AdmissionWait* wait = nullptr);
  // `size`, if given, receives the freed block's size (0 if not freed); `state` as above.
  FreeResult deallocate(std::uint64_t ptr, std::size_t* size = nullptr, PoolStats* state = nullptr);

  bool owns(std::uint64_t ptr) const;  // inside one of the pool's chunks (frees of it belong here); no lock (inline, below)
  bool block_range(std::uint64_t ptr, std::uint64_t* base, std::size_t* size) const;  // interior too
  // The same, and the start of the upstream reservation (one driver allocation) holding it: what
  // CUDA IPC shares. Asks the driver nothing, so it works on threads with no current context.
  bool block_in_reservation(std::uint64_t ptr, std::uint64_t* base, std::size_t* size,
                            std::uint64_t* reservation_base) const;
  std::size_t block_size(std::uint64_t ptr) const;  // live block starting at ptr, else 0
  PoolStats state() const;
  // total: the cap; free: what the process could still get (headroom under the cap that the driver
  // also has, plus free bytes inside the pool).
  void mem_info(std::size_t* free, std::size_t* total);

  bool has_room(std::size_t bytes) const;  // under the cap as things stand (nothing given back)

  // MemoryHolder: what the device's admission asks of its pools when it is short. What the pool
  // holds that nothing uses goes back (thread caches, the quarantine once its fences retire,
  // wholly free chunks but the preallocated one), once its growth in flight has landed: room for
  // memory outside the pools (which the cap counts too).
  void give_back_idle() override;
  void trim() override;  // give back every wholly free chunk (the preallocated one too)
  void held(std::uint64_t* in_use, std::uint64_t* reserved) const override;
  void abandon();  // the context is gone: forget everything, never call the upstream again
  // In a forked child: the parent's threads may have held the pool's or a cache's lock at the
  // fork; with only this thread left, they are released, then the pool is abandoned.
  void abandon_after_fork();
  static void after_fork_in_child();  // once per child, before abandon_after_fork

  void set_clock(Clock clock, void* ctx);
  // Replay: one thread replays the calls of every recorded thread, and each recorded thread gets
  // the cache its calls would have had: *tid names whose call is being replayed. Set before use.
  void set_recorded_thread(const std::uint32_t* tid) { recorded_thread_ = tid; }
  std::uint64_t cap() const { return admission_->cap(); }
  DeviceAdmission& admission() const { return *admission_; }
  // False for a preallocated region that may not grow (CUPOOL_PREALLOCATE_GROW unset): the pool
  // then never asks the driver for more.
  bool may_grow() const;
  // The vmm policy is in force: blocks lie in one virtual range backed by granules mapped on
  // demand (false under vmm when the upstream has no virtual memory: the pool then grows in
  // chunks). The driver's IPC handles do not cover such blocks: cupool shares them itself
  // (shim/ipc_vmm.h).
  bool virtual_memory() const;

  // Blocks in threads' caches (cfg.thread_cache): freed by the program, kept for its thread.
  std::uint64_t thread_cached() const;

  static constexpr std::size_t kChunkGranularity = growth::kChunkGranularity;
  // Deferred free (a fence per batch of frees: policy/quarantine.h): an allocation waits for the
  // oldest fences while the quarantine holds more than an eighth of the reserved bytes, and at
  // least this much.
  static constexpr std::uint64_t kQuarantineFloor = 256ull << 20;

 private:
  friend class VmmRange;  // works under the pool's lock, within its cap and its transit
  struct Reservation {  // what the upstream gave, by suballocator chunk id
    std::uint64_t base = 0;
    std::size_t size = 0;
  };
  struct Grow {
    std::uint64_t ptr = 0;
    OomClass fail = OomClass::none;
    int driver_code = 0;
  };
  // The pool's lock. When tracing, unlocking publishes the state that events served from a
  // thread cache (without the lock) report, unless state_locked() has just published it.
  class PoolMutex {
   public:
    explicit PoolMutex(const ContextPool* pool) : pool_(pool) {}
    void lock() noexcept {
      spin_.lock();
      pool_->snapshot_fresh_ = false;
    }
    void reset_after_fork() noexcept { spin_.reset_after_fork(); }
    void unlock() noexcept {
      pool_->post_locked();
      if (pool_->observer_ && !pool_->snapshot_fresh_) pool_->publish_state_locked(pool_->state_locked());
      spin_.unlock();
    }

   private:
    SpinLock spin_;
    const ContextPool* pool_;
  };
  using Lock = std::unique_lock<PoolMutex>;
  struct Range {
    std::uint64_t base, end;
  };

  static constexpr std::uint64_t kNever = ~std::uint64_t{0};  // no time yet (next_idle_check_, idle_before)
  static constexpr std::size_t kMaxRequest = std::size_t{1} << 62;  // more than any cap

  std::uint64_t now() const { return clock_(clock_ctx_); }
  std::uint64_t charged() const { return reserved_locked() + transit_; }
  // What the pool holds from the device: its chunks, or (vmm) its mapped granules.
  std::uint64_t reserved_locked() const;
  // Bytes the pool holds that no live or quarantined block uses (thread caches aside).
  std::uint64_t free_locked() const;
  OomClass at_cap() const { return admission_->cap_refusal(); }
  // What the device's admission holds, with this pool's part as it is now (not as last posted).
  std::uint64_t device_charged() const {
    const std::uint64_t all = admission_->charged();
    return (all > posted_ ? all - posted_ : 0) + charged();
  }
  std::uint64_t headroom() const {
    const std::uint64_t cap = admission_->cap(), charged = device_charged();
    return cap > charged ? cap - charged : 0;
  }
  // Tells the device's admission what charged() became (at every unlock).
  void post_locked() const {
    const std::uint64_t now = charged();
    if (now == posted_) return;
    admission_->add(static_cast<std::int64_t>(now) - static_cast<std::int64_t>(posted_));
    posted_ = now;
  }
  // The cap's admission of `bytes` more, atomic across the device's pools and the memory outside
  // them: true when they fit, and the caller then adds them to transit_.
  bool take_locked(std::uint64_t bytes) {
    post_locked();
    if (!admission_->try_take(bytes)) return false;
    posted_ += bytes;
    return true;
  }
  // The one way the pool takes memory from the upstream (a chunk, the preallocated region, or
  // granules mapped): `bytes` are admitted under the cap (false: no room, nothing done), then
  // `call` makes the upstream calls with the lock dropped, while the bytes count in transit as a
  // reservation in flight, which other threads wait for (wait_for_growth) rather than grow beside.
  template <class Call>
  bool reserve_unlocked(Lock& lk, std::uint64_t bytes, Call call) {
    if (!take_locked(bytes)) return false;
    transit_ += bytes;
    ++growing_;
    lk.unlock();
    call();
    lk.lock();
    transit_ -= bytes;
    --growing_;
    transit_cv_.notify_all();  // waiters re-check once the memory is in (same critical section)
    return true;
  }
  // The upstream's memory, past the shared budget (the cap's part is reserve_unlocked's): a chunk
  // of `bytes`, else anything down to `min_bytes` (Upstream::reserve), each ask admitted by the
  // budget on its own, only the smallest waiting for room; and granules mapped. What is given
  // back goes back to the budget too. Called with the lock dropped (or, to give back, held where
  // the release is rare).
  UpstreamStatus take_chunk(std::size_t bytes, std::size_t min_bytes, std::uint64_t* base, std::size_t* got,
                            int* driver_code, AdmissionWait* wait);
  void give_chunk(std::uint64_t base, std::size_t bytes);
  UpstreamStatus map_granules(std::uint64_t va, std::size_t bytes, int* driver_code, AdmissionWait* wait);
  void unmap_granules(std::uint64_t va, std::size_t bytes);
  // Reservation `id` of the suballocator's chunks is [base, base + size) of the upstream's.
  void add_reservation_locked(std::uint32_t id, std::uint64_t base, std::size_t size);
  PoolStats state_locked() const;
  PoolStats reported_state_locked() const;  // state_locked(), published: the caller unlocks next
  void publish_state_locked(const PoolStats& state) const;
  void say_vmm_fallback(const std::string& why) const;  // once per device (VmmRange too)
  void emit(PoolEvent::Kind kind, std::uint64_t size, std::uint64_t ptr, std::uint64_t t0, std::uint64_t dur,
            OomClass oom = OomClass::none, int code = 0);

  // Thread caches.
  bool cache_usable() const;
  ThreadCache* my_cache(bool create);
  void fast_state(PoolStats* state, std::int64_t in_use_change) const;
  std::uint64_t thread_cached_locked() const;
  bool in_a_cache_locked(std::uint64_t ptr) const;
  std::uint64_t reclaim_caches_locked(ThreadCache* only = nullptr);
  void reclaim_large_locked(ThreadCache* cache);
  void give_back_locked(std::uint64_t ptr);
  Suballocator::FreeStatus quarantine_locked(std::uint64_t ptr, std::size_t* size);
  void retire_cache(ThreadCache* cache) override;
  void publish_ranges_locked();

  AllocResult allocate_slow(Lock& lk, std::size_t size, AdmissionWait* wait);
  bool wait_for_growth(Lock& lk);
  bool wait_for_transit(Lock& lk);
  std::uint64_t wait_for_quarantine(Lock& lk, std::uint64_t bytes);
  bool wait_oldest_fence(Lock& lk, bool seal_first, bool bounding = false);
  void bound_quarantine(Lock& lk);
  Grow grow(Lock& lk, std::size_t bytes, AdmissionWait* wait);
  Grow preallocate(Lock& lk, std::size_t bytes, AdmissionWait* wait);
  Grow add_reserved(std::uint64_t base, std::size_t size, std::size_t bytes, bool is_prealloc);
  std::size_t release_free_chunks(Lock& lk, bool include_prealloc, std::uint64_t idle_before);
  std::uint64_t give_back_free(Lock& lk, bool include_prealloc);  // chunks, or (vmm) idle granules
  // A block of `bytes` from the suballocator, or 0. Under vmm only one whose granules are all
  // mapped (the others need map_block).
  std::uint64_t take(std::uint64_t bytes);
  // A block the suballocator freed (or released from quarantine: `fenced`).
  void note_free(std::uint64_t ptr, const Suballocator::FreeInfo& info, bool fenced);

  void give_back_idle_locked(Lock& lk);
  void check_idle(Lock& lk);
  void seal_pending(bool from_free = false);
  void retire_through(std::uint64_t seq);
  void retire_ready();
  void release_batch(const Quarantine::Batch& b);

  const Config cfg_;
  const int device_;
  Upstream& up_;
  PoolObserver* const observer_;
  Clock clock_;
  void* clock_ctx_ = nullptr;

  mutable PoolMutex mu_{this};
  Suballocator sub_;
  std::vector<Reservation> reservations_;
  std::uint64_t device_total_ = 0;
  std::unique_ptr<DeviceAdmission> own_admission_;  // when none was given
  DeviceAdmission* admission_ = nullptr;
  mutable std::uint64_t posted_ = 0;  // charged() as admission_ last heard it (under mu_)
  std::uint64_t transit_ = 0;   // bytes being reserved or released outside the lock
  int growing_ = 0;             // reservations (grow, preallocate) in flight
  // Signalled when a reservation or a release in flight lands: a thread that could not fit
  // beside it waits for it instead of refusing (docs/design.md, "Cap").
  std::condition_variable_any transit_cv_;
  std::condition_variable_any fence_cv_;  // a thread's wait for a fence has retired batches
  std::uint64_t step_ = 0;      // growth: the next chunk size
  std::atomic<bool> abandoned_{false};  // read without the lock by the thread-cache paths

  // preallocate
  bool prealloc_done_ = false;
  bool prealloc_busy_ = false;
  std::uint32_t prealloc_chunk_ = Suballocator::kNoChunk;
  std::condition_variable_any prealloc_cv_;

  // idle release
  std::vector<std::uint64_t> idle_since_;  // by chunk id: when it last became wholly free
  std::uint64_t next_idle_check_ = ~std::uint64_t{0};

  // deferred free
  bool deferred_ = false;
  Quarantine quarantine_;  // under mu_

  // the vmm policy: the virtual range (one suballocator chunk) and its granules
  std::unique_ptr<VmmRange> vmm_;

  // thread caches
  const std::uint64_t id_;                          // unique for the process's lifetime
  std::vector<std::unique_ptr<ThreadCache>> caches_;  // under mu_
  const std::uint32_t* recorded_thread_ = nullptr;  // replay (set_recorded_thread)
  std::unordered_map<std::uint32_t, ThreadCache*> recorded_caches_;
  mutable std::atomic<std::uint64_t> snap_reserved_{0}, snap_largest_{0}, snap_quarantined_{0};
  mutable std::atomic<std::uint32_t> snap_free_blocks_{0};
  mutable bool snapshot_fresh_ = false;  // under mu_: the snapshot is the state as it is now

  // The chunks' address ranges, sorted, for owns() without the lock. Every list published stays
  // allocated until the pool is destroyed (a reader may still be using it; chunks change rarely).
  std::atomic<const std::vector<Range>*> ranges_{nullptr};
  std::vector<std::unique_ptr<std::vector<Range>>> range_lists_;
};

// Inline: every free asks it, of each pool, to find the block's pool.
inline bool ContextPool::owns(std::uint64_t ptr) const {
  const std::vector<Range>* ranges = ranges_.load(std::memory_order_acquire);
  if (ranges == nullptr) return false;
  auto it = std::upper_bound(ranges->begin(), ranges->end(), ptr,
                             [](std::uint64_t p, const Range& r) { return p < r.base; });
  return it != ranges->begin() && ptr < std::prev(it)->end;
}

}  // namespace cupool
