// Folding trace events into what the tools show (analysis.h): the per process and device fold,
// peaks, fragmentation, latency histograms, counts and out-of-memory events.
#include "analysis.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>

#include "cli.h"

namespace cupool::tools {

using trace::EventKind;

std::string_view kind_name(EventKind k) { return trace::kEventKindNames[static_cast<int>(k)]; }
std::string_view path_name(trace::Path p) { return trace::kPathNames[static_cast<int>(p)]; }
std::string_view oom_name(trace::OomClass c) { return trace::kOomClassNames[static_cast<int>(c)]; }

// ---- Analysis ------------------------------------------------------------------------------

std::size_t Analysis::add_source(TraceMeta meta) {
  sources_.emplace_back();
  sources_.back().meta = std::move(meta);
  return sources_.size() - 1;
}

DeviceStats& Analysis::device(SourceStats& s, int dev) {
  auto it = s.devices.find(dev);
  if (it != s.devices.end()) return it->second;
  DeviceStats& d = s.devices[dev];
  d.device = dev;
  d.series = Series(origin_);
  DeviceTotal& total = totals_[dev];
  if (total.processes == 0) {
    total.device = dev;
    total.series = Series(origin_);
  }
  ++total.processes;
  return d;
}

ApiStats& Analysis::api(SourceStats& s, const Event& e) {
  for (ApiStats& a : s.apis)
    if (a.kind == e.kind && a.api == e.api) return a;
  s.apis.emplace_back();
  s.apis.back().api = e.api;
  s.apis.back().kind = e.kind;
  return s.apis.back();
}

void Analysis::note_largest(SourceStats& s, const Event& e, const Stack* stack) {
  auto& v = s.largest;
  auto smaller = [](const AllocInfo& a, const AllocInfo& b) {  // heap order: the smallest on top
    return a.size != b.size ? a.size > b.size : a.t < b.t;
  };
  if (v.size() == SourceStats::kLargest && e.size <= v.front().size) return;
  v.push_back(AllocInfo{e.size, e.t_ns, e.device, e.api, e.ptr, stack ? *stack : Stack{}});
  std::push_heap(v.begin(), v.end(), smaller);
  if (v.size() > SourceStats::kLargest) {
    std::pop_heap(v.begin(), v.end(), smaller);
    v.pop_back();
  }
}

void Analysis::add(std::size_t source, const Event& e, std::uint64_t line, const Stack* stack) {
  SourceStats& s = sources_[source];
  ++s.events;
  if (s.events == 1) s.first_t = e.t_ns;
  s.first_t = std::min(s.first_t, e.t_ns);
  s.last_t = std::max(s.last_t, e.t_ns);

  // Calls the program made (pool-internal events name no call of the program's; a graph_mem event
  // names the call after which the driver's graph memory changed, not one call of its own).
  const bool is_call = e.kind != EventKind::grow && e.kind != EventKind::release && e.kind != EventKind::fence_retired &&
                       e.kind != EventKind::oom && e.kind != EventKind::device && e.kind != EventKind::graph_mem;
  if (is_call && !e.api.empty()) {
    ApiStats& a = api(s, e);
    ++a.count;
    ++a.per_path[static_cast<std::size_t>(e.path)];
    if (e.rc != 0) ++a.failures;
    if (e.kind == EventKind::alloc || e.kind == EventKind::free) {
      if (e.timed_for)
        a.latency.add(e.dur_ns, e.timed_for);  // a sampled timing stands for its sample
      else
        ++a.untimed;
      // Saturates: a sum past 2^64 - 1 says "at least this much", not a small number.
      if (e.kind == EventKind::alloc && e.rc == 0 && __builtin_add_overflow(a.bytes, e.size, &a.bytes))
        a.bytes = ~std::uint64_t{0};
    }
  }

  // Out-of-memory: the pool's oom event, then the program's failed alloc on the same thread.
  // A failed alloc with no oom event before it is the driver's refusal (passthrough). Other
  // threads' events may come between the two: the thread's own oom is found by its index.
  std::size_t own_oom = 0;  // 1-based index in s.ooms of this failed alloc's oom, 0: none
  if (e.kind == EventKind::alloc && e.rc != 0)
    if (auto it = s.pending_oom_.find(e.tid); it != s.pending_oom_.end()) own_oom = it->second;
  if (e.kind == EventKind::oom ||
      (e.kind == EventKind::alloc && e.rc == 2 && s.pending_oom_.erase(e.tid) == 0)) {
    ++s.oom_count;
    if (s.ooms.size() < SourceStats::kMaxOomsKept) {
      OomInfo o;
      o.t = e.t_ns;
      o.event_index = s.events;
      o.line = line;
      o.device = e.device;
      if (e.kind != EventKind::oom) o.api = e.api;  // the pool's own event: its alloc names the API
      o.size = e.size;
      o.oom_class = e.kind == EventKind::oom ? e.oom_class : trace::OomClass::device;
      o.rc = e.rc;
      o.tid = e.tid;
      o.has_pool = e.has_pool;
      o.pool = e.pool;
      s.ooms.push_back(o);
    }
    if (e.kind == EventKind::oom) s.pending_oom_[e.tid] = s.ooms.size();
  }
  if (e.kind == EventKind::alloc && e.rc == 0 && e.size > 0) note_largest(s, e, stack);

  if (e.device < 0 && e.kind != EventKind::alloc && e.kind != EventKind::free) return;
  DeviceStats& d = device(s, e.device);
  switch (e.kind) {
    case EventKind::alloc:
      if (e.rc == 0) ++d.allocs;
      else ++d.failed_allocs;
      // The program's call names the API: fill in the oom event's API (and stack) from its
      // failed alloc; a refusal of the driver's own is the entry this alloc made.
      if (e.rc != 0) {
        OomInfo* o = own_oom != 0 && own_oom <= s.ooms.size() ? &s.ooms[own_oom - 1]
                     : !s.ooms.empty() && s.ooms.back().event_index == s.events ? &s.ooms.back()
                                                                                 : nullptr;
        if (o != nullptr && o->tid == e.tid) {
          if (o->api.empty()) o->api = e.api;
          if (stack) o->stack = *stack;
        }
      }
      break;
    case EventKind::free: ++d.frees; break;
    case EventKind::grow: if (e.rc == 0) { ++d.grows; d.grow_bytes += e.size; } break;
    case EventKind::release: ++d.releases; d.release_bytes += e.size; break;
    case EventKind::oom: ++d.ooms; break;
    default: break;
  }

  fold(d, e);
}

void Analysis::fold(DeviceStats& d, const Event& e) {
  const Memory before = d.fold.now();
  d.fold.apply(e);
  const Memory& m = d.fold.now();
  const bool first = !d.started;
  d.started = true;

  const double frag = m.fragmentation();
  d.frag_max = std::max(d.frag_max, frag);
  if (m.in_use > d.peak_in_use || first) {
    d.peak_in_use = m.in_use;
    d.peak_in_use_memory = m;
    d.peak_in_use_t = e.t_ns;
  }
  if (m.reserved > d.peak_reserved || first) {
    d.peak_reserved = m.reserved;
    d.peak_reserved_t = e.t_ns;
  }
  d.peak_requested = std::max(d.peak_requested, m.requested);
  d.series.add(e.t_ns, m);

  DeviceTotal& total = totals_[e.device];
  Memory& sum = total.now;
  sum.requested += m.requested - before.requested;
  sum.in_use += m.in_use - before.in_use;
  sum.reserved += m.reserved - before.reserved;
  // Each process can use only its own pool: summed, the fragmentation is the free-weighted mean.
  sum.largest_free += m.largest_free - before.largest_free;
  sum.free += m.free - before.free;
  if (sum.in_use > total.peak_in_use) {
    total.peak_in_use = sum.in_use;
    total.peak_in_use_t = e.t_ns;
  }
  if (sum.reserved > total.peak_reserved) {
    total.peak_reserved = sum.reserved;
    total.peak_reserved_t = e.t_ns;
  }
  total.peak_requested = std::max(total.peak_requested, sum.requested);
  total.series.add(e.t_ns, sum);
}

void Analysis::exit(std::size_t source, std::uint64_t t) {
  if (source >= sources_.size() || sources_[source].events == 0) return;  // it held nothing
  SourceStats& s = sources_[source];
  s.exit_t = std::max(t, s.last_t);
  // What the driver does at exit, as at a context reset: every allocation and the pool gone.
  for (auto& [dev, d] : s.devices) {
    Event gone;
    gone.kind = EventKind::context_reset;
    gone.device = dev;
    gone.t_ns = s.exit_t;
    fold(d, gone);
  }
}

void Analysis::finish(std::size_t source, std::vector<DeviceInfo> devices, std::uint64_t dropped, bool has_footer,
                      std::string truncated) {
  SourceStats& s = sources_[source];
  s.truncated = std::move(truncated);
  s.device_infos = std::move(devices);
  s.dropped = dropped;
  s.has_footer = has_footer;
  for (auto& [dev, d] : s.devices) {
    for (const DeviceInfo& info : s.device_infos)
      if (info.index == dev) d.info = info;
    d.cap = s.meta.cap(dev, d.info.total_bytes);
    DeviceTotal& total = totals_[dev];
    if (total.info.total_bytes == 0) total.info = d.info;
  }
  std::sort(s.largest.begin(), s.largest.end(),
            [](const AllocInfo& a, const AllocInfo& b) { return a.size != b.size ? a.size > b.size : a.t < b.t; });
  s.pending_oom_.clear();
}

std::uint64_t Analysis::end() const {
  std::uint64_t t = origin_;
  for (const auto& s : sources_) t = std::max({t, s.last_t, s.exit_t});
  return t;
}

std::uint64_t Analysis::events() const {
  std::uint64_t n = 0;
  for (const auto& s : sources_) n += s.events;
  return n;
}

const OomInfo* Analysis::first_oom(std::size_t* source) const {
  const OomInfo* best = nullptr;
  for (std::size_t i = 0; i < sources_.size(); ++i) {
    if (sources_[i].ooms.empty()) continue;
    const OomInfo& o = sources_[i].ooms.front();
    if (!best || o.t < best->t) {
      best = &o;
      if (source) *source = i;
    }
  }
  return best;
}

std::uint64_t Analysis::oom_count() const {
  std::uint64_t n = 0;
  for (const auto& s : sources_) n += s.oom_count;
  return n;
}

// ---- reading -------------------------------------------------------------------------------

namespace {

// What to add to each trace's `t` to put it on one clock with the others. `t` is CLOCK_MONOTONIC,
// which processes of one boot share exactly; traces of other boots (or hosts) are placed by the
// wall clock: each trace's boot time (start_unix_ns - start_mono_ns) against the earliest one.
// Boot times within 1 s of each other are taken as one boot (the wall clock drifts against the
// monotonic one by far less between two traces of one boot; two boots are more than 1 s apart):
// their traces keep their exact order.
std::vector<std::uint64_t> clock_shifts(const std::vector<std::unique_ptr<TraceInput>>& inputs) {
  constexpr std::int64_t kSameBoot = 1'000'000'000;
  std::vector<std::int64_t> boot;
  for (const auto& in : inputs) {
    const TraceMeta& m = in->meta();
    std::int64_t b = static_cast<std::int64_t>(m.start_unix_ns - m.start_mono_ns);
    for (std::int64_t earlier : boot)
      if (b - earlier < kSameBoot && earlier - b < kSameBoot) b = earlier;  // the boot already seen
    boot.push_back(b);
  }
  std::vector<std::uint64_t> shift;
  const std::int64_t first = boot.empty() ? 0 : *std::min_element(boot.begin(), boot.end());
  for (std::int64_t b : boot) shift.push_back(static_cast<std::uint64_t>(b - first));
  return shift;
}

}  // namespace

void analyze(const std::vector<std::string>& paths, Analysis& out, bool progress, const char* command,
             EventVisitor* visitor) {
  std::vector<std::unique_ptr<TraceInput>> inputs;
  for (const auto& p : paths) inputs.push_back(std::make_unique<TraceInput>(p));
  const std::size_t n = inputs.size();
  std::vector<std::size_t> index(n);
  for (std::size_t i = 0; i < n; ++i) index[i] = out.add_source(inputs[i]->meta());

  // Every trace's events on one clock, merged on it; the earliest is time zero. A trace that has
  // ended waits, as its process's exit, for the merged clock to reach its exit time.
  const std::vector<std::uint64_t> shift = clock_shifts(inputs);
  std::vector<Event> head(n);
  std::vector<bool> live(n), exiting(n);
  std::vector<std::uint64_t> last(n), exit_at(n);
  auto next = [&](std::size_t i) {
    live[i] = inputs[i]->next(head[i]);
    if (live[i]) {
      head[i].t_ns += shift[i];
      last[i] = std::max(last[i], head[i].t_ns);
      return;
    }
    exiting[i] = true;
    exit_at[i] = last[i];
    if (const auto end = inputs[i]->end_mono_ns()) exit_at[i] = std::max(last[i], *end + shift[i]);
  };
  auto leave = [&](std::size_t i) {
    exiting[i] = false;
    out.exit(index[i], exit_at[i]);
    if (visitor) visitor->end(index[i], exit_at[i], *inputs[i]);
  };
  std::uint64_t origin = ~std::uint64_t{0};
  for (std::size_t i = 0; i < n; ++i) {
    next(i);
    if (live[i]) origin = std::min(origin, head[i].t_ns);
  }
  out.set_origin(origin == ~std::uint64_t{0} ? 0 : origin);

  std::uint64_t total_bytes = 0;
  for (const auto& in : inputs) total_bytes += in->size();
  const auto start = std::chrono::steady_clock::now();
  bool shown = false;
  std::uint64_t count = 0;
  progress = progress && stderr_is_terminal();

  // Merge by time; within one trace, file order. An exit goes before events of its time.
  for (;;) {
    std::size_t pick = n, gone = n;
    if (n == 1) {
      pick = live[0] ? 0 : 1;
      gone = exiting[0] ? 0 : 1;
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        if (live[i] && (pick == n || head[i].t_ns < head[pick].t_ns)) pick = i;
        if (exiting[i] && (gone == n || exit_at[i] < exit_at[gone])) gone = i;
      }
    }
    if (gone != n && (pick == n || exit_at[gone] <= head[pick].t_ns)) {
      leave(gone);
      continue;
    }
    if (pick == n) break;
    out.add(index[pick], head[pick], inputs[pick]->line(), inputs[pick]->stack(head[pick].stack));
    if (visitor) visitor->visit(index[pick], head[pick], *inputs[pick]);
    next(pick);
    if (progress && (++count & 0x3ffff) == 0) {
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (secs > 1.0) {
        std::uint64_t done = 0;
        for (const auto& in : inputs) done += in->bytes_read();
        std::fprintf(stderr, "\r%s: %.1f M events, %.0f%%, %.1f M events/s   ", command,
                     static_cast<double>(count) / 1e6,
                     total_bytes ? 100.0 * static_cast<double>(done) / static_cast<double>(total_bytes) : 0.0,
                     static_cast<double>(count) / secs / 1e6);
        shown = true;
      }
    }
  }
  if (shown) std::fprintf(stderr, "\r%*s\r", 70, "");
  for (std::size_t i = 0; i < n; ++i)
    out.finish(index[i], inputs[i]->devices(), inputs[i]->dropped(), inputs[i]->has_footer(), inputs[i]->truncated());
}

}  // namespace cupool::tools
