// ContextPool's lookups for the rest of the process (context_pool.h): which blocks it owns, their
// ranges and reservations, its state and memory info; no call here changes the pool.
#include "context_pool.h"

#include <algorithm>
#include <vector>

namespace cupool {

bool ContextPool::block_range(std::uint64_t ptr, std::uint64_t* base, std::size_t* size) const {
  Lock lk(mu_);
  return sub_.block_range(ptr, base, size) && !in_a_cache_locked(*base);
}

bool ContextPool::block_in_reservation(std::uint64_t ptr, std::uint64_t* base, std::size_t* size,
                                      std::uint64_t* reservation_base) const {
  Lock lk(mu_);
  if (!sub_.block_range(ptr, base, size) || in_a_cache_locked(*base)) return false;
  const std::uint32_t id = sub_.chunk_of(*base);
  if (id == Suballocator::kNoChunk || id >= reservations_.size()) return false;
  *reservation_base = reservations_[id].base;
  return true;
}

std::size_t ContextPool::block_size(std::uint64_t ptr) const {
  Lock lk(mu_);
  return in_a_cache_locked(ptr) ? 0 : sub_.block_size(ptr);
}

// A block in a thread's bin is free to the program, though the suballocator holds it live.
bool ContextPool::in_a_cache_locked(std::uint64_t ptr) const {
  for (const auto& c : caches_) {
    std::lock_guard g(c->lock);
    if (c->holds(ptr)) return true;
  }
  return false;
}

PoolStats ContextPool::state() const {
  Lock lk(mu_);
  return state_locked();
}

void ContextPool::mem_info(std::size_t* free, std::size_t* total) {
  std::size_t dev_total = 0, dev_free = 0;
  up_.device_memory(&dev_total, &dev_free);  // outside the lock: the real query is a driver call
  Lock lk(mu_);
  std::uint64_t t = admission_->limited() ? admission_->cap() : dev_total;
  std::uint64_t f = std::min<std::uint64_t>(headroom(), dev_free) + free_locked() + thread_cached_locked();
  if (free) *free = std::min(f, t);
  if (total) *total = t;
}

std::uint64_t ContextPool::thread_cached() const {
  Lock lk(mu_);
  return thread_cached_locked();
}

bool ContextPool::has_room(std::size_t bytes) const {
  Lock lk(mu_);
  return bytes <= headroom();
}

}  // namespace cupool
