#include "cli.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

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

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

// A non-negative decimal number at the front of `text`; the rest is left in `rest`.
bool take_number(std::string_view text, long double& value, std::string_view& rest) {
  std::size_t i = 0;
  bool digits = false;
  while (i < text.size() && text[i] == ' ') ++i;
  const std::size_t start = i;
  while (i < text.size() && ((text[i] >= '0' && text[i] <= '9') || text[i] == '.')) {
    digits = digits || text[i] != '.';
    ++i;
  }
  if (!digits) return false;
  try {
    value = std::stold(std::string(text.substr(start, i - start)));
  } catch (...) {
    return false;
  }
  rest = text.substr(i);
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  return true;
}

}  // namespace

std::uint64_t parse_size(std::string_view text, std::string_view option) {
  long double v = 0;
  std::string_view rest;
  const std::string bad = std::string(option) + ": \"" + std::string(text) +
                          "\" is not a size (bytes, or a number with K, KiB, M, MiB, G, GiB, T, TiB)";
  if (!take_number(text, v, rest)) throw UsageError(bad);
  const std::string unit = lower(rest);
  long double scale;
  if (unit.empty() || unit == "b") scale = 1;
  else if (unit == "k" || unit == "kb" || unit == "kib") scale = 1024.0L;
  else if (unit == "m" || unit == "mb" || unit == "mib") scale = 1024.0L * 1024;
  else if (unit == "g" || unit == "gb" || unit == "gib") scale = 1024.0L * 1024 * 1024;
  else if (unit == "t" || unit == "tb" || unit == "tib") scale = 1024.0L * 1024 * 1024 * 1024;
  else throw UsageError(bad);
  const long double bytes = v * scale;
  if (bytes >= 1.8e19L) throw UsageError(std::string(option) + ": \"" + std::string(text) + "\" is too large");
  return static_cast<std::uint64_t>(bytes);
}

std::uint64_t parse_duration_ns(std::string_view text, std::string_view option) {
  long double v = 0;
  std::string_view rest;
  const std::string bad = std::string(option) + ": \"" + std::string(text) +
                          "\" is not a duration (a number with ns, us, ms or s)";
  if (!take_number(text, v, rest)) throw UsageError(bad);
  const std::string unit = lower(rest);
  long double scale;
  if (unit.empty() || unit == "ns") scale = 1;
  else if (unit == "us") scale = 1e3L;
  else if (unit == "ms") scale = 1e6L;
  else if (unit == "s") scale = 1e9L;
  else throw UsageError(bad);
  return static_cast<std::uint64_t>(v * scale);
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
