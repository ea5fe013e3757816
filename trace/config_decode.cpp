// The configuration a trace's header records, decoded back (config_decode.h): the inverse of
// config_json (config_json.cpp).
#include "config_decode.h"

#include <charconv>
#include <cstdint>
#include <optional>
#include <string>

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
// The codecs of options.def's rows, read back: false when the value is not one.
bool read_policy_name(const nlohmann::json& v, PolicyKind* out) {
  if (!v.is_string()) return false;
  const auto p = policy_named(v.get<std::string>());
  if (p) *out = *p;
  return p.has_value();
}
bool read_free_name(const nlohmann::json& v, FreeMode* out) {
  if (!v.is_string()) return false;
  const auto m = free_mode_named(v.get<std::string>());
  if (m) *out = *m;
  return m.has_value();
}
bool read_limit(const nlohmann::json& v, LimitSpec* out) { return decode_limit(v, out); }
bool read_size(const nlohmann::json& v, SizeSpec* out) { return decode_size(v, out); }
bool read_boolean(const nlohmann::json& v, bool* out) {
  if (!v.is_boolean()) return false;
  *out = v.get<bool>();
  return true;
}
bool read_u64(const nlohmann::json& v, std::uint64_t* out) {
  if (!v.is_number_unsigned()) return false;
  *out = v.get<std::uint64_t>();
  return true;
}
bool read_u32(const nlohmann::json& v, std::uint32_t* out) {
  std::uint64_t n = 0;
  if (!read_u64(v, &n) || n > UINT32_MAX) return false;
  *out = static_cast<std::uint32_t>(n);
  return true;
}
bool read_stacks(const nlohmann::json& v, std::uint32_t* out) {  // format 3.3 on
  std::uint64_t n = 0;
  if (!read_u64(v, &n) || n > 1'000'000) return false;
  *out = static_cast<std::uint32_t>(n);
  return true;
}
bool read_u64_or_null(const nlohmann::json& v, std::optional<std::uint64_t>* out) {
  if (v.is_null()) {
    out->reset();
    return true;
  }
  std::uint64_t n = 0;
  if (!read_u64(v, &n)) return false;
  *out = n;
  return true;
}
bool read_text(const nlohmann::json& v, std::string* out) {
  if (!v.is_string()) return false;
  *out = v.get<std::string>();
  return true;
}
bool read_access(const nlohmann::json& v, bool* group) {
  if (!v.is_string() || (v != "user" && v != "group")) return false;
  *group = v == "group";
  return true;
}

enum class Presence { required, since, share, lenient };
constexpr Presence required = Presence::required, since = Presence::since, share = Presence::share,
                   lenient = Presence::lenient;

}  // namespace

// Every row of options.def, by its presence rule: required in every trace; added later (absent:
// the default, which was the behaviour before); the shared budget's (format 3.0 on: all present
// with "share", or none); lenient (absent or unreadable: the default).
std::optional<Config> decode_config(const nlohmann::json& j, std::string* why) {
  auto fail = [&](const std::string& what) -> std::optional<Config> {
    if (why) *why = "configuration: " + what;
    return std::nullopt;
  };
  if (!j.is_object()) return fail("not an object");
  const bool with_share = j.contains("share");
  Config c;
#define CUPOOL_OPTION(id, variable, type, field, default_value, json_key, json_codec, json_presence, ...) \
  {                                                                                                      \
    constexpr Presence presence = json_presence;                                                         \
    const auto it = j.find(json_key);                                                                    \
    const bool wanted = presence == Presence::required || (presence == Presence::share && with_share);   \
    if (it == j.end()) {                                                                                 \
      if (wanted) return fail("no \"" json_key "\"");                                                  \
    } else if (presence != Presence::share || with_share) {                                              \
      type value = c.field;                                                                              \
      if (read_##json_codec(*it, &value)) c.field = value;                                               \
      else if (presence != Presence::lenient) return fail("bad \"" json_key "\": " + it->dump().substr(0, 80)); \
    }                                                                                                    \
  }
#include "options.def"
#undef CUPOOL_OPTION
  return c;
}

}  // namespace cupool
