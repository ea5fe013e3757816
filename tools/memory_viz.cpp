// `cupool export --memory-viz` (memory_viz.h): the traces' segments, blocks and trace entries
// written as a PyTorch memory snapshot.
#include "memory_viz.h"

#include <algorithm>
#include <iterator>

#include "pickle_writer.h"

namespace cupool::tools {

using trace::EventKind;

namespace {

// MemoryViz.js reads integers of at most 8 bytes, as signed: a larger one (a refused request of
// SIZE_MAX bytes) stops the whole page from loading. Such a value is written as 2^63 - 1.
void page_integer(PickleWriter& p, std::uint64_t v) {
  p.integer(static_cast<std::int64_t>(std::min<std::uint64_t>(v, static_cast<std::uint64_t>(INT64_MAX))));
}

constexpr std::uint64_t kBlockAlignment = 512;  // the pool's block granularity (policy/suballocator.h)
constexpr std::uint64_t kSmallSegment = 1 << 20;  // PyTorch calls segments of at most 1 MiB "small"

constexpr const char* kActionNames[] = {"alloc",        "free_requested", "free_completed", "segment_alloc",
                                        "segment_free", "segment_map",    "segment_unmap",  "oom"};

}  // namespace

MemoryVizWriter::MemoryVizWriter(std::FILE* out, const Analysis& analysis, std::size_t max_entries)
    : out_(out), analysis_(analysis), max_entries_(max_entries) {}

MemoryVizWriter::Lane& MemoryVizWriter::lane(std::size_t source, int device) {
  Lane& l = lanes_[{source, device}];
  l.source = source;
  l.device = device;
  return l;
}

// The lane whose block starts at `ptr`: the event's device first, then the process's others (a
// free may name no device).
MemoryVizWriter::Lane* MemoryVizWriter::lane_holding(std::size_t source, int device, std::uint64_t ptr) {
  if (auto it = lanes_.find({source, device}); it != lanes_.end() && it->second.blocks.count(ptr)) return &it->second;
  for (auto& [key, l] : lanes_)
    if (key.first == source && l.blocks.count(ptr)) return &l;
  return nullptr;
}

void MemoryVizWriter::add(Lane& l, Action a, std::uint64_t addr, std::uint64_t size, std::uint64_t stream,
                          std::uint64_t t_ns, std::uint32_t stack) {
  // PyTorch stamps entries in microseconds of the wall clock.
  const Source& s = sources_[l.source];
  std::uint64_t unix_ns = t_ns;
  if (s.start_unix_ns != 0) unix_ns = t_ns >= s.start_mono_ns ? s.start_unix_ns + (t_ns - s.start_mono_ns)
                                                                : s.start_unix_ns - std::min(s.start_unix_ns, s.start_mono_ns - t_ns);
  l.entries.push_back(Entry{a, addr, size, stream, unix_ns / 1000, stack});
  if (max_entries_ != 0 && l.entries.size() > max_entries_) {
    l.entries.pop_front();
    ++l.dropped;
  }
}

// Removes every block and segment overlapping [lo, hi): what a trace that lost events (a full
// writer buffer) can leave behind, freed so that the snapshot stays consistent.
namespace {
// The keys of the entries of `map` (address -> something with a size) that overlap [lo, hi).
template <class Map>
std::vector<std::uint64_t> overlapping(const Map& map, std::uint64_t lo, std::uint64_t hi) {
  std::vector<std::uint64_t> found;
  auto it = map.lower_bound(lo);
  if (it != map.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second.size > lo) found.push_back(prev->first);
  }
  for (; it != map.end() && it->first < hi; ++it) found.push_back(it->first);
  return found;
}
}  // namespace

void MemoryVizWriter::evict_range(Lane& l, std::uint64_t lo, std::uint64_t hi, std::uint64_t t, bool segments) {
  if (segments)
    for (std::uint64_t addr : overlapping(l.segments, lo, hi))
      if (auto it = l.segments.find(addr); it != l.segments.end()) drop_segment(l, it, t);
  for (std::uint64_t addr : overlapping(l.blocks, lo, hi)) complete(l, addr, t);
}

