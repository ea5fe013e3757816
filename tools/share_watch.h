// What `cupool top` and `cupool metrics` share to watch the shared budgets' segments over time:
// the stop signals that end a live view, the --interval and --dir options, and the warning of a
// segment that cannot be read.
#pragma once

#include <signal.h>
#include <time.h>

#include <cstdint>
#include <mutex>
#include <set>
#include <string>

#include "cli.h"
#include "share_view.h"

namespace cupool::tools {

// Where the segments are unless --dir says.
inline constexpr const char* kDefaultShareDir = "/dev/shm";

// SIGINT and SIGTERM end the live views, with status 0. They stay blocked but while waiting:
// ppoll unblocks them atomically, so one that comes between two waits is not lost.
class StopSignals {
 public:
  StopSignals();
  // False when told to stop.
  bool sleep(std::uint64_t ns);
  // Until `fd` is readable (true) or told to stop (false).
  bool readable(int fd);

 private:
  static std::uint64_t now_ns();
  static timespec to_timespec(std::uint64_t ns);
  sigset_t waiting_;
};

// --interval, more than 0; `default_ns` without it.
std::uint64_t interval_option(const Args& args, std::uint64_t default_ns);

// The segments in `dir`; a directory that cannot be read is a usage error (--dir names it).
ShareScan scan_or_throw(const std::string& dir);

// A segment that cannot be read is said once, not at every refresh or request.
class SkipWarnings {
 public:
  explicit SkipWarnings(const char* command) : command_(command) {}
  void operator()(const ShareScan& scan);

 private:
  const char* command_;
  std::mutex mu_;
  std::set<std::string> said_;
};

}  // namespace cupool::tools
