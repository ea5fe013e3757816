// SimUpstream (sim_upstream.h): the simulated device of tests and `cupool replay`.
#include "sim_upstream.h"

#include <algorithm>

namespace cupool {

SimUpstream::SimUpstream(std::size_t capacity, std::size_t granularity, std::uint64_t base)
    : capacity_(capacity / std::max<std::size_t>(granularity, 1) * std::max<std::size_t>(granularity, 1)),
      granularity_(std::max<std::size_t>(granularity, 1)),
      vmm_granularity_((std::max(granularity_, kVmmGranularity) + granularity_ - 1) / granularity_ * granularity_),
      base_(base) {
  if (capacity_ > 0) free_.emplace(base_, capacity_);
}

UpstreamStatus SimUpstream::reserve(std::size_t bytes, std::size_t min_bytes, std::uint64_t* base, std::size_t* got,
                                    int* driver_code) {
  return reserve_at_least(bytes, min_bytes, got, [&](std::size_t n, bool) { return ask(n, base, driver_code); });
}

UpstreamStatus SimUpstream::ask(std::size_t bytes, std::uint64_t* base, int* driver_code) {
  if (reserve_gate_) reserve_gate_();
  std::lock_guard lock(mu_);
  ++counters_.reserve_calls;
  auto fail = [&](UpstreamStatus s) {
    ++counters_.reserve_failures;
    if (driver_code) *driver_code = s == UpstreamStatus::out_of_memory ? kOutOfMemoryCode : 999;
    return s;
  };
  if (fail_count_ > 0) {
    --fail_count_;
    return fail(fail_status_);
  }
  if (bytes == 0 || (fail_above_ != 0 && bytes > fail_above_)) return fail(UpstreamStatus::out_of_memory);
  std::size_t need = rounded(bytes);
  if (need + used_ + foreign_ > capacity_ || need < bytes) return fail(UpstreamStatus::out_of_memory);
  // First fit in address order: fragmentation of the device is part of what is simulated.
  auto it = std::find_if(free_.begin(), free_.end(), [&](const auto& r) { return r.second >= need; });
  if (it == free_.end()) return fail(UpstreamStatus::out_of_memory);
  std::uint64_t at = it->first;
  std::uint64_t rest = it->second - need;
  free_.erase(it);
  if (rest > 0) free_.emplace(at + need, rest);
  taken_.emplace(at, bytes);
  used_ += need;
  counters_.reserved_bytes += bytes;
  counters_.total_reserved_bytes += bytes;
  counters_.peak_reserved_bytes = std::max(counters_.peak_reserved_bytes, counters_.reserved_bytes);
  *base = at;
  if (driver_code) *driver_code = 0;
  return UpstreamStatus::ok;
}

void SimUpstream::release(std::uint64_t base, std::size_t bytes) {
  std::lock_guard lock(mu_);
  ++counters_.release_calls;
  auto t = taken_.find(base);
  if (t == taken_.end() || t->second != bytes) {
    ++counters_.bad_releases;
    return;
  }
  taken_.erase(t);
  std::uint64_t size = rounded(bytes);
  used_ -= size;
  counters_.reserved_bytes -= bytes;
  counters_.total_released_bytes += bytes;
  // Coalesce with the free neighbours.
  auto next = free_.lower_bound(base);
  if (next != free_.end() && base + size == next->first) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == base) {
      prev->second += size;
      return;
    }
  }
  free_.emplace(base, size);
}

UpstreamStatus SimUpstream::reserve_address(std::size_t bytes, std::uint64_t* va) {
  std::lock_guard lock(mu_);
  ++counters_.address_reserves;
  if (bytes == 0 || bytes % vmm_granularity_ != 0) return UpstreamStatus::error;
  *va = next_va_;
  next_va_ += bytes + vmm_granularity_;  // a gap: two ranges are never one
  vas_.emplace(*va, bytes);
  return UpstreamStatus::ok;
}

void SimUpstream::free_address(std::uint64_t va, std::size_t) {
  std::lock_guard lock(mu_);
  ++counters_.address_frees;
  vas_.erase(va);
}

