// A thread's cache in front of a ContextPool: the blocks it freed, kept for its next allocation of
// the same size, and the blocks it got from the pool (so a free knows their size without the
// pool's lock). Blocks up to kMaxBlock wait in bins; of larger ones only the first the thread
// frees after an allocation is kept, and only until its next allocation: one of the same size
// takes it, any other gives it back to the pool first, so large blocks coalesce as if they had
// never been cached. With 8 threads allocating at once, every pair taking the pool's one lock cost
// 1.1-1.3 us of wall time per pair on the H200 host; a thread that reuses its own blocks touches
// no shared cache line at all. Not thread-safe by itself: the owner and the pool (reclaiming
// blocks, checking a free from another thread) take `lock`; it is only ever taken after the
// pool's lock, never before it.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "spin_lock.h"

namespace cupool {

class ThreadCache {
 public:
  static constexpr int kBins = 8;                       // distinct sizes kept
  static constexpr int kBinBlocks = 8;                  // blocks kept per size
  static constexpr std::uint64_t kMaxBytes = 16u << 20;  // bytes kept in all bins together
  static constexpr std::uint64_t kMaxBlock = 1u << 20;   // the largest block kept in a bin
  static constexpr std::size_t kLiveSlots = 2048;       // live blocks tracked (power of two)

  SpinLock lock;

  // Live blocks this thread got from the pool. track() is false when the table is full: such a
  // block's free takes the pool's path.
  bool track(std::uint64_t ptr, std::uint64_t size);
  bool untrack(std::uint64_t ptr, std::uint64_t* size);

  // Freed blocks. put() is false when there is no room for that size.
  bool put(std::uint64_t ptr, std::uint64_t size);
  std::uint64_t take(std::uint64_t size);  // 0: none of that size
  bool holds(std::uint64_t ptr) const;     // a freed block kept here (a second free is a double free)
  std::uint64_t bytes() const { return bytes_.load(std::memory_order_relaxed); }  // all kept
  // A large block waits for the next allocation. Under the lock, or by the owner holding the
  // pool's lock (every other writer holds both).
  bool holds_large() const { return large_.ptr != 0; }

  // Empties the bins and the large slot: fn(ptr, size) for each block.
  template <typename Fn>
  void drain(Fn&& fn) {
    for (Bin& b : bins_) {
      for (int i = 0; i < b.count; ++i) fn(b.ptrs[static_cast<std::size_t>(i)], b.size);
      b.count = 0;
    }
    bin_bytes_ = 0;
    drain_large(fn);
    bytes_.store(0, std::memory_order_relaxed);
  }
  // Empties the large slot only.
  template <typename Fn>
  void drain_large(Fn&& fn) {
    if (large_.ptr == 0) return;
    fn(large_.ptr, large_.size);
    bytes_.store(bytes() - large_.size, std::memory_order_relaxed);
    large_ = Slot{};
  }
  void forget_live();  // the owner is gone: its live blocks stay live in the pool, untracked

  bool orphan = false;  // the owning thread exited: a new thread may adopt this cache

 private:
  struct Bin {
    std::uint64_t size = 0;
    int count = 0;
    std::array<std::uint64_t, kBinBlocks> ptrs{};
  };
  struct Slot {
    std::uint64_t ptr = 0;  // 0: empty (no block starts at address 0)
    std::uint64_t size = 0;
  };
  static std::size_t home(std::uint64_t ptr) { return (ptr >> 9) * 0x9E3779B97F4A7C15ull >> 53; }

  std::array<Bin, kBins> bins_{};
  std::uint64_t bin_bytes_ = 0;          // in the bins (bounded by kMaxBytes)
  Slot large_{};                         // a freed block larger than kMaxBlock, if kept
  std::atomic<std::uint64_t> bytes_{0};  // bins and large slot: read by the pool without this cache's lock
  std::array<Slot, kLiveSlots> live_{};
  std::size_t live_count_ = 0;
};

// Who owns caches (a ContextPool): a thread that exits gives its cache back to its owner.
class ThreadCacheOwner {
 public:
  virtual void retire_cache(ThreadCache* cache) = 0;

 protected:
  ~ThreadCacheOwner() = default;
};

// Each thread's caches, by owner id (ids are never reused, so a destroyed owner's entry never
// matches again), and the owners alive: a thread that exits gives its caches back to owners that
// still exist. Never destroyed: threads exit until the very end of the process.
namespace thread_caches {
void add_owner(std::uint64_t id, ThreadCacheOwner* owner);
void remove_owner(std::uint64_t id);
ThreadCache* mine(std::uint64_t id);  // this thread's cache of owner `id`, or nullptr
// Can this thread keep one more cache (a free slot, or one of an owner since destroyed)?
bool room();
// `cache` is this thread's for owner `id` from now on (after room() said yes).
void adopt(std::uint64_t id, ThreadCache* cache);
void after_fork_in_child();  // once per child: the registry's lock may have been held
}  // namespace thread_caches

}  // namespace cupool
