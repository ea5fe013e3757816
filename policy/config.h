// The effective configuration, parsed from CUPOOL_* variables by policy/options.cpp, whose one
// table (kOptions) names every variable, its type, default, accepted values and meaning.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cupool {

// A process whose CUPOOL_* configuration is wrong exits with this status (EX_CONFIG) before
// any of its own code runs.
inline constexpr int kConfigErrorExitCode = 78;

// vmm: one virtual range per device, physical memory mapped in granules as blocks need it
// (docs/design.md, "The vmm policy"). Last, so that the other values keep their numbers.
enum class PolicyKind : std::uint8_t { growth, preallocate, passthrough, vmm };
enum class FreeMode : std::uint8_t { sync, deferred };

// A size given either in bytes or as a share of the device's total memory.
struct SizeSpec {
  std::uint64_t bytes = 0;
  double percent = 0;  // > 0 means "percent of the device's total"
  bool is_percent() const { return percent > 0; }
  bool operator==(const SizeSpec&) const = default;
  std::uint64_t resolve(std::uint64_t device_total) const {
    return is_percent() ? static_cast<std::uint64_t>(static_cast<double>(device_total) * percent / 100.0)
                        : bytes;
  }
};

// CUPOOL_LIMIT: a default for every device, optionally overridden per device ("8GiB,1:50%").
struct LimitSpec {
  std::optional<SizeSpec> all;
  std::vector<std::pair<int, SizeSpec>> per_device;
  std::optional<SizeSpec> for_device(int device) const {
    for (const auto& [d, s] : per_device)
      if (d == device) return s;
    return all;
  }
  bool operator==(const LimitSpec&) const = default;
};

// CUPOOL_TRACE_STACKS=on: the native stack of one allocation in this many. Chosen so that the
// trace-on pair cost stays under half a microsecond on the H200 (docs/performance.md).
inline constexpr std::uint32_t kTraceStacksOn = 64;

struct Config {
  PolicyKind policy = PolicyKind::growth;
  FreeMode free_mode = FreeMode::deferred;
  LimitSpec limit;                                   // no value: no cap beyond the device
  SizeSpec preallocate{0, 75.0};                     // preallocate policy: up-front reservation
  bool preallocate_grow = false;                     // may preallocate grow past it (within the cap)?
  std::uint64_t growth_chunk = 32ull << 20;          // first chunk; later chunks double...
  std::uint64_t growth_chunk_max = 512ull << 20;     // ...up to this
  std::optional<std::uint64_t> release_idle_ns;      // no value: never give chunks back while running
  bool thread_cache = true;                          // per-thread caches in front of each pool
  bool vmm_cache = true;                             // recycle whole VMM mappings (every pooling policy)
  bool vmm_tight = false;                            // vmm: wait for fences before mapping past the mark
  std::string trace_path;                            // empty: no trace; "%p" becomes the pid
  std::uint64_t trace_flush_ns = 100'000'000;        // the writer flushes at least this often
  std::uint32_t trace_buffer_events = 16384;         // per-thread buffer, in events
  std::uint32_t trace_stacks = 0;                    // native stack of one allocation in N (0: none)
  std::string log_level = "info";
  // CUPOOL_SHARE*: a budget shared with the other processes on the node that name it.
  std::string share;                                 // empty: none
  LimitSpec share_limit;                             // the budget per device
  std::uint64_t share_wait_ns = 0;                   // how long an allocation may wait for room
  bool share_group = false;                          // the segment is the group's (0660), not the user's
  bool operator==(const Config&) const = default;
};

}  // namespace cupool
