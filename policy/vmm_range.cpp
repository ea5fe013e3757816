// VmmRange: the vmm policy's virtual range and the granules mapped behind it (vmm_range.h).
#include "vmm_range.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "units.h"

namespace cupool {

std::uint64_t VmmRange::take(std::uint64_t bytes) {
  // Best fit keeps the range's free space in few large blocks: TLSF's good fit cut larger free
  // blocks, stranding mapped granules between live blocks, and the pool mapped more elsewhere.
  const std::uint64_t p = pool_.sub_.allocate_best_fit(bytes, kBestFitProbe);
  if (p == 0) return 0;
  if (granules_.ready(p, bytes)) {
    granules_.touch(p, bytes);
    return p;
  }
  pool_.sub_.free(p);  // it needs memory mapped: the miss path's map_block places it
  return 0;
}

// The block's granules lose a user; those left idle may be unmapped once no device work can
// still use them: at once after a sync free's wait or a fence (`fenced`), else after a fence
// placed later (unmap_idle).
void VmmRange::note_free(std::uint64_t ptr, std::uint64_t size, bool fenced, bool deferred) {
  granules_.untouch(ptr, size, fenced || !deferred ? 0 : free_seq_);
  if (!fenced && deferred) cover_idle();
}

// The virtual range, reserved at the first allocation: the cap times kRangeOverCap (memory never
// passes the cap; the spare addresses keep blocks contiguous however the range fragments).
bool VmmRange::setup(Lock& lk, Grow* fail) {
  if (size_ != 0) return true;
  if (busy_) {
    pool_.transit_cv_.wait(lk, [&] { return !busy_ || pool_.abandoned_; });
    if (size_ != 0) return true;
    *fail = {0, OomClass::device, 0};
    return false;
  }
  const std::uint64_t g = pool_.up_.vmm_granularity();
  const std::uint64_t size = round_up(std::max<std::uint64_t>(pool_.cap(), g) * kRangeOverCap, g);
  busy_ = true;
  lk.unlock();
  std::uint64_t va = 0;
  const UpstreamStatus st = pool_.up_.reserve_address(size, &va);
  lk.lock();
  busy_ = false;
  pool_.transit_cv_.notify_all();
  const std::uint32_t id = st == UpstreamStatus::ok && !pool_.abandoned_ ? pool_.sub_.add_chunk(va, size) : Suballocator::kNoChunk;
  if (id == Suballocator::kNoChunk) {
    if (st == UpstreamStatus::ok) pool_.up_.free_address(va, size);
    *fail = {0, OomClass::device, 0};
    // No range (the driver would not reserve the addresses): the pool grows in chunks from now
    // on, as where the driver has no virtual memory, rather than fail every allocation.
    if (!pool_.abandoned_) {
      active_ = false;
      pool_.say_vmm_fallback("the driver would not reserve a virtual range of " + std::to_string(size) + " bytes");
    }
    return false;
  }
  base_ = va;
  size_ = size;
  granules_.reset(va, size, g);
  pool_.add_reservation_locked(id, va, size);
  return true;
}

// Its granules are touched first, so that no other thread unmaps them while the lock is dropped
// around the driver calls; mapped bytes count in transit meanwhile.
VmmRange::Grow VmmRange::map_block(Lock& lk, std::size_t bytes, AdmissionWait* wait) {
  // More than the cap can ever map: the cap's refusal (or the device's), not fragmentation.
  if (bytes > pool_.cap()) return {0, pool_.at_cap(), 0};
  Grow fail{};
  if (!setup(lk, &fail)) return fail;
  for (;;) {
    if (pool_.abandoned_) return {0, OomClass::device, 0};
    // Another thread gave the range up while this one waited (give_up): grow() asks for chunks.
    if (!active_) return {0, OomClass::device, 0};
    // take()'s best fit has no memory behind it: the place, in any free block, that needs the
    // fewest granules mapped (often none: a mapped stretch inside a larger free block).
    const std::uint64_t p = pool_.sub_.allocate_best(bytes, [&](std::uint64_t a, std::uint64_t size, std::uint64_t n,
                                                          std::uint64_t* offset) { return granules_.best_window(a, size, n, offset); });
    if (p == 0) return {0, OomClass::fragmentation, 0};  // no contiguous addresses left in the range
    if (granules_.busy(p, bytes)) {  // another thread maps or unmaps some of them: wait for it
      pool_.sub_.free(p);
      pool_.transit_cv_.wait(lk, [&] { return pool_.abandoned_ || !active_ || !granules_.busy(p, bytes); });
      continue;
    }
    granules_.touch(p, bytes);
    if (granules_.ready(p, bytes)) return {p, OomClass::none, 0};
    // Memory is mapped past the mark (the most ever in blocks, and kMapSlack more) only once no
    // idle granule that is safe to unmap can make room: idle granules go first, so that the peak
    // of reserved follows the peak in use. Below the mark, idle granules stay: a loop whose use
    // swings every step would otherwise unmap and map them again every step (docs/design.md,
    // "The vmm policy"). Idle granules that the device may still read (deferred frees, their
    // fence not yet retired) are not waited for: the map goes past the mark at once, and they go
    // once their fence has retired (settle(), at a later free or map). Waiting for them kept
    // reserved tightest but cost the transformer's step on the H200 (issue 39; docs/design.md): with
    // CUPOOL_VMM_TIGHT the allocation still waits.
    const std::uint64_t mark = note_mark();
    const std::uint64_t after = granules_.mapped_bytes() + pool_.transit_ + granules_.missing_bytes(p, bytes);
    if (after > mark && granules_.idle_bytes() > 0) {
      const std::uint64_t want = after - mark;
      const std::uint64_t got = unmap_idle(lk, want, false);
      if (tight_ && !pool_.abandoned_ && got < want && granules_.idle_bytes() > 0) unmap_idle(lk, want - got, true);
      if (pool_.abandoned_) return {0, OomClass::device, 0};
    }
    std::uint64_t need = 0;
    const std::vector<Granules::Run> runs = granules_.begin_map(p, bytes, &need);
    auto undo = [&] {
      granules_.untouch(p, bytes, 0);
      pool_.sub_.free(p);
    };
    struct Done {
      std::uint64_t t0, dur;
    };
    std::vector<Done> done;  // the runs mapped, in order; the first failure stops the rest
    UpstreamStatus st = UpstreamStatus::ok;
    int code = 0;
    const bool admitted = need <= pool_.headroom() && pool_.reserve_unlocked(lk, need, [&] {
      done.reserve(runs.size());
      for (const Granules::Run& r : runs) {
        const std::uint64_t t0 = pool_.now();
        st = pool_.map_granules(r.va, r.bytes, &code, wait);
        if (st != UpstreamStatus::ok) break;
        done.push_back({t0, pool_.now() - t0});
      }
    });
    if (!admitted) {
      for (const Granules::Run& r : runs) granules_.end_map(r, false);
      undo();
      return {0, pool_.at_cap(), 0};
    }
    if (pool_.abandoned_) {
      // The context went meanwhile: the upstream (detached) makes no call, and the shared
      // budget gets back what it admitted for the runs mapped, as for a chunk in flight.
      for (std::size_t i = 0; i < done.size(); ++i) pool_.unmap_granules(runs[i].va, runs[i].bytes);
      return {0, OomClass::device, 0};
    }
    for (std::size_t i = 0; i < runs.size(); ++i) granules_.end_map(runs[i], i < done.size());
    for (std::size_t i = 0; i < done.size(); ++i) pool_.emit(PoolEvent::Kind::grow, runs[i].bytes, runs[i].va, done[i].t0, done[i].dur);
    if (!done.empty()) mapped_once_ = true;
    if (st != UpstreamStatus::ok) {
      undo();  // what was mapped stays, idle
      // The driver refused the first granule ever (not for want of memory): it will refuse the
      // next too (a device or driver that reserves addresses but creates no such memory). The
      // pool grows in chunks instead, as growth does; grow() asks again.
      if (st == UpstreamStatus::error && !mapped_once_ && give_up(lk, code)) return {0, OomClass::device, 0};
      return {0, st == UpstreamStatus::share_exhausted ? OomClass::share : OomClass::device, code};
    }
    // A granule at its edge that another thread was mapping: wait for the outcome.
    pool_.transit_cv_.wait(lk, [&] { return pool_.abandoned_ || !active_ || !granules_.busy(p, bytes); });
    if (pool_.abandoned_ || !active_) return {0, OomClass::device, 0};
    if (granules_.ready(p, bytes)) return {p, OomClass::none, 0};
    undo();  // that thread's map failed: try again
  }
}

// Gives the range back and turns the policy off, once no other map is in flight (they were
// refused too, or one succeeded, and then the refusal was not a "never"). True when the policy
// is off on return, by this call or another thread's.
bool VmmRange::give_up(Lock& lk, int driver_code) {
  pool_.transit_cv_.wait(lk, [&] { return pool_.abandoned_ || !active_ || mapped_once_ || pool_.growing_ == 0; });
  if (!active_) return true;
  if (pool_.abandoned_ || mapped_once_ || size_ == 0) return false;
  pool_.sub_.remove_chunk(base_);  // no block can be in it: none was ever mapped
  pool_.publish_ranges_locked();
  const std::uint64_t base = base_, size = size_;
  clear();
  active_ = false;
  pool_.up_.free_address(base, size);  // under the lock: rare, and no other call is in flight
  pool_.transit_cv_.notify_all();
  pool_.say_vmm_fallback("the driver refused its memory (cuMemCreate or cuMemMap: CUDA error " +
                         std::to_string(driver_code) + ")");
  return true;
}

// The mark: the most ever in blocks (live, quarantined, cached) as maps saw it, and 1/kMapSlack
// more, in granules.
std::uint64_t VmmRange::mark() const { return round_up(blocks_high_ + blocks_high_ / kMapSlack, granules_.granule()); }

// A map notes the blocks it serves among the most ever in blocks.
std::uint64_t VmmRange::note_mark() {
  blocks_high_ = std::max(blocks_high_, pool_.sub_.in_use() + pool_.sub_.held());
  return mark();
}

// After a map past the mark that did not wait, idle granules above it go back here, once the
// fence placed after their frees has retired: the allocating thread never waits for them, and
// reserved comes back to the mark soon after the peak (at the next free that reaches the pool
// once the fence has retired; fences are placed and polled at most once per sealing interval).
void VmmRange::settle(Lock& lk) {
  if (!active_ || size_ == 0 || granules_.idle_bytes() == 0) return;
  // The mark as the last map saw it (noted at frees too, it rose with blocks that no map needed).
  const std::uint64_t limit = mark();
  const std::uint64_t mapped = granules_.mapped_bytes() + pool_.transit_;
  if (mapped <= limit) return;
  const std::uint64_t t = pool_.now();
  if (t < settle_due_) return;
  settle_due_ = t + Quarantine::kSealIntervalNs;
  unmap_idle(lk, mapped - limit, false);
}

// Deferred frees in one order of work leave idle granules that the device may still be using: a
// fence placed after them makes them safe to unmap once it retires. Placed and polled from frees,
// at most once per sealing interval (as the quarantine seals: a fence costs a call per stream),
// so that idle granules are mostly safe by the time a map would unmap them.
void VmmRange::cover_idle() {
  if (!granules_.unsafe_idle(safe_seq_) || pool_.up_.capturing()) return;
  const std::uint64_t t = pool_.now();
  if (t < unmap_fence_due_) return;
  unmap_fence_due_ = t + Quarantine::kSealIntervalNs;
  if (unmap_fence_ != 0) {
    if (!pool_.up_.fence_retired(unmap_fence_)) return;
    safe_seq_ = std::max(safe_seq_, unmap_fence_seq_);
    unmap_fence_ = 0;
    if (!granules_.unsafe_idle(safe_seq_)) return;
  }
  unmap_fence_ = pool_.up_.place_fence();
  unmap_fence_seq_ = free_seq_++;
}

// Unmaps up to `bytes` of idle granules, longest idle first. Granules freed without a wait (deferred
// frees while all work is in one order) may still be read by the device, and an unmap does not
// wait for it as cudaFree does: they go only once a fence placed after their free has retired.
// That fence is polled; `may_wait` (on the way to a refusal, or giving memory back) waits for it.
std::uint64_t VmmRange::unmap_idle(Lock& lk, std::uint64_t bytes, bool may_wait) {
  // An unmap is not a call to make during a capture (as cuMemFree is not): granules stay until it ends.
  if (!active_ || pool_.abandoned_ || pool_.up_.capturing() || granules_.idle_bytes() == 0) return 0;
  if (unmap_fence_ != 0 && pool_.up_.fence_retired(unmap_fence_)) {
    safe_seq_ = std::max(safe_seq_, unmap_fence_seq_);
    unmap_fence_ = 0;
  }
  // A wait goes twice at most: the fence in flight may have been placed before the latest frees;
  // once it retires (and is forgotten), one placed after them. Frees made meanwhile by other
  // threads wait for the next fence.
  for (int round = 0; round < (may_wait ? 2 : 1) && granules_.unsafe_idle(safe_seq_); ++round) {
    if (unmap_fence_ == 0) {
      unmap_fence_ = pool_.up_.place_fence();
      unmap_fence_seq_ = free_seq_++;
    }
    if (!may_wait) break;
    const FenceId fence = unmap_fence_;
    const std::uint64_t covers = unmap_fence_seq_;
    lk.unlock();
    pool_.up_.wait_fence(fence);
    lk.lock();
    if (pool_.abandoned_) return 0;
    safe_seq_ = std::max(safe_seq_, covers);
    if (unmap_fence_ == fence) unmap_fence_ = 0;
    if (pool_.up_.capturing()) return 0;  // a capture began meanwhile: no fence and no unmap during it
  }
  const std::vector<Granules::Run> runs = granules_.begin_unmap(bytes, safe_seq_);
  if (runs.empty()) return 0;
  std::uint64_t total = 0;
  for (const Granules::Run& r : runs) total += r.bytes;
  pool_.transit_ += total;  // still counts against the cap until the driver has it back
  lk.unlock();
  std::vector<std::pair<std::uint64_t, std::uint64_t>> times;
  times.reserve(runs.size());
  for (const Granules::Run& r : runs) {
    const std::uint64_t t0 = pool_.now();
    pool_.unmap_granules(r.va, r.bytes);
    times.emplace_back(t0, pool_.now() - t0);
  }
  lk.lock();
  pool_.transit_ -= total;
  pool_.transit_cv_.notify_all();
  if (pool_.abandoned_) return total;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    granules_.end_unmap(runs[i]);
    pool_.emit(PoolEvent::Kind::release, runs[i].bytes, runs[i].va, times[i].first, times[i].second);
  }
  return total;
}

void VmmRange::release_all() {
  if (size_ == 0) return;
  for (const Granules::Run& r : granules_.begin_unmap(~std::uint64_t{0}, ~std::uint64_t{0})) pool_.unmap_granules(r.va, r.bytes);
  // Granules that blocks still hold (the program did not free them) are mapped too.
  std::uint64_t run_va = 0, run_bytes = 0;
  for (std::uint64_t va = base_; va < base_ + size_; va += granules_.granule()) {
    if (granules_.mapped(va) && run_va + run_bytes == va && run_bytes > 0) {
      run_bytes += granules_.granule();
      continue;
    }
    if (run_bytes > 0) pool_.unmap_granules(run_va, run_bytes);
    run_bytes = 0;
    if (granules_.mapped(va)) {
      run_va = va;
      run_bytes = granules_.granule();
    }
  }
  if (run_bytes > 0) pool_.unmap_granules(run_va, run_bytes);
  pool_.up_.free_address(base_, size_);
}

void VmmRange::clear() {
  granules_.clear();
  base_ = size_ = 0;
  unmap_fence_ = 0;
}

}  // namespace cupool
