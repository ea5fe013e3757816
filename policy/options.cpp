// The CUPOOL_* options (options.h): their table, parsers, checks and descriptions.
#include "options.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <limits>

#include "quoted_string.h"

namespace cupool {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (lower(a[i]) != lower(b[i])) return false;
  return true;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// A piece of the value, quoted for an error message: escaped, so that the message stays one line
// of valid UTF-8 whatever the value holds (newlines, control characters, bytes that are not UTF-8).
std::string quoted(std::string_view s) {
  std::string out;
  append_quoted(out, s);
  return out;
}

// A decimal number "123", "1.5", ".5": integer part and fraction digits, exactly.
struct Decimal {
  std::uint64_t integer = 0;
  std::uint64_t fraction = 0;   // the digits after the point, as an integer
  std::uint64_t fraction_scale = 1;  // 10^(number of fraction digits kept)
  bool has_fraction() const { return fraction != 0; }
};

// Consumes a decimal number from the front of `s`. False if there is none or it overflows.
bool take_decimal(std::string_view& s, Decimal& d, std::string& why) {
  std::size_t i = 0;
  bool any = false;
  while (i < s.size() && is_digit(s[i])) {
    if (__builtin_mul_overflow(d.integer, 10u, &d.integer) ||
        __builtin_add_overflow(d.integer, static_cast<std::uint64_t>(s[i] - '0'), &d.integer)) {
      why = "the number is too large";
      return false;
    }
    ++i;
    any = true;
  }
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && is_digit(s[i])) {
      if (d.fraction_scale < 1'000'000'000'000'000ull) {  // 18 digits is more than any unit needs
        d.fraction = d.fraction * 10 + static_cast<std::uint64_t>(s[i] - '0');
        d.fraction_scale *= 10;
      }
      ++i;
      any = true;
    }
  }
  if (!any) return false;
  s.remove_prefix(i);
  return true;
}

__extension__ typedef unsigned __int128 u128;

// value * unit, exactly, rounded down. False on overflow.
bool scale(const Decimal& d, std::uint64_t unit, std::uint64_t& out) {
  std::uint64_t whole;
  if (__builtin_mul_overflow(d.integer, unit, &whole)) return false;
  const auto part = static_cast<std::uint64_t>(static_cast<u128>(d.fraction) * unit / d.fraction_scale);
  return !__builtin_add_overflow(whole, part, &out);
}

}  // namespace

constexpr std::string_view kSizeAccepted =
    "bytes, or a number (fractions allowed) with B, K, KB, KiB, M, MB, MiB, G, GB, GiB, T, TB, TiB "
    "(all 1024-based)";

// "8GiB", "1.5G", "4096", "64 MiB". KB/MB/GB/TB are binary, like K and KiB: GPU memory is
// reported in binary units everywhere (nvidia-smi, cudaMemGetInfo totals).
bool parse_size(std::string_view v, std::uint64_t& out, std::string& why) {
  v = trim(v);
  Decimal d;
  if (!take_decimal(v, d, why)) {
    if (why.empty()) why = "not a number";
    return false;
  }
  const std::string_view suffix = trim(v);
  struct Unit { std::string_view name; std::uint64_t bytes; };
  static constexpr Unit kUnits[] = {
      {"", 1},          {"b", 1},
      {"k", 1ull << 10}, {"kb", 1ull << 10}, {"kib", 1ull << 10},
      {"m", 1ull << 20}, {"mb", 1ull << 20}, {"mib", 1ull << 20},
      {"g", 1ull << 30}, {"gb", 1ull << 30}, {"gib", 1ull << 30},
      {"t", 1ull << 40}, {"tb", 1ull << 40}, {"tib", 1ull << 40},
  };
  for (const auto& u : kUnits) {
    if (!iequals(suffix, u.name)) continue;
    if (u.bytes == 1 && d.has_fraction()) {
      why = "a byte count must be a whole number";
      return false;
    }
    if (!scale(d, u.bytes, out)) {
      why = "the size is too large";
      return false;
    }
    return true;
  }
  why = "unknown unit " + quoted(suffix);
  return false;
}

constexpr std::string_view kDurationAccepted = "a number with ns, us, ms, s, m (or min), h (30s, 500ms, 2m)";

