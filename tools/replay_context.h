// ReplayContext: what the driver is to one context in `cupool replay` (replay.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <unordered_map>

#include "sim_upstream.h"
#include "upstream.h"

namespace cupool::tools {

// What the driver is to one context in a replay: the simulated device, and a record of all the
// context holds on it, so that a context reset gives it back as the driver does (the shim's
// DriverUpstream::detach, after which the pool's memory is forgotten without calls).
class ReplayContext final : public Upstream {
 public:
  ReplayContext(SimUpstream& device, const bool& streams_seen) : device_(device), streams_seen_(streams_seen) {}
  UpstreamStatus reserve(std::size_t bytes, std::size_t min_bytes, std::uint64_t* base, std::size_t* got,
                         int* driver_code) override {
    if (detached_) {
      *driver_code = SimUpstream::kOutOfMemoryCode;
      return UpstreamStatus::error;
    }
    const UpstreamStatus s = device_.reserve(bytes, min_bytes, base, got, driver_code);
    if (s == UpstreamStatus::ok) held_[*base] = *got;
    return s;
  }
  void release(std::uint64_t base, std::size_t bytes) override {
    if (detached_ || held_.erase(base) == 0) return;
    device_.release(base, bytes);
  }
  void device_memory(std::size_t* total, std::size_t* free) override { device_.device_memory(total, free); }
  void synchronize() override { device_.synchronize(); }
  // As the shim's: fences only once the process has streams of its own.
  bool needs_fences() override { return streams_seen_; }
  FenceId place_fence() override { return device_.place_fence(); }
  bool fence_retired(FenceId fence) override { return device_.fence_retired(fence); }
  void wait_fence(FenceId fence) override { device_.wait_fence(fence); }
  bool capturing() override { return false; }
  // The vmm policy on the simulated device; a reset context's mapped granules go with it.
  std::size_t vmm_granularity() override { return device_.vmm_granularity(); }
  UpstreamStatus reserve_address(std::size_t bytes, std::uint64_t* va) override {
    if (detached_) return UpstreamStatus::error;
    return device_.reserve_address(bytes, va);
  }
  void free_address(std::uint64_t va, std::size_t bytes) override {
    if (!detached_) device_.free_address(va, bytes);
  }
  UpstreamStatus map(std::uint64_t va, std::size_t bytes, int* driver_code) override {
    if (detached_) {
      *driver_code = SimUpstream::kOutOfMemoryCode;
      return UpstreamStatus::error;
    }
    const UpstreamStatus s = device_.map(va, bytes, driver_code);
    if (s == UpstreamStatus::ok) mapped_[va] = bytes;
    return s;
  }
  void unmap(std::uint64_t va, std::size_t bytes) override {
    if (detached_) return;
    device_.unmap(va, bytes);
    forget_mapped(va, bytes);
  }

  void detach() {
    for (const auto& [base, bytes] : held_) device_.release(base, bytes);
    held_.clear();
    for (const auto& [va, bytes] : mapped_) device_.unmap(va, bytes);
    mapped_.clear();
    detached_ = true;
  }

 private:
  SimUpstream& device_;
  const bool& streams_seen_;
  // What map() was asked, by address; an unmap may take any granules of it (the pieces stay).
  void forget_mapped(std::uint64_t va, std::size_t bytes) {
    const std::size_t g = device_.vmm_granularity();
    for (std::uint64_t at = va; at < va + bytes; at += g) {
      auto it = mapped_.upper_bound(at);
      if (it == mapped_.begin()) continue;
      --it;
      const std::uint64_t base = it->first, size = it->second;
      if (at >= base + size) continue;
      mapped_.erase(it);
      if (at > base) mapped_[base] = at - base;
      if (at + g < base + size) mapped_[at + g] = base + size - at - g;
    }
  }
  std::unordered_map<std::uint64_t, std::size_t> held_;
  std::map<std::uint64_t, std::size_t> mapped_;  // mapped granules, as ranges
  bool detached_ = false;
};


}  // namespace cupool::tools
