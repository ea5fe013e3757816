// VmmCache: recycles whole virtual-memory mappings (cuMemCreate + cuMemAddressReserve + cuMemMap of
// one handle over one reservation of the same size) so that a program that creates and destroys
// them for every buffer (XLA's platform allocator) pays no driver call when it repeats a size.
// Pure bookkeeping, no CUDA: the shim asks it what to do on each call and performs the driver
// calls; the few real calls the cache must make itself (giving a mapping back) go through
// VmmDriver, and reuse safety through the Upstream of the mapping's context (synchronize, fences).
// docs/design.md ("Virtual-memory mappings") explains the rules.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "config.h"
#include "upstream.h"

namespace cupool {

struct LastTaken;  // vmm_cache.cpp

// The allocation properties that must be equal for a mapping to be reused (the shim packs type,
// location, requested handle types and allocation flags into these words).
struct VmmProps {
  std::array<std::uint64_t, 4> w{};
  bool operator==(const VmmProps&) const = default;
};

// The access descriptors last set on a mapping (packed by the shim, one word per descriptor).
struct VmmAccess {
  static constexpr std::size_t kMax = 8;  // one per device of an 8-GPU node
  std::array<std::uint64_t, kMax> w{};
  std::uint32_t count = 0;  // more than kMax descriptors: never equal to anything cached
  bool operator==(const VmmAccess&) const = default;
  bool storable() const { return count > 0 && count <= kMax; }
};

// The real calls the cache makes itself, when it gives a mapping back or makes the driver's
// state match what the program believes before a call the cache cannot serve.
class VmmDriver {
 public:
  virtual ~VmmDriver() = default;
  virtual void unmap(std::uint64_t va, std::uint64_t size) = 0;
  // True if the driver released it (ProcessMemory then uncharges the handle's bytes).
  virtual bool release(std::uint64_t handle) = 0;
  virtual void address_free(std::uint64_t va, std::uint64_t size) = 0;
};

class VmmCache {
 public:
  // What the shim does with a call: nothing more (the cache served it), or the real call.
  enum class Verdict { served, forward };
  // Deferred mode: mappings of one size (in use or free) before a cuMemCreate of that size waits
  // for a fence of a freed one instead of creating another (bounds what the host's lead costs).
  static constexpr std::size_t kMaxPerKey = 32;

  struct Stats {
    std::uint64_t entries = 0;      // mappings held (in use by the program or free)
    std::uint64_t free_entries = 0;
    std::uint64_t free_bytes = 0;   // bytes of free mappings (still charged, reusable)
    std::uint64_t hits = 0;         // cuMemCreate served from a free mapping
    std::uint64_t evicted = 0;      // mappings given back to the driver for real
    std::uint64_t materialized = 0; // mappings dropped because the program did something else
    std::uint64_t synchronizes = 0, fences_placed = 0, fence_waits = 0;
  };

  VmmCache(VmmDriver& driver, FreeMode mode) : driver_(driver), mode_(mode) {}
  VmmCache(const VmmCache&) = delete;
  VmmCache& operator=(const VmmCache&) = delete;

  // ---- cuMemCreate
  // A free mapping of this owner, size and props whose reuse is safe: its handle (the program
  // now holds it), or 0 (create for real, then call created()). May synchronize or wait for a
  // fence of `owner`, as the free mode says.
  // `room`: whether the cap leaves room for a new mapping of `size`; without it, deferred mode
  // waits for a fence of a freed mapping rather than create one (and have the cap evict).
  std::uint64_t take(Upstream* owner, std::uint64_t size, const VmmProps& props, bool room = true);
  // A real cuMemCreate succeeded: the handle may become part of a mapping.
  void created(Upstream* owner, std::uint64_t handle, std::uint64_t size, const VmmProps& props);

  // ---- cuMemAddressReserve
  // addr 0 and flags 0: the address of the mapping whose handle this thread was just given, if it
  // fits (size, alignment), else 0 (reserve for real, then call reserved()).
  std::uint64_t reserve(std::uint64_t size, std::uint64_t alignment);
  // Before a real reservation at a hint: cached addresses the program has given up that overlap
  // the hint are given back, so the driver may honour the hint as it would have.
  void before_reserve_at(std::uint64_t addr, std::uint64_t size);
  void reserved(std::uint64_t va, std::uint64_t size);