void MemoryVizWriter::add_segment(Lane& l, std::uint64_t addr, const Segment& s, std::uint64_t t) {
  evict_range(l, addr, addr + s.size, t, true);
  l.segments[addr] = s;
  const bool mapped = s.kind == SegmentKind::mapping || s.kind == SegmentKind::granules;
  add(l, mapped ? Action::segment_map : Action::segment_alloc, addr, s.size, s.stream, t);
}

void MemoryVizWriter::drop_segment(Lane& l, std::map<std::uint64_t, Segment>::iterator it, std::uint64_t t) {
  const std::uint64_t addr = it->first;
  const Segment s = it->second;
  std::vector<std::uint64_t> inside;
  for (auto b = l.blocks.lower_bound(addr); b != l.blocks.end() && b->first < addr + s.size; ++b)
    inside.push_back(b->first);
  for (std::uint64_t b : inside) complete(l, b, t);
  l.segments.erase(addr);
  const bool mapped = s.kind == SegmentKind::mapping || s.kind == SegmentKind::granules;
  add(l, mapped ? Action::segment_unmap : Action::segment_free, addr, s.size, s.stream, t);
}

// Granules of the vmm policy mapped at [addr, addr + size): joined with the runs they touch, so
// that a block over granules of two maps lies in one segment.
void MemoryVizWriter::map_granules(Lane& l, std::uint64_t addr, std::uint64_t size, std::uint64_t t) {
  std::uint64_t lo = addr, hi = addr + size;
  for (std::uint64_t at : overlapping(l.segments, addr > 0 ? addr - 1 : 0, hi + 1)) {
    auto it = l.segments.find(at);
    if (it->second.kind != SegmentKind::granules) {
      if (at < addr + size && at + it->second.size > addr) drop_segment(l, it, t);  // lost events left it here
      continue;
    }
    lo = std::min(lo, at);
    hi = std::max(hi, at + it->second.size);
    l.segments.erase(it);
  }
  l.segments[lo] = Segment{hi - lo, 0, SegmentKind::granules};
  add(l, Action::segment_map, addr, size, 0, t);
}

// Granules unmapped: the runs they lay in are cut (no block is left on them; any the trace still
// shows there is freed).
void MemoryVizWriter::unmap_granules(Lane& l, std::uint64_t addr, std::uint64_t size, std::uint64_t t) {
  const std::uint64_t hi = addr + size;
  evict_range(l, addr, hi, t, false);
  for (std::uint64_t at : overlapping(l.segments, addr, hi)) {
    auto it = l.segments.find(at);
    if (it->second.kind != SegmentKind::granules) continue;
    const std::uint64_t end = at + it->second.size;
    l.segments.erase(it);
    if (at < addr) l.segments[at] = Segment{addr - at, 0, SegmentKind::granules};
    if (end > hi) l.segments[hi] = Segment{end - hi, 0, SegmentKind::granules};
  }
  add(l, Action::segment_unmap, addr, size, 0, t);
}

// The block at `addr` is free again: free_requested (unless it was already), free_completed.
void MemoryVizWriter::complete(Lane& l, std::uint64_t addr, std::uint64_t t) {
  auto it = l.blocks.find(addr);
  if (it == l.blocks.end()) return;
  const Block b = it->second;
  if (b.pending_free) {
    if (auto q = std::find(l.quarantine.begin(), l.quarantine.end(), addr); q != l.quarantine.end())
      l.quarantine.erase(q);
    l.quarantine_bytes -= std::min(l.quarantine_bytes, b.size);
  } else {
    add(l, Action::free_requested, addr, b.requested, b.stream, t, b.stack);
  }
  // A free carries its allocation's frames, as PyTorch's do: the page shows them for a block it
  // rebuilds from the free.
  add(l, Action::free_completed, addr, b.requested, b.stream, t, b.stack);
  l.blocks.erase(it);
}

