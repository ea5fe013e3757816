// The clock of trace events: CLOCK_MONOTONIC nanoseconds. Every traced call reads it twice, and
// on the H200's VM clock_gettime costs 28 ns against 16 ns for rdtsc, so where the TSC is
// invariant and the kernel trusts it, it is read instead and mapped onto CLOCK_MONOTONIC by a
// continuous, increasing piecewise-linear function, re-fitted every 20 ms: readings stay within
// microseconds of CLOCK_MONOTONIC and never run backwards. Elsewhere clock_gettime is used.
#pragma once

#include <cstdint>

namespace cupool {

std::uint64_t monotonic_ns();  // clock_gettime(CLOCK_MONOTONIC)

class EventClock {
 public:
  // Decides TSC or not (and calibrates: ~2 ms) on first use; call early to keep that off hot paths.
  static void init();
  // For tests: the TSC wherever the CPU says it is invariant, whatever the kernel thinks of it
  // (machines whose kernel prefers its hypervisor's clock would otherwise never test this path).
  static void init_trusting_cpu();
  static std::uint64_t now();
  static bool uses_tsc();
};

}  // namespace cupool
