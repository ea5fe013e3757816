// `cupool export --memory-viz`: a PyTorch memory snapshot (the pickle torch.cuda.memory._dump_snapshot
// writes), opened by pytorch.org/memory_viz and torch.cuda._memory_viz. docs/cli.md says what
// goes where; in short:
//
// - `segments`: the memory each process held on each device at the end of the traces: the
//   pool's chunks with their blocks (allocated, waiting for a fence, free), every allocation the
//   pool did not serve as a segment of its own (passthrough, managed, stream-ordered...), and
//   every virtual-memory mapping as an expandable segment holding one block;
// - `device_traces`: the events that led there, per device: `alloc`, `free_requested` and
//   `free_completed` (apart when the block waited for a fence), `segment_alloc`/`segment_free`
//   (chunks, and allocations outside the pool), `segment_map`/`segment_unmap` (mappings), `oom`.
//
// The page rebuilds earlier states by undoing events from the final state, so the two must
// agree: every block lies inside a segment at every step. Events that would break that (a
// trace that lost events) are made consistent: an allocation over a live block frees it first.
#pragma once

#include <cstdint>
#include <cstdio>
#include <deque>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "analysis.h"

namespace cupool::tools {

class MemoryVizWriter final : public EventVisitor {
 public:
  // `analysis` is the one analyze() fills (its memory figures give `oom`'s free bytes).
  // `max_entries`: the last this many trace entries per device are kept (0: all), as PyTorch's
  // own history keeps its last max_entries.
  MemoryVizWriter(std::FILE* out, const Analysis& analysis, std::size_t max_entries);
  void visit(std::size_t source, const Event& e, TraceInput& input) override;
  void finish();  // writes the whole pickle

 private:
  static constexpr std::uint64_t kNoEntry = ~std::uint64_t{0};
  enum class Action : std::uint8_t {
    alloc, free_requested, free_completed, segment_alloc, segment_free, segment_map, segment_unmap, oom
  };
  struct Entry {
    Action action;
    std::uint64_t addr;  // oom: the device's free bytes
    std::uint64_t size, stream, time_us;
    std::uint32_t stack = 0;  // the allocation's native stack (CUPOOL_TRACE_STACKS): its `frames`
  };
  // granules: mapped runs of the vmm policy's range (adjacent maps joined, unmaps cut them),
  // shown as PyTorch shows its expandable segments.
  enum class SegmentKind : std::uint8_t { chunk, outside, mapping, granules };
  struct Segment {
    std::uint64_t size = 0, stream = 0;
    SegmentKind kind = SegmentKind::chunk;
  };
  struct Block {
    std::uint64_t size = 0, requested = 0, stream = 0;
    bool pending_free = false;  // freed, waiting for a fence
    std::uint32_t stack = 0;
  };
  // One process on one device.
  struct Lane {
    std::size_t source = 0;
    int device = 0;
    std::map<std::uint64_t, Segment> segments;  // by address, never overlapping
    std::map<std::uint64_t, Block> blocks;      // live and pending-free blocks, by address
    std::deque<std::uint64_t> quarantine;       // pending-free blocks, oldest first
    std::uint64_t quarantine_bytes = 0;
    std::deque<Entry> entries;
    std::uint64_t dropped = 0;  // entries left out by max_entries
  };
  struct Source {
    std::uint64_t start_unix_ns = 0, start_mono_ns = 0;
    std::string path;
    std::int64_t pid = 0;
    // Frees read before their allocation (threads' lines interleaved): address -> free's t.
    std::unordered_map<std::uint64_t, std::uint64_t> early_frees;
    // Threads whose pool `oom` awaits its failed call: the oom entry's position in its lane
    // (counting entries dropped by max_entries), or kNoEntry.
    std::unordered_map<std::uint32_t, std::uint64_t> pending_oom;
    std::unordered_map<std::uint32_t, Stack> stacks;  // those the entries and blocks name, by id
  };

  Lane& lane(std::size_t source, int device);
  Lane* lane_holding(std::size_t source, int device, std::uint64_t ptr);
  void add(Lane& l, Action a, std::uint64_t addr, std::uint64_t size, std::uint64_t stream, std::uint64_t t_ns,
           std::uint32_t stack = 0);
  void allocate(Lane& l, const Event& e, std::uint64_t t);
  void free_block(Lane& l, std::uint64_t addr, bool held, std::uint64_t t);
  void complete(Lane& l, std::uint64_t addr, std::uint64_t t);
  void settle_quarantine(Lane& l, std::uint64_t quarantined, std::uint64_t t);
  void add_segment(Lane& l, std::uint64_t addr, const Segment& s, std::uint64_t t);
  void drop_segment(Lane& l, std::map<std::uint64_t, Segment>::iterator it, std::uint64_t t);
  void map_granules(Lane& l, std::uint64_t addr, std::uint64_t size, std::uint64_t t);
  void unmap_granules(Lane& l, std::uint64_t addr, std::uint64_t size, std::uint64_t t);
  // `segments`: the segments overlapping too (with their blocks), else blocks only.
  void evict_range(Lane& l, std::uint64_t lo, std::uint64_t hi, std::uint64_t t, bool segments);
  void oom(Lane& l, const Event& e, TraceInput& input);
  void write_segments(class PickleWriter& p, const Lane& l, int index) const;
  void write_frames(class PickleWriter& p, const Lane& l, std::uint32_t stack) const;

  std::FILE* out_;
  const Analysis& analysis_;
  std::size_t max_entries_;
  std::vector<Source> sources_;
  std::map<std::pair<std::size_t, int>, Lane> lanes_;
};

}  // namespace cupool::tools