void MemoryVizWriter::allocate(Lane& l, const Event& e, std::uint64_t t) {
  const std::uint64_t stream = e.has_stream ? e.stream : 0;
  if (e.has_pool) {
    // A pool block: inside one of the pool's chunks, at the pool's granularity.
    const std::uint64_t size = (std::max<std::uint64_t>(e.size, 1) + kBlockAlignment - 1) / kBlockAlignment * kBlockAlignment;
    auto seg = l.segments.upper_bound(e.ptr);
    if (seg != l.segments.begin()) {
      --seg;
      if ((seg->second.kind == SegmentKind::chunk || seg->second.kind == SegmentKind::granules) &&
          e.ptr + size <= seg->first + seg->second.size) {
        evict_range(l, e.ptr, e.ptr + size, t, false);  // blocks only: the chunk stays
        l.blocks[e.ptr] = Block{size, e.size, stream, false, e.stack};
        add(l, Action::alloc, e.ptr, e.size, stream, t, e.stack);
        return;
      }
    }
  }
  // Memory the pool did not serve (or a block of a chunk the trace never showed): a segment of
  // its own, as PyTorch shows memory taken with its cache turned off.
  if (e.size == 0) return;
  add_segment(l, e.ptr, Segment{e.size, stream, SegmentKind::outside}, t);
  if (!l.entries.empty() && l.entries.back().action == Action::segment_alloc) l.entries.back().stack = e.stack;
  l.blocks[e.ptr] = Block{e.size, e.size, stream, false, e.stack};
  add(l, Action::alloc, e.ptr, e.size, stream, t, e.stack);
}

void MemoryVizWriter::free_block(Lane& l, std::uint64_t addr, bool held, std::uint64_t t) {
  auto it = l.blocks.find(addr);
  if (it == l.blocks.end() || it->second.pending_free) return;  // unknown, or freed twice
  auto seg = l.segments.upper_bound(addr);
  if (seg == l.segments.begin()) return;
  --seg;
  if (seg->second.kind == SegmentKind::mapping) return;  // given back by cuMemUnmap only
  if (held) {
    it->second.pending_free = true;
    l.quarantine.push_back(addr);
    l.quarantine_bytes += it->second.size;
    add(l, Action::free_requested, addr, it->second.requested, it->second.stream, t, it->second.stack);
    return;
  }
  complete(l, addr, t);
  if (seg->second.kind == SegmentKind::outside && seg->first == addr) drop_segment(l, seg, t);
}

// Deferred frees: blocks wait for a fence and are released oldest first. The pool reports the
// bytes still waiting on every event it serves; those beyond it have been released.
void MemoryVizWriter::settle_quarantine(Lane& l, std::uint64_t quarantined, std::uint64_t t) {
  while (l.quarantine_bytes > quarantined && !l.quarantine.empty()) complete(l, l.quarantine.front(), t);
}

void MemoryVizWriter::oom(Lane& l, const Event& e, TraceInput& input) {
  // What the process could still get, as cupool's memory info answers it (ProcessMemory::
  // mem_info): its cap (the recorded limit, else the device's memory) less what it holds.
  std::uint64_t total = 0;
  for (const DeviceInfo& d : input.devices())
    if (d.index == e.device) total = d.total_bytes;
  const SourceStats& s = analysis_.sources()[l.source];
  const std::uint64_t cap = s.meta.cap(e.device, total);
  Memory own;
  if (auto it = s.devices.find(e.device); it != s.devices.end()) own = it->second.fold.now();
  std::uint64_t free = cap > own.reserved ? cap - own.reserved : 0;
  // Refused by a shared budget: no more than the budget's room, besides the free memory of its
  // own pools. A trace records its own process's holdings only: the other members' come from
  // their traces exported with it (those naming the same budget); members whose trace is not
  // here are not known, and the room shown is then at most what it was.
  const std::optional<Config>& config = s.meta.config;
  const std::optional<SizeSpec> budget = config && !config->share.empty() ? config->share_limit.for_device(e.device)
                                                                          : std::nullopt;
  if (e.oom_class == trace::OomClass::share && budget) {
    std::uint64_t held = 0;
    for (const SourceStats& other : analysis_.sources()) {
      if (!other.meta.config || other.meta.config->share != config->share) continue;
      if (auto it = other.devices.find(e.device); it != other.devices.end()) held += it->second.fold.now().reserved;
    }
    const std::uint64_t limit = budget->resolve(total);
    const std::uint64_t room = limit > held ? limit - held : 0;
    const std::uint64_t own_free = own.reserved > own.in_use ? own.reserved - own.in_use : 0;
    free = std::min(free, room + own_free);
  }
  add(l, Action::oom, free, e.size, e.has_stream ? e.stream : 0, e.t_ns);
}

