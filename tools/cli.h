// What every cupool subcommand shares: exit codes, argument parsing, sizes and durations.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace cupool::tools {

// Exit codes of `cupool` (docs/cli.md, and every --help). `run` exits with the program's own
// status instead, or 128 + signal when the program was killed by a signal.
inline constexpr int kExitOk = 0;
inline constexpr int kExitOutOfMemory = 1;  // replay: a policy ran out of memory
inline constexpr int kExitUsage = 2;        // bad arguments
inline constexpr int kExitBadTrace = 3;     // a trace cannot be read (missing, broken, newer format)
inline constexpr int kExitInternal = 4;     // cupool itself failed (cannot write output, cannot start)

// A usage error: printed as "cupool CMD: MESSAGE" plus a pointer to --help, exit 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Options of one subcommand: "--name VALUE", "--name=VALUE", flags "--name", and positionals.
// "--" ends the options; what follows is positional (the program of `run`). A value may not be
// empty, and "--name VALUE" takes no VALUE that begins with "--" (use "--name=--x").
class Args {
 public:
  Args(std::vector<std::string> args, std::vector<std::string_view> value_options,
       std::vector<std::string_view> flag_options, bool stop_at_first_positional = false);
  bool flag(std::string_view name) const;
  std::optional<std::string> value(std::string_view name) const;  // the last one given
  std::vector<std::string> values(std::string_view name) const;   // all, in order
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::vector<std::pair<std::string, std::string>> values_;
  std::vector<std::string> flags_;
  std::vector<std::string> positional_;
};

// "1.5GiB", "512MiB", "4096", "2G" (all 1024-based, as CUPOOL_* sizes).
std::uint64_t parse_size(std::string_view text, std::string_view option);
// "100us", "1ms", "2s", "500ns", "250" (ns).
std::uint64_t parse_duration_ns(std::string_view text, std::string_view option);

// "1.50 GiB" (units.h), "12.3 us", "45.6%".
std::string human_size(std::uint64_t bytes);
std::string human_duration(std::uint64_t ns);
std::string percent(double fraction);
std::string hex_ptr(std::uint64_t ptr);

// Does stderr go to a terminal (progress lines)?
bool stderr_is_terminal();

}  // namespace cupool::tools
