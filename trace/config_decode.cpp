// The configuration a trace's header records, decoded back (config_decode.h): the inverse of
// config_json (config_json.cpp).
#include "config_decode.h"

#include <charconv>

#include "options.h"

namespace cupool {

namespace {
bool decode_size(const nlohmann::json& v, SizeSpec* out) {
  if (!v.is_object()) return false;
  if (auto b = v.find("bytes"); b != v.end() && b->is_number_unsigned()) {
    *out = SizeSpec{b->get<std::uint64_t>(), 0};
    return true;
  }
  if (auto p = v.find("percent"); p != v.end() && p->is_number() && p->get<double>() > 0) {
    *out = SizeSpec{0, p->get<double>()};
    return true;
  }
  return false;
}

// The inverse of append_limit_json (config_json.cpp).
bool decode_limit(const nlohmann::json& l, LimitSpec* out) {
  *out = LimitSpec{};
  if (l.is_null()) return true;
  if (!l.is_object()) return false;
  if (auto all = l.find("all"); all != l.end() && !all->is_null()) {
    SizeSpec s;
    if (!decode_size(*all, &s)) return false;
    out->all = s;
  }
  if (auto devices = l.find("devices"); devices != l.end()) {
    if (!devices->is_object()) return false;
    for (const auto& [key, value] : devices->items()) {
      SizeSpec s;
      int device = -1;
      const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), device);
      if (ec != std::errc() || end != key.data() + key.size() || !decode_size(value, &s)) return false;
      out->per_device.emplace_back(device, s);
    }
  }
  return true;
}
}  // namespace

std::optional<Config> decode_config(const nlohmann::json& j, std::string* why) {
  auto fail = [&](const std::string& what) -> std::optional<Config> {
    if (why) *why = "configuration: " + what;
    return std::nullopt;
  };
  if (!j.is_object()) return fail("not an object");
  auto u64 = [&](const char* key, std::uint64_t* out) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number_unsigned()) return false;
    *out = it->get<std::uint64_t>();
    return true;
  };
  auto boolean = [&](const char* key, bool* out) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_boolean()) return false;
    *out = it->get<bool>();
    return true;
  };
  auto text = [&](const char* key, std::string* out) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_string()) return false;
    *out = it->get<std::string>();
    return true;
  };
  Config c;
  std::string name;
  if (!text("policy", &name)) return fail("no \"policy\"");
  if (auto p = policy_named(name)) c.policy = *p;
  else return fail("unknown policy \"" + name + "\"");
  if (!text("free", &name)) return fail("no \"free\"");
  if (auto m = free_mode_named(name)) c.free_mode = *m;
  else return fail("unknown free mode \"" + name + "\"");
  const auto limit = j.find("limit");
  if (limit == j.end()) return fail("no \"limit\"");
  if (!decode_limit(*limit, &c.limit)) return fail("bad \"limit\"");
  if (auto p = j.find("preallocate"); p == j.end() || !decode_size(*p, &c.preallocate)) return fail("bad \"preallocate\"");
  if (!boolean("preallocate_grow", &c.preallocate_grow)) return fail("bad \"preallocate_grow\"");
  if (!u64("growth_chunk", &c.growth_chunk) || !u64("growth_chunk_max", &c.growth_chunk_max))
    return fail("bad \"growth_chunk\" or \"growth_chunk_max\"");
  if (auto r = j.find("release_idle_ns"); r != j.end() && r->is_number_unsigned()) {
    c.release_idle_ns = r->get<std::uint64_t>();
  } else if (r == j.end() || !r->is_null()) {
    return fail("bad \"release_idle_ns\"");
  }
  // Keys added after format 2.0: absent in older traces, which had these defaults' behaviour.
  if (j.contains("thread_cache") && !boolean("thread_cache", &c.thread_cache)) return fail("bad \"thread_cache\"");
  if (j.contains("vmm_cache") && !boolean("vmm_cache", &c.vmm_cache)) return fail("bad \"vmm_cache\"");
  if (j.contains("vmm_tight") && !boolean("vmm_tight", &c.vmm_tight)) return fail("bad \"vmm_tight\"");
  text("trace", &c.trace_path);
  u64("trace_flush_ns", &c.trace_flush_ns);
  if (std::uint64_t events = 0; u64("trace_buffer_events", &events)) c.trace_buffer_events = static_cast<std::uint32_t>(events);
  if (std::uint64_t n = 0; u64("trace_stacks", &n) && n <= 1'000'000) c.trace_stacks = static_cast<std::uint32_t>(n);  // 3.3 on
  text("log_level", &c.log_level);
  // The shared budget (format 3.0 on): absent before.
  if (j.contains("share")) {
    if (!text("share", &c.share)) return fail("bad \"share\"");
    if (!u64("share_wait_ns", &c.share_wait_ns)) return fail("bad \"share_wait_ns\"");
    std::string access;
    if (!text("share_access", &access) || (access != "user" && access != "group")) return fail("bad \"share_access\"");
    c.share_group = access == "group";
    const auto sl = j.find("share_limit");
    if (sl == j.end()) return fail("no \"share_limit\"");
    if (!decode_limit(*sl, &c.share_limit)) return fail("bad \"share_limit\"");
  }
  return c;
}

}  // namespace cupool