void MemoryVizWriter::visit(std::size_t source, const Event& e, TraceInput& input) {
  while (sources_.size() <= source) {
    const TraceMeta& m = analysis_.sources()[sources_.size()].meta;
    sources_.push_back(Source{m.start_unix_ns, m.start_mono_ns, m.path, m.pid, {}, {}, {}});
  }
  Source& src = sources_[source];
  const std::uint64_t t = e.t_ns;
  if (e.stack != 0 && !src.stacks.contains(e.stack))
    if (const Stack* stack = input.stack(e.stack)) src.stacks.emplace(e.stack, *stack);
  switch (e.kind) {
    case EventKind::alloc:
      if (e.rc == 0 && e.ptr != 0 && e.device >= 0) {
        Lane& l = lane(source, e.device);
        auto early = src.early_frees.find(e.ptr);
        const bool freed_already = early != src.early_frees.end() && early->second >= t;
        if (early != src.early_frees.end()) src.early_frees.erase(early);
        allocate(l, e, t);
        if (freed_already) free_block(l, e.ptr, false, t);
      } else if (e.rc != 0) {
        // The refused call's stack goes with its own `oom` entry (other threads' entries may
        // have come between the two).
        const auto pending = src.pending_oom.find(e.tid);
        if (pending == src.pending_oom.end()) {
          if (e.rc != 2 || e.device < 0) break;
          Lane& l = lane(source, e.device);
          oom(l, e, input);  // the driver's refusal: no pool event before it
          l.entries.back().stack = e.stack;
          break;
        }
        const std::uint64_t at = pending->second;
        src.pending_oom.erase(pending);
        if (at == kNoEntry || e.device < 0) break;
        Lane& l = lane(source, e.device);
        if (at >= l.dropped && at - l.dropped < l.entries.size()) l.entries[at - l.dropped].stack = e.stack;
      }
      break;
    case EventKind::free:
      if (e.rc == 0 && e.ptr != 0) {
        Lane* l = lane_holding(source, e.device, e.ptr);
        if (l == nullptr) {
          src.early_frees[e.ptr] = t;
          break;
        }
        // Held for a fence when the pool reports at least its bytes waiting; a free that went
        // to a thread's cache or straight back to the pool left nothing waiting.
        const std::uint64_t size = l->blocks[e.ptr].size;
        const bool held = e.has_pool && e.pool.quarantined >= size && e.pool.quarantined > 0;
        free_block(*l, e.ptr, held, t);
        if (e.has_pool) settle_quarantine(*l, e.pool.quarantined, t);
      }
      break;
    case EventKind::fence_retired:
      if (e.device >= 0) {
        Lane& l = lane(source, e.device);
        if (e.has_pool) {
          settle_quarantine(l, e.pool.quarantined, t);
        } else {
          std::uint64_t left = e.size;  // released bytes, oldest blocks first
          while (left > 0 && !l.quarantine.empty()) {
            const std::uint64_t addr = l.quarantine.front();
            left -= std::min(left, l.blocks[addr].size);
            complete(l, addr, t);
          }
        }
      }
      break;
    case EventKind::grow:
      if (e.rc == 0 && e.ptr != 0 && e.size != 0 && e.device >= 0) {
        if (e.granules) map_granules(lane(source, e.device), e.ptr, e.size, t);
        else add_segment(lane(source, e.device), e.ptr, Segment{e.size, 0, SegmentKind::chunk}, t);
      }
      break;
    case EventKind::release:
      if (e.device >= 0) {
        Lane& l = lane(source, e.device);
        if (e.granules) {
          if (e.size != 0) unmap_granules(l, e.ptr, e.size, t);
        } else if (auto it = l.segments.find(e.ptr); it != l.segments.end() && it->second.kind == SegmentKind::chunk) {
          drop_segment(l, it, t);
        }
      }
      break;
    case EventKind::vmm_map:
      if (e.rc == 0 && e.ptr != 0 && e.size != 0 && e.device >= 0) {
        Lane& l = lane(source, e.device);
        add_segment(l, e.ptr, Segment{e.size, 0, SegmentKind::mapping}, t);
        l.blocks[e.ptr] = Block{e.size, e.size, 0, false};
        add(l, Action::alloc, e.ptr, e.size, 0, t);
      }
      break;
    case EventKind::vmm_unmap:
      if (e.rc == 0 && e.ptr != 0) {
        for (auto& [key, l] : lanes_) {
          if (key.first != source) continue;
          std::vector<std::uint64_t> mapped;
          const std::uint64_t hi = e.ptr + std::max<std::uint64_t>(e.size, 1);
          for (const auto& [addr, seg] : l.segments)
            if (seg.kind == SegmentKind::mapping && addr < hi && addr + seg.size > e.ptr) mapped.push_back(addr);
          for (std::uint64_t addr : mapped) drop_segment(l, l.segments.find(addr), t);
        }
      }
      break;
    case EventKind::oom: {
      std::uint64_t at = kNoEntry;
      if (e.device >= 0) {
        Lane& l = lane(source, e.device);
        oom(l, e, input);
        at = l.dropped + l.entries.size() - 1;
      }
      src.pending_oom[e.tid] = at;
      break;
    }
    case EventKind::context_reset:
      if (e.device >= 0) {
        Lane& l = lane(source, e.device);
        while (!l.segments.empty()) drop_segment(l, l.segments.begin(), t);
        while (!l.blocks.empty()) complete(l, l.blocks.begin()->first, t);
      }
      break;
    default:
      break;
  }
}