UpstreamStatus SimUpstream::map(std::uint64_t va, std::size_t bytes, int* driver_code) {
  std::lock_guard lock(mu_);
  ++counters_.map_calls;
  auto fail = [&](UpstreamStatus s) {
    ++counters_.map_failures;
    *driver_code = s == UpstreamStatus::out_of_memory ? kOutOfMemoryCode : 999;
    return s;
  };
  if (fail_count_ > 0) {
    --fail_count_;
    return fail(fail_status_);
  }
  auto range = vas_.upper_bound(va);
  if (bytes == 0 || bytes % vmm_granularity_ != 0 || va % vmm_granularity_ != 0 || range == vas_.begin() ||
      va + bytes > std::prev(range)->first + std::prev(range)->second)
    return fail(UpstreamStatus::error);
  for (std::uint64_t g = va; g < va + bytes; g += vmm_granularity_)
    if (mapped_.count(g)) return fail(UpstreamStatus::error);
  if (bytes + used_ + foreign_ > capacity_) return fail(UpstreamStatus::out_of_memory);
  for (std::uint64_t g = va; g < va + bytes; g += vmm_granularity_) mapped_.insert(g);
  used_ += bytes;
  counters_.mapped_bytes += bytes;
  counters_.total_mapped_bytes += bytes;
  counters_.peak_mapped_bytes = std::max(counters_.peak_mapped_bytes, counters_.mapped_bytes);
  *driver_code = 0;
  return UpstreamStatus::ok;
}

void SimUpstream::unmap(std::uint64_t va, std::size_t bytes) {
  std::lock_guard lock(mu_);
  ++counters_.unmap_calls;
  for (std::uint64_t g = va; g < va + bytes; g += vmm_granularity_) {
    if (mapped_.erase(g) == 0) {
      ++counters_.bad_unmaps;
      continue;
    }
    used_ -= vmm_granularity_;
    counters_.mapped_bytes -= vmm_granularity_;
    counters_.total_unmapped_bytes += vmm_granularity_;
  }
}

bool SimUpstream::is_mapped(std::uint64_t va, std::size_t bytes) const {
  std::lock_guard lock(mu_);
  for (std::uint64_t g = va / vmm_granularity_ * vmm_granularity_; g < va + bytes; g += vmm_granularity_)
    if (!mapped_.count(g)) return false;
  return true;
}

void SimUpstream::device_memory(std::size_t* total, std::size_t* free) {
  std::lock_guard lock(mu_);
  if (total) *total = capacity_;
  if (free) *free = capacity_ - std::min(capacity_, used_ + foreign_);
}

void SimUpstream::synchronize() {
  std::lock_guard lock(mu_);
  ++counters_.synchronizes;
  completed_ = last_fence_;
}

bool SimUpstream::needs_fences() {
  std::lock_guard lock(mu_);
  return needs_fences_;
}

FenceId SimUpstream::place_fence() {
  std::lock_guard lock(mu_);
  ++counters_.fences_placed;
  counters_.fence_calls_while_capturing += capturing_;
  FenceId f = ++last_fence_;
  if (!pending_work_) completed_ = f;
  return f;
}

bool SimUpstream::fence_retired(FenceId fence) {
  std::lock_guard lock(mu_);
  ++counters_.fence_polls;
  counters_.fence_calls_while_capturing += capturing_;
  return fence <= completed_;
}

void SimUpstream::wait_fence(FenceId fence) {
  std::lock_guard lock(mu_);
  ++counters_.fence_waits;
  counters_.fence_calls_while_capturing += capturing_;
  completed_ = std::max(completed_, std::min(fence, last_fence_));
}

bool SimUpstream::capturing() {
  std::lock_guard lock(mu_);
  return capturing_;
}

void SimUpstream::set_capturing(bool capturing) {
  std::lock_guard lock(mu_);
  capturing_ = capturing;
}

void SimUpstream::set_reserve_gate(std::function<void()> gate) { reserve_gate_ = std::move(gate); }

void SimUpstream::fail_next_reserves(int count, UpstreamStatus status) {
  std::lock_guard lock(mu_);
  fail_count_ = count;
  fail_status_ = status;
}

void SimUpstream::fail_reserves_above(std::size_t bytes) {
  std::lock_guard lock(mu_);
  fail_above_ = bytes;
}

void SimUpstream::set_foreign_bytes(std::size_t bytes) {
  std::lock_guard lock(mu_);
  foreign_ = bytes;
}

void SimUpstream::set_pending_work(bool pending) {
  std::lock_guard lock(mu_);
  pending_work_ = pending;
}

void SimUpstream::complete_all() {
  std::lock_guard lock(mu_);
  completed_ = last_fence_;
}

void SimUpstream::set_needs_fences(bool needs) {
  std::lock_guard lock(mu_);
  needs_fences_ = needs;
}

SimUpstream::Counters SimUpstream::counters() const {
  std::lock_guard lock(mu_);
  return counters_;
}

std::size_t SimUpstream::used() const {
  std::lock_guard lock(mu_);
  return used_;
}

std::size_t SimUpstream::live_chunks() const {
  std::lock_guard lock(mu_);
  return taken_.size();
}

}  // namespace cupool
