// The configuration written as JSON for the trace header (config_json.h).
#include "config_json.h"

#include <fmt/format.h>

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

}  // namespace

std::string config_json(const Config& c) {
  std::string out = "{\"policy\":\"";
  out += policy_name(c.policy);
  out += "\",\"free\":\"";
  out += free_mode_name(c.free_mode);
  out += "\",\"limit\":";
  append_limit_json(out, c.limit);
  out += ",\"preallocate\":";
  append_size_json(out, c.preallocate);
  out += fmt::format(",\"preallocate_grow\":{},\"growth_chunk\":{},\"growth_chunk_max\":{},\"release_idle_ns\":",
                     c.preallocate_grow, c.growth_chunk, c.growth_chunk_max);
  out += c.release_idle_ns ? fmt::format("{}", *c.release_idle_ns) : std::string("null");
  out += fmt::format(",\"thread_cache\":{},\"vmm_cache\":{},\"vmm_tight\":{}", c.thread_cache, c.vmm_cache, c.vmm_tight);
  out += ",\"trace\":";
  append_quoted(out, c.trace_path);
  out += fmt::format(",\"trace_flush_ns\":{},\"trace_buffer_events\":{},\"trace_stacks\":{},\"log_level\":",
                     c.trace_flush_ns, c.trace_buffer_events, c.trace_stacks);
  append_quoted(out, c.log_level);
  out += ",\"share\":";
  append_quoted(out, c.share);
  out += ",\"share_limit\":";
  append_limit_json(out, c.share_limit);
  out += fmt::format(",\"share_wait_ns\":{},\"share_access\":\"{}\"", c.share_wait_ns, c.share_group ? "group" : "user");
  out += '}';
  return out;
}

}  // namespace cupool
