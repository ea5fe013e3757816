// cupool top: the shared budgets on this node (policy/shared_budget.h) and who holds what in them,
// as a live view redrawn until interrupted, as text once, or as JSON. It reads the segments
// without joining them (tools/share_view.h).
#include <unistd.h>

#include <cstdio>
#include <ctime>

#include "cli.h"
#include "commands.h"
#include "output.h"
#include "share_view.h"
#include "share_watch.h"

namespace cupool::tools {

const char* const kTopHelp =
    "usage: cupool top [--json] [--once] [--interval DURATION] [--dir DIR]\n"
    "\n"
    "Shows every shared budget on this node (CUPOOL_SHARE; their segments are the files named\n"
    "cupool-share-* in /dev/shm): per budget its name, limit, and per device the budget and what\n"
    "its members hold; per member its pid, command, whether it is alive or gone (a process that\n"
    "died holding memory, until another member reclaims it), and per device it uses the bytes it\n"
    "holds of the budget, has in use, has reserved and waits for, and its out-of-memory count.\n"
    "On a terminal the view is redrawn every interval until interrupted (Ctrl-C); otherwise, or\n"
    "with --once or --json, it is printed once. Segments that cannot be read are skipped with a\n"
    "warning.\n"
    "\n"
    "options:\n"
    "  --json               print one JSON document ({\"format\":\"cupool-top\",...}) and exit\n"
    "  --once               print the view once, even on a terminal\n"
    "  --interval DURATION  time between redraws (default 1s)\n"
    "  --dir DIR            where the segments are (default /dev/shm)\n"
    "  --help               this text\n"
    "\n";

namespace {

std::string top_header(const ShareScan& scan, const std::string& dir) {
  std::size_t members = 0;
  for (const auto& b : scan.budgets) members += b.members.size();
  return "cupool top: " + std::to_string(scan.budgets.size()) + (scan.budgets.size() == 1 ? " budget, " : " budgets, ") +
         std::to_string(members) + (members == 1 ? " member" : " members") + " in " + clean_text(dir, true);
}

// The live view: the cursor goes home and each line clears what the last frame left after
// it, so the screen is redrawn without flicker.
int top_live(const std::string& dir, std::uint64_t interval) {
  StopSignals signals;
  std::fputs("\x1b[?25l\x1b[H\x1b[2J", stdout);  // hide the cursor, clear the screen
  do {
    std::string header, body;
    ShareScan scan;
    std::string error;
    const std::time_t now = std::time(nullptr);
    char clock[16] = "";
    std::strftime(clock, sizeof clock, "%H:%M:%S", std::localtime(&now));
    if (scan_shares(dir, scan, &error)) {
      body = top_text(scan, top_header(scan, dir) + "   " + clock + "   every " + human_duration(interval) + ", Ctrl-C quits",
                      true);
    } else {
      body = "cupool top: cannot read " + clean_text(error, true) + "   " + clock + "\n";
    }
    std::string frame = "\x1b[H";
    for (std::size_t start = 0; start < body.size();) {
      std::size_t end = body.find('\n', start);
      if (end == std::string::npos) end = body.size();
      frame.append(body, start, end - start);
      frame += "\x1b[K\n";
      start = end + 1;
    }
    frame += "\x1b[J";
    std::fwrite(frame.data(), 1, frame.size(), stdout);
    if (std::fflush(stdout) != 0) break;  // main() says so (exit 4)
  } while (signals.sleep(interval));
  std::fputs("\x1b[?25h", stdout);  // the cursor back
  return kExitOk;
}

}  // namespace

int cmd_top(const std::vector<std::string>& raw) {
  const char* const cmd = "top";
  try {
    Args args(raw, {"--interval", "--dir"}, {"--json", "--once", "--help"});
    if (args.flag("--help")) {
      std::fputs(kTopHelp, stdout);
      std::fputs(exit_codes_help({kExitOk, kExitUsage, kExitInternal}).c_str(), stdout);
      return kExitOk;
    }
    if (!args.positional().empty()) return usage_error(cmd, "unexpected argument \"" + args.positional()[0] + "\"");
    const std::uint64_t interval = interval_option(args, 1'000'000'000);
    const std::string dir = args.value("--dir").value_or(kDefaultShareDir);
    const ShareScan scan = scan_or_throw(dir);
    if (!args.flag("--json") && !args.flag("--once") && isatty(STDOUT_FILENO) == 1) return top_live(dir, interval);

    SkipWarnings warn(cmd);
    warn(scan);
    std::string text = args.flag("--json")
                           ? top_json(scan).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n"
                           : top_text(scan, top_header(scan, dir), false);
    std::fwrite(text.data(), 1, text.size(), stdout);
    return kExitOk;
  } catch (const UsageError& e) {
    return usage_error(cmd, e.what());
  }
}

}  // namespace cupool::tools
