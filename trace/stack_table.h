// Native call stacks of allocations (CUPOOL_TRACE_STACKS): interned by the thread that captured
// one, so that a trace writes each distinct stack once (a `stack` line) and its allocations name
// it by id; symbolized only when the writer writes that line, off the program's threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace cupool {

class StackTable {
 public:
  static constexpr std::size_t kMaxFrames = 48;
  static constexpr std::uint32_t kMaxStacks = 1u << 16;  // past it, new stacks are not recorded

  // The id (1, 2, ...) of this stack of return addresses, innermost first; 0 when the table is
  // full, `count` is 0, or memory ran out. Any thread; takes a lock (sampled allocations only).
  std::uint32_t intern(const std::uintptr_t* pcs, std::size_t count);
  // The frames of `id`; empty if unknown.
  std::vector<std::uintptr_t> frames(std::uint32_t id) const;
  std::size_t size() const;

  // pthread_atfork: the lock is held across fork, so the child's table is consistent.
  void lock() { mu_.lock(); }
  void unlock() { mu_.unlock(); }

 private:
  mutable std::mutex mu_;
  std::vector<std::vector<std::uintptr_t>> stacks_;  // id - 1
  std::unordered_multimap<std::uint64_t, std::uint32_t> by_hash_;
};

// A frame's JSON by return address. glibc's dladdr scans a module's symbols one by one (a
// framework's library exports hundreds of thousands), and stacks share most of their frames.
class FrameCache {
 public:
  const std::string& json(std::uintptr_t pc);

 private:
  static constexpr std::size_t kMaxEntries = 1u << 17;  // then it starts over
  std::unordered_map<std::uintptr_t, std::string> by_pc_;
};

// The `stack` line of trace format 3.3 (trace_schema.h, stack_key), newline included: each return
// address resolved with dladdr to its module and, where the module exports one, the symbol
// (demangled) that holds the call instruction.
std::string stack_line(std::uint32_t id, const std::vector<std::uintptr_t>& pcs, FrameCache& frames);

}  // namespace cupool
