// DeviceAccount: the bytes one process holds on one device, whichever of its contexts holds
// them, and memory that names its device but no context (cuMemCreate from a thread with no
// current context). The cap is per device (CUPOOL_LIMIT), so every pool of the device and every
// such allocation charges this one account: two contexts, or a context-less thread, cannot each
// hold a cap's worth (issue 25).
#pragma once

#include <atomic>
#include <cstdint>

namespace cupool {

class DeviceAccount {
 public:
  explicit DeviceAccount(std::uint64_t cap) : cap_(cap) {}
  DeviceAccount(const DeviceAccount&) = delete;
  DeviceAccount& operator=(const DeviceAccount&) = delete;

  std::uint64_t cap() const { return cap_; }
  std::uint64_t charged() const { return charged_.load(std::memory_order_acquire); }
  // Charges `bytes` if they fit under the cap with everything already charged.
  bool try_take(std::uint64_t bytes) {
    std::uint64_t now = charged_.load(std::memory_order_relaxed);
    do {
      if (bytes > cap_ || now > cap_ - bytes) return false;
    } while (!charged_.compare_exchange_weak(now, now + bytes, std::memory_order_acq_rel, std::memory_order_relaxed));
    return true;
  }
  // Charges (delta > 0) or uncharges without a check: memory already taken or given back.
  void add(std::int64_t delta) { charged_.fetch_add(static_cast<std::uint64_t>(delta), std::memory_order_acq_rel); }
  // A forked child holds none of its parent's device memory.
  void reset() {
    charged_.store(0, std::memory_order_release);
    unowned_.store(0, std::memory_order_release);
  }
  // Of what is charged, the bytes that name the device but no context (in use, all of them).
  std::uint64_t unowned() const { return unowned_.load(std::memory_order_acquire); }
  void add_unowned(std::int64_t delta) { unowned_.fetch_add(static_cast<std::uint64_t>(delta), std::memory_order_acq_rel); }

 private:
  const std::uint64_t cap_;
  std::atomic<std::uint64_t> charged_{0};
  std::atomic<std::uint64_t> unowned_{0};
};

}  // namespace cupool
