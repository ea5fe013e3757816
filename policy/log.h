// cupool's own messages: one logger, "cupool", writing whole lines to stderr ("cupool: ...").
// log.cpp is the only file that includes spdlog. Messages are never built on the hot path: check
// log_debug_enabled() before formatting a debug message.
#pragma once

#include <string_view>

namespace cupool {

// Sets the level: trace, debug, info, warn, error or off (Config::log_level). An unknown name
// means info. Safe to call again; messages logged before the first call use info.
void log_init(std::string_view level);

// "cupool: <message>" for debug and info; "cupool: warning: ..." and "cupool: error: ...".
// Each line reaches stderr in one write(2): no lock, no stdio, safe across fork.
void log_debug(std::string_view message);
void log_info(std::string_view message);
// Out-of-memory warnings (a message that begins "out of memory") are rate-limited: a program that
// retries a refused allocation gets one per try. The first kOomWarningsShown are printed, then a
// count at 10, 100, 1000... of them; a trace (CUPOOL_TRACE) records every one.
void log_warn(std::string_view message);
inline constexpr unsigned kOomWarningsShown = 5;
void log_error(std::string_view message);

bool log_debug_enabled();
bool log_trace_enabled();

}  // namespace cupool
