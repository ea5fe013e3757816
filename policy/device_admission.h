// DeviceAdmission: the one admission chain of a device, as RMM's resource adaptors stack. Every
// byte the process takes on the device passes it: the pools' chunks and granules, and every
// allocation outside the pools (passthrough, managed, stream-ordered, VMM handles, graph memory,
// memory that names the device but no context). It owns, in order:
// 1. the cap (CUPOOL_LIMIT, else the device's size): one account per device, whichever context
//    holds the memory (issue 25), so two contexts or a context-less thread cannot each hold a
//    cap's worth;
// 2. the budget shared with the node's other processes (CUPOOL_SHARE), when there is one;
// and it says which class a refusal is. What it needs from the pools above it (give back what
// nothing uses, say what they hold) it asks through MemoryHolder, which they register: calls
// only go down.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "config.h"
#include "pool_events.h"

namespace cupool {

class SharedBudget;  // shared_budget.h

// What holds memory on a device and can give some back when the device's admission is short:
// a context's pool. Registered with the device's admission while it lives.
class MemoryHolder {
 public:
  // What nothing uses goes back (thread caches, the quarantine once its fences retire, wholly
  // free chunks but a preallocated one), once the holder's reservations in flight have landed;
  // returns after its releases have landed too.
  virtual void give_back_idle() = 0;
  // Every wholly free chunk goes back (a preallocated one too): another member of the shared
  // budget needs the room.
  virtual void trim() = 0;
  // What it holds now: the bytes in use and reserved (for what `cupool top` shows).
  virtual void held(std::uint64_t* in_use, std::uint64_t* reserved) const = 0;

 protected:
  ~MemoryHolder() = default;
};

// Every wait of one allocation for room in the shared budget ends at one deadline: the pool may
// ask several times (a large chunk, then just what is needed, then again after giving back its
// own free chunks), and the allocation waits for others at most CUPOOL_SHARE_WAIT in all.
struct AdmissionWait {
  std::uint64_t deadline_ns = 0;  // set at the first wait
};

class DeviceAdmission {
 public:
  // The cap is cfg's limit for `device` resolved against `device_total`, else the device's size.
  // `share`: the budget shared with other processes (nullptr: none); it must outlive this.
  DeviceAdmission(const Config& cfg, int device, std::uint64_t device_total, SharedBudget* share = nullptr);
  DeviceAdmission(const DeviceAdmission&) = delete;
  DeviceAdmission& operator=(const DeviceAdmission&) = delete;

  int device() const { return device_; }
  std::uint64_t device_total() const { return device_total_; }
  std::uint64_t cap() const { return cap_; }
  bool limited() const { return limited_; }  // CUPOOL_LIMIT names this device (else the cap is its size)
  // The one rule for a refusal at the cap: the limit's when one is set, else the device's (with
  // no limit set, the cap is the device's size).
  OomClass cap_refusal() const { return limited_ ? OomClass::limit : OomClass::device; }
  SharedBudget* share() const { return share_; }

  // ---- registration of what holds memory here (a pool, from its birth to its end)
  void add_holder(MemoryHolder* holder);
  void remove_holder(MemoryHolder* holder);

  // ---- 1. the cap. Everything charged: the pools' parts as they last posted them, and memory
  // outside the pools.
  std::uint64_t charged() const { return charged_.load(std::memory_order_acquire); }
  // Charges `bytes` if they fit under the cap with everything already charged (no give-back).
  bool try_take(std::uint64_t bytes) {
    std::uint64_t now = charged_.load(std::memory_order_relaxed);
    do {
      if (bytes > cap_ || now > cap_ - bytes) return false;
    } while (!charged_.compare_exchange_weak(now, now + bytes, std::memory_order_acq_rel, std::memory_order_relaxed));
    return true;
  }
  // Charges (delta > 0) or uncharges without a check: what a pool posts of memory it took or
  // gave back under its lock.
  void add(std::int64_t delta) { charged_.fetch_add(static_cast<std::uint64_t>(delta), std::memory_order_acq_rel); }

  // ---- 2. the shared budget, for a pool's chunk or granules (the pool took the cap's part under
  // its lock). True with no budget. No room: the device's holders give back their wholly free
  // chunks first; then, `may_wait`, a wait for others to give some back, ending at `wait`'s
  // deadline (nullptr: CUPOOL_SHARE_WAIT from now).
  bool admit_shared(std::uint64_t bytes, bool may_wait, AdmissionWait* wait);
  void release_shared(std::uint64_t bytes);  // the driver has the memory back

  // ---- memory outside the pools: the cap (after the device's holders have given back what
  // nothing uses), then the shared budget (waiting for room as a pool's chunk does). Returns
  // none when admitted, else the refusal's class (limit, device or share).
  OomClass admit_outside(std::uint64_t bytes, AdmissionWait* wait);
  // Counts memory the driver already handed out where no admission could come first (graph
  // memory the driver reports after the fact): whatever the cap and the budget say.
  void charge_outside(std::uint64_t bytes);
  void release_outside(std::uint64_t bytes);  // admitted or charged, now gone
  std::uint64_t outside() const { return outside_.load(std::memory_order_acquire); }

  // What `cupool top` shows of this process on the device: its holders' figures and the memory
  // outside the pools (in use, all of it). Called with no pool's lock held.
  void publish();
  // Those figures, summed: the bytes in use and reserved on the device.
  void held(std::uint64_t* in_use, std::uint64_t* reserved) const;

  // A forked child holds none of its parent's device memory.
  void reset();

 private:
  std::vector<MemoryHolder*> holders_copy() const;

  const int device_;
  const std::uint64_t device_total_;
  std::uint64_t cap_ = 0;
  bool limited_ = false;
  SharedBudget* const share_;
  const std::uint64_t share_wait_ns_;
  std::atomic<std::uint64_t> charged_{0};
  std::atomic<std::uint64_t> outside_{0};
  // Holders are called with no lock of this object held; a holder unregisters only as it is
  // destroyed, which the process does with no allocation in flight (replay, tests).
  mutable std::mutex holders_mu_;
  std::vector<MemoryHolder*> holders_;
};

}  // namespace cupool
