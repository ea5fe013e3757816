// ContextPool's miss path (context_pool.h): what an allocation the pool's free blocks cannot
// serve goes through, the growth and preallocate policies, and the upstream's memory taken and
// given back through the device's admission (the cap, then the shared budget).
#include "context_pool.h"

#include <algorithm>

#include "units.h"
#include "vmm_range.h"

namespace cupool {

// The miss path, in order: retired fences; (first use) preallocation; waiting for the oldest
// fences when the quarantine holds enough; growth; waiting for the remaining fences; giving back wholly free chunks and growing once more; then out of memory.
AllocResult ContextPool::allocate_slow(Lock& lk, std::size_t size, AdmissionWait* wait) {
  if (abandoned_) return {0, OomClass::device, 0};
  AdmissionWait own;  // every wait of this allocation for the shared budget ends at one deadline
  if (wait == nullptr) wait = &own;
  if (size > kMaxRequest) {  // more than any cap: the cap's refusal
    emit(PoolEvent::Kind::oom, size, 0, now(), 0, at_cap());
    return {0, at_cap(), 0};
  }
  const std::uint64_t bytes = round_up(size, Suballocator::kAlignment);
  // With no limit set, the cap is the device's size: a refusal there is the device's, not a
  // limit's (a used-up preallocation that may not grow included).
  Grow last{0, at_cap(), 0};

  if (!quarantine_.empty()) {
    seal_pending();
    retire_ready();
    if (std::uint64_t p = take(bytes)) return {p};
  }
  // Blocks in threads' caches are free memory to the program: take them back before growing.
  if (reclaim_caches_locked() > 0) {
    retire_ready();
    if (std::uint64_t p = take(bytes)) return {p};
  }
  if (cfg_.policy == PolicyKind::preallocate && !prealloc_done_) {
    Grow g = preallocate(lk, bytes, wait);
    if (g.ptr) return {g.ptr};
    if (std::uint64_t p = take(bytes)) return {p};  // another thread's preallocation
    if (g.fail != OomClass::none) last = g;
  }
  // Memory in quarantine is the program's own and free again once the device catches up.
  // Waiting for it (oldest fence first) before growing keeps the pool from growing by however
  // far the host runs ahead of the device (measured on the H200: a PyTorch step loop grew the
  // pool tenfold when growth came first). The host waits only for old work; newer work stays
  // queued, so the device does not go idle.
  if (sub_.held() >= bytes)
    if (std::uint64_t p = wait_for_quarantine(lk, bytes)) return {p};
  // Another thread's reservation in flight counts against the cap until it lands, and its chunk
  // may well serve this request: wait for it rather than grow beside it or refuse.
  while (wait_for_growth(lk))
    if (std::uint64_t p = take(bytes)) return {p};
  if (may_grow()) {
    Grow g = grow(lk, bytes, wait);
    if (g.ptr) return {g.ptr};
    last = g;
  }
  if (std::uint64_t p = wait_for_quarantine(lk, bytes)) return {p};
  if (may_grow() && give_back_free(lk, false) > 0) {
    if (std::uint64_t p = take(bytes)) return {p};
    Grow g = grow(lk, bytes, wait);
    if (g.ptr) return {g.ptr};
    last = g;
  }
  if (std::uint64_t p = take(bytes)) return {p};  // another thread freed meanwhile
  // Before refusing: bytes another thread is giving back or taking still count against the cap.
  if (wait_for_transit(lk)) {
    if (std::uint64_t p = take(bytes)) return {p};
    if (may_grow()) {
      Grow g = grow(lk, bytes, wait);
      if (g.ptr) return {g.ptr};
      last = g;
    }
  }

  AllocResult r{0, last.fail, last.driver_code};
  if (free_locked() >= bytes) r = {0, OomClass::fragmentation, 0};
  if (r.oom == OomClass::none) r.oom = at_cap();
  emit(PoolEvent::Kind::oom, size, 0, now(), 0, r.oom, r.driver_code);
  return r;
}

// The growth policy (its rule: growth_rule.h): a chunk of the next step, or at least what the
// allocation needs, never more than the cap leaves.
ContextPool::Grow ContextPool::grow(Lock& lk, std::size_t bytes, AdmissionWait* wait) {
  if (vmm_->active()) {
    Grow g = vmm_->map_block(lk, bytes, wait);
    if (g.ptr || vmm_->active()) return g;  // else the range could not be reserved: grow in chunks
  }
  const growth::Ask ask = growth::next_chunk(step_, bytes, headroom());
  std::uint64_t base = 0, t0 = 0, dur = 0;
  std::size_t got = 0;
  int code = 0;
  UpstreamStatus st = UpstreamStatus::ok;
  // Past the cap; or another pool of the device (another context) took the room since headroom().
  if (ask.need == 0 || !reserve_unlocked(lk, ask.chunk, [&] {
        t0 = now();
        st = take_chunk(ask.chunk, ask.need, &base, &got, &code, wait);
        dur = now() - t0;
      }))
    return {0, at_cap(), 0};
  if (abandoned_) {  // the context went away meanwhile: the upstream (detached) makes no call
    if (st == UpstreamStatus::ok) give_chunk(base, got);
    return {0, OomClass::device, 0};
  }
  if (st == UpstreamStatus::share_exhausted) return {0, OomClass::share, 0};
  if (st != UpstreamStatus::ok) return {0, OomClass::device, code};
  step_ = growth::next_step(step_, cfg_.growth_chunk_max);
  Grow g = add_reserved(base, got, bytes, false);
  emit(PoolEvent::Kind::grow, got, base, t0, dur);
  return g;
}

// First use under the preallocate policy: one chunk of preallocate.resolve(total), clamped to
// the cap. If the driver refuses, try once with what it reports free.
ContextPool::Grow ContextPool::preallocate(Lock& lk, std::size_t bytes, AdmissionWait* wait) {
  if (prealloc_busy_) {  // another thread is reserving it: wait for the outcome
    prealloc_cv_.wait(lk, [&] { return !prealloc_busy_; });
    return {};
  }
  auto granular = [](std::uint64_t v) {
    return v >= kChunkGranularity ? round_down(v, kChunkGranularity) : round_down(v, Suballocator::kAlignment);
  };
  std::uint64_t want = granular(std::min<std::uint64_t>(cfg_.preallocate.resolve(device_total_), headroom()));
  if (want == 0) {
    prealloc_done_ = true;
    return {};
  }
  std::uint64_t base = 0, t0 = 0, dur = 0;
  std::size_t got = want;
  int code = 0;
  UpstreamStatus st = UpstreamStatus::ok;
  prealloc_busy_ = true;  // (the lock is held throughout where the cap refuses)
  const bool admitted = reserve_unlocked(lk, want, [&] {
    t0 = now();
    st = take_chunk(want, want, &base, &got, &code, wait);
    if (st == UpstreamStatus::out_of_memory) {
      std::size_t total = 0, free = 0;
      up_.device_memory(&total, &free);
      got = granular(std::min<std::uint64_t>(free, want));
      std::size_t exact = 0;
      if (got > 0 && got < want) st = take_chunk(got, got, &base, &exact, &code, wait);
    }
    dur = now() - t0;
  });
  prealloc_busy_ = false;
  prealloc_cv_.notify_all();
  if (!admitted) return {0, at_cap(), 0};
  if (abandoned_) {
    if (st == UpstreamStatus::ok) give_chunk(base, got);
    return {0, OomClass::device, 0};
  }
  if (st == UpstreamStatus::share_exhausted) return {0, OomClass::share, 0};
  if (st != UpstreamStatus::ok) return {0, OomClass::device, code};
  prealloc_done_ = true;
  Grow g = add_reserved(base, got, bytes, true);
  emit(PoolEvent::Kind::grow, got, base, t0, dur);
  return g;
}

// A new reservation joins the suballocator (aligned to 512 bytes if the upstream gave less),
// and serves `bytes` at once, in the same critical section, so no other thread can take it.
ContextPool::Grow ContextPool::add_reserved(std::uint64_t base, std::size_t size, std::size_t bytes, bool is_prealloc) {
  std::uint64_t start = round_up(base, Suballocator::kAlignment);
  std::uint64_t usable = size > start - base ? round_down(size - (start - base), Suballocator::kAlignment) : 0;
  std::uint32_t id = usable ? sub_.add_chunk(start, usable) : Suballocator::kNoChunk;
  if (id == Suballocator::kNoChunk) {
    give_chunk(base, size);  // unusable (overlaps a chunk we hold?): give it straight back
    return {0, OomClass::device, 0};
  }
  add_reservation_locked(id, base, size);
  idle_since_[id] = now();
  if (is_prealloc) prealloc_chunk_ = id;
  return {sub_.allocate(bytes), OomClass::none, 0};
}

namespace {

// Memory the shared budget admitted first (waiting for room if `may_wait`), then taken from the
// driver by `take`; given back to the budget if the driver refuses. The budget's refusal is its
// own status (the pool's out-of-memory class share).
template <class Take>
UpstreamStatus admitted(DeviceAdmission& admission, std::size_t bytes, bool may_wait, AdmissionWait* wait,
                        int* driver_code, Take take) {
  if (!admission.admit_shared(bytes, may_wait, wait)) {
    *driver_code = 0;
    return UpstreamStatus::share_exhausted;
  }
  const UpstreamStatus st = take();
  if (st != UpstreamStatus::ok) admission.release_shared(bytes);
  return st;
}

}  // namespace

UpstreamStatus ContextPool::take_chunk(std::size_t bytes, std::size_t min_bytes, std::uint64_t* base,
                                       std::size_t* got, int* driver_code, AdmissionWait* wait) {
  if (admission_->share() == nullptr) return up_.reserve(bytes, min_bytes, base, got, driver_code);
  const UpstreamStatus st = reserve_at_least(bytes, min_bytes, got, [&](std::size_t n, bool last) {
    std::size_t exact = 0;
    return admitted(*admission_, n, last, wait, driver_code, [&] { return up_.reserve(n, n, base, &exact, driver_code); });
  });
  admission_->publish();
  return st;
}

void ContextPool::give_chunk(std::uint64_t base, std::size_t bytes) {
  up_.release(base, bytes);
  admission_->release_shared(bytes);
}

UpstreamStatus ContextPool::map_granules(std::uint64_t va, std::size_t bytes, int* driver_code, AdmissionWait* wait) {
  const UpstreamStatus st =
      admitted(*admission_, bytes, true, wait, driver_code, [&] { return up_.map(va, bytes, driver_code); });
  admission_->publish();
  return st;
}

void ContextPool::unmap_granules(std::uint64_t va, std::size_t bytes) {
  up_.unmap(va, bytes);
  admission_->release_shared(bytes);
}

void ContextPool::add_reservation_locked(std::uint32_t id, std::uint64_t base, std::size_t size) {
  publish_ranges_locked();
  if (reservations_.size() <= id) {
    reservations_.resize(id + 1);
    idle_since_.resize(id + 1, 0);
  }
  reservations_[id] = Reservation{base, size};
}

std::uint64_t ContextPool::take(std::uint64_t bytes) {
  return vmm_->active() ? vmm_->take(bytes) : sub_.allocate(bytes);
}

// Waits until a reservation that another thread has in flight lands (the lock is dropped
// meanwhile). False when none was in flight. Reservations do not wait for each other, so this
// cannot deadlock; it never waits on device work.
bool ContextPool::wait_for_growth(Lock& lk) {
  if (growing_ == 0) return false;
  transit_cv_.wait(lk, [&] { return growing_ == 0 || abandoned_; });
  return !abandoned_;
}

// The same for any bytes in transit, releases included (a release may wait for the device, as
// cuMemFree does): only on the way to a refusal.
bool ContextPool::wait_for_transit(Lock& lk) {
  if (transit_ == 0) return false;
  transit_cv_.wait(lk, [&] { return transit_ == 0 || abandoned_; });
  return !abandoned_;
}

}  // namespace cupool
