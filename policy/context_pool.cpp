// ContextPool's allocations and frees (context_pool.h): the hit path, thread caches, events.
// Beside it: context_pool_grow.cpp (the miss path, the growth and preallocate policies, the
// upstream's memory through the device's admission), context_pool_fences.cpp (deferred frees
// behind fences), context_pool_give_back.cpp (memory given back), context_pool_queries.cpp
// (lookups and state), vmm_range.cpp (the vmm policy).
#include "context_pool.h"

#include <algorithm>
#include <array>
#include <unordered_map>
#include <utility>

#include "log.h"
#include "thread_id.h"
#include "units.h"
#include "vmm_range.h"

namespace cupool {

namespace {

FreeResult to_free_result(Suballocator::FreeStatus s) {
  switch (s) {
    case Suballocator::FreeStatus::freed: return FreeResult::freed;
    case Suballocator::FreeStatus::double_free: return FreeResult::double_free;
    case Suballocator::FreeStatus::not_owned: break;
  }
  return FreeResult::not_owned;
}

std::atomic<std::uint64_t> g_next_pool_id{1};

}  // namespace

ContextPool::ContextPool(const Config& cfg, int device, Upstream& upstream, PoolObserver* observer,
                       DeviceAdmission* admission)
    : cfg_(cfg), device_(device), up_(upstream), observer_(observer), clock_(&monotonic_clock), id_(g_next_pool_id++) {
  thread_caches::add_owner(id_, this);
  std::size_t total = 0, free = 0;
  up_.device_memory(&total, &free);
  device_total_ = total;
  if (admission == nullptr) own_admission_ = std::make_unique<DeviceAdmission>(cfg_, device, total);
  admission_ = admission ? admission : own_admission_.get();
  admission_->add_holder(this);
  step_ = growth::first_step(cfg_.growth_chunk);
  deferred_ = cfg_.free_mode == FreeMode::deferred;
  vmm_ = std::make_unique<VmmRange>(*this, cfg_.policy == PolicyKind::vmm && up_.vmm_granularity() > 0, cfg_.vmm_tight);
  if (cfg_.policy == PolicyKind::vmm && !vmm_->active())
    say_vmm_fallback("the driver says " + up_.no_virtual_memory_reason());
}

// A default must never be why a program fails: where the vmm policy cannot run, the pool grows
// in chunks as growth does, and says so once per device.
void ContextPool::say_vmm_fallback(const std::string& why) const {
  static std::atomic<std::uint64_t> said{0};  // a bit per device (0 to 63; the rest share bit 63)
  const std::uint64_t bit = std::uint64_t{1} << std::min(device_, 63);
  if (said.fetch_or(bit) & bit) return;
  log_warn("device " + std::to_string(device_) + ": the vmm policy grows in chunks here, as growth does: " + why);
}

ContextPool::~ContextPool() {
  thread_caches::remove_owner(id_);
  admission_->remove_holder(this);
  // Last, once what the pool holds has gone back below: the admission forgets its part.
  struct Settle {
    ContextPool* pool;
    ~Settle() {
      pool->admission_->add(-static_cast<std::int64_t>(pool->posted_));
      pool->posted_ = 0;
    }
  } settle{this};
  if (abandoned_) return;
  if (vmm_->active()) {
    vmm_->release_all();
    return;
  }
  sub_.for_each_chunk([&](std::uint32_t id, std::uint64_t, std::size_t) {
    give_chunk(reservations_[id].base, reservations_[id].size);
  });
}

void ContextPool::set_clock(Clock clock, void* ctx) {
  Lock lk(mu_);
  clock_ = clock ? clock : &monotonic_clock;
  clock_ctx_ = ctx;
}

bool ContextPool::may_grow() const {
  return cfg_.policy != PolicyKind::preallocate || cfg_.preallocate_grow;
}

bool ContextPool::virtual_memory() const { return vmm_->active(); }

std::uint64_t ContextPool::reserved_locked() const {
  return vmm_->active() ? vmm_->mapped_bytes() : sub_.reserved();
}

std::uint64_t ContextPool::free_locked() const {
  if (!vmm_->active()) return sub_.free_bytes();
  const std::uint64_t taken = sub_.in_use() + sub_.held(), mapped = vmm_->mapped_bytes();
  return mapped > taken ? mapped - taken : 0;
}

// ---- allocation ----------------------------------------------------------------------------------

AllocResult ContextPool::allocate(std::size_t size, PoolStats* state, AdmissionWait* wait) {
  if (size == 0) return {};
  const std::uint64_t bytes = round_up(std::min<std::uint64_t>(size, kMaxRequest), Suballocator::kAlignment);
  ThreadCache* tc = nullptr;
  if (cfg_.thread_cache && !cfg_.release_idle_ns) {
    tc = my_cache(true);
    if (tc != nullptr && cache_usable()) {
      std::uint64_t p = 0;
      bool large_kept = false;
      {
        std::lock_guard g(tc->lock);
        p = tc->take(bytes);
        if (p) tc->track(p, bytes);  // untracked if full: its free then takes the pool's path
        large_kept = tc->holds_large();
      }
      if (p && !large_kept) {
        if (state) fast_state(state, static_cast<std::int64_t>(bytes));
        return {p};
      }
      if (p) {  // served, but a large block kept for this allocation goes back now
        Lock lk(mu_);
        reclaim_large_locked(tc);
        if (state) *state = reported_state_locked();
        return {p};
      }
    }
  }
  Lock lk(mu_);
  if (tc != nullptr && !cache_usable() && tc->bytes() > 0)
    reclaim_caches_locked(tc);  // fences now needed
  else if (tc != nullptr)
    reclaim_large_locked(tc);  // before allocating, so that it can coalesce and serve this
  if (cfg_.release_idle_ns) check_idle(lk);
  if (deferred_ && quarantine_.open_full() && quarantine_.seal_due(now())) {
    seal_pending();  // a full batch that frees left open (they seal at most once an interval)
    retire_ready();
  }
  if (deferred_ && sub_.held() > kQuarantineFloor) bound_quarantine(lk);
  AllocResult r;
  if (std::uint64_t p = take(bytes))
    r.ptr = p;
  else
    r = allocate_slow(lk, size, wait);
  if (!lk.owns_lock()) lk.lock();
  if (r.ptr) {
    if (tc != nullptr) {
      std::lock_guard g(tc->lock);
      tc->track(r.ptr, bytes);
    }
  }
  if (state) *state = reported_state_locked();
  return r;
}

// ---- free ------------------------------------------------------------------------------------------

FreeResult ContextPool::deallocate(std::uint64_t ptr, std::size_t* size, PoolStats* state) {
  std::size_t freed_size = 0;
  auto finish = [&](Suballocator::FreeStatus st) {
    if (size) *size = st == Suballocator::FreeStatus::freed ? freed_size : 0;
    if (state) *state = reported_state_locked();
    return to_free_result(st);
  };
  if (!deferred_) {
    // As cudaFree does: wait for the device, then the memory is reusable at once. Done before
    // looking the pointer up so the lock is taken once; a foreign pointer's free waits anyway.
    up_.synchronize();
  }
  // Reuse needs a fence: deferred frees once streams overlap; and, during a stream capture, sync
  // frees too: the wait above then covered only the work that is not being captured, and work
  // that threads put on their per-thread streams meanwhile may not be covered (docs/design.md,
  // "Stream capture"). Such blocks wait in quarantine until the capture has ended.
  const bool hold = deferred_ ? up_.needs_fences() : up_.capturing();
  // A block this thread got from the pool goes into its cache when reuse needs no fence.
  bool known_live = false;  // this thread tracked it: live, and in nobody's bin
  if (cfg_.thread_cache && ptr != 0) {
    if (ThreadCache* tc = my_cache(false)) {
      std::uint64_t bytes = 0;
      std::unique_lock g(tc->lock);
      if (tc->untrack(ptr, &bytes)) {
        known_live = true;
        if (!hold && cache_usable() && tc->put(ptr, bytes)) {
          g.unlock();
          if (size) *size = bytes;
          if (state) fast_state(state, -static_cast<std::int64_t>(bytes));
          return FreeResult::freed;
        }
      }
    }
  }
  Lock lk(mu_);
  if (cfg_.thread_cache && !known_live && !caches_.empty() && sub_.block_size(ptr) != 0) {
    // Another thread's block, or one already freed into a cache (a double free, whether the
    // block waits in a bin or in a large slot).
    for (auto& c : caches_) {
      std::lock_guard g(c->lock);
      if (c->holds(ptr)) return finish(Suballocator::FreeStatus::double_free);
      std::uint64_t ignored = 0;
      c->untrack(ptr, &ignored);
    }
  }
  if (hold) {
    auto st = quarantine_locked(ptr, &freed_size);
    if (st != Suballocator::FreeStatus::freed) return finish(st);
    // A fence costs one call per stream the process made (PyTorch makes 128 once it uses a side
    // stream), and on the H200 such calls took about 1.7 us each while the device was busy, so
    // sealing at every 64 MiB freed made the host, not the device, set a training step's pace.
    // Frees seal at most once per kSealIntervalNs; an allocation that misses seals at once.
    if (deferred_ && quarantine_.open_full() && quarantine_.seal_due(now())) {
      seal_pending(true);
      retire_ready();
    }
    if (cfg_.release_idle_ns) check_idle(lk);
    if (vmm_->active()) vmm_->settle(lk);
    return finish(st);
  }
  // sync mode, or deferred with one order of work only: stream order alone makes reuse safe
  Suballocator::FreeInfo info;
  auto st = sub_.free(ptr, &info);
  freed_size = info.size;
  if (st == Suballocator::FreeStatus::freed) {
    note_free(ptr, info, false);
    if (cfg_.release_idle_ns) check_idle(lk);
    if (vmm_->active()) vmm_->settle(lk);
  }
  return finish(st);
}

// ---- thread caches -----------------------------------------------------------------------------

// Reuse without a fence is safe: after cudaFree's wait (sync), or while all work is in one order.
// Not with idle release: a chunk whose blocks sit in a thread's cache would never look idle.
bool ContextPool::cache_usable() const {
  return !abandoned_.load(std::memory_order_relaxed) && !cfg_.release_idle_ns && (!deferred_ || !up_.needs_fences());
}

ThreadCache* ContextPool::my_cache(bool create) {
  if (recorded_thread_) [[unlikely]] {
    // Replay: the cache of the recorded thread whose call this is.
    if (auto it = recorded_caches_.find(*recorded_thread_); it != recorded_caches_.end()) return it->second;
    if (!create) return nullptr;
    Lock lk(mu_);
    if (abandoned_) return nullptr;
    caches_.push_back(std::make_unique<ThreadCache>());
    return recorded_caches_[*recorded_thread_] = caches_.back().get();
  }
  if (ThreadCache* c = thread_caches::mine(id_)) return c;
  if (!create) return nullptr;
  if (!thread_caches::room()) return nullptr;  // this thread uses more pools than it keeps caches for
  ThreadCache* cache = nullptr;
  {
    Lock lk(mu_);
    if (abandoned_) return nullptr;
    for (auto& c : caches_)
      if (c->orphan) {
        cache = c.get();
        cache->orphan = false;
        break;
      }
    if (cache == nullptr) {
      try {
        caches_.push_back(std::make_unique<ThreadCache>());
      } catch (...) {
        return nullptr;
      }
      cache = caches_.back().get();
    }
  }
  thread_caches::adopt(id_, cache);
  return cache;
}

// The state a cache-served event reports: the pool's as of its last locked operation, and the
// change to the bytes in use (the trace writer derives in_use and cached from it).
void ContextPool::fast_state(PoolStats* s, std::int64_t in_use_change) const {
  s->reserved = snap_reserved_.load(std::memory_order_relaxed);
  s->largest_free = snap_largest_.load(std::memory_order_relaxed);
  s->quarantined = snap_quarantined_.load(std::memory_order_relaxed);
  s->free_blocks = snap_free_blocks_.load(std::memory_order_relaxed);
  s->cache_delta = in_use_change;
  s->pool = id_;
}

std::uint64_t ContextPool::thread_cached_locked() const {
  std::uint64_t n = 0;
  for (const auto& c : caches_) n += c->bytes();
  return n;
}

// Empties the bins of every cache (or of `only`) back into the pool: free at once, or into
// quarantine when reuse now needs a fence.
std::uint64_t ContextPool::reclaim_caches_locked(ThreadCache* only) {
  std::uint64_t bytes = 0;
  for (auto& c : caches_) {
    if (only != nullptr && c.get() != only) continue;
    std::lock_guard g(c->lock);
    c->drain([&](std::uint64_t ptr, std::uint64_t size) {
      bytes += size;
      give_back_locked(ptr);
    });
  }
  if (quarantine_.has_open()) {
    seal_pending();
    retire_ready();
  }
  return bytes;
}

// The large block `cache` kept for its thread's next allocation goes back to the pool. Called by
// that thread only, so the look before the cache's lock is safe (ThreadCache::holds_large).
void ContextPool::reclaim_large_locked(ThreadCache* cache) {
  if (!cache->holds_large()) return;
  std::lock_guard g(cache->lock);
  cache->drain_large([&](std::uint64_t ptr, std::uint64_t) { give_back_locked(ptr); });
}

// Holds a live block and adds it to the open batch (sealed behind a fence later).
Suballocator::FreeStatus ContextPool::quarantine_locked(std::uint64_t ptr, std::size_t* size) {
  const auto st = sub_.hold(ptr, size);
  if (st == Suballocator::FreeStatus::freed) quarantine_.hold(ptr, *size);
  return st;
}

void ContextPool::give_back_locked(std::uint64_t ptr) {
  if (deferred_ && up_.needs_fences()) {
    std::size_t held = 0;
    quarantine_locked(ptr, &held);
    return;
  }
  Suballocator::FreeInfo info;
  if (sub_.free(ptr, &info) == Suballocator::FreeStatus::freed) note_free(ptr, info, false);
}

// The cache's thread exited: its bins go back, its live blocks stay live (another thread may
// free them), and the cache waits for a new thread to adopt it.
void ContextPool::retire_cache(ThreadCache* cache) {
  Lock lk(mu_);
  if (!abandoned_) reclaim_caches_locked(cache);
  std::lock_guard g(cache->lock);
  cache->forget_live();
  cache->orphan = true;
}

void ContextPool::publish_ranges_locked() {
  auto list = std::make_unique<std::vector<Range>>();
  sub_.for_each_chunk([&](std::uint32_t, std::uint64_t base, std::size_t size) { list->push_back({base, base + size}); });
  std::sort(list->begin(), list->end(), [](const Range& a, const Range& b) { return a.base < b.base; });
  ranges_.store(list.get(), std::memory_order_release);
  range_lists_.push_back(std::move(list));
}

// Under vmm, the block's granules lose a user (VmmRange::note_free); else a chunk it leaves
// wholly free may be given back once idle.
void ContextPool::note_free(std::uint64_t ptr, const Suballocator::FreeInfo& info, bool fenced) {
  if (vmm_->active()) {
    vmm_->note_free(ptr, info.size, fenced, deferred_);
    return;
  }
  if (!info.chunk_now_free || !cfg_.release_idle_ns) return;
  std::uint64_t t = now();
  idle_since_[info.chunk] = t;
  next_idle_check_ = std::min(next_idle_check_, t + *cfg_.release_idle_ns);
}

PoolStats ContextPool::state_locked() const {
  PoolStats s;
  s.reserved = reserved_locked();
  s.cached = thread_cached_locked();
  s.in_use = sub_.in_use() - s.cached;  // cached blocks are free to the program
  // Under vmm, a free block is virtual: what could be handed out without the driver is at most
  // the free bytes mapped.
  s.largest_free = vmm_->active() ? std::min(sub_.largest_free(), free_locked()) : sub_.largest_free();
  s.quarantined = sub_.held();
  s.free_blocks = sub_.free_blocks();
  s.pool = id_;
  return s;
}

// What events served from a thread cache report (fast_state): published at unlock while tracing.
void ContextPool::publish_state_locked(const PoolStats& s) const {
  snap_reserved_.store(s.reserved, std::memory_order_relaxed);
  snap_largest_.store(s.largest_free, std::memory_order_relaxed);
  snap_quarantined_.store(s.quarantined, std::memory_order_relaxed);
  snap_free_blocks_.store(s.free_blocks, std::memory_order_relaxed);
}

// The state a call reports as its last step before it unlocks: published now, so that the
// unlock need not compute it again.
PoolStats ContextPool::reported_state_locked() const {
  const PoolStats s = state_locked();
  if (observer_) {
    publish_state_locked(s);
    snapshot_fresh_ = true;
  }
  return s;
}

// ---- events ----------------------------------------------------------------------------------------

void ContextPool::emit(PoolEvent::Kind kind, std::uint64_t size, std::uint64_t ptr, std::uint64_t t0,
                      std::uint64_t dur, OomClass oom, int code) {
  if (!observer_) return;
  PoolEvent e;
  e.kind = kind;
  e.t_ns = t0;
  e.dur_ns = dur;
  e.size = size;
  e.ptr = ptr;
  e.tid = current_thread_id();
  e.device = device_;
  e.driver_code = code;
  e.oom = oom;
  e.granules = vmm_->active() && (kind == PoolEvent::Kind::grow || kind == PoolEvent::Kind::release);
  e.has_stats = true;
  e.stats = state_locked();
  observer_->pool_event(e);
}

}  // namespace cupool
