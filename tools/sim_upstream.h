// SimUpstream: a simulated device for tests and `cupool replay`. Address space only (no memory
// behind the addresses), first fit over the device's free ranges with coalescing so that the
// device's own fragmentation is modelled, deterministic, thread-safe, with injectable failures and
// fences that tests control.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>

#include "upstream.h"

namespace cupool {

class SimUpstream final : public Upstream {
 public:
  static constexpr std::uint64_t kDefaultBase = 0x7f0000000000ull;
  static constexpr int kOutOfMemoryCode = 2;  // CUDA_ERROR_OUT_OF_MEMORY, for traces

  // A device of `capacity` bytes; reservations are rounded up to `granularity` (the driver's
  // allocation granularity) when placed, so they consume device space as the real one does.
  explicit SimUpstream(std::size_t capacity, std::size_t granularity = 2u << 20,
                       std::uint64_t base = kDefaultBase);

  // Upstream
  // Asks for `bytes`, then for `min_bytes` (reserve_at_least): each ask counts as a call below,
  // and each can be made to fail.
  UpstreamStatus reserve(std::size_t bytes, std::size_t min_bytes, std::uint64_t* base, std::size_t* got,
                         int* driver_code) override;
  void release(std::uint64_t base, std::size_t bytes) override;
  void device_memory(std::size_t* total, std::size_t* free) override;
  void synchronize() override;
  bool needs_fences() override;
  FenceId place_fence() override;
  bool fence_retired(FenceId fence) override;
  void wait_fence(FenceId fence) override;
  bool capturing() override;
  // Virtual memory: address space from a region of its own (kVaBase), memory counted as mapped.
  // Granules are the driver's minimum mapping granularity (2 MiB on every GPU it runs on), not
  // `granularity` (replay places chunks at 512 bytes, and a 512-byte granule would make the vmm
  // policy's bookkeeping of a whole device's range gigabytes).
  static constexpr std::size_t kVmmGranularity = 2u << 20;
  std::size_t vmm_granularity() override { return vmm_granularity_; }
  UpstreamStatus reserve_address(std::size_t bytes, std::uint64_t* va) override;
  void free_address(std::uint64_t va, std::size_t bytes) override;
  UpstreamStatus map(std::uint64_t va, std::size_t bytes, int* driver_code) override;
  void unmap(std::uint64_t va, std::size_t bytes) override;
  static constexpr std::uint64_t kVaBase = 0x100000000000ull;  // apart from reserve()'s addresses
  // Whether every granule of [va, va + bytes) is mapped (tests).
  bool is_mapped(std::uint64_t va, std::size_t bytes) const;

  // Failure injection: the next `count` asks of reserve() (or map() calls) fail with `status`.
  void fail_next_reserves(int count, UpstreamStatus status = UpstreamStatus::out_of_memory);
  // Every ask of reserve() for more than `bytes` fails with out_of_memory (0: no such rule).
  void fail_reserves_above(std::size_t bytes);
  // Memory that someone else (another process) holds: lowers what reserve() can get and `free`.
  void set_foreign_bytes(std::size_t bytes);

  // Fences. With pending work, a placed fence stays unretired until complete_all(), a wait, or
  // synchronize(); without, it retires at once. Fences retire in order, as on one timeline.
  void set_pending_work(bool pending);
  void complete_all();
  void set_needs_fences(bool needs);
  // A stream capture in progress: fence calls made meanwhile are counted (a pool must make none).
  void set_capturing(bool capturing);
  // Called by each ask of reserve() before it takes the device lock, on the reserving thread: a test can
  // hold a reservation in flight there. Set before the pool is shared between threads.
  void set_reserve_gate(std::function<void()> gate);

  struct Counters {
    std::uint64_t reserve_calls = 0, reserve_failures = 0, release_calls = 0;
    std::uint64_t reserved_bytes = 0;  // current, as asked for (not rounded)
    std::uint64_t peak_reserved_bytes = 0;
    std::uint64_t total_reserved_bytes = 0, total_released_bytes = 0;
    std::uint64_t synchronizes = 0, fences_placed = 0, fence_polls = 0, fence_waits = 0;
    std::uint64_t bad_releases = 0;  // release() of something reserve() did not return
    std::uint64_t fence_calls_while_capturing = 0;  // place/poll/wait during a capture
    // Virtual memory: calls and bytes.
    std::uint64_t map_calls = 0, map_failures = 0, unmap_calls = 0, address_reserves = 0, address_frees = 0;
    std::uint64_t mapped_bytes = 0, peak_mapped_bytes = 0;
    std::uint64_t total_mapped_bytes = 0, total_unmapped_bytes = 0;
    std::uint64_t bad_unmaps = 0;  // unmap() of a granule that was not mapped
  };
  Counters counters() const;
  std::size_t capacity() const { return capacity_; }
  std::size_t used() const;  // device bytes taken (rounded), foreign bytes excluded
  std::size_t live_chunks() const;

 private:
  UpstreamStatus ask(std::size_t bytes, std::uint64_t* base, int* driver_code);  // one ask of reserve()
  std::size_t rounded(std::size_t bytes) const { return (bytes + granularity_ - 1) / granularity_ * granularity_; }

  mutable std::mutex mu_;
  const std::size_t capacity_;
  const std::size_t granularity_;
  const std::size_t vmm_granularity_;  // a multiple of granularity_, at least kVmmGranularity
  const std::uint64_t base_;
  std::map<std::uint64_t, std::uint64_t> free_;   // base -> size, coalesced
  std::map<std::uint64_t, std::uint64_t> taken_;  // base -> size as asked
  std::size_t used_ = 0;
  std::size_t foreign_ = 0;
  int fail_count_ = 0;
  UpstreamStatus fail_status_ = UpstreamStatus::out_of_memory;
  std::size_t fail_above_ = 0;
  bool pending_work_ = false;
  bool needs_fences_ = true;
  bool capturing_ = false;
  std::function<void()> reserve_gate_;
  std::uint64_t next_va_ = kVaBase;
  std::map<std::uint64_t, std::uint64_t> vas_;    // virtual ranges: base -> size
  std::set<std::uint64_t> mapped_;                // mapped granules (by address)
  FenceId last_fence_ = 0;
  FenceId completed_ = 0;  // every fence <= completed_ has retired
  Counters counters_;
};

}  // namespace cupool
