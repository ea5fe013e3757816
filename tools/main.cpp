// The cupool command's entry point: one table of its subcommands, from which both `cupool --help`
// and the dispatch come, and what each exit status means. The subcommands run a program under
// libcupool.so, read its traces back (report, replay, export), and watch the budgets processes
// share (top, metrics).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "cli.h"
#include "commands.h"
#include "output.h"

#ifndef CUPOOL_VERSION
#define CUPOOL_VERSION "unknown"
#endif

namespace {

// The subcommands, in the order `cupool --help` lists them; run_command finds them by name.
struct Command {
  const char* name;
  const char* summary;  // its line in `cupool --help`
  int (*run)(const std::vector<std::string>& args);
};
const Command kCommands[] = {
    {"run", "run a program with libcupool.so preloaded, then print a summary", cupool::tools::cmd_run},
    {"report", "peaks, fragmentation, latency, counts and out-of-memory events of traces (text, --json, --html)",
     cupool::tools::cmd_report},
    {"replay", "drive a trace's allocations through policies on a simulated device", cupool::tools::cmd_replay},
    {"export", "convert a trace: Perfetto (--perfetto), PyTorch's memory_viz (--memory-viz), RMM's log (--rmm-csv)",
     cupool::tools::cmd_export},
    {"top", "the shared budgets on this node: who holds what, live (CUPOOL_SHARE)", cupool::tools::cmd_top},
    {"metrics", "the same figures for Prometheus: stdout, a textfile, or HTTP (--listen)", cupool::tools::cmd_metrics},
};

std::string main_help() {
  std::size_t width = 0;
  for (const Command& c : kCommands) width = std::max(width, std::strlen(c.name));
  std::string help = "usage: cupool COMMAND [OPTIONS...]\n\n";
  for (const Command& c : kCommands)
    help += "  " + std::string(c.name) + std::string(width - std::strlen(c.name) + 2, ' ') + c.summary + "\n";
  return help +
         "\n"
         "  cupool COMMAND --help   the options of one command\n"
         "  cupool --version        the version\n";
}
const std::string g_main_help = main_help();
const char* const kMainHelp = g_main_help.c_str();

int run_command(const std::string& command, const std::vector<std::string>& args) {
  using namespace cupool::tools;
  if (command == "--help" || command == "-h" || command == "help") {
    std::fputs(kMainHelp, stdout);
    std::printf("\n%s", kExitCodesHelp);
    return kExitOk;
  }
  if (command == "--version" || command == "-V") {
    std::printf("cupool %s\n", CUPOOL_VERSION);
    return kExitOk;
  }
  try {
    for (const Command& c : kCommands)
      if (command == c.name) return c.run(args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cupool %s: %s\n", command.c_str(), e.what());
    return kExitInternal;
  }
  std::fprintf(stderr, "cupool: unknown command \"%s\"\n\n%s", command.c_str(), kMainHelp);
  return kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace cupool::tools;
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::fputs(kMainHelp, stderr);
    std::fprintf(stderr, "\n%s", kExitCodesHelp);
    return kExitUsage;
  }
  const std::string command = args.front();
  args.erase(args.begin());
  const int code = run_command(command, args);
  // Output lost to a full disk or a closed pipe is a failure, not a success with nothing to
  // show (`run` writes nothing there but --help: its status stays the program's).
  if (!flush_stdout(command.c_str()) && (code == kExitOk || code == kExitOutOfMemory)) return kExitInternal;
  return code;
}

namespace cupool::tools {

namespace {

// What each status means: one table for `cupool --help` (all of them) and each command's --help
// (those it returns). `command`: the one command that returns it, named in the whole table.
struct ExitStatus {
  int code;
  const char* command;
  const char* meaning;
};
constexpr ExitStatus kExitStatuses[] = {
    {kExitOk, nullptr, "success"},
    {kExitOutOfMemory, "replay", "a replayed policy ran out of memory, or does not fit the recorded device (--min-capacity)"},
    {kExitUsage, nullptr, "usage error (bad options or arguments)"},
    {kExitBadTrace, nullptr, "a trace cannot be read: missing, broken line, or a newer format version"},
    {kExitInternal, nullptr, "cupool itself failed (cannot write an output file or standard output)"},
};

std::string exit_table(std::initializer_list<int> codes, bool name_commands) {
  std::string out = "exit status:\n";
  for (const ExitStatus& s : kExitStatuses) {
    if (std::find(codes.begin(), codes.end(), s.code) == codes.end()) continue;
    out += "  " + std::to_string(s.code) + "  " + (name_commands && s.command ? std::string(s.command) + ": " : "") +
           s.meaning + "\n";
  }
  return out;
}

const std::string g_all_exit_codes =
    exit_table({kExitOk, kExitOutOfMemory, kExitUsage, kExitBadTrace, kExitInternal}, true) +
    "  run: the program's own exit status, or 128+N when it was killed by signal N; 4 when cupool\n"
    "       cannot start it\n";

}  // namespace

const char* const kExitCodesHelp = g_all_exit_codes.c_str();

std::string exit_codes_help(std::initializer_list<int> codes) { return exit_table(codes, false); }

int usage_error(const char* command, const std::string& message) {
  std::fprintf(stderr, "cupool %s: %s\nTry 'cupool %s --help'.\n", command, message.c_str(), command);
  return kExitUsage;
}

}  // namespace cupool::tools
