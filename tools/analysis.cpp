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

// ---- PtrMap --------------------------------------------------------------------------------

void PtrMap::grow() {
  std::vector<Slot> old = std::move(slots_);
  const std::size_t n = old.empty() ? 1024 : old.size() * 2;
  slots_.assign(n, Slot{});
  shift_ = static_cast<unsigned>(64 - __builtin_ctzll(n));
  size_ = 0;
  for (const Slot& s : old) {
    if (s.key == 0) continue;
    bool inserted;
    find_or_insert(s.key, inserted) = s.value;
  }
}

PtrMap::Value& PtrMap::find_or_insert(std::uint64_t key, bool& inserted) {
  if ((size_ + 1) * 4 > slots_.size() * 3) grow();  // load <= 3/4
  const std::size_t mask = slots_.size() - 1;
  for (std::size_t i = slot_of(key);; i = (i + 1) & mask) {
    Slot& s = slots_[i];
    if (s.key == key) {
      inserted = false;
      return s.value;
    }
    if (s.key == 0) {
      s.key = key;
      s.value = Value{};
      ++size_;
      inserted = true;
      return s.value;
    }
  }
}

bool PtrMap::take(std::uint64_t key, Value& out) {
  if (slots_.empty()) return false;
  const std::size_t mask = slots_.size() - 1;
  std::size_t i = slot_of(key);
  for (;; i = (i + 1) & mask) {
    if (slots_[i].key == 0) return false;
    if (slots_[i].key == key) break;
  }
  out = slots_[i].value;
  // Backward shift: move later members of the probe run into the hole.
  for (std::size_t j = (i + 1) & mask;; j = (j + 1) & mask) {
    if (slots_[j].key == 0) break;
    const std::size_t home = slot_of(slots_[j].key);
    // Can the entry at j move to i? Only if its home is not in (i, j] (cyclically).
    const bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
    if (stays) continue;
    slots_[i] = slots_[j];
    i = j;
  }
  slots_[i] = Slot{};
  --size_;
  return true;
}

void PtrMap::clear() {
  slots_.clear();
  size_ = 0;
  shift_ = 64;
}

// ---- DeviceFold ----------------------------------------------------------------------------

void DeviceFold::apply(const Event& e) {
  if (e.has_pool) pool_ = e.pool;
  switch (e.kind) {
    case EventKind::alloc:
      if (e.rc == 0 && e.ptr != 0) {
        if (PtrMap::Value early; early_frees_.size() && early_frees_.take(e.ptr, early)) {
          if (early.size >= e.t_ns) break;  // freed already (another thread's line came first)
          bool ignored;
          early_frees_.find_or_insert(e.ptr, ignored) = early;  // an older address: keep it
        }
        bool inserted;
        PtrMap::Value& v = live_.find_or_insert(e.ptr, inserted);
        if (!inserted) {  // a free was lost (writer drop): forget the old one
          requested_ -= v.size;
          if (!v.pooled) outside_ -= v.size;
        }
        v = PtrMap::Value{e.size, e.has_pool};
        requested_ += e.size;
        if (!e.has_pool) outside_ += e.size;
      }
      break;
    case EventKind::free:
      if (e.ptr != 0) {
        if (PtrMap::Value v; live_.take(e.ptr, v)) {
          requested_ -= v.size;
          if (!v.pooled) outside_ -= v.size;
        } else {
          bool ignored;
          early_frees_.find_or_insert(e.ptr, ignored) = PtrMap::Value{e.t_ns, false};
        }
      }
      break;
    case EventKind::vmm_create:
      if (e.rc == 0) {
        if (auto kept = vmm_kept_.find(e.ptr); e.recycled && kept != vmm_kept_.end()) {
          kept_ -= kept->second;
          vmm_kept_.erase(kept);
        }
        vmm_[e.ptr] += e.size;
        outside_ += e.size;
      }
      break;
    case EventKind::vmm_release:
      if (e.rc != 0) break;
      if (auto it = vmm_.find(e.ptr); it != vmm_.end()) {
        outside_ -= it->second;
        if (e.recycled) {  // kept by the cache: still reserved
          vmm_kept_[e.ptr] = it->second;
          kept_ += it->second;
        }
        vmm_.erase(it);
      } else if (auto kept = vmm_kept_.find(e.ptr); kept != vmm_kept_.end()) {  // cupool gave it back
        kept_ -= kept->second;
        vmm_kept_.erase(kept);
      }
      break;
    case EventKind::context_reset:
      // The context's pool and every allocation in it are gone.
      live_.clear();
      vmm_.clear();
      vmm_kept_.clear();
      kept_ = 0;
      pool_ = {};
      requested_ = outside_ = 0;
      break;
    default:
      break;
  }
  update();
}