  // ---- cuMemMap / cuMemUnmap / cuMemSetAccess / cuMemRelease / cuMemAddressFree
  // `forward`: the cache has already made the driver's state match the program's view for what
  // the call touches; the shim makes the real call, then reports success with the *_done call.
  Verdict map(std::uint64_t va, std::uint64_t size, std::uint64_t offset, std::uint64_t handle);
  void map_done(std::uint64_t va, std::uint64_t size, std::uint64_t offset, std::uint64_t handle);
  Verdict unmap(std::uint64_t va, std::uint64_t size);
  Verdict set_access(std::uint64_t va, std::uint64_t size, const VmmAccess& access);
  void set_access_done(std::uint64_t va, std::uint64_t size, const VmmAccess& access);
  // `size`, when served, receives the mapping's bytes (for the trace).
  Verdict release(std::uint64_t handle, std::uint64_t* size);
  Verdict address_free(std::uint64_t va, std::uint64_t size);

  // The handle is shared (cuMemExportToShareableHandle) or retained again
  // (cuMemRetainAllocationHandle at an address inside it): it is never cached from now on.
  void pin_handle(std::uint64_t handle);
  void pin_address(std::uint64_t addr);

  // Memory pressure: give back every free mapping of `owner` (nullptr: of every owner) for real.
  // Returns the bytes given back.
  std::uint64_t evict_free(Upstream* owner);
  // Replay: one thread replays every recorded thread's calls; *tid names whose call this is, so
  // that "the mapping this thread was just given" is the recorded thread's. Set before use.
  void set_recorded_thread(const std::uint32_t* tid) { recorded_thread_ = tid; }
  // The owner's context is gone (reset, destroyed, fork child): forget its mappings, no calls.
  void abandon(Upstream* owner);

  std::uint64_t free_bytes(Upstream* owner) const;
  Stats stats() const;

 private:
  enum class Stage : std::uint8_t { used, pending, fenced, safe };
  struct Entry {
    std::uint64_t va = 0, size = 0, handle = 0;
    Upstream* owner = nullptr;
    VmmProps props;
    VmmAccess access;
    bool access_known = false;
    // The program's view: does it hold the handle, the reservation, the mapping?
    bool has_handle = true, has_va = true, mapped = true;
    Stage stage = Stage::used;
    bool any() const { return has_handle || has_va || mapped; }
    bool live() const { return has_handle && has_va && mapped; }
  };
  struct Key {
    Upstream* owner;
    std::uint64_t size;
    VmmProps props;
    bool operator<(const Key& o) const {
      if (owner != o.owner) return owner < o.owner;
      if (size != o.size) return size < o.size;
      return props.w < o.props.w;
    }
  };
  struct Candidate {
    std::uint64_t size = 0;
    Upstream* owner = nullptr;
    VmmProps props;
  };
  struct Batch {
    Upstream* owner = nullptr;
    FenceId fence = 0;
    std::vector<std::uint64_t> ids;
  };
  using Lock = std::unique_lock<std::mutex>;

  Entry* by_handle(std::uint64_t handle);
  Entry* by_id(std::uint64_t id);
  std::vector<std::uint64_t> overlapping(std::uint64_t va, std::uint64_t size) const;
  void became_free(std::uint64_t id, Entry& e);
  void make_safe(std::uint64_t id, Entry& e);
  void materialize(std::uint64_t id);  // make the driver match the program's view; drop it
  void forget(std::uint64_t id);       // drop it, no calls (the driver already matches)
  void erase(std::uint64_t id);
  void unlink_free(std::uint64_t id, const Entry& e);
  void clear_range(std::uint64_t va, std::uint64_t size);  // materialize/forget what overlaps
  std::uint64_t hand_out(std::uint64_t id, Entry& e);
  void seal(Upstream* owner);
  void poll(Upstream* owner);

  LastTaken last_taken() const;
  void set_last_taken(std::uint64_t id);  // 0: none

  VmmDriver& driver_;
  const FreeMode mode_;
  const std::uint32_t* recorded_thread_ = nullptr;
  std::unordered_map<std::uint32_t, std::uint64_t> recorded_last_;  // recorded tid -> entry id
  mutable std::mutex mu_;
  std::uint64_t next_id_ = 1;
  std::unordered_map<std::uint64_t, Entry> entries_;
  std::unordered_map<std::uint64_t, std::uint64_t> by_handle_;  // handle -> id
  std::map<std::uint64_t, std::uint64_t> by_va_;                // va -> id
  std::map<Key, std::vector<std::uint64_t>> free_;              // free mappings (any stage but used)
  std::map<Key, std::size_t> per_key_;                          // mappings by key, in use or free
  std::unordered_map<std::uint64_t, Candidate> cand_handles_;   // created, not yet mapped
  std::unordered_map<std::uint64_t, std::uint64_t> cand_vas_;   // reserved (va -> size), not yet mapped
  std::vector<std::uint64_t> pending_;                          // freed, not yet synchronized/fenced
  std::uint64_t pending_bytes_ = 0;
  std::vector<Batch> batches_;                                  // fenced, oldest first
  Stats stats_;
};

}  // namespace cupool
