// The parts Analysis (analysis.h) folds trace events with, one process on one device at a time:
// its Memory at a moment, live allocations by address, the fold itself, latency histograms and
// bounded time series. `export` uses DeviceFold for its counter tracks too.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "trace_reader.h"
#include "trace_schema.h"

namespace cupool::tools {

// The memory of one process on one device at one moment.
struct Memory {
  std::uint64_t requested = 0;     // live bytes the program asked for
  std::uint64_t in_use = 0;        // bytes handed out (pool block sizes, plus memory held outside the pool)
  std::uint64_t reserved = 0;      // bytes taken from the driver (pool chunks, plus memory outside the pool)
  std::uint64_t largest_free = 0;  // largest pool block that could be handed out
  std::uint64_t free = 0;          // reusable free bytes in the pool: reserved - in_use - quarantined
  // External fragmentation: 1 - largest free block / free bytes (0 when nothing is free).
  double fragmentation() const {
    return free == 0 ? 0.0 : 1.0 - static_cast<double>(largest_free) / static_cast<double>(free);
  }
};

// Live allocations by address: open addressing with linear probing and backward-shift deletion
// (an alloc/free pair per event at millions of events per second). Address 0 is never a key.
class PtrMap {
 public:
  struct Value {
    std::uint64_t size = 0;
    bool pooled = false;
  };
  // The slot for `key`, inserted (zeroed) if absent; `inserted` says which.
  Value& find_or_insert(std::uint64_t key, bool& inserted);
  bool take(std::uint64_t key, Value& out);  // remove and return
  void clear();
  std::size_t size() const { return size_; }

 private:
  struct Slot {
    std::uint64_t key = 0;
    Value value;
  };
  std::size_t slot_of(std::uint64_t key) const {
    return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  void grow();
  std::vector<Slot> slots_;
  std::size_t size_ = 0;
  unsigned shift_ = 64;
};

// Folds the events of one process on one device, in trace order, into its Memory. Pool-served
// events carry the pool's state; allocations without it (passthrough, or memory the pool does not
// serve) are held outside the pool and count as both in use and reserved.
class DeviceFold {
 public:
  void apply(const Event& e);
  const Memory& now() const { return now_; }
  // Frees of addresses never allocated in the trace (allocated before tracing began).
  std::uint64_t unmatched_frees() const { return early_frees_.size(); }

 private:
  void update();
  PtrMap live_;
  // Threads' events are interleaved in the file in the order the writer drained them, so a free
  // may come before its allocation: kept here (value.size: the free's time) until it does.
  PtrMap early_frees_;
  std::unordered_map<std::uint64_t, std::uint64_t> vmm_;  // cuMemCreate handle -> bytes
  // Mappings the VMM cache keeps after the program released them (`recycled` releases): still
  // reserved, not in use, until a `recycled` create hands one out again or cupool gives it back.
  std::unordered_map<std::uint64_t, std::uint64_t> vmm_kept_;
  std::uint64_t kept_ = 0;
  trace::PoolState pool_{};
  std::uint64_t requested_ = 0;
  std::uint64_t outside_ = 0;  // held outside the pool
  Memory now_;
};

// Log-linear histogram of durations: exact below 32 ns, then 16 buckets per power of two
// (at most 1/16 relative error).
class LatencyHistogram {
 public:
  static constexpr int kBuckets = 976;
  void add(std::uint64_t ns, std::uint64_t calls = 1);  // `calls` calls took about `ns` each
  std::uint64_t count() const { return count_; }
  std::uint64_t max() const { return max_; }
  std::uint64_t min() const { return count_ ? min_ : 0; }
  std::uint64_t quantile(double q) const;  // q in [0, 1]
  static int index(std::uint64_t ns);
  static std::uint64_t lower_bound(int index);
  const std::array<std::uint64_t, kBuckets>& buckets() const { return buckets_; }

 private:
  std::array<std::uint64_t, kBuckets> buckets_{};
  std::uint64_t count_ = 0, max_ = 0, min_ = ~std::uint64_t{0};
};

// A bounded time series of Memory: kBuckets buckets of equal width from `origin`, the width
// doubling whenever the trace outgrows them. Each bucket keeps the min, max and last values, and
// the time-weighted mean of the fragmentation over the bucket (each value weighs as long as it
// held, as the mean over the whole trace does: a chart of bucket maxima shows a brief spike as a
// plateau).
class Series {
 public:
  static constexpr std::size_t kBuckets = 1024;
  struct Point {
    std::uint64_t t = 0;  // bucket start, ns since origin
    Memory min, max, last;
    // Over every value held during the bucket, the one carried in from before its first sample
    // included: the mean lies between min and max.
    double frag_min = 0, frag_max = 0, frag_last = 0, frag_mean = 0;
  };
  explicit Series(std::uint64_t origin = 0) : origin_(origin) {}
  // The value from `t` on. Samples out of time order (threads' lines interleaved) are taken as
  // the latest value, and weigh from the latest time seen.
  void add(std::uint64_t t, const Memory& m);
  std::vector<Point> points() const;  // the buckets that got a value, in time order
  std::uint64_t width() const { return width_; }
  // The time-weighted mean fragmentation from the first sample to the last (0 before two).
  double frag_mean() const {
    return frag_time_ ? static_cast<double>(frag_weighted_ / static_cast<long double>(frag_time_)) : 0.0;
  }

 private:
  struct Bucket {
    bool set = false;        // a sample fell in it (else only a value carried across it)
    bool frag_seen = false;  // frag_min/max hold a value
    Point p;
    double frag_ns = 0;           // fragmentation x ns held within the bucket
    std::uint64_t known_ns = 0;   // ns of the bucket with a value
  };
  void widen();
  void fit(std::uint64_t rel);  // widen until `rel` falls in a bucket
  void weigh(std::uint64_t from, std::uint64_t to, double frag);  // `frag` held over [from, to)
  static void note_frag(Bucket& b, double lo, double hi);
  std::uint64_t origin_;
  std::uint64_t width_ = 1000;  // ns
  std::vector<Bucket> buckets_;
  bool started_ = false;
  std::uint64_t last_t_ = 0;  // the latest sample time
  double last_frag_ = 0;      // the latest sample's fragmentation
  long double frag_weighted_ = 0;  // fragmentation x ns, first sample to last
  std::uint64_t frag_time_ = 0;
};

}  // namespace cupool::tools
