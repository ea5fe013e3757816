// cupool metrics: the figures of `cupool top` as Prometheus metrics, printed once, written to a
// textfile for node_exporter, or served over HTTP (metrics_server.h).
#include <sys/stat.h>

#include <cstdio>
#include <optional>

#include "cli.h"
#include "commands.h"
#include "metrics_server.h"
#include "output.h"
#include "share_view.h"
#include "share_watch.h"

namespace cupool::tools {

const char* const kMetricsHelp =
    "usage: cupool metrics [--listen HOST:PORT | --textfile PATH] [--interval DURATION] [--dir DIR] [--once]\n"
    "\n"
    "The figures of `cupool top` as Prometheus metrics (text exposition format 0.0.4):\n"
    "cupool_share_budget_bytes, cupool_share_budget_ratio, cupool_share_held_bytes,\n"
    "cupool_share_members, cupool_member_up, cupool_member_held_bytes, cupool_member_in_use_bytes,\n"
    "cupool_member_reserved_bytes, cupool_member_waiting_bytes, cupool_member_out_of_memory_total,\n"
    "cupool_share_segments_unreadable (docs/cli.md lists their labels). With neither --listen nor\n"
    "--textfile they are printed once.\n"
    "\n"
    "options:\n"
    "  --listen HOST:PORT   serve them over HTTP at /metrics until interrupted (SIGINT, SIGTERM);\n"
    "                       port 0 picks a free port; the address is said on stderr\n"
    "  --textfile PATH      write them to PATH (for node_exporter's textfile collector: name it\n"
    "                       *.prom), replaced whole every interval until interrupted\n"
    "  --once               with --textfile: write the file once and exit\n"
    "  --interval DURATION  with --textfile: time between writes (default 15s)\n"
    "  --dir DIR            where the segments are (default /dev/shm)\n"
    "  --help               this text\n"
    "\n";

namespace {

// --textfile: node_exporter runs as another user, so the file is readable by all (as far as the
// umask lets) rather than 0600 like cupool's other output; it holds pids and command names, which
// any user sees in /proc anyway.
void write_textfile(const std::string& path, const std::string& text, mode_t mode) {
  OutputFile out(path, false);
  struct stat st{};
  // A regular file here is our new temporary file; never chmod what is written in place (/dev/null).
  if (fstat(fileno(out.stream()), &st) == 0 && S_ISREG(st.st_mode)) fchmod(fileno(out.stream()), mode);
  std::fwrite(text.data(), 1, text.size(), out.stream());
  out.commit();
}

}  // namespace

int cmd_metrics(const std::vector<std::string>& raw) {
  const char* const cmd = "metrics";
  try {
    Args args(raw, {"--listen", "--textfile", "--interval", "--dir"}, {"--once", "--help"});
    if (args.flag("--help")) {
      std::fputs(kMetricsHelp, stdout);
      std::fputs(exit_codes_help({kExitOk, kExitUsage, kExitInternal}).c_str(), stdout);
      return kExitOk;
    }
    if (!args.positional().empty()) return usage_error(cmd, "unexpected argument \"" + args.positional()[0] + "\"");
    const auto listen = args.value("--listen");
    const auto textfile = args.value("--textfile");
    if (listen && textfile) return usage_error(cmd, "give --listen or --textfile, not both");
    if (listen && args.flag("--once")) return usage_error(cmd, "--once does not apply to --listen, which serves until interrupted");
    if (args.value("--interval") && !textfile)
      return usage_error(cmd, "--interval applies to --textfile (--listen reads the figures at each request)");
    const std::uint64_t interval = interval_option(args, 15'000'000'000);
    const std::string dir = args.value("--dir").value_or(kDefaultShareDir);
    const std::optional<ListenAddress> where = listen ? std::optional(parse_listen(*listen)) : std::nullopt;
    ShareScan scan = scan_or_throw(dir);

    if (where) return serve_metrics(*where, *listen, dir);
    SkipWarnings warn(cmd);
    if (!textfile) {
      warn(scan);
      const std::string text = metrics_text(scan);
      std::fwrite(text.data(), 1, text.size(), stdout);
      return kExitOk;
    }
    const mode_t mask = umask(0);
    umask(mask);
    const mode_t mode = 0644 & ~mask;
    if (args.flag("--once")) {
      warn(scan);
      write_textfile(*textfile, metrics_text(scan), mode);
      return kExitOk;
    }
    StopSignals signals;
    do {
      std::string error;
      if (!scan_shares(dir, scan, &error)) {
        std::fprintf(stderr, "cupool %s: cannot read %s\n", cmd, error.c_str());
        return kExitInternal;
      }
      warn(scan);
      write_textfile(*textfile, metrics_text(scan), mode);
    } while (signals.sleep(interval));
    return kExitOk;
  } catch (const UsageError& e) {
    return usage_error(cmd, e.what());
  }
}

}  // namespace cupool::tools
