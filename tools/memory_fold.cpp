// The parts of the fold (memory_fold.h): live allocations by address, one device's memory over
// its events, latency histograms and bounded time series.
#include "memory_fold.h"

#include <algorithm>

namespace cupool::tools {

using trace::EventKind;

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

}  // namespace cupool::tools