bool parse_duration(std::string_view v, std::uint64_t& ns, std::string& why) {
  v = trim(v);
  Decimal d;
  if (!take_decimal(v, d, why)) {
    if (why.empty()) why = "not a duration";
    return false;
  }
  const std::string_view unit = trim(v);
  struct Unit { std::string_view name; std::uint64_t ns; };
  static constexpr Unit kUnits[] = {{"ns", 1},
                                    {"us", 1'000},
                                    {"ms", 1'000'000},
                                    {"s", 1'000'000'000},
                                    {"m", 60'000'000'000},
                                    {"min", 60'000'000'000},
                                    {"h", 3'600'000'000'000}};
  if (unit.empty()) {
    why = "a duration needs a unit";
    return false;
  }
  for (const auto& u : kUnits) {
    if (!iequals(unit, u.name)) continue;
    if (!scale(d, u.ns, ns)) {
      why = "the duration is too long";
      return false;
    }
    return true;
  }
  why = "unknown unit " + quoted(unit);
  return false;
}

namespace {

// "50%", "12.5%": 0 < p <= 100.
bool parse_percent(std::string_view v, double& out, std::string& why) {
  v = trim(v);
  if (v.empty() || v.back() != '%') return false;
  v = trim(v.substr(0, v.size() - 1));
  double p = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), p, std::chars_format::fixed);
  if (ec != std::errc() || end != v.data() + v.size() || v.empty() || !is_digit(v.front())) {
    why = "not a percent";
    return false;
  }
  if (!(p > 0 && p <= 100)) {
    why = "a percent must be more than 0 and at most 100";
    return false;
  }
  out = p;
  return true;
}

bool parse_size_spec(std::string_view v, SizeSpec& out, std::string& why) {
  v = trim(v);
  if (!v.empty() && v.back() == '%') {
    double p;
    if (!parse_percent(v, p, why)) return false;
    out = SizeSpec{0, p};
    return true;
  }
  std::uint64_t b;
  if (!parse_size(v, b, why)) return false;
  if (b == 0) {
    why = "must be more than 0";
    return false;
  }
  out = SizeSpec{b, 0};
  return true;
}

template <typename Enum, std::size_t N>
std::optional<std::string> parse_enum(std::string_view v, const std::array<std::pair<std::string_view, Enum>, N>& names,
                                      Enum& out) {
  v = trim(v);
  for (const auto& [name, value] : names)
    if (iequals(v, name)) {
      out = value;
      return std::nullopt;
    }
  return std::string();
}

// ---- one parser per variable -----------------------------------------------------------------

std::optional<std::string> parse_policy(std::string_view v, Config& c) {
  static constexpr std::array<std::pair<std::string_view, PolicyKind>, 4> kNames{
      {{"growth", PolicyKind::growth},
       {"preallocate", PolicyKind::preallocate},
       {"passthrough", PolicyKind::passthrough},
       {"vmm", PolicyKind::vmm}}};
  return parse_enum(v, kNames, c.policy);
}

std::optional<std::string> parse_free(std::string_view v, Config& c) {
  static constexpr std::array<std::pair<std::string_view, FreeMode>, 2> kNames{
      {{"sync", FreeMode::sync}, {"deferred", FreeMode::deferred}}};
  return parse_enum(v, kNames, c.free_mode);
}

std::optional<std::string> parse_limit(std::string_view v, Config& c) {
  LimitSpec limit;
  std::string why;
  std::size_t start = 0;
  while (start <= v.size()) {
    std::size_t comma = v.find(',', start);
    if (comma == std::string_view::npos) comma = v.size();
    const std::string_view item = trim(v.substr(start, comma - start));
    start = comma + 1;
    if (item.empty()) return std::string("empty entry between commas");
    const std::size_t colon = item.find(':');
    SizeSpec spec;
    if (colon == std::string_view::npos) {
      if (limit.all) return std::string("more than one value without a device prefix");
      if (!parse_size_spec(item, spec, why)) return why;
      limit.all = spec;
      continue;
    }
    const std::string_view dev_text = trim(item.substr(0, colon));
    int device = -1;
    const auto [end, ec] = std::from_chars(dev_text.data(), dev_text.data() + dev_text.size(), device);
    if (dev_text.empty() || ec != std::errc() || end != dev_text.data() + dev_text.size() || device < 0 ||
        device > 1023)
      return quoted(dev_text) + " is not a device index (0 to 1023)";
    for (const auto& [d, s] : limit.per_device)
      if (d == device) return fmt::format("device {} is given twice", device);
    if (!parse_size_spec(item.substr(colon + 1), spec, why)) return fmt::format("device {}: {}", device, why);
    limit.per_device.emplace_back(device, spec);
  }
  c.limit = std::move(limit);
  return std::nullopt;
}

std::optional<std::string> parse_preallocate(std::string_view v, Config& c) {
  std::string why;
  if (!parse_size_spec(v, c.preallocate, why)) return why;
  // The pool reserves whole chunks: less than one would reserve nothing and refuse everything.
  if (!c.preallocate.is_percent() && c.preallocate.bytes < kMinPreallocateBytes)
    return fmt::format("less than the pool's chunk granularity ({})", format_size(kMinPreallocateBytes));
  return std::nullopt;
}

std::optional<std::string> parse_bool(std::string_view v, bool& out) {
  v = trim(v);
  if (iequals(v, "true") || v == "1") out = true;
  else if (iequals(v, "false") || v == "0") out = false;
  else return std::string();
  return std::nullopt;
}

// A switch: on/off, or a bool's spellings.
std::optional<std::string> parse_switch(std::string_view v, bool& out) {
  const std::string_view t = trim(v);
  if (iequals(t, "on")) out = true;
  else if (iequals(t, "off")) out = false;
  else return parse_bool(v, out);
  return std::nullopt;
}

std::optional<std::string> parse_vmm_cache(std::string_view v, Config& c) { return parse_switch(v, c.vmm_cache); }
std::optional<std::string> parse_vmm_tight(std::string_view v, Config& c) { return parse_switch(v, c.vmm_tight); }

std::optional<std::string> parse_preallocate_grow(std::string_view v, Config& c) {
  return parse_bool(v, c.preallocate_grow);
}

std::optional<std::string> parse_thread_cache(std::string_view v, Config& c) { return parse_switch(v, c.thread_cache); }

std::optional<std::string> parse_chunk(std::string_view v, std::uint64_t& out) {
  std::string why;
  std::uint64_t b;
  if (!parse_size(v, b, why)) return why;
  if (b == 0) return std::string("must be more than 0");
  out = b;
  return std::nullopt;
}

std::optional<std::string> parse_growth_chunk(std::string_view v, Config& c) { return parse_chunk(v, c.growth_chunk); }
std::optional<std::string> parse_growth_chunk_max(std::string_view v, Config& c) {
  return parse_chunk(v, c.growth_chunk_max);
}

std::optional<std::string> parse_release(std::string_view v, Config& c) {
  v = trim(v);
  if (iequals(v, "never")) {
    c.release_idle_ns.reset();
    return std::nullopt;
  }
  std::uint64_t ns = 0;
  std::string why;
  if (!parse_duration(v, ns, why)) return why;
  c.release_idle_ns = ns;
  return std::nullopt;
}

std::optional<std::string> parse_share(std::string_view v, Config& c) {
  v = trim(v);
  if (v.size() > 64) return std::string("at most 64 characters");
  for (char ch : v)
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' || ch == '.'))
      return "the character " + quoted(std::string_view(&ch, 1)) + " is not allowed";
  c.share = std::string(v);
  return std::nullopt;
}

std::optional<std::string> parse_share_limit(std::string_view v, Config& c) {
  Config scratch;
  if (auto why = parse_limit(v, scratch)) return why;
  c.share_limit = scratch.limit;
  return std::nullopt;
}

std::optional<std::string> parse_share_wait(std::string_view v, Config& c) {
  v = trim(v);
  if (v == "0") {
    c.share_wait_ns = 0;
    return std::nullopt;
  }
  std::uint64_t ns = 0;
  std::string why;
  if (!parse_duration(v, ns, why)) return why;
  c.share_wait_ns = ns;
  return std::nullopt;
}

std::optional<std::string> parse_share_access(std::string_view v, Config& c) {
  static constexpr std::array<std::pair<std::string_view, bool>, 2> kNames{{{"user", false}, {"group", true}}};
  return parse_enum(v, kNames, c.share_group);
}

std::optional<std::string> parse_trace(std::string_view v, Config& c) {
  c.trace_path = std::string(v);
  return std::nullopt;
}

std::optional<std::string> parse_int_in(std::string_view v, std::uint64_t lo, std::uint64_t hi, std::uint64_t& out) {
  v = trim(v);
  std::uint64_t n = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (v.empty() || ec == std::errc::result_out_of_range) return std::string("out of range");
  if (ec != std::errc() || end != v.data() + v.size()) return std::string("not a whole number");
  if (n < lo || n > hi) return std::string("out of range");
  out = n;
  return std::nullopt;
}

std::optional<std::string> parse_trace_flush_ms(std::string_view v, Config& c) {
  std::uint64_t ms;
  if (auto e = parse_int_in(v, 1, 60'000, ms)) return e;
  c.trace_flush_ns = ms * 1'000'000;
  return std::nullopt;
}

std::optional<std::string> parse_trace_buffer(std::string_view v, Config& c) {
  std::uint64_t n;
  if (auto e = parse_int_in(v, 16, 1u << 22, n)) return e;
  c.trace_buffer_events = static_cast<std::uint32_t>(n);
  return std::nullopt;
}

std::optional<std::string> parse_trace_stacks(std::string_view v, Config& c) {
  v = trim(v);
  if (v == "off" || v == "0") c.trace_stacks = 0;
  else if (v == "on") c.trace_stacks = kTraceStacksOn;
  else if (v == "all") c.trace_stacks = 1;
  else {
    std::uint64_t n;
    if (auto e = parse_int_in(v, 1, 1'000'000, n)) return e;
    c.trace_stacks = static_cast<std::uint32_t>(n);
  }
  return std::nullopt;
}

std::optional<std::string> parse_log_level(std::string_view v, Config& c) {
  v = trim(v);
  for (std::string_view level : {"trace", "debug", "info", "warn", "error", "off"})
    if (iequals(v, level)) {
      c.log_level = std::string(level);
      return std::nullopt;
    }
  return std::string();
}

std::string format_duration(std::uint64_t ns) {
  struct Unit { std::string_view name; std::uint64_t ns; };
  static constexpr Unit kUnits[] = {
      {"h", 3'600'000'000'000}, {"m", 60'000'000'000}, {"s", 1'000'000'000}, {"ms", 1'000'000}, {"us", 1'000}};
  if (ns == 0) return "0s";
  for (const auto& u : kUnits)
    if (ns % u.ns == 0) return fmt::format("{}{}", ns / u.ns, u.name);
  return fmt::format("{}ns", ns);
}

constexpr std::string_view kPolicyNames[] = {"growth", "preallocate", "passthrough", "vmm"};
constexpr std::string_view kFreeNames[] = {"sync", "deferred"};

}  // namespace

std::string_view policy_name(PolicyKind p) { return kPolicyNames[static_cast<int>(p)]; }
std::string_view free_mode_name(FreeMode m) { return kFreeNames[static_cast<int>(m)]; }
std::optional<PolicyKind> policy_named(std::string_view name) {
  for (std::size_t i = 0; i < std::size(kPolicyNames); ++i)
    if (kPolicyNames[i] == name) return static_cast<PolicyKind>(i);
  return std::nullopt;
}
std::optional<FreeMode> free_mode_named(std::string_view name) {
  for (int i = 0; i < 2; ++i)
    if (kFreeNames[i] == name) return static_cast<FreeMode>(i);
  return std::nullopt;
}

constexpr std::array<OptionInfo, kOptionCount> kOptions = {{
#define CUPOOL_OPTION(id, variable, type, field, default_value, json_key, json_codec, json_presence, type_text, \
                      default_text, accepted, meaning, parser)                                             \
  {Option::id, variable, type_text, default_text, accepted, meaning, parser},
#include "options.def"
#undef CUPOOL_OPTION
}};
static_assert(
    [] {
      for (std::size_t i = 0; i < kOptionCount; ++i)
        if (kOptions[i].id != static_cast<Option>(i)) return false;
      return true;
    }(),
    "kOptions: one row per Option, in the enum's order");

std::variant<Config, OptionError> parse_options(const std::function<const char*(const char*)>& lookup) {
  Config config;
  bool chunk_max_set = false;
  for (const OptionInfo& option : kOptions) {
    const std::string name(option.name);
    const char* raw = lookup(name.c_str());
    if (raw == nullptr || *raw == '\0') continue;
    const std::string_view value(raw);
    if (auto why = option.parse(value, config)) {
      std::string message = "cupool: " + name + "=";
      append_quoted(message, value);
      message += " is not valid";
      if (!why->empty()) message += ": " + *why;
      message += "; accepted: ";
      message += option.accepted;
      return OptionError{name, std::move(message)};
    }
    if (option.id == Option::growth_chunk_max) chunk_max_set = true;
  }
  if (config.growth_chunk_max < config.growth_chunk) {
    if (!chunk_max_set) {
      config.growth_chunk_max = config.growth_chunk;
    } else {
      std::string message = "cupool: CUPOOL_GROWTH_CHUNK_MAX=";
      append_quoted(message, lookup("CUPOOL_GROWTH_CHUNK_MAX"));
      message += fmt::format(" is not valid: it is less than CUPOOL_GROWTH_CHUNK ({}); accepted: a size at least CUPOOL_GROWTH_CHUNK",
                             format_size(config.growth_chunk));
      return OptionError{"CUPOOL_GROWTH_CHUNK_MAX", std::move(message)};
    }
  }
  // A budget's limit, wait or access without a budget to apply them to is a mistake, not a no-op.
  if (config.share.empty()) {
    for (const char* name : {"CUPOOL_SHARE_LIMIT", "CUPOOL_SHARE_WAIT", "CUPOOL_SHARE_ACCESS"}) {
      const char* v = lookup(name);
      if (v == nullptr || *v == '\0') continue;
      std::string message = std::string("cupool: ") + name + "=";
      append_quoted(message, v);
      message += " is not valid: it applies to a shared budget, and CUPOOL_SHARE is not set; accepted: set CUPOOL_SHARE too";
      return OptionError{name, std::move(message)};
    }
  }
  return config;
}

std::string format_size(std::uint64_t bytes) {
  static constexpr std::pair<std::uint64_t, std::string_view> kUnits[] = {
      {1ull << 40, "TiB"}, {1ull << 30, "GiB"}, {1ull << 20, "MiB"}, {1ull << 10, "KiB"}};
  for (const auto& [unit, name] : kUnits)
    if (bytes >= unit && bytes % unit == 0) return fmt::format("{}{}", bytes / unit, name);
  return fmt::format("{}", bytes);
}

std::string format_size_spec(const SizeSpec& spec) {
  return spec.is_percent() ? fmt::format("{}%", spec.percent) : format_size(spec.bytes);
}

std::string format_limit_spec(const LimitSpec& l) {
  std::string out;
  if (l.all) out = format_size_spec(*l.all);
  for (const auto& [d, s] : l.per_device) {
    if (!out.empty()) out += ',';
    out += fmt::format("{}:{}", d, format_size_spec(s));
  }
  return out;
}

namespace {
std::string limit_text(const LimitSpec& l) {
  const std::string out = format_limit_spec(l);
  return out.empty() ? std::string("none") : out;
}
}  // namespace

std::string describe(const Config& c) {
  const std::string limit = limit_text(c.limit);
  return fmt::format(
      "policy={} free={} limit={} preallocate={} preallocate_grow={} growth_chunk={} growth_chunk_max={} "
      "release={} thread_cache={} vmm_cache={}{} trace={} trace_flush_ms={} trace_buffer={} trace_stacks={} log={}{}",
      kPolicyNames[static_cast<int>(c.policy)], kFreeNames[static_cast<int>(c.free_mode)], limit,
      format_size_spec(c.preallocate), c.preallocate_grow, format_size(c.growth_chunk), format_size(c.growth_chunk_max),
      c.release_idle_ns ? format_duration(*c.release_idle_ns) : std::string("never"), c.thread_cache ? "on" : "off",
      c.vmm_cache ? "on" : "off", c.vmm_tight ? " vmm_tight=on" : "",
      c.trace_path.empty() ? std::string("off") : c.trace_path, c.trace_flush_ns / 1'000'000, c.trace_buffer_events,
      c.trace_stacks == 0 ? std::string("off") : fmt::format("1/{}", c.trace_stacks), c.log_level,
      c.share.empty() ? std::string()
                      : fmt::format(" share={} share_limit={} share_wait={} share_access={}", c.share,
                                    limit_text(c.share_limit), c.share_wait_ns ? format_duration(c.share_wait_ns) : "0",
                                    c.share_group ? "group" : "user"));
}

std::optional<std::string> check_trace_path(const std::string& path) {
  auto fail = [&](const std::string& why) {
    std::string line = "cupool: CUPOOL_TRACE: cannot write the trace to ";
    append_quoted(line, path);
    return line + ": " + why;
  };
  if (path.empty()) return fail("the path is empty");
  const std::size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? std::string(".") : slash == 0 ? std::string("/") : path.substr(0, slash);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return fail(fmt::format("directory \"{}\": {}", dir, std::strerror(errno)));
  if (!S_ISDIR(st.st_mode)) return fail(fmt::format("\"{}\" is not a directory", dir));
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return fail("it is a directory");
    if (::access(path.c_str(), W_OK) != 0) return fail(std::strerror(errno));
    return std::nullopt;
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    return fail(fmt::format("cannot create files in \"{}\": {}", dir, std::strerror(errno)));
  return std::nullopt;
}

std::string options_markdown() {
  auto cell = [](std::string_view s) {
    std::string out;
    for (char c : s) {
      if (c == '|') out += '\\';
      out += c;
    }
    return out;
  };
  std::string out = "| Variable | Type | Default | Accepted values | Meaning |\n|---|---|---|---|---|\n";
  for (const OptionInfo& o : kOptions)
    out += fmt::format("| `{}` | {} | `{}` | {} | {} |\n", o.name, cell(o.type), cell(o.default_text), cell(o.accepted),
                       cell(o.meaning));
  return out;
}

}  // namespace cupool
