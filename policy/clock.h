// The policy core's time source: nanoseconds of CLOCK_MONOTONIC, read by its events and its
// waits. The shim hands ProcessMemory the trace's clock instead (trace/event_clock.h: the same
// clock, read more cheaply where the TSC is trusted), so that pool events and hook events share
// one time line; tests and replay hand the pools clocks of their own (ContextPool::set_clock).
#pragma once

#include <time.h>

#include <cstdint>

namespace cupool {

inline std::uint64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

// A time source (ns) and its context.
using Clock = std::uint64_t (*)(void* ctx);
inline std::uint64_t monotonic_clock(void*) { return monotonic_ns(); }

}  // namespace cupool
