// The upstream interface: how a pool sees device memory. The shim implements it with the
// real CUDA driver (shim/driver_upstream.cpp); test/ and the replay tool implement it with a
// simulated device (tools/sim_upstream.h). The pool knows nothing of CUDA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace cupool {

enum class UpstreamStatus : std::uint8_t {
  ok = 0,
  out_of_memory,  // the device itself has no room
  share_exhausted,  // the budget shared with other processes has no room (policy/shared_budget.h)
  error,          // anything else (lost context, driver shut down)
};

// A fence is a marker placed after all device work issued so far; once it has retired,
// memory freed before it was placed may be reused. 0 means "no fence".
using FenceId = std::uint64_t;

// What a pool needs of the device, split by concern: memory (chunks), device work (sync, fences,
// captures), and virtual memory (the vmm policy's range and granules). An upstream is all three.

// Device memory in chunks.
class UpstreamMemory {
 public:
  virtual ~UpstreamMemory() = default;
  // Take device memory (a chunk): `bytes` if there is room for them, else anything down to
  // `min_bytes` (<= bytes), as RMM's try_to_expand(try, min): how to get it is the upstream's
  // business (reserve_at_least below is the shape they share). On success writes its base
  // address and, in `got`, its size. `driver_code` receives the native error code of the last
  // ask for the trace (0 on success).
  virtual UpstreamStatus reserve(std::size_t bytes, std::size_t min_bytes, std::uint64_t* base, std::size_t* got,
                                 int* driver_code) = 0;
  // Give a whole chunk back. Called only with a base and the size that reserve() gave.
  virtual void release(std::uint64_t base, std::size_t bytes) = 0;
  // Total device memory and what the driver reports free, for memory info and percentages.
  virtual void device_memory(std::size_t* total, std::size_t* free) = 0;
};

// The device's work, as far as reusing freed memory depends on it.
class UpstreamWork {
 public:
  virtual ~UpstreamWork() = default;
  // Wait for all device work issued so far (what cudaFree itself does).
  virtual void synchronize() = 0;
  // Deferred frees. True once the process has created any stream of its own: before that,
  // all work runs in one stream and stream order alone makes reuse safe.
  virtual bool needs_fences() = 0;
  // Place a fence after all work issued so far on every stream the process uses.
  virtual FenceId place_fence() = 0;
  // Non-blocking: has the fence retired? A retired fence is forgotten by the upstream.
  virtual bool fence_retired(FenceId fence) = 0;
  // Blocking: wait until the fence retires (then it is forgotten).
  virtual void wait_fence(FenceId fence) = 0;
  // A stream capture (a CUDA graph being recorded) is in progress. Placing, polling or waiting
  // for fences now could invalidate it (the driver forbids querying or synchronizing a capturing
  // stream, and, in its stricter modes, most queries at all), so the pool does none of these
  // until it ends. synchronize() stays usable: the driver's upstream then waits only for work
  // that is not being captured, as the driver's own cudaFree does there.
  virtual bool capturing() { return false; }
};

// Virtual memory: what the vmm policy needs (docs/design.md, "The vmm policy"). Optional: an
// upstream without it answers 0 to vmm_granularity() and the pool grows in chunks instead.
// Every address and size below is a multiple of the granularity.
class UpstreamMappings {
 public:
  virtual ~UpstreamMappings() = default;
  virtual std::size_t vmm_granularity() { return 0; }
  // Why vmm_granularity() is 0, in words (for the one line that says the vmm policy grows in
  // chunks instead).
  virtual std::string no_virtual_memory_reason() { return "it has no virtual memory management"; }
  // A virtual range with no memory behind it.
  virtual UpstreamStatus reserve_address(std::size_t /*bytes*/, std::uint64_t* /*va*/) { return UpstreamStatus::error; }
  virtual void free_address(std::uint64_t /*va*/, std::size_t /*bytes*/) {}
  // Device memory behind [va, va + bytes), readable and writable by the device. Each granule can
  // later be unmapped on its own, whatever the calls that mapped it.
  virtual UpstreamStatus map(std::uint64_t /*va*/, std::size_t /*bytes*/, int* driver_code) {
    *driver_code = 0;
    return UpstreamStatus::error;
  }
  // The memory behind mapped granules [va, va + bytes) goes back to the device. Does not wait for
  // device work: the caller makes sure none still uses it.
  virtual void unmap(std::uint64_t /*va*/, std::size_t /*bytes*/) {}
};

class Upstream : public UpstreamMemory, public UpstreamWork, public UpstreamMappings {};

// How an upstream serves reserve(bytes, min_bytes, ...): it asks for `bytes`, then, where there
// was no room for them (the device's, or a budget's), for `min_bytes`. ask(n, last) asks for
// exactly n bytes; `last`: no smaller ask follows (a budget waits for room only then). Writes the
// size of the last ask to `got`.
template <class Ask>
UpstreamStatus reserve_at_least(std::size_t bytes, std::size_t min_bytes, std::size_t* got, Ask ask) {
  const bool smaller = min_bytes < bytes;
  *got = bytes;
  UpstreamStatus st = ask(bytes, !smaller);
  if (smaller && (st == UpstreamStatus::out_of_memory || st == UpstreamStatus::share_exhausted)) {
    *got = min_bytes;
    st = ask(min_bytes, true);
  }
  return st;
}

}  // namespace cupool
