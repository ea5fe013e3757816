// What a ContextPool gives back (context_pool.h): wholly free chunks (idle or all) or idle
// granules, its caches and quarantine when the device's admission needs room, and everything
// when its context goes.
#include "context_pool.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "vmm_range.h"

namespace cupool {

void ContextPool::give_back_idle_locked(Lock& lk) {
  reclaim_caches_locked();
  retire_ready();
  while (!quarantine_.empty() && wait_oldest_fence(lk, true)) {
  }
  give_back_free(lk, false);
}

// The admission refuses only once the bytes the process holds, plus what it asks, pass the cap
// after this: the pool's growth in flight has landed (it counts against the cap until then),
// what nothing uses has gone back, and no release of another thread is still in flight.
void ContextPool::give_back_idle() {
  Lock lk(mu_);
  while (wait_for_growth(lk)) {
  }
  if (abandoned_) return;
  give_back_idle_locked(lk);
  wait_for_transit(lk);
}

void ContextPool::held(std::uint64_t* in_use, std::uint64_t* reserved) const {
  Lock lk(mu_);
  const PoolStats s = state_locked();
  *in_use = s.in_use;
  *reserved = s.reserved;
}

std::uint64_t ContextPool::give_back_free(Lock& lk, bool include_prealloc) {
  return vmm_->active() ? vmm_->unmap_idle(lk, ~std::uint64_t{0}, true)
                        : release_free_chunks(lk, include_prealloc, kNever);
}

// Gives back wholly free chunks (those idle since before `idle_before`, kNever: all); the
// preallocated chunk only when asked. The lock is dropped around the upstream calls.
std::size_t ContextPool::release_free_chunks(Lock& lk, bool include_prealloc, std::uint64_t idle_before) {
  // cuMemFree is a call a capture may forbid the calling thread: chunks stay until it has ended.
  // The vmm policy's range is never given back while the pool lives (its granules are).
  if (up_.capturing() || vmm_->active()) return 0;
  std::vector<Reservation> gone;
  std::vector<std::uint64_t> bases;
  sub_.for_each_free_chunk([&](std::uint32_t id, std::uint64_t base, std::size_t) {
    if (id == prealloc_chunk_ && !include_prealloc) return;
    if (idle_before != kNever && idle_since_[id] > idle_before) return;
    gone.push_back(reservations_[id]);
    bases.push_back(base);
    if (id == prealloc_chunk_) {
      prealloc_chunk_ = Suballocator::kNoChunk;
      prealloc_done_ = false;  // the next allocation preallocates again
    }
  });
  if (gone.empty()) return 0;
  std::uint64_t bytes = 0;
  for (std::size_t i = 0; i < gone.size(); ++i) {
    sub_.remove_chunk(bases[i]);
    bytes += gone[i].size;
  }
  publish_ranges_locked();
  transit_ += bytes;  // still counts against the cap until the driver has it back
  lk.unlock();
  std::vector<std::pair<std::uint64_t, std::uint64_t>> times;
  times.reserve(gone.size());
  for (const Reservation& r : gone) {
    std::uint64_t t0 = now();
    give_chunk(r.base, r.size);
    times.emplace_back(t0, now() - t0);
  }
  lk.lock();
  transit_ -= bytes;
  transit_cv_.notify_all();
  for (std::size_t i = 0; i < gone.size(); ++i)
    emit(PoolEvent::Kind::release, gone[i].size, gone[i].base, times[i].first, times[i].second);
  return gone.size();
}

// Idle release: a chunk (not the preallocated one) wholly free for release_idle_ns is given back.
// Checked on allocate/deallocate, only once the earliest candidate can have expired.
void ContextPool::check_idle(Lock& lk) {
  if (next_idle_check_ == kNever) return;  // no wholly free chunk: no need to read the clock
  std::uint64_t t = now();
  if (t < next_idle_check_ || abandoned_) return;
  const std::uint64_t idle = *cfg_.release_idle_ns;
  std::uint64_t next = kNever;
  sub_.for_each_free_chunk([&](std::uint32_t id, std::uint64_t, std::size_t) {
    if (id != prealloc_chunk_ && idle_since_[id] + idle > t) next = std::min(next, idle_since_[id] + idle);
  });
  next_idle_check_ = next;
  if (t >= idle) release_free_chunks(lk, false, t - idle);
}

void ContextPool::trim() {
  Lock lk(mu_);
  if (abandoned_) return;
  reclaim_caches_locked();
  seal_pending();
  retire_ready();
  give_back_free(lk, true);
}

void ContextPool::after_fork_in_child() {
  thread_caches::after_fork_in_child();
}

void ContextPool::abandon_after_fork() {
  mu_.reset_after_fork();
  for (auto& c : caches_) c->lock.reset_after_fork();
  abandon();
}

void ContextPool::abandon() {
  Lock lk(mu_);
  abandoned_ = true;
  for (auto& c : caches_) {  // the memory is gone with the context
    std::lock_guard g(c->lock);
    c->drain([](std::uint64_t, std::uint64_t) {});
    c->forget_live();
  }
  sub_.clear();
  publish_ranges_locked();
  reservations_.clear();
  idle_since_.clear();
  quarantine_.clear();
  vmm_->clear();
  prealloc_chunk_ = Suballocator::kNoChunk;
  next_idle_check_ = kNever;
}

}  // namespace cupool