// PyTorch's frames: {filename, line, name}; a native frame has no line (0), as PyTorch's own.
void MemoryVizWriter::write_frames(PickleWriter& p, const Lane& l, std::uint32_t stack) const {
  p.begin_list();
  const auto& stacks = sources_[l.source].stacks;
  if (auto it = stacks.find(stack); stack != 0 && it != stacks.end()) {
    for (const StackFrame& f : it->second) {
      p.begin_dict();
      // Memoized: a loop's allocations repeat their frames thousands of times.
      p.str_memo("filename"); p.str_memo(f.module.empty() ? "??" : f.module); p.item();
      p.str_memo("line"); p.integer(0); p.item();
      p.str_memo("name"); p.str_memo(frame_name(f)); p.item();
      p.end();
      p.item();
    }
  }
  p.end();
}

void MemoryVizWriter::write_segments(PickleWriter& p, const Lane& l, int index) const {
  for (const auto& [addr, seg] : l.segments) {
    std::uint64_t allocated = 0, active = 0, requested = 0;
    for (auto b = l.blocks.lower_bound(addr); b != l.blocks.end() && b->first < addr + seg.size; ++b) {
      active += b->second.size;
      if (!b->second.pending_free) {
        allocated += b->second.size;
        requested += b->second.requested;
      }
    }
    p.begin_dict();
    p.str_memo("device"); p.integer(index); p.item();
    p.str_memo("address"); page_integer(p, addr); p.item();
    p.str_memo("total_size"); page_integer(p, seg.size); p.item();
    p.str_memo("allocated_size"); page_integer(p, allocated); p.item();
    p.str_memo("active_size"); page_integer(p, active); p.item();
    p.str_memo("requested_size"); page_integer(p, requested); p.item();
    p.str_memo("stream"); page_integer(p, seg.stream); p.item();
    p.str_memo("segment_type"); p.str_memo(seg.size <= kSmallSegment ? "small" : "large"); p.item();
    p.str_memo("segment_pool_id"); p.integer(0); p.integer(0); p.tuple2(); p.item();
    p.str_memo("is_expandable"); p.boolean(seg.kind == SegmentKind::mapping || seg.kind == SegmentKind::granules); p.item();
    p.str_memo("frames"); p.begin_list(); p.end(); p.item();
    // The blocks tile the segment from its start: free gaps become inactive blocks.
    p.str_memo("blocks");
    p.begin_list();
    auto block = [&](std::uint64_t at, std::uint64_t size, std::uint64_t req, const char* state, std::uint32_t stack) {
      p.begin_dict();
      p.str_memo("address"); page_integer(p, at); p.item();
      p.str_memo("size"); page_integer(p, size); p.item();
      p.str_memo("requested_size"); page_integer(p, req); p.item();
      p.str_memo("state"); p.str_memo(state); p.item();
      p.str_memo("frames"); write_frames(p, l, stack); p.item();
      p.end();
      p.item();
    };
    std::uint64_t at = addr;
    for (auto b = l.blocks.lower_bound(addr); b != l.blocks.end() && b->first < addr + seg.size; ++b) {
      if (b->first > at) block(at, b->first - at, 0, "inactive", 0);
      block(b->first, b->second.size, b->second.requested,
            b->second.pending_free ? "active_pending_free" : "active_allocated", b->second.stack);
      at = b->first + b->second.size;
    }
    if (at < addr + seg.size) block(at, addr + seg.size - at, 0, "inactive", 0);
    p.end();
    p.item();
    p.end();
    p.item();
  }
}

