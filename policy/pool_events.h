// What a pool says about itself, in its own terms: its statistics, why it refused an allocation,
// and the events of its own making (chunks taken and given back, fences retired, refusals). The
// trace maps them onto its lines (trace_schema.h: trace::record_of); replay onto its analysis. No
// trace, no CUDA here: the pool knows neither.
#pragma once

#include <cstdint>

namespace cupool {

// Why an allocation was refused.
enum class OomClass : std::uint8_t {
  none = 0,
  limit,          // the cap (CUPOOL_LIMIT) would be exceeded
  fragmentation,  // the pool holds enough free bytes, but no block large enough
  device,         // the driver itself is out of memory
  share,          // the budget shared with other processes (CUPOOL_SHARE) has no room
  count_
};

// A pool's state, as it reports it after serving a call.
struct PoolStats {
  std::uint64_t reserved = 0;      // bytes the pool holds from the driver
  std::uint64_t in_use = 0;        // bytes handed to the program (rounded sizes)
  std::uint64_t largest_free = 0;  // the largest block that could be handed out now
  std::uint64_t quarantined = 0;   // freed bytes waiting for a fence (deferred free)
  std::uint64_t cached = 0;        // freed bytes kept in threads' caches (free to the program)
  std::uint32_t free_blocks = 0;   // number of free blocks
  // Nonzero on calls a thread cache served without the pool's lock: in_use and cached are then
  // not filled in, and whoever keeps the pool's history derives them from the last values it saw
  // (in_use += cache_delta, cached -= cache_delta): counters shared by all threads on that path
  // cost many times the call itself on the H200 host.
  std::int64_t cache_delta = 0;
  std::uint64_t pool = 0;  // which pool (unique in the process), for that derivation
  bool operator==(const PoolStats&) const = default;
};

// An event of the pool's own making, or of the process's memory (a kept VMM mapping given back).
struct PoolEvent {
  enum class Kind : std::uint8_t { grow, release, fence_retired, oom, vmm_given_back };
  Kind kind = Kind::grow;
  std::uint64_t t_ns = 0, dur_ns = 0;  // on the pool's clock
  std::uint64_t size = 0;              // bytes taken, given back, retired, or refused
  std::uint64_t ptr = 0;               // the chunk (or the handle given back)
  std::uint32_t tid = 0;
  int device = -1;
  int driver_code = 0;                 // oom: the driver's error code, when it refused
  OomClass oom = OomClass::none;
  // grow/release of the vmm policy: granules mapped or unmapped at ptr (inside the pool's
  // virtual range), not a chunk taken or given back.
  bool granules = false;
  bool has_stats = false;
  PoolStats stats{};
};

// Where a pool (and a process's memory) reports its events: the trace writer in the library,
// the analysis in replay, a recorder in tests.
class PoolObserver {
 public:
  virtual ~PoolObserver() = default;
  virtual void pool_event(const PoolEvent&) = 0;
};

}  // namespace cupool
