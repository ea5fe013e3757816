// ContextPool's deferred frees (context_pool.h): blocks wait in quarantine behind fences, which
// are sealed, polled and waited for here, and the quarantine is bounded (policy/quarantine.h).
#include "context_pool.h"

#include <algorithm>
#include <vector>

namespace cupool {

// Waits for the oldest fence that no other thread waits on, outside the lock, and retires what it
// proves reusable. `seal_first`: put the open batch behind a fence first (it may be the one waited
// for). `bounding` (the quarantine bound, not a shortage): only a fence a free sealed at least an
// interval ago. False when there was none to wait for.
bool ContextPool::wait_oldest_fence(Lock& lk, bool seal_first, bool bounding) {
  if (up_.capturing()) return false;  // a wait for uncaptured work is not the program's to make now
  if (seal_first) seal_pending();
  bool all_taken = false;
  Quarantine::Batch* b = quarantine_.oldest_untaken(&all_taken);
  if (b == nullptr) {
    // Every sealed fence is being waited on by another thread: wait for the first of them to
    // retire its batches (giving up here would refuse memory that is about to come back).
    if (bounding || !all_taken) return false;
    const std::uint64_t head = quarantine_.oldest_seq();
    fence_cv_.wait(lk, [&] { return abandoned_ || quarantine_.oldest_seq() != head; });
    return !abandoned_;
  }
  if (bounding && (!b->from_free || !Quarantine::interval_passed(b->sealed_ns, now()))) return false;
  b->taken = true;  // nobody else polls or waits on a fence the upstream will forget
  const FenceId fence = b->fence;
  const std::uint64_t seq = b->seq;
  lk.unlock();
  up_.wait_fence(fence);
  lk.lock();
  retire_through(seq);
  retire_ready();
  fence_cv_.notify_all();
  return true;
}

// Waits for quarantined blocks, oldest fence first, trying the allocation after each fence.
std::uint64_t ContextPool::wait_for_quarantine(Lock& lk, std::uint64_t bytes) {
  for (;;) {
    if (std::uint64_t p = take(bytes)) return p;
    if (!wait_oldest_fence(lk, true)) return 0;
  }
}

// Deferred frees never block, so a host far ahead of the device holds everything freed over its
// whole lead in quarantine (a PyTorch step with a side stream: 3.4 GiB of 4 GiB reserved, on the
// H200), and the pool grows by as much. An allocation past the bound waits for the oldest fences,
// but only fences that a free sealed, at least a sealing interval ago:
// - sealed by a free, a fence covers only work issued before that free, where cudaFree would
//   have waited for the device anyway; a fence sealed at an allocation may cover later work that
//   waits on something the host does next (a collective, a host function), and waiting for it
//   could hang a program that runs without cupool;
// - an interval old, the host has issued work since, so the device still has some queued.
// Under preallocate the bound is an eighth of the whole region: memory held there costs nothing.
void ContextPool::bound_quarantine(Lock& lk) {
  const std::uint64_t bound = std::max<std::uint64_t>(kQuarantineFloor, reserved_locked() / 8);
  if (sub_.held() <= bound) return;
  retire_ready();
  while (sub_.held() > bound && wait_oldest_fence(lk, false, true)) {
  }
}

void ContextPool::seal_pending(bool from_free) {
  if (!quarantine_.has_open() || up_.capturing()) return;  // the open batch is sealed once the capture ends
  quarantine_.seal(up_.place_fence(), now(), from_free);
}

// Fences retire in order: polled from the oldest; a poll is a query, not made during a capture.
void ContextPool::retire_ready() {
  if (quarantine_.no_sealed() || up_.capturing()) return;
  quarantine_.retire_ready([&](FenceId f) { return up_.fence_retired(f); },
                           [&](const Quarantine::Batch& b) { release_batch(b); });
}

void ContextPool::retire_through(std::uint64_t seq) {
  quarantine_.retire_through(seq, [&](const Quarantine::Batch& b) { release_batch(b); });
}

// A retired batch's blocks are free again.
void ContextPool::release_batch(const Quarantine::Batch& b) {
  const std::uint64_t t0 = now();
  for (std::uint64_t p : b.blocks) {
    Suballocator::FreeInfo info;
    if (sub_.release_held(p, &info)) note_free(p, info, true);
  }
  emit(PoolEvent::Kind::fence_retired, b.bytes, 0, t0, now() - t0);
}

}  // namespace cupool
