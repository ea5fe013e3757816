// `cupool replay`: the recorded allocations and frees driven through policies on simulated
// devices (tools/sim_upstream.h), each recorded process by the object the shim runs
// (ProcessMemory, core/process_memory.h): its pools, its memory outside them, its cap. The
// replayed events go into one Analysis per policy: the same numbers as `report`.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "analysis.h"
#include "config.h"

namespace cupool::tools {

struct ReplayPolicy {
  std::string name;  // "growth", "preallocate", "passthrough", or "recorded"
  Config config;
  // Each trace under the configuration its header records (decoded as the reader decodes it).
  bool recorded = false;
};

struct ReplayOptions {
  std::vector<ReplayPolicy> policies;
  std::optional<std::uint64_t> capacity;  // every simulated device; else the trace's device total
  static constexpr std::uint64_t kDefaultCapacity = 80ull << 30;  // when the trace names no total
  // The simulated devices place each reservation at this granularity (plain cudaMalloc's).
  static constexpr std::uint64_t kDeviceGranularity = 512;
};

class Replayer final : public EventVisitor {
 public:
  explicit Replayer(ReplayOptions options);
  ~Replayer() override;
  void visit(std::size_t source, const Event& e, TraceInput& input) override;
  // After the last event: device lines, drops and footers of the recorded traces.
  void finish(const Analysis& recorded);

  struct Run;
  const std::vector<std::unique_ptr<Run>>& runs() const { return runs_; }
  const Analysis& analysis(std::size_t run) const;
  const ReplayPolicy& policy(std::size_t run) const;
  // The configuration a run replayed trace `source` under (the recorded one for "recorded").
  Config config(std::size_t run, std::size_t source) const;
  std::uint64_t capacity(int device) const;   // what the simulated device had
  std::uint64_t skipped() const { return skipped_; }  // allocations not replayed (size 0)

 private:
  ReplayOptions options_;
  std::vector<std::unique_ptr<Run>> runs_;
  std::map<int, std::uint64_t> capacities_;
  std::uint64_t skipped_ = 0;
  bool started_ = false;
  std::set<std::size_t> streams_seen_;  // traces whose process created a stream
};

}  // namespace cupool::tools
