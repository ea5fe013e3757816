// VmmRange: the vmm policy's one virtual range of a ContextPool, with device memory mapped behind
// its granules on demand and unmapped once idle (docs/design.md, "The vmm policy"). The range is
// one chunk of the pool's suballocator; the range works under the pool's lock and within its cap,
// counts what it maps or unmaps in the pool's transit, and reports through the pool's events.
#pragma once

#include <atomic>
#include <cstdint>

#include "context_pool.h"
#include "granules.h"

namespace cupool {

class VmmRange {
 public:
  using Lock = ContextPool::Lock;
  using Grow = ContextPool::Grow;

  // `on`: the vmm policy is chosen and the upstream has virtual memory.
  // `tight`: wait for fences before mapping past the mark (CUPOOL_VMM_TIGHT).
  VmmRange(ContextPool& pool, bool on, bool tight) : pool_(pool), active_(on), tight_(tight) {}

  // The policy is in force. False from the start without virtual memory, and from a failed
  // reservation of the range, or a first granule the driver refused, on (the pool then grows in
  // chunks). Read without the lock.
  bool active() const { return active_; }
  std::uint64_t mapped_bytes() const { return granules_.mapped_bytes(); }

  // A block of `bytes` whose granules are all mapped, or 0 (the others need map_block).
  std::uint64_t take(std::uint64_t bytes);
  // What growth is to the vmm policy: a block of the range, with memory mapped behind its
  // granules that have none. The range is reserved at the first call.
  Grow map_block(Lock& lk, std::size_t bytes, AdmissionWait* wait);
  // Unmaps up to `bytes` of idle granules, longest idle first; what it unmapped.
  std::uint64_t unmap_idle(Lock& lk, std::uint64_t bytes, bool may_wait);
  // A block of `size` at `ptr` was freed: its granules lose a user. `fenced`: no device work can
  // still use it (a sync free's wait, or a retired fence); else `deferred` says whether it may.
  void note_free(std::uint64_t ptr, std::uint64_t size, bool fenced, bool deferred);
  // Unmaps idle granules above the mark whose fences have retired, without waiting (at most once
  // per sealing interval): where reserved comes back after a map past the mark that did not wait.
  void settle(Lock& lk);
  // The pool is going: every granule mapped, then the range, goes back (no lock: no one else is left).
  void release_all();
  void clear();  // the context is gone: forget everything, never call the upstream

  // The range is this many times the cap: blocks need contiguous addresses, memory does not.
  static constexpr std::uint64_t kRangeOverCap = 2;
  // Best fit looks at up to this many free blocks of the size class that holds it.
  static constexpr int kBestFitProbe = 64;
  // Idle granules are unmapped only where the mapped bytes would pass the most ever in blocks by
  // more than 1/kMapSlack: issue 15 allows 1.03 times the peak in use, and a swing of use below
  // the mark then costs no map or unmap (docs/design.md, "When idle granules are unmapped"; test
  // tools-vmm-h200-traces).
  static constexpr std::uint64_t kMapSlack = 40;

 private:
  bool setup(Lock& lk, Grow* fail);
  bool give_up(Lock& lk, int driver_code);
  std::uint64_t mark() const;
  std::uint64_t note_mark();
  void cover_idle();

  ContextPool& pool_;
  std::atomic<bool> active_;
  const bool tight_;
  bool busy_ = false;  // the range is being reserved (outside the lock)
  std::uint64_t base_ = 0, size_ = 0;
  Granules granules_;
  bool mapped_once_ = false;           // a granule was mapped: a later refusal is not the driver's "never"
  std::uint64_t blocks_high_ = 0;      // the most bytes in blocks (live, quarantined, cached) seen at a map
  std::uint64_t free_seq_ = 1;         // advances past each fence placed for idle granules
  std::uint64_t safe_seq_ = 0;         // idle granules freed at or before it may be unmapped
  FenceId unmap_fence_ = 0;            // placed for idle granules, not yet seen retired...
  std::uint64_t unmap_fence_seq_ = 0;  // ...covering frees up to this sequence number
  std::uint64_t unmap_fence_due_ = 0;  // cover_idle places or polls it no sooner than this
  std::uint64_t settle_due_ = 0;       // settle() looks again no sooner than this
};

}  // namespace cupool
