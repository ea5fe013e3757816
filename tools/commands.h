// The subcommands of `cupool`; each takes the arguments after its name and returns the exit code.
#pragma once

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

// The exit-code paragraph shared by every --help.
extern const char* const kExitCodesHelp;

// Prints "cupool CMD: message" and "Try 'cupool CMD --help'." to stderr; returns kExitUsage.
int usage_error(const char* command, const std::string& message);

}  // namespace cupool::tools
