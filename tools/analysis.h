// Folding trace events into what the tools show: per process and device memory over time (its
// parts: memory_fold.h), peaks,
// fragmentation, latency, counts, the largest allocations and every out-of-memory. The one home
// of that logic: `report` prints it, `replay` runs it over the events the replayed pools produce,
// `export` uses DeviceFold for its counter tracks, and `run` for its summary.
//
// Memory stays bounded: time series are downsampled into a fixed number of buckets, latencies go
// into log-linear histograms; only live allocations are remembered one by one.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "memory_fold.h"
#include "trace_input.h"
#include "trace_reader.h"
#include "trace_schema.h"

namespace cupool::tools {

struct OomInfo {
  std::uint64_t t = 0;
  std::uint64_t event_index = 0;  // 1-based, in this trace's events
  std::uint64_t line = 0;         // line of the trace file (replay: of the recorded event), 0: unknown
  int device = -1;
  std::string api;
  std::uint64_t size = 0;
  trace::OomClass oom_class = trace::OomClass::none;
  int rc = 0;
  std::uint32_t tid = 0;
  bool has_pool = false;
  trace::PoolState pool{};
  Stack stack;  // the refused call's native stack (CUPOOL_TRACE_STACKS), when the trace has it
};

struct AllocInfo {
  std::uint64_t size = 0;
  std::uint64_t t = 0;
  int device = -1;
  std::string api;
  std::uint64_t ptr = 0;
  Stack stack;  // its native stack (CUPOOL_TRACE_STACKS), when sampled
};

struct ApiStats {
  std::string api;
  trace::EventKind kind = trace::EventKind::alloc;
  std::array<std::uint64_t, static_cast<int>(trace::Path::count_)> per_path{};
  std::uint64_t count = 0;
  std::uint64_t failures = 0;  // rc != 0
  std::uint64_t bytes = 0;     // successful allocations, summed; saturates at 2^64 - 1
  LatencyHistogram latency;    // alloc and free calls only, weighted by timed_for
  std::uint64_t untimed = 0;   // alloc and free calls without a timing (trace format 2.0)
};

// One process on one device.
struct DeviceStats {
  int device = -1;
  DeviceInfo info;
  std::uint64_t cap = 0;  // the recorded limit, else the device total, else 0
  DeviceFold fold;
  Series series;
  Memory peak_in_use_memory;  // everything at the moment in_use peaked
  std::uint64_t peak_in_use = 0, peak_in_use_t = 0;
  std::uint64_t peak_reserved = 0, peak_reserved_t = 0;
  std::uint64_t peak_requested = 0;
  double frag_max = 0;
  bool started = false;
  std::uint64_t allocs = 0, frees = 0, failed_allocs = 0, grows = 0, grow_bytes = 0, releases = 0,
                release_bytes = 0, ooms = 0;
  double frag_mean() const { return series.frag_mean(); }
  double reserved_ratio() const {
    return peak_in_use ? static_cast<double>(peak_reserved) / static_cast<double>(peak_in_use) : 0.0;
  }
};

// One trace (one process).
struct SourceStats {
  TraceMeta meta;
  std::vector<DeviceInfo> device_infos;
  std::uint64_t events = 0, first_t = 0, last_t = 0, dropped = 0;
  bool has_footer = false;
  // When the process exited and its memory went back (Analysis::exit); 0: not yet.
  std::uint64_t exit_t = 0;
  std::string truncated;  // the reader's message when the last line was cut short, else ""
  std::vector<ApiStats> apis;  // in order of first appearance
  std::map<int, DeviceStats> devices;
  static constexpr std::size_t kMaxOomsKept = 1000;
  std::vector<OomInfo> ooms;  // the first kMaxOomsKept
  std::uint64_t oom_count = 0;
  static constexpr std::size_t kLargest = 10;
  std::vector<AllocInfo> largest;  // the kLargest largest allocations, largest first (after finish)
  std::unordered_map<std::uint32_t, std::size_t> pending_oom_;  // tid -> oom index, until its alloc fails
};

// Every process on one device, summed at each moment (peak of the sum, not sum of the peaks).
struct DeviceTotal {
  int device = -1;
  DeviceInfo info;
  Memory now;
  Series series;
  std::uint64_t peak_in_use = 0, peak_in_use_t = 0, peak_reserved = 0, peak_reserved_t = 0, peak_requested = 0;
  std::size_t processes = 0;
};

class Analysis {
 public:
  std::size_t add_source(TraceMeta meta);
  // Time zero of every series (the earliest event of all traces).
  void set_origin(std::uint64_t t) { origin_ = t; }
  // `line`: where the event is in its file (0: unknown), for out-of-memory listings.
  // `stack`: the event's native stack, if the trace has it (TraceInput::stack).
  void add(std::size_t source, const Event& e, std::uint64_t line = 0, const Stack* stack = nullptr);
  // Device lines, drops and footers, then the values that need the whole trace.
  void finish(std::size_t source, std::vector<DeviceInfo> devices, std::uint64_t dropped, bool has_footer,
              std::string truncated = "");
  // The process of trace `source` exited at `t`: everything it held on every device is gone (the
  // driver takes it back), from its own figures and from the sums. Called in time order with the
  // events of the other traces. Peaks stay; a source not added yet, or with no events, is ignored.
  void exit(std::size_t source, std::uint64_t t);

  std::uint64_t origin() const { return origin_; }
  std::uint64_t end() const;  // the last event or exit of all traces
  const std::vector<SourceStats>& sources() const { return sources_; }
  const std::map<int, DeviceTotal>& totals() const { return totals_; }
  std::uint64_t events() const;
  std::uint64_t oom_count() const;
  // The earliest out-of-memory of all traces (by time), or nullptr; `source` gets its trace.
  const OomInfo* first_oom(std::size_t* source = nullptr) const;

 private:
  DeviceStats& device(SourceStats& s, int device);
  ApiStats& api(SourceStats& s, const Event& e);
  void note_largest(SourceStats& s, const Event& e, const Stack* stack);
  // `e` changes the memory of one process on one device (`d`): its figures, series and the sums.
  void fold(DeviceStats& d, const Event& e);
  std::uint64_t origin_ = 0;
  std::vector<SourceStats> sources_;
  std::map<int, DeviceTotal> totals_;
};

// Reads every trace, merged by time (traces of other boots placed by the wall clock), into an
// Analysis. Each process exits, in that order too, at its footer's end time, else (killed) at its
// last event: Analysis::exit. `progress`: a line on stderr, refreshed, when reading takes more
// than a second and stderr is a terminal. `visit(source, event)` (may be empty) sees each event
// after the analysis did, with `t` on the merged clock. Throws TraceError.
class EventVisitor {
 public:
  virtual ~EventVisitor() = default;
  virtual void visit(std::size_t source, const Event& e, TraceInput& input) = 0;
  // The process of trace `source` exited at `t` (merged clock), after the analysis saw it.
  virtual void end(std::size_t /*source*/, std::uint64_t /*t*/, TraceInput& /*input*/) {}
};
void analyze(const std::vector<std::string>& paths, Analysis& out, bool progress, const char* command,
             EventVisitor* visitor = nullptr);

std::string_view kind_name(trace::EventKind k);
std::string_view path_name(trace::Path p);
std::string_view oom_name(trace::OomClass c);

}  // namespace cupool::tools
