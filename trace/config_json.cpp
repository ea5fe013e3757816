// The configuration written as JSON for the trace header (config_json.h).
#include "config_json.h"

#include <fmt/format.h>

#include <iterator>

#include "options.h"
#include "quoted_string.h"

namespace cupool {
namespace {

void append_size_json(std::string& out, const SizeSpec& s) {
  if (s.is_percent()) out += fmt::format("{{\"percent\":{}}}", s.percent);
  else out += fmt::format("{{\"bytes\":{}}}", s.bytes);
}

// A LimitSpec as the header writes it: null, or {"all": size|null, "devices": {"1": size}}.
void append_limit_json(std::string& out, const LimitSpec& l) {
  if (!l.all && l.per_device.empty()) {
    out += "null";
    return;
  }
  out += "{\"all\":";
  if (l.all) append_size_json(out, *l.all);
  else out += "null";
  out += ",\"devices\":{";
  bool first = true;
  for (const auto& [d, s] : l.per_device) {
    if (!first) out += ',';
    first = false;
    out += fmt::format("\"{}\":", d);
    append_size_json(out, s);
  }
  out += "}}";
}

// The codecs of options.def's rows: how each kind of field is written.
void write_policy_name(std::string& out, PolicyKind p) { fmt::format_to(std::back_inserter(out), "\"{}\"", policy_name(p)); }
void write_free_name(std::string& out, FreeMode m) { fmt::format_to(std::back_inserter(out), "\"{}\"", free_mode_name(m)); }
void write_limit(std::string& out, const LimitSpec& l) { append_limit_json(out, l); }
void write_size(std::string& out, const SizeSpec& s) { append_size_json(out, s); }
void write_boolean(std::string& out, bool b) { out += b ? "true" : "false"; }
void write_u64(std::string& out, std::uint64_t v) { fmt::format_to(std::back_inserter(out), "{}", v); }
void write_u32(std::string& out, std::uint32_t v) { write_u64(out, v); }
void write_stacks(std::string& out, std::uint32_t v) { write_u64(out, v); }
void write_u64_or_null(std::string& out, const std::optional<std::uint64_t>& v) {
  if (v) write_u64(out, *v);
  else out += "null";
}
void write_text(std::string& out, const std::string& s) { append_quoted(out, s); }
void write_access(std::string& out, bool group) { out += group ? "\"group\"" : "\"user\""; }

}  // namespace

// Every row of options.def, in its order: "key": value.
std::string config_json(const Config& c) {
  std::string out = "{";
#define CUPOOL_OPTION(id, variable, type, field, default_value, json_key, json_codec, ...) \
  if (out.size() > 1) out += ',';                                                        \
  out += "\"" json_key "\":";                                                              \
  write_##json_codec(out, c.field);
#include "options.def"
#undef CUPOOL_OPTION
  out += '}';
  return out;
}

}  // namespace cupool
