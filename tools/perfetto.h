// `cupool export --perfetto`: Chrome trace event JSON (ui.perfetto.dev, chrome://tracing).
// Counter tracks per process and device (requested, in use, reserved, largest free), instant
// events for out-of-memory, grow and release, and slices for calls slower than a threshold.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "analysis.h"

namespace cupool::tools {

class PerfettoWriter final : public EventVisitor {
 public:
  // Writes to `out` (not closed). `analysis` is the one analyze() fills: its DeviceFold values
  // are what the counters show.
  PerfettoWriter(std::FILE* out, const Analysis& analysis, std::uint64_t slow_ns);
  void visit(std::size_t source, const Event& e, TraceInput& input) override;
  void finish();  // closes the JSON
  std::uint64_t written() const { return written_; }

 private:
  struct Track {
    std::size_t source;
    int device;
    Memory last;
    bool any = false;
  };
  void line(const std::string& text);
  void begin(std::size_t source, TraceInput& input);
  std::int64_t pid(std::size_t source) const { return pids_[source]; }
  std::string ts(std::uint64_t t) const;

  std::FILE* out_;
  const Analysis& analysis_;
  std::uint64_t slow_ns_;
  std::vector<std::int64_t> pids_;
  std::vector<Track> tracks_;
  bool first_line_ = true;
  std::uint64_t written_ = 0;
};

}  // namespace cupool::tools
