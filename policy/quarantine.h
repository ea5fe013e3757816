// Quarantine: blocks freed in deferred mode, held until a fence placed after their free has
// retired (docs/design.md, "Free modes"). Frees join the open batch; sealing closes it behind one
// fence; fences retire in order, oldest first, and a retired fence releases every batch up to it.
// Bookkeeping only: the owner (ContextPool) places, polls and waits for fences, and holds its own
// lock around every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "upstream.h"

namespace cupool {

class Quarantine {
 public:
  static constexpr std::size_t kBatchBlocks = 64;          // a batch is full at this many blocks...
  static constexpr std::size_t kBatchBytes = 64u << 20;    // ...or this many bytes...
  static constexpr std::uint64_t kSealIntervalNs = 1'000'000;  // ...and frees seal at most once a millisecond
  static constexpr std::uint64_t kNever = ~std::uint64_t{0};

  struct Batch {  // frees behind one fence
    FenceId fence = 0;
    std::uint64_t seq = 0;        // batches are sealed, fenced and retired in this order
    bool taken = false;           // a thread waits on its fence outside the owner's lock
    std::uint64_t sealed_ns = 0;  // when it was sealed (the owner's clock)
    bool from_free = false;       // sealed by a free: covers no work issued after a free
    std::vector<std::uint64_t> blocks;
    std::uint64_t bytes = 0;
  };

  // A block freed: it joins the open batch.
  void hold(std::uint64_t block, std::uint64_t bytes) {
    if (pending_.capacity() == 0) pending_.reserve(kBatchBlocks);
    pending_.push_back(block);
    pending_bytes_ += bytes;
  }
  bool has_open() const { return !pending_.empty(); }
  bool open_full() const { return pending_.size() >= kBatchBlocks || pending_bytes_ >= kBatchBytes; }
  // Frees seal at most once per kSealIntervalNs (never sealed yet, or a clock that went back: due).
  bool seal_due(std::uint64_t t) const {
    return last_seal_ns_ == kNever || t < last_seal_ns_ || interval_passed(last_seal_ns_, t);
  }
  static bool interval_passed(std::uint64_t since, std::uint64_t t) {
    return t >= since && t - since >= kSealIntervalNs;
  }
  // Closes the open batch behind `fence` (placed by the owner just now, at time t).
  void seal(FenceId fence, std::uint64_t t, bool from_free);

  bool empty() const { return pending_.empty() && head_ == batches_.size(); }
  bool no_sealed() const { return head_ == batches_.size(); }
  // The oldest sealed batch no thread is waiting on, or nullptr. `all_taken` says whether there
  // are sealed batches, all of them waited on by other threads.
  Batch* oldest_untaken(bool* all_taken);
  const Batch* oldest() const { return head_ < batches_.size() ? &batches_[head_] : nullptr; }
  std::uint64_t oldest_seq() const { return head_ < batches_.size() ? batches_[head_].seq : 0; }

  // Fences retire in order: `retired(fence)` is asked from the oldest untaken batch on until it
  // says no; every batch up to a retired one is released (a retired fence proves every older
  // batch reusable, including those another thread is still waiting on).
  template <typename Retired, typename Release>
  void retire_ready(Retired&& retired, Release&& release) {
    std::size_t i = head_;
    while (i < batches_.size()) {
      if (batches_[i].taken) {  // its fence belongs to a waiting thread: look further
        ++i;
        continue;
      }
      if (!retired(batches_[i].fence)) return;
      retire_through(batches_[i].seq, release);
      i = head_;
    }
  }
  // Releases every batch up to `seq`: release(batch) gives its blocks back, then it is recycled.
  template <typename Release>
  void retire_through(std::uint64_t seq, Release&& release) {
    while (head_ < batches_.size() && batches_[head_].seq <= seq) {
      release(static_cast<const Batch&>(batches_[head_]));
      pop_front();
    }
  }
  // Forgets everything, with no calls (the context is gone).
  void clear();

 private:
  void pop_front();

  std::vector<std::uint64_t> pending_;  // the open batch: held blocks not yet behind a fence
  std::uint64_t pending_bytes_ = 0;
  std::uint64_t last_seal_ns_ = kNever;
  std::vector<Batch> batches_;          // sealed, FIFO from head_
  std::size_t head_ = 0;
  std::uint64_t seq_ = 0;
  std::vector<std::vector<std::uint64_t>> spare_;  // recycled block lists: no allocation when warm
};

}  // namespace cupool
