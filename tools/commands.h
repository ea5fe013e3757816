// The subcommands of `cupool`; each takes the arguments after its name and returns the exit code.
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

namespace cupool::tools {

int cmd_run(const std::vector<std::string>& args);
int cmd_report(const std::vector<std::string>& args);
int cmd_replay(const std::vector<std::string>& args);
int cmd_export(const std::vector<std::string>& args);
int cmd_top(const std::vector<std::string>& args);
int cmd_metrics(const std::vector<std::string>& args);

extern const char* const kRunHelp;
extern const char* const kReportHelp;
extern const char* const kReplayHelp;
extern const char* const kExportHelp;
extern const char* const kTopHelp;
extern const char* const kMetricsHelp;

// Every exit status of cupool (`cupool --help`).
extern const char* const kExitCodesHelp;
// The exit-status paragraph of one command's --help: the statuses it returns (kExit*).
std::string exit_codes_help(std::initializer_list<int> codes);

// Prints "cupool CMD: message" and "Try 'cupool CMD --help'." to stderr; returns kExitUsage.
int usage_error(const char* command, const std::string& message);

}  // namespace cupool::tools
