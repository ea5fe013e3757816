// The effective configuration, parsed from CUPOOL_* variables by policy/options.cpp. Its fields
// come from the one table of options (policy/options.def), which names every variable, its
// field, default, accepted values, meaning and how the trace header records it.
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

// One field per option, with its default: policy/options.def (the variable's meaning is there).
struct Config {
#define CUPOOL_OPTION(id, variable, type, field, default_value, ...) type field = default_value;
#include "options.def"
#undef CUPOOL_OPTION
  bool operator==(const Config&) const = default;
};

}  // namespace cupool
