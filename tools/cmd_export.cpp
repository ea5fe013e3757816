// cupool export --perfetto: traces as Chrome trace event JSON.
#include <cstdio>

#include "cli.h"
#include "commands.h"
#include "output.h"
#include "perfetto.h"

namespace cupool::tools {

const char* const kExportHelp =
    "usage: cupool export --perfetto TRACE... -o FILE [--slow DURATION]\n"
    "\n"
    "Writes Chrome trace event JSON, opened by ui.perfetto.dev and chrome://tracing: per process\n"
    "and device, counter tracks \"GPU N requested\", \"GPU N in use\", \"GPU N reserved\" and \"GPU N\n"
    "largest free\" (a value each time it changes); instant events for out-of-memory (and failed\n"
    "allocations), grow and release; slices for allocations and frees slower than --slow. Times\n"
    "are microseconds since the first event of all traces. Several traces become several processes.\n"
    "\n"
    "options:\n"
    "  --perfetto          the format (the only one so far; required)\n"
    "  -o, --output FILE   where to write (- for standard output)\n"
    "  --slow DURATION     slices for calls at least this slow (default 100us; 0: every call)\n"
    "  --no-progress       no progress line\n"
    "  --help              this text\n"
    "\n";

int cmd_export(const std::vector<std::string>& raw) {
  const char* const cmd = "export";
  try {
    Args args(raw, {"-o", "--output", "--slow"}, {"--perfetto", "--no-progress", "--help"});
    if (args.flag("--help")) {
      std::fputs(kExportHelp, stdout);
      std::fputs(kExitCodesHelp, stdout);
      return kExitOk;
    }
    if (!args.flag("--perfetto")) return usage_error(cmd, "say which format: --perfetto");
    if (args.positional().empty()) return usage_error(cmd, "no trace given");
    auto output = args.value("-o");
    if (auto o = args.value("--output")) output = o;
    if (!output) return usage_error(cmd, "no output file given (-o FILE)");
    const std::uint64_t slow = args.value("--slow") ? parse_duration_ns(*args.value("--slow"), "--slow") : 100'000;

    // Opened before the traces are read: a path that cannot be written is said at once.
    OutputFile out(*output, true);
    Analysis a;
    PerfettoWriter writer(out.stream(), a, slow);
    try {
      analyze(args.positional(), a, !args.flag("--no-progress"), "cupool export", &writer);
      writer.finish();
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
