// cupool's messages (log.h) written out: the level filter, the "cupool" spdlog logger with its
// one-write(2)-per-line stderr sink, and the rate limit of out-of-memory warnings.
#include "log.h"

#include <spdlog/details/null_mutex.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <memory>

namespace cupool {
namespace {

// Writes each message as one line with one write(2). No mutex (null_mutex) and no formatter
// state: several threads may log at once, and a fork never inherits a held lock.
class StderrLineSink final : public spdlog::sinks::base_sink<spdlog::details::null_mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    fmt::basic_memory_buffer<char, 512> line;
    line.append(std::string_view("cupool: "));
    if (msg.level == spdlog::level::warn) line.append(std::string_view("warning: "));
    else if (msg.level >= spdlog::level::err) line.append(std::string_view("error: "));
    line.append(msg.payload.data(), msg.payload.data() + msg.payload.size());
    line.push_back('\n');
    const char* p = line.data();
    std::size_t left = line.size();
    while (left > 0) {
      const ssize_t n = ::write(STDERR_FILENO, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      p += n;
      left -= static_cast<std::size_t>(n);
    }
  }
  void flush_() override {}
};

std::atomic<int> g_level{spdlog::level::info};

// Never destroyed: the shim may still log from atexit handlers and other threads during exit.
spdlog::logger& logger() {
  static spdlog::logger* const instance = [] {
    auto* l = new spdlog::logger("cupool", std::make_shared<StderrLineSink>());
    l->set_level(spdlog::level::trace);  // filtering happens in g_level, before any formatting
    return l;
  }();
  return *instance;
}

void log_at(spdlog::level::level_enum level, std::string_view message) {
  if (static_cast<int>(level) < g_level.load(std::memory_order_relaxed)) return;
  try {
    logger().log(level, spdlog::string_view_t(message.data(), message.size()));
  } catch (...) {
    // Logging must never throw into the traced program.
  }
}

}  // namespace

void log_init(std::string_view level) {
  spdlog::level::level_enum l = spdlog::level::info;
  if (level == "trace") l = spdlog::level::trace;
  else if (level == "debug") l = spdlog::level::debug;
  else if (level == "warn") l = spdlog::level::warn;
  else if (level == "error") l = spdlog::level::err;
  else if (level == "off") l = spdlog::level::off;
  g_level.store(l, std::memory_order_relaxed);
  (void)logger();
}

void log_debug(std::string_view m) { log_at(spdlog::level::debug, m); }
void log_info(std::string_view m) { log_at(spdlog::level::info, m); }
void log_warn(std::string_view m) {
  static std::atomic<std::uint64_t> ooms{0};
  if (!m.starts_with("out of memory")) {
    log_at(spdlog::level::warn, m);
    return;
  }
  const std::uint64_t n = ooms.fetch_add(1, std::memory_order_relaxed) + 1;
  if (n <= kOomWarningsShown) log_at(spdlog::level::warn, m);
  if (n == kOomWarningsShown) {
    log_at(spdlog::level::warn,
           "further out-of-memory warnings are counted, not printed (a count at 10, 100, 1000...); a trace "
           "(CUPOOL_TRACE) records every one");
    return;
  }
  std::uint64_t power = 10;
  while (power < n && power <= UINT64_MAX / 10) power *= 10;
  if (n <= kOomWarningsShown || power != n || g_level.load(std::memory_order_relaxed) > spdlog::level::warn) return;
  try {
    log_at(spdlog::level::warn, fmt::format("{} out-of-memory warnings so far, the first {} printed; a trace "
                                            "(CUPOOL_TRACE) records every one", n, kOomWarningsShown));
  } catch (...) {
    // Logging must never throw into the traced program.
  }
}
void log_error(std::string_view m) { log_at(spdlog::level::err, m); }

bool log_debug_enabled() { return g_level.load(std::memory_order_relaxed) <= spdlog::level::debug; }
bool log_trace_enabled() { return g_level.load(std::memory_order_relaxed) <= spdlog::level::trace; }

}  // namespace cupool
