// DeviceAdmission (device_admission.h): the cap, then the shared budget, for all of a device's memory.
#include "device_admission.h"

#include <algorithm>

#include "clock.h"
#include "shared_budget.h"

namespace cupool {

DeviceAdmission::DeviceAdmission(const Config& cfg, int device, std::uint64_t device_total, SharedBudget* share)
    : device_(device), device_total_(device_total), share_(share), share_wait_ns_(cfg.share_wait_ns) {
  if (const auto limit = cfg.limit.for_device(device)) {
    limited_ = true;
    cap_ = limit->resolve(device_total);
  } else {
    cap_ = device_total;
  }
}

void DeviceAdmission::add_holder(MemoryHolder* holder) {
  std::lock_guard lock(holders_mu_);
  holders_.push_back(holder);
}

void DeviceAdmission::remove_holder(MemoryHolder* holder) {
  std::lock_guard lock(holders_mu_);
  holders_.erase(std::remove(holders_.begin(), holders_.end(), holder), holders_.end());
}

std::vector<MemoryHolder*> DeviceAdmission::holders_copy() const {
  std::lock_guard lock(holders_mu_);
  return holders_;
}

bool DeviceAdmission::admit_shared(std::uint64_t bytes, bool may_wait, AdmissionWait* wait) {
  if (!share_) return true;
  if (share_->admit(device_, device_total_, bytes, 0)) return true;
  // The holders' locks are not held here: a pool asks with its lock dropped.
  for (MemoryHolder* h : holders_copy()) h->trim();
  if (!may_wait) return share_->admit(device_, device_total_, bytes, 0);
  std::uint64_t left = share_wait_ns_;
  if (left > 0) {
    AdmissionWait own;
    if (wait == nullptr) wait = &own;
    const std::uint64_t now = monotonic_ns();
    if (wait->deadline_ns == 0) wait->deadline_ns = now > UINT64_MAX - left ? UINT64_MAX : now + left;  // saturated
    left = wait->deadline_ns > now ? wait->deadline_ns - now : 0;
  }
  return share_->admit(device_, device_total_, bytes, left);
}

void DeviceAdmission::release_shared(std::uint64_t bytes) {
  if (share_) share_->release(device_, bytes);
}

OomClass DeviceAdmission::admit_outside(std::uint64_t bytes, AdmissionWait* wait) {
  if (!try_take(bytes)) {
    // What the device's pools hold that nothing uses makes room, once their growth in flight has
    // landed (it may serve nothing here, but counts against the cap until it does).
    for (MemoryHolder* h : holders_copy()) h->give_back_idle();
    if (!try_take(bytes)) return cap_refusal();
  }
  if (!admit_shared(bytes, true, wait)) {
    add(-static_cast<std::int64_t>(bytes));
    return OomClass::share;
  }
  outside_.fetch_add(bytes, std::memory_order_acq_rel);
  return OomClass::none;
}

void DeviceAdmission::charge_outside(std::uint64_t bytes) {
  add(static_cast<std::int64_t>(bytes));
  outside_.fetch_add(bytes, std::memory_order_acq_rel);
  if (share_) share_->add(device_, bytes);
}

void DeviceAdmission::release_outside(std::uint64_t bytes) {
  add(-static_cast<std::int64_t>(bytes));
  outside_.fetch_sub(bytes, std::memory_order_acq_rel);
  release_shared(bytes);
}

void DeviceAdmission::held(std::uint64_t* in_use, std::uint64_t* reserved) const {
  std::uint64_t u = outside(), r = outside();
  for (MemoryHolder* h : holders_copy()) {
    std::uint64_t hu = 0, hr = 0;
    h->held(&hu, &hr);
    u += hu;
    r += hr;
  }
  *in_use = u;
  *reserved = r;
}

void DeviceAdmission::publish() {
  if (!share_) return;
  std::uint64_t in_use = 0, reserved = 0;
  held(&in_use, &reserved);
  share_->publish(device_, in_use, reserved);
}

void DeviceAdmission::reset() {
  charged_.store(0, std::memory_order_release);
  outside_.store(0, std::memory_order_release);
}

}  // namespace cupool
