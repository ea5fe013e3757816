// Sizes: rounding to a multiple, and approximate human-readable sizes ("1.5 GiB") for messages
// and reports. (options.h's format_size writes exact sizes that parse back, for configuration.)
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace cupool {

constexpr std::uint64_t round_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }
constexpr std::uint64_t round_down(std::uint64_t v, std::uint64_t a) { return v / a * a; }

inline std::string human_bytes(std::uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char buf[32];
  if (unit == 0)
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else
    std::snprintf(buf, sizeof buf, "%.*f %s", value < 10 ? 2 : 1, value, kUnits[unit]);
  return buf;
}

}  // namespace cupool
