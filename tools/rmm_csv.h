// `cupool export --rmm-csv`: the log RMM's logging_resource_adaptor writes and its replay
// benchmark (REPLAY_BENCHMARK) reads, so that RMM's allocators can be benchmarked on the
// allocations of any program cupool traced. docs/cli.md describes the columns.
#pragma once

#include <cstdint>
#include <cstdio>
#include <unordered_map>
#include <vector>

#include "analysis.h"

namespace cupool::tools {

class RmmCsvWriter final : public EventVisitor {
 public:
  // Writes the header at once, a row per allocation, failed allocation and free as events come.
  RmmCsvWriter(std::FILE* out, const Analysis& analysis);
  void visit(std::size_t source, const Event& e, TraceInput& input) override;
  std::uint64_t rows() const { return rows_; }

 private:
  struct Free {
    std::uint64_t t = 0, stream = 0;
    std::uint32_t tid = 0;
  };
  struct Source {
    std::uint64_t start_unix_ns = 0, start_mono_ns = 0;
    std::uint64_t tag = 0;  // xor-ed into pointers: keeps two processes' equal addresses apart
    struct Live {
      std::uint64_t size = 0;  // asked for
      int device = -1;
    };
    std::unordered_map<std::uint64_t, Live> live;  // by pointer
    // Frees read before their allocation (threads' lines interleaved), by pointer.
    std::unordered_map<std::uint64_t, Free> early_frees;
  };
  void row(const Source& s, std::uint32_t tid, std::uint64_t t, const char* action, std::uint64_t ptr,
           std::uint64_t size, std::uint64_t stream);
  void allocated(Source& s, const Event& e, std::uint64_t ptr, std::uint64_t size, std::uint64_t stream);
  void freed(Source& s, std::uint32_t tid, std::uint64_t t, std::uint64_t ptr, std::uint64_t stream);

  std::FILE* out_;
  const Analysis& analysis_;
  std::vector<Source> sources_;
  std::uint64_t rows_ = 0;
};

}  // namespace cupool::tools
