// The stop signals, options and warnings that `cupool top` and `cupool metrics` share
// (share_watch.h).
#include "share_watch.h"

#include <poll.h>

#include <csignal>
#include <cstdio>


namespace cupool::tools {

namespace {

volatile std::sig_atomic_t g_stop = 0;
void on_stop_signal(int) { g_stop = 1; }

}  // namespace

StopSignals::StopSignals() {
  struct sigaction sa{};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  sigprocmask(SIG_BLOCK, &stop, &waiting_);
  sigdelset(&waiting_, SIGINT);
  sigdelset(&waiting_, SIGTERM);
}

bool StopSignals::sleep(std::uint64_t ns) {
  const std::uint64_t deadline = now_ns() + ns;
  while (!g_stop) {
    const std::uint64_t now = now_ns();
    if (now >= deadline) return true;
    const timespec left = to_timespec(deadline - now);
    ppoll(nullptr, 0, &left, &waiting_);
  }
  return false;
}

bool StopSignals::readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  while (!g_stop)
    if (ppoll(&p, 1, nullptr, &waiting_) > 0) return true;
  return false;
}

std::uint64_t StopSignals::now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

timespec StopSignals::to_timespec(std::uint64_t ns) {
  return timespec{static_cast<time_t>(ns / 1'000'000'000ull), static_cast<long>(ns % 1'000'000'000ull)};
}

std::uint64_t interval_option(const Args& args, std::uint64_t default_ns) {
  const auto text = args.value("--interval");
  if (!text) return default_ns;
  const std::uint64_t ns = parse_duration_ns(*text, "--interval");
  if (ns == 0) throw UsageError("--interval: \"" + *text + "\" is not more than 0");
  return ns;
}

ShareScan scan_or_throw(const std::string& dir) {
  ShareScan scan;
  std::string error;
  if (!scan_shares(dir, scan, &error)) throw UsageError("cannot read the segments' directory " + error);
  return scan;
}

void SkipWarnings::operator()(const ShareScan& scan) {
  std::lock_guard lock(mu_);  // the server's clients are served on threads of their own
  for (const std::string& s : scan.skipped)
    if (said_.insert(s).second)
      std::fprintf(stderr, "cupool %s: warning: skipping %s\n", command_, clean_text(s, true).c_str());
}

}  // namespace cupool::tools