void MemoryVizWriter::finish() {
  // One process: the snapshot's devices are its device ordinals. Several: one snapshot device
  // per process and device (their addresses may coincide), numbered in trace order.
  const bool several = analysis_.sources().size() > 1;
  std::vector<std::pair<const Lane*, int>> order;
  int next = 0;
  for (const auto& [key, l] : lanes_) order.emplace_back(&l, several ? next++ : key.second);
  int devices = 0;
  for (const auto& [l, index] : order) devices = std::max(devices, index + 1);

  PickleWriter p(out_, 4);
  p.begin_dict();
  p.str_memo("segments");
  p.begin_list();
  for (const auto& [l, index] : order) write_segments(p, *l, index);
  p.end();
  p.item();

  p.str_memo("device_traces");
  p.begin_list();
  for (int d = 0; d < devices; ++d) {
    p.begin_list();
    for (const auto& [l, index] : order) {
      if (index != d) continue;
      for (const Entry& e : l->entries) {
        p.begin_dict();
        p.str_memo("action"); p.str_memo(kActionNames[static_cast<int>(e.action)]); p.item();
        p.str_memo(e.action == Action::oom ? "device_free" : "addr"); page_integer(p, e.addr); p.item();
        p.str_memo("size"); page_integer(p, e.size); p.item();
        p.str_memo("stream"); page_integer(p, e.stream); p.item();
        p.str_memo("time_us"); page_integer(p, e.time_us); p.item();
        p.str_memo("frames"); write_frames(p, *l, e.stack); p.item();
        p.end();
        p.item();
      }
    }
    p.end();
    p.item();
  }
  p.end();
  p.item();

  // What each snapshot device stands for: pages and scripts that read only PyTorch's keys skip it.
  p.str_memo("cupool");
  p.begin_dict();
  p.str_memo("format"); p.str("cupool-memory-viz"); p.item();
  p.str_memo("version"); p.integer(1); p.item();
  p.str_memo("state_at"); p.str("end"); p.item();
  p.str_memo("devices");
  p.begin_list();
  for (const auto& [l, index] : order) {
    const Source& s = sources_[l->source];
    p.begin_dict();
    p.str_memo("index"); p.integer(index); p.item();
    p.str_memo("device"); p.integer(l->device); p.item();
    p.str_memo("pid"); p.integer(s.pid); p.item();
    p.str_memo("trace"); p.str(s.path); p.item();
    p.str_memo("entries_left_out"); page_integer(p, l->dropped); p.item();
    p.end();
    p.item();
  }
  p.end();
  p.item();
  p.end();
  p.item();

  p.end();
  p.finish();
}

}  // namespace cupool::tools
