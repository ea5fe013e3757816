// cupool report: what one or more traces say, as text, JSON or an HTML page.
#include <cstdio>

#include "analysis.h"
#include "cli.h"
#include "commands.h"
#include "output.h"
#include "report.h"

namespace cupool::tools {

const char* const kReportHelp =
    "usage: cupool report [OPTIONS] TRACE...\n"
    "\n"
    "Reads traces written by libcupool.so (streamed: any size, bounded memory) and prints, per\n"
    "trace and device: peak requested / in use / reserved, reserved-to-in-use ratio, external\n"
    "fragmentation (1 - largest free block / free bytes) at peak in use, mean over time and max,\n"
    "latency p50/p99/max per API, calls per API and path, the largest allocations, every\n"
    "out-of-memory with its class and the pool's state, and writer drops. Several traces (ranks of\n"
    "a job, processes on one GPU) are merged by time, shown side by side and summed per device.\n"
    "TRACE may be - for standard input; traces compressed with gzip or zstd are read as they are.\n"
    "\n"
    "options:\n"
    "  --json          print JSON instead of text\n"
    "  --html FILE     also write a self-contained HTML page with charts (works offline)\n"
    "  --no-progress   no progress line (shown on a terminal when reading takes over a second)\n"
    "  --help          this text\n"
    "\n";

int cmd_report(const std::vector<std::string>& raw) {
  const char* const cmd = "report";
  try {
    Args args(raw, {"--html"}, {"--json", "--no-progress", "--help"});
    if (args.flag("--help")) {
      std::fputs(kReportHelp, stdout);
      std::fputs(exit_codes_help({kExitOk, kExitUsage, kExitBadTrace, kExitInternal}).c_str(), stdout);
      return kExitOk;
    }
    if (args.positional().empty()) return usage_error(cmd, "no trace given");
    Analysis a;
    try {
      analyze(args.positional(), a, !args.flag("--no-progress"), "cupool report");
    } catch (const TraceError& e) {
      std::fprintf(stderr, "cupool report: %s\n", e.what());
      return kExitBadTrace;
    }
    if (auto html = args.value("--html")) {
      OutputFile out(*html, false);
      const std::string page = report_html(a);
      std::fwrite(page.data(), 1, page.size(), out.stream());
      out.commit();
    }
    if (args.flag("--json")) {
      std::string text = report_json(a).dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fputc('\n', stdout);
    } else {
      const std::string text = report_text(a);
      std::fwrite(text.data(), 1, text.size(), stdout);
    }
    return kExitOk;
  } catch (const UsageError& e) {
    return usage_error(cmd, e.what());
  }
}

}  // namespace cupool::tools
