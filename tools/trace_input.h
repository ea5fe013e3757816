// One trace file opened for reading: the streaming reader (trace/trace_reader.h) plus what the
// tools want from its header. The only file of tools/ that uses the reader (TraceReader); the
// others see only what it hands out (Event, Stack, DeviceInfo, frame_name).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trace_reader.h"

namespace cupool::tools {

using DeviceInfo = cupool::DeviceInfo;  // index, name, total_bytes

struct TraceMeta {
  std::string path;                  // as given on the command line (bad UTF-8 replaced)
  std::int64_t pid = 0;
  std::vector<std::string> cmdline;
  int format_major = 0, format_minor = 0;  // the trace format version of the header
  // The recorded configuration, decoded by the code that reads every header (decode_config);
  // nothing when the header's is not one this version knows (config_error says why).
  std::optional<Config> config;
  std::string config_error;
  // When the trace was opened, by the wall clock and by CLOCK_MONOTONIC (the clock of `t`): an
  // event's wall-clock time is start_unix_ns + (t - start_mono_ns).
  std::uint64_t start_unix_ns = 0, start_mono_ns = 0;
  // The CUPOOL_TRACE the trace was written for, as its header's configuration records it (""
  // when none): what `cupool run` finds the traces of a run by.
  std::string trace_pattern;
  std::string policy;                // config's policy and free mode by name ("" when unknown)
  std::string free_mode;
  std::string label() const;         // "pid 1234 python train.py"
  // The cap on `device`: the recorded limit resolved against the device total, else the total.
  std::uint64_t cap(int device, std::uint64_t device_total) const;
};

class TraceInput {
 public:
  // "-" reads standard input. A gzip or zstd trace is decompressed as it is read. Throws
  // TraceError when the file cannot be opened or its header read.
  explicit TraceInput(const std::string& path);
  ~TraceInput();
  TraceInput(const TraceInput&) = delete;
  TraceInput& operator=(const TraceInput&) = delete;

  // False at the end. A last line cut short (the process was killed while writing it) ends the
  // trace with a warning (truncated()); any other broken line throws TraceError.
  bool next(Event& e);
  const std::string& truncated() const { return truncated_; }
  const TraceMeta& meta() const { return meta_; }
  std::vector<DeviceInfo> devices() const;  // device lines seen so far
  std::uint64_t dropped() const;            // events the writer dropped (drop lines)
  // An event's `stack` (CUPOOL_TRACE_STACKS): its frames, or nullptr. Valid until the next next().
  const Stack* stack(std::uint32_t id) const { return reader_->stack(id); }
  bool has_footer() const;                  // false: the process did not exit normally
  // When the process exited (CLOCK_MONOTONIC, the clock of `t`): its footer's end time; nothing
  // without a footer, or in one that has none.
  std::optional<std::uint64_t> end_mono_ns() const;
  std::uint64_t bytes_read();               // for progress
  std::uint64_t size() const { return size_; }
  std::uint64_t line() const { return reader_->line_number(); }  // of the event last read

 private:
  std::unique_ptr<TraceReader> reader_;
  TraceMeta meta_;
  std::uint64_t size_ = 0;
  std::string truncated_;
};

}  // namespace cupool::tools
