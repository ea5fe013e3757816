// What every cupool subcommand shares (cli.h): argument parsing, sizes and durations.
#include "cli.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "options.h"
#include "units.h"

namespace cupool::tools {

Args::Args(std::vector<std::string> args, std::vector<std::string_view> value_options,
           std::vector<std::string_view> flag_options, bool stop_at_first_positional) {
  auto is = [](const std::vector<std::string_view>& list, std::string_view name) {
    return std::find(list.begin(), list.end(), name) != list.end();
  };
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      positional_.insert(positional_.end(), args.begin() + static_cast<long>(i) + 1, args.end());
      return;
    }
    if (a.size() > 1 && a[0] == '-' && a != "-") {
      std::string name = a;
      std::optional<std::string> inline_value;
      if (auto eq = a.find('='); eq != std::string::npos) {
        name = a.substr(0, eq);
        inline_value = a.substr(eq + 1);
      }
      if (is(value_options, name)) {
        if (!inline_value) {
          // "--trace -- prog" is a missing value, not a file named "--"; so is "--trace --policy".
          if (i + 1 >= args.size() || args[i + 1].rfind("--", 0) == 0)
            throw UsageError(name + " needs a value" +
                             (i + 1 < args.size() ? " (got \"" + args[i + 1] + "\"; write " + name + "=VALUE for a value that begins with --)" : ""));
          inline_value = args[++i];
        }
        // An empty value would silently mean "not given" (CUPOOL_TRACE= turns tracing off).
        if (inline_value->empty()) throw UsageError(name + " needs a value (it is empty)");
        values_.emplace_back(name, *inline_value);
      } else if (is(flag_options, name) && !inline_value) {
        flags_.push_back(name);
      } else {
        throw UsageError("unknown option " + a);
      }
      continue;
    }
    positional_.push_back(a);
    if (stop_at_first_positional) {
      positional_.insert(positional_.end(), args.begin() + static_cast<long>(i) + 1, args.end());
      return;
    }
  }
}

bool Args::flag(std::string_view name) const {
  return std::find(flags_.begin(), flags_.end(), name) != flags_.end();
}

std::optional<std::string> Args::value(std::string_view name) const {
  std::optional<std::string> out;
  for (const auto& [n, v] : values_)
    if (n == name) out = v;
  return out;
}

std::vector<std::string> Args::values(std::string_view name) const {
  std::vector<std::string> out;
  for (const auto& [n, v] : values_)
    if (n == name) out.push_back(v);
  return out;
}


std::uint64_t parse_size(std::string_view text, std::string_view option) {
  std::uint64_t bytes = 0;
  std::string why;
  if (!cupool::parse_size(text, bytes, why))
    throw UsageError(std::string(option) + ": \"" + std::string(text) + "\" is not a size (" + why + "; accepted: " +
                     std::string(kSizeAccepted) + ")");
  return bytes;
}

std::uint64_t parse_duration_ns(std::string_view text, std::string_view option) {
  if (text == "0") return 0;  // zero needs no unit
  std::uint64_t ns = 0;
  std::string why;
  if (!cupool::parse_duration(text, ns, why))
    throw UsageError(std::string(option) + ": \"" + std::string(text) + "\" is not a duration (" + why +
                     "; accepted: 0, or " + std::string(kDurationAccepted) + ")");
  return ns;
}

std::string human_size(std::uint64_t bytes) { return human_bytes(bytes); }

std::string human_duration(std::uint64_t ns) {
  char buf[32];
  if (ns < 1000) std::snprintf(buf, sizeof buf, "%llu ns", static_cast<unsigned long long>(ns));
  else if (ns < 1'000'000) std::snprintf(buf, sizeof buf, "%.1f us", static_cast<double>(ns) / 1e3);
  else if (ns < 1'000'000'000) std::snprintf(buf, sizeof buf, "%.2f ms", static_cast<double>(ns) / 1e6);
  else std::snprintf(buf, sizeof buf, "%.2f s", static_cast<double>(ns) / 1e9);
  return buf;
}

std::string percent(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", fraction * 100.0);
  return buf;
}

std::string hex_ptr(std::uint64_t ptr) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(ptr));
  return buf;
}

bool stderr_is_terminal() { return isatty(2) == 1; }

}  // namespace cupool::tools
