// cupool export: traces as Chrome trace event JSON (--perfetto), a PyTorch memory snapshot
// (--memory-viz) or RMM's allocation log (--rmm-csv).
#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "cli.h"
#include "commands.h"
#include "memory_viz.h"
#include "output.h"
#include "perfetto.h"
#include "rmm_csv.h"

namespace cupool::tools {

const char* const kExportHelp =
    "usage: cupool export (--perfetto | --memory-viz | --rmm-csv) TRACE... -o FILE [options]\n"
    "\n"
    "--perfetto writes Chrome trace event JSON, opened by ui.perfetto.dev and chrome://tracing: per\n"
    "process and device, counter tracks \"GPU N requested\", \"GPU N in use\", \"GPU N reserved\" and\n"
    "\"GPU N largest free\" (a value each time it changes); instant events for out-of-memory (and\n"
    "failed allocations), grow and release; slices for allocations and frees slower than --slow.\n"
    "Times are microseconds since the first event of all traces. Several traces become several\n"
    "processes.\n"
    "\n"
    "--memory-viz writes a PyTorch memory snapshot (a pickle), opened by pytorch.org/memory_viz and\n"
    "torch.cuda._memory_viz: the segments and blocks held at the end of the traces (pool chunks;\n"
    "memory outside the pool and virtual-memory mappings as segments of their own) and the events\n"
    "that led there per device (alloc, free_requested, free_completed, segment_alloc/free/map/unmap,\n"
    "oom). With several traces, each process's device is a device of its own in the snapshot.\n"
    "\n"
    "--rmm-csv writes RMM's allocation log (Thread,Time,Action,Pointer,Size,Stream), which RMM's\n"
    "REPLAY_BENCHMARK replays: every allocation, failed allocation and free of the program.\n"
    "\n"
    "options:\n"
    "  --perfetto          Chrome trace event JSON\n"
    "  --memory-viz        PyTorch memory snapshot\n"
    "  --rmm-csv           RMM's replay log\n"
    "  -o, --output FILE   where to write (- for standard output)\n"
    "  --slow DURATION     --perfetto: slices for calls at least this slow (default 100us; 0: every call)\n"
    "  --max-entries N     --memory-viz: keep the last N events per device (default: all)\n"
    "  --no-progress       no progress line\n"
    "  --help              this text\n"
    "\n";

int cmd_export(const std::vector<std::string>& raw) {
  const char* const cmd = "export";
  try {
    Args args(raw, {"-o", "--output", "--slow", "--max-entries"},
              {"--perfetto", "--memory-viz", "--rmm-csv", "--no-progress", "--help"});
    if (args.flag("--help")) {
      std::fputs(kExportHelp, stdout);
      std::fputs(exit_codes_help({kExitOk, kExitUsage, kExitBadTrace, kExitInternal}).c_str(), stdout);
      return kExitOk;
    }
    const int formats = args.flag("--perfetto") + args.flag("--memory-viz") + args.flag("--rmm-csv");
    if (formats == 0) return usage_error(cmd, "say which format: --perfetto, --memory-viz or --rmm-csv");
    if (formats > 1) return usage_error(cmd, "one format at a time: --perfetto, --memory-viz or --rmm-csv");
    if (args.positional().empty()) return usage_error(cmd, "no trace given");
    auto output = args.value("-o");
    if (auto o = args.value("--output")) output = o;
    if (!output) return usage_error(cmd, "no output file given (-o FILE)");
    if (args.value("--slow") && !args.flag("--perfetto")) return usage_error(cmd, "--slow is an option of --perfetto");
    if (args.value("--max-entries") && !args.flag("--memory-viz"))
      return usage_error(cmd, "--max-entries is an option of --memory-viz");
    const std::uint64_t slow = args.value("--slow") ? parse_duration_ns(*args.value("--slow"), "--slow") : 100'000;
    std::uint64_t max_entries = 0;
    if (auto v = args.value("--max-entries")) {
      char* end = nullptr;
      errno = 0;
      max_entries = std::strtoull(v->c_str(), &end, 10);
      if (v->empty() || (*v)[0] < '0' || (*v)[0] > '9' || *end != '\0' || errno != 0 || max_entries == 0)
        return usage_error(cmd, "--max-entries: '" + *v + "' is not a whole number of at least 1");
    }

    // Opened before the traces are read: a path that cannot be written is said at once.
    OutputFile out(*output, true);
    Analysis a;
    try {
      const bool progress = !args.flag("--no-progress");
      if (args.flag("--memory-viz")) {
        MemoryVizWriter writer(out.stream(), a, static_cast<std::size_t>(max_entries));
        analyze(args.positional(), a, progress, "cupool export", &writer);
        writer.finish();
      } else if (args.flag("--rmm-csv")) {
        RmmCsvWriter writer(out.stream(), a);
        analyze(args.positional(), a, progress, "cupool export", &writer);
      } else {
        PerfettoWriter writer(out.stream(), a, slow);
        analyze(args.positional(), a, progress, "cupool export", &writer);
        writer.finish();
      }
    } catch (const TraceError& e) {
      std::fprintf(stderr, "cupool export: %s\n", e.what());
      return kExitBadTrace;  // the output file is left as it was
    }
    out.commit();
    return kExitOk;
  } catch (const UsageError& e) {
    return usage_error(cmd, e.what());
  }
}

}  // namespace cupool::tools
