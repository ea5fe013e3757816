// The shared budget in front of a context's upstream (CUPOOL_SHARE): what the pool takes from the
// driver is admitted by the node's budget first, and given back to it after the driver has it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "process_memory.h"
#include "shared_budget.h"
#include "upstream.h"

namespace cupool {

// One allocation's dealings with the shared budget, on its thread, for as long as it lives
// (ProcessMemory::allocate makes one per call): the pool may ask for a chunk several times (a
// large one, then just what is needed, then again after giving back its own free chunks), and the
// allocation waits for others at most CUPOOL_SHARE_WAIT in all, not that long at every ask.
class ShareAskScope {
 public:
  ShareAskScope();
  ~ShareAskScope();
  ShareAskScope(const ShareAskScope&) = delete;
  ShareAskScope& operator=(const ShareAskScope&) = delete;
  std::uint64_t deadline_ns = 0;  // set at the first wait
 private:
  ShareAskScope* outer_;
};

// A context's upstream with the shared budget in front: a chunk (or, under the vmm policy, a run
// of granules) is admitted before the driver is asked (and given back to the budget if the
// driver refuses), and given back after the driver has it back. The budget's refusal is its own
// status: the pool's out-of-memory class `share`.
class BudgetedUpstream final : public Upstream {
 public:
  BudgetedUpstream(Upstream& inner, SharedBudget& share, ContextMemory& c, std::uint64_t wait_ns)
      : inner_(inner), share_(share), c_(c), wait_ns_(wait_ns) {}
  // Each ask is admitted on its own. One that a smaller ask follows waits for no one: the budget
  // refuses it at once if it has no room, and only the smallest ask waits.
  UpstreamStatus reserve(std::size_t bytes, std::size_t min_bytes, std::uint64_t* base, std::size_t* got,
                         int* driver_code) override {
    return reserve_at_least(bytes, min_bytes, got, [&](std::size_t n, bool last) {
      std::size_t exact = 0;
      return admitted(n, last, driver_code, [&] { return inner_.reserve(n, n, base, &exact, driver_code); });
    });
  }
  // May be called with the pool's lock held (a chunk the pool could not take): no publish here.
  void release(std::uint64_t base, std::size_t bytes) override {
    inner_.release(base, bytes);
    share_.release(c_.device, bytes);
  }
  void device_memory(std::size_t* total, std::size_t* free) override { inner_.device_memory(total, free); }
  void synchronize() override { inner_.synchronize(); }
  bool needs_fences() override { return inner_.needs_fences(); }
  FenceId place_fence() override { return inner_.place_fence(); }
  bool fence_retired(FenceId fence) override { return inner_.fence_retired(fence); }
  void wait_fence(FenceId fence) override { inner_.wait_fence(fence); }
  bool capturing() override { return inner_.capturing(); }
  // The vmm policy's granules are admitted and given back as chunks are.
  std::size_t vmm_granularity() override { return inner_.vmm_granularity(); }
  UpstreamStatus reserve_address(std::size_t bytes, std::uint64_t* va) override {
    return inner_.reserve_address(bytes, va);
  }
  void free_address(std::uint64_t va, std::size_t bytes) override { inner_.free_address(va, bytes); }
  UpstreamStatus map(std::uint64_t va, std::size_t bytes, int* driver_code) override {
    return admitted(bytes, true, driver_code, [&] { return inner_.map(va, bytes, driver_code); });
  }
  void unmap(std::uint64_t va, std::size_t bytes) override {
    inner_.unmap(va, bytes);
    share_.release(c_.device, bytes);
  }

 private:
  std::uint64_t total() const { return c_.device_total; }
  // Memory the budget admitted first (waiting for room if `may_wait`), then taken from the driver
  // (`take`); given back to the budget if the driver refuses.
  template <class Take>
  UpstreamStatus admitted(std::size_t bytes, bool may_wait, int* driver_code, Take take) {
    if (!admit(bytes, may_wait)) {
      *driver_code = 0;
      return UpstreamStatus::share_exhausted;
    }
    const UpstreamStatus st = take();
    if (st != UpstreamStatus::ok) share_.release(c_.device, bytes);
    publish();
    return st;
  }
  // No room: this process's own wholly free chunks go back first (they did not fit the request,
  // but the room they free in the budget may). Then, `may_wait`, a wait for others to give some
  // back; every wait of one allocation ends at one deadline.
  bool admit(std::size_t bytes, bool may_wait);
  // What `cupool top` shows of this member: its figures at its last chunk taken (and at each
  // give-back). Called without the pool's lock.
  void publish();

  Upstream& inner_;
  SharedBudget& share_;
  ContextMemory& c_;
  const std::uint64_t wait_ns_;
};

}  // namespace cupool
