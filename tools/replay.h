// `cupool replay`: the recorded allocations and frees driven through policies on simulated
// devices (tools/sim_upstream.h), each recorded process by the object the shim runs
// (ProcessMemory, policy/process_memory.h): its pools, its memory outside them, its cap. The
// replayed events go into one Analysis per policy: the same numbers as `report`.
#pragma once

#include <cstdint>
#include <functional>
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
  // A budget shared by every replayed process (CUPOOL_SHARE_LIMIT), in a private segment; none
  // when unset. It applies to every policy, "recorded" included. With share_wait_ns > 0, a
  // refusal makes every other process give back its wholly free memory (what their give-back
  // threads do while a member waits), then the allocation is tried once more; no time passes.
  std::optional<LimitSpec> share_limit;
  std::uint64_t share_wait_ns = 0;
  // Bisection probes stop reading at the first failure they look for.
  enum class Stop { never, failure, share_refusal } stop = Stop::never;
};

// An allocation the recording got that a replay refused: when, which trace, what, the class;
// with a shared budget, what each process held of it on that device then (by trace).
struct ReplayFailure {
  OomInfo oom;
  std::size_t source = 0;
  std::vector<std::pair<std::size_t, std::uint64_t>> held;
};

class Replayer final : public EventVisitor {
 public:
  explicit Replayer(ReplayOptions options);
  ~Replayer() override;
  void visit(std::size_t source, const Event& e, TraceInput& input) override;
  // The process has exited: the driver takes all its memory back (and the budget its claims).
  void end(std::size_t source, std::uint64_t t, TraceInput& input) override;
  struct Stopped {};  // thrown by visit() when options.stop is met
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
  // The first allocation the recording got that the run refused, of any class.
  const std::optional<ReplayFailure>& first_failure(std::size_t run) const;
  // With a shared budget: its first refusal of an allocation the recording got, the refusals of
  // any allocation, and the highest sum of every process's claims, per device.
  const std::optional<ReplayFailure>& first_refusal(std::size_t run) const;
  std::uint64_t share_refusals(std::size_t run) const;
  const std::map<int, std::uint64_t>& share_peak(std::size_t run) const;

 private:
  ReplayOptions options_;
  std::vector<std::unique_ptr<Run>> runs_;
  std::map<int, std::uint64_t> capacities_;
  std::uint64_t skipped_ = 0;
  bool started_ = false;
  std::set<std::size_t> streams_seen_;  // traces whose process created a stream
};

// One replay of `paths` under `policy` with `options` (the traces are read again), stopping at the
// first failure that options.stop names: that failure (none: it fits), and the budget's peak.
struct Probe {
  std::optional<ReplayFailure> failure;
  std::uint64_t share_peak = 0;  // the highest of every device's
};
Probe probe(const std::vector<std::string>& paths, const ReplayPolicy& policy, ReplayOptions options);

// The smallest of granularity, 2 x granularity, ... (and `upper` itself) at which `failure_at`
// finds no failure, given that `upper` fits, by bisection: sound because a replay is
// deterministic, exact if fitting is monotone in the value (more memory never hurts). `below` is
// what failed at the largest value that does not fit (none when even the smallest fits).
struct Smallest {
  std::uint64_t value = 0;
  std::uint64_t below_value = 0;
  std::optional<ReplayFailure> below;
  int probes = 0;
};
Smallest smallest_fitting(std::uint64_t upper, std::uint64_t granularity,
                          const std::function<std::optional<ReplayFailure>(std::uint64_t)>& failure_at);

}  // namespace cupool::tools