void DeviceFold::update() {
  now_.requested = requested_;
  now_.in_use = pool_.in_use + outside_;
  now_.reserved = pool_.reserved + outside_ + kept_;
  now_.largest_free = pool_.largest_free;
  const std::uint64_t busy = pool_.in_use + pool_.quarantined + pool_.cached;  // cached: one thread's, not free to all
  now_.free = pool_.reserved > busy ? pool_.reserved - busy : 0;
  if (now_.largest_free > now_.free) now_.free = now_.largest_free;
}

// ---- LatencyHistogram ----------------------------------------------------------------------

int LatencyHistogram::index(std::uint64_t v) {
  if (v < 32) return static_cast<int>(v);
  const int e = 63 - __builtin_clzll(v);  // >= 5
  const auto m = static_cast<int>(v >> (e - 4));  // [16, 32)
  return (e - 4) * 16 + m;
}

std::uint64_t LatencyHistogram::lower_bound(int i) {
  if (i < 32) return static_cast<std::uint64_t>(i);
  const int e = i / 16 + 3;
  const auto m = static_cast<std::uint64_t>(i % 16 + 16);
  return m << (e - 4);
}

void LatencyHistogram::add(std::uint64_t ns, std::uint64_t calls) {
  buckets_[static_cast<std::size_t>(index(ns))] += calls;
  count_ += calls;
  max_ = std::max(max_, ns);
  min_ = std::min(min_, ns);
}

std::uint64_t LatencyHistogram::quantile(double q) const {
  if (count_ == 0) return 0;
  auto rank = static_cast<std::uint64_t>(q * static_cast<double>(count_));
  if (rank >= count_) rank = count_ - 1;
  std::uint64_t seen = 0;
  for (int i = 0; i < kBuckets; ++i) {
    seen += buckets_[static_cast<std::size_t>(i)];
    if (seen > rank) {
      // The middle of the bucket, within what was seen.
      const std::uint64_t lo = lower_bound(i);
      const std::uint64_t hi = i + 1 < kBuckets ? lower_bound(i + 1) : lo;
      const std::uint64_t mid = lo + (hi - lo) / 2;
      return std::clamp(mid, min(), max_);
    }
  }
  return max_;
}

// ---- Series --------------------------------------------------------------------------------

void Series::note_frag(Bucket& b, double lo, double hi) {
  b.p.frag_min = b.frag_seen ? std::min(b.p.frag_min, lo) : lo;
  b.p.frag_max = b.frag_seen ? std::max(b.p.frag_max, hi) : hi;
  b.frag_seen = true;
}

