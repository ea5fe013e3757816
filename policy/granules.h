// Granules: which parts of the vmm policy's virtual range have device memory behind them, and
// which of those no block touches any more. The range is cut into granules (the driver's mapping
// granularity); each has a state (unmapped, mapped, or a map or unmap in flight) and a count of
// the taken blocks (live or quarantined) that touch it. A mapped granule that no block touches is
// idle: it may be unmapped, once the device work that used it has retired (`safe_seq`).
// No driver calls and no lock here: ContextPool serialises access and makes the calls
// (docs/design.md, "The vmm policy").
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace cupool {

class Granules {
 public:
  // Consecutive granules [first, first + count), as addresses: [va, va + bytes).
  struct Run {
    std::uint64_t va = 0;
    std::uint64_t bytes = 0;
  };

  // The range [base, base + size); size a multiple of `granule`. Everything unmapped and untouched.
  void reset(std::uint64_t base, std::uint64_t size, std::uint64_t granule);
  void clear() { reset(0, 0, granule_ ? granule_ : 1); }
  bool empty() const { return users_.empty(); }
  std::uint64_t base() const { return base_; }
  std::uint64_t size() const { return static_cast<std::uint64_t>(users_.size()) * granule_; }
  std::uint64_t granule() const { return granule_; }

  // Is every granule of the block mapped (none unmapped or in flight)?
  bool ready(std::uint64_t addr, std::uint64_t bytes) const;
  // Is a map or unmap of one of its granules in flight?
  bool busy(std::uint64_t addr, std::uint64_t bytes) const;
  // A block was taken: its granules are touched (and so never picked for unmapping).
  void touch(std::uint64_t addr, std::uint64_t bytes);
  // A block went: granules it leaves untouched become idle. `seq`: 0 if the device can no longer
  // be using the block (its free waited, or its fence retired); else the pool's free sequence
  // number at the free, and the granule may be unmapped only once a fence placed after that
  // retires (safe_seq >= seq).
  void untouch(std::uint64_t addr, std::uint64_t bytes, std::uint64_t seq);

  // Where a block of `bytes` inside the free block [addr, addr + size) finds the most memory
  // mapped: at its start, at a granule boundary after it, or at the last place it fits; *offset
  // receives the place (from addr, a multiple of 512). Returns the bytes that place would need
  // mapped (granules in flight count as missing).
  std::uint64_t best_window(std::uint64_t addr, std::uint64_t size, std::uint64_t bytes, std::uint64_t* offset) const;
  // Bytes of the block's granules that are unmapped.
  std::uint64_t missing_bytes(std::uint64_t addr, std::uint64_t bytes) const;
  // The block's unmapped granules, as runs, now marked as being mapped. Their bytes in *bytes.
  std::vector<Run> begin_map(std::uint64_t addr, std::uint64_t bytes, std::uint64_t* total);
  // A run from begin_map: mapped, or (failed) unmapped again.
  void end_map(const Run& run, bool mapped);

  // Up to `max_bytes` of idle granules that are safe as of `safe_seq`, those idle the longest
  // first, as runs (ascending) now marked as being unmapped; no longer counted as mapped.
  std::vector<Run> begin_unmap(std::uint64_t max_bytes, std::uint64_t safe_seq);
  void end_unmap(const Run& run);  // the run is unmapped

  std::uint64_t mapped_bytes() const { return mapped_ * granule_; }  // mapped, not in flight
  std::uint64_t idle_bytes() const { return idle_ * granule_; }      // mapped and untouched
  // Some idle granule waits for a fence past `safe_seq` before it may be unmapped.
  bool unsafe_idle(std::uint64_t safe_seq) const { return idle_ > 0 && max_idle_seq_ > safe_seq; }
  std::uint32_t users(std::uint64_t addr) const;  // tests
  bool mapped(std::uint64_t addr) const;          // tests: mapped, not in flight

 private:
  enum class State : std::uint8_t { unmapped, mapping, mapped, unmapping };
  std::size_t index(std::uint64_t addr) const { return static_cast<std::size_t>((addr - base_) / granule_); }
  void first_last(std::uint64_t addr, std::uint64_t bytes, std::size_t* first, std::size_t* last) const;
  bool is_idle(std::size_t i) const { return state_[i] == State::mapped && users_[i] == 0; }
  void set_idle_bit(std::size_t i, bool on);

  std::uint64_t base_ = 0;
  std::uint64_t granule_ = 1;
  std::vector<std::uint32_t> users_;   // taken blocks touching each granule
  std::vector<State> state_;
  std::vector<std::uint64_t> seq_;     // idle granules: the free sequence they wait for (0: none)
  std::vector<std::uint64_t> idle_bits_;  // one bit per idle granule, scanned by words
  std::uint64_t mapped_ = 0, idle_ = 0;  // granules
  // An upper bound of seq_ over the idle granules not yet safe (those safe stay safe: the safe
  // sequence number only grows).
  std::uint64_t max_idle_seq_ = 0;
  std::size_t top_ = 0;               // past the highest granule ever mapped
  std::vector<std::uint64_t> since_;  // idle granules: when they became idle (stamp_ then)
  std::uint64_t stamp_ = 0;           // counts granules becoming idle
};

}  // namespace cupool