void Series::widen() {
  // Merge neighbours pairwise: the same span in half the buckets.
  std::vector<Bucket> merged(kBuckets);
  auto lo = [](Memory& a, const Memory& b) {
    a.requested = std::min(a.requested, b.requested);
    a.in_use = std::min(a.in_use, b.in_use);
    a.reserved = std::min(a.reserved, b.reserved);
    a.largest_free = std::min(a.largest_free, b.largest_free);
    a.free = std::min(a.free, b.free);
  };
  auto hi = [](Memory& a, const Memory& b) {
    a.requested = std::max(a.requested, b.requested);
    a.in_use = std::max(a.in_use, b.in_use);
    a.reserved = std::max(a.reserved, b.reserved);
    a.largest_free = std::max(a.largest_free, b.largest_free);
    a.free = std::max(a.free, b.free);
  };
  for (std::size_t i = 0; i < kBuckets; ++i) {
    Bucket& out = merged[i / 2];
    const Bucket& in = buckets_[i];
    out.p.t = (i / 2) * width_ * 2;
    out.frag_ns += in.frag_ns;
    out.known_ns += in.known_ns;
    if (in.frag_seen) note_frag(out, in.p.frag_min, in.p.frag_max);
    if (!in.set) continue;
    if (!out.set) {
      out.set = true;
      out.p.min = in.p.min;
      out.p.max = in.p.max;
    } else {
      lo(out.p.min, in.p.min);
      hi(out.p.max, in.p.max);
    }
    out.p.last = in.p.last;  // the later bucket's last value
    out.p.frag_last = in.p.frag_last;
  }
  buckets_ = std::move(merged);
  width_ *= 2;
}

void Series::fit(std::uint64_t rel) {
  if (buckets_.empty()) buckets_.resize(kBuckets);
  while (rel / width_ >= kBuckets) widen();
}

void Series::weigh(std::uint64_t from, std::uint64_t to, double frag) {
  frag_weighted_ += static_cast<long double>(frag) * static_cast<long double>(to - from);
  frag_time_ += to - from;
  const std::uint64_t a = from > origin_ ? from - origin_ : 0, b = to > origin_ ? to - origin_ : 0;
  if (a >= b) return;
  for (std::uint64_t i = a / width_; i <= (b - 1) / width_; ++i) {
    const std::uint64_t start = i * width_;
    const std::uint64_t span = std::min(b, start + width_) - std::max(a, start);
    Bucket& bucket = buckets_[i];
    bucket.p.t = start;
    bucket.frag_ns += frag * static_cast<double>(span);
    bucket.known_ns += span;
    note_frag(bucket, frag, frag);
  }
}

void Series::add(std::uint64_t t, const Memory& m) {
  const std::uint64_t rel = t > origin_ ? t - origin_ : 0;
  fit(rel);
  // The value before this one held from the latest sample until now.
  if (started_ && t > last_t_) weigh(last_t_, t, last_frag_);
  if (!started_ || t > last_t_) last_t_ = t;
  started_ = true;
  const double f = m.fragmentation();
  last_frag_ = f;

  Bucket& b = buckets_[rel / width_];
  note_frag(b, f, f);
  b.p.frag_last = f;
  if (!b.set) {
    b.set = true;
    b.p.t = rel / width_ * width_;
    b.p.min = b.p.max = b.p.last = m;
    return;
  }
  b.p.min.requested = std::min(b.p.min.requested, m.requested);
  b.p.min.in_use = std::min(b.p.min.in_use, m.in_use);
  b.p.min.reserved = std::min(b.p.min.reserved, m.reserved);
  b.p.min.largest_free = std::min(b.p.min.largest_free, m.largest_free);
  b.p.min.free = std::min(b.p.min.free, m.free);
  b.p.max.requested = std::max(b.p.max.requested, m.requested);
  b.p.max.in_use = std::max(b.p.max.in_use, m.in_use);
  b.p.max.reserved = std::max(b.p.max.reserved, m.reserved);
  b.p.max.largest_free = std::max(b.p.max.largest_free, m.largest_free);
  b.p.max.free = std::max(b.p.max.free, m.free);
  b.p.last = m;
}

std::vector<Series::Point> Series::points() const {
  std::vector<Point> out;
  for (const Bucket& b : buckets_) {
    if (!b.set) continue;
    out.push_back(b.p);
    // A bucket with no time weighed yet (the only sample so far) shows its value.
    out.back().frag_mean = b.known_ns ? b.frag_ns / static_cast<double>(b.known_ns) : b.p.frag_last;
  }
  return out;
}

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
