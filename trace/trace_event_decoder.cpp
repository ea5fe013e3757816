// Event decoding: one event line of a trace into an Event (TraceReader::parse_event), through the
// JSON scanner (json_scanner.h), with the keys of the schema's one list (trace_schema.h).
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "json_scanner.h"
#include "trace_reader.h"

namespace cupool {
namespace {

namespace tk = trace::key;

template <typename Enum, std::size_t N>
bool lookup_name(std::string_view name, const std::array<std::string_view, N>& names, Enum& out) {
  for (std::size_t i = 0; i < N; ++i)
    if (names[i].size() == name.size() && !name.empty() && names[i][0] == name[0] &&
        std::memcmp(names[i].data(), name.data(), name.size()) == 0) {
      out = static_cast<Enum>(i);
      return true;
    }
  return false;
}

// Event fields, as bits, to find the missing ones.
enum Field : std::uint32_t {
  f_t = 1u << 0, f_tid = 1u << 1, f_ev = 1u << 2, f_api = 1u << 3, f_path = 1u << 4, f_dev = 1u << 5,
  f_size = 1u << 6, f_ptr = 1u << 7, f_rc = 1u << 8, f_dur = 1u << 9,
};
// `dur` is required only of 1.x traces: from 2.0 on, calls that were not timed leave it out.
constexpr std::uint32_t kRequired = f_t | f_tid | f_ev | f_api | f_path | f_dev | f_size | f_ptr | f_rc;
constexpr std::pair<Field, std::string_view> kRequiredNames[] = {
    {f_t, tk::t},       {f_tid, tk::tid},   {f_ev, tk::ev},   {f_api, tk::api}, {f_path, tk::path},
    {f_dev, tk::dev},   {f_size, tk::size}, {f_ptr, tk::ptr}, {f_rc, tk::rc},   {f_dur, tk::dur}};

// The keys of event lines (CUPOOL_TRACE_EVENT_KEYS, trace_schema.h), and their names by the enum.
enum class Key : std::uint8_t {
  unknown,
#define CUPOOL_KEY_ENUMERATOR(id, text) id,
  CUPOOL_TRACE_EVENT_KEYS(CUPOOL_KEY_ENUMERATOR)
#undef CUPOOL_KEY_ENUMERATOR
};
constexpr std::string_view kKeyNames[] = {
    "",
#define CUPOOL_KEY_NAME(id, text) text,
    CUPOOL_TRACE_EVENT_KEYS(CUPOOL_KEY_NAME)
#undef CUPOOL_KEY_NAME
};
constexpr std::size_t kKeyCount = std::size(kKeyNames);
constexpr std::size_t kLongestKey = [] {
  std::size_t n = 0;
  for (const std::string_view name : kKeyNames) n = std::max(n, name.size());
  return n;
}();

// The keys by length, made from the list when compiling: key_of compares a name with the few of
// its length, first byte first.
struct KeysOfLength {
  std::array<Key, kKeyCount> keys{};
  std::size_t count = 0;
};
constexpr auto kKeysByLength = [] {
  std::array<KeysOfLength, kLongestKey + 1> by_length{};
  for (std::size_t i = 1; i < kKeyCount; ++i) {
    KeysOfLength& same = by_length[kKeyNames[i].size()];
    same.keys[same.count++] = static_cast<Key>(i);
  }
  return by_length;
}();

Key key_of(std::string_view k) {
  if (k.empty() || k.size() > kLongestKey) return Key::unknown;
  const KeysOfLength& same = kKeysByLength[k.size()];
  for (std::size_t i = 0; i < same.count; ++i) {
    const std::string_view name = kKeyNames[static_cast<std::size_t>(same.keys[i])];
    if (name[0] == k[0] && std::memcmp(name.data(), k.data(), k.size()) == 0) return same.keys[i];
  }
  return Key::unknown;
}

}  // namespace

bool TraceReader::parse_event(std::string_view line, Event& out) {
  JsonScanner s(line.data(), line.data() + line.size());
  s.set_start(line.data());
  std::uint32_t seen = 0;
  bool has_pool = false;
  bool unknown_kind = false;
  out.has_stream = false;
  out.stream = 0;
  out.has_flags = false;
  out.recycled = false;
  out.granules = false;
  out.has_handle = false;
  out.handle = out.offset = 0;
  out.flags = 0;
  out.oom_class = trace::OomClass::none;
  out.pool = trace::PoolState{};
  out.dur_ns = 0;
  std::uint64_t timed_for = 1;
  const int known_minor = header_.major == trace::kFormatMajor ? trace::kFormatMinor
                          : header_.major == 2               ? trace::kLastMinorOfMajor2
                                                             : trace::kLastMinorOfMajor1;

  auto bad = [&](std::string_view key, const char* expected) {
    if (!s.ok()) fail(fmt::format("event field \"{}\": {}", key, s.error));
    fail(fmt::format("event field \"{}\": expected {}", key, expected));
  };
  auto u64 = [&](std::string_view key, std::uint64_t& v) {
    if (!s.u64(v)) bad(key, "a non-negative integer");
  };
  auto name = [&](std::string_view key, auto& value, const auto& names) {
    const char* at = s.pos();
    std::string_view text;
    if (s.raw_string(text) && lookup_name(text, names, value)) return;
    s.rewind(at);
    if (!s.string(text, scratch_)) bad(key, "a string");
    if (!lookup_name(text, names, value)) fail(fmt::format("event field \"{}\": unknown value \"{}\"", key, text));
  };

  if (!s.expect('{', "'{'")) fail(s.error);
  if (!s.eat('}')) {
    for (;;) {
      const char* key_at = s.pos();
      std::string_view key;
      Key id = s.raw_string(key) ? key_of(key) : Key::unknown;
      char key_copy[32];
      if (id == Key::unknown) {  // escapes, or a key this version does not know: the careful way
        s.rewind(key_at);
        if (!s.string(key, scratch_)) fail(s.error);
        id = key_of(key);
        // The key's text may live in scratch_, which the value may reuse: keep a copy if so.
        if (key.data() == scratch_.data() && key.size() <= sizeof key_copy) {
          std::memcpy(key_copy, key.data(), key.size());
          key = std::string_view(key_copy, key.size());
        }
      }
      if (!s.expect(':', "':'")) fail(s.error);
      std::uint64_t u = 0;
      std::int64_t i = 0;
      switch (id) {
      case Key::t:
        u64(key, out.t_ns);
        seen |= f_t;
        break;
      case Key::tid:
        u64(key, u);
        if (u > UINT32_MAX) bad(key, "a thread id (32 bits)");
        out.tid = static_cast<std::uint32_t>(u);
        seen |= f_tid;
        break;
      case Key::ev: {
        // A kind from a newer minor version is skipped; in a trace of a version this reader
        // knows, an unknown kind is an error.
        const char* at = s.pos();
        std::string_view text;
        if (header_.minor > known_minor && s.string(text, scratch_) &&
            !lookup_name(text, trace::kEventKindNames, out.kind)) {
          unknown_kind = true;
        } else {
          s.rewind(at);
          name(key, out.kind, trace::kEventKindNames);
        }
        seen |= f_ev;
        break;
      }
      case Key::api: {
        std::string_view text;
        if (!s.string(text, scratch_)) bad(key, "a string");
        out.api.assign(text.data(), text.size());  // reuses the capacity
        seen |= f_api;
        break;
      }
      case Key::path:
        name(key, out.path, trace::kPathNames);
        seen |= f_path;
        break;
      case Key::dev:
        if (!s.i64(i) || i < -1 || i > 1 << 20) bad(key, "a device index (-1 when unknown)");
        out.device = static_cast<int>(i);
        seen |= f_dev;
        break;
      case Key::size:
        u64(key, out.size);
        seen |= f_size;
        break;
      case Key::ptr:
        if (!s.address(out.ptr)) bad(key, "an address \"0x...\"");
        seen |= f_ptr;
        break;
      case Key::stream:
        if (!s.address(out.stream)) bad(key, "a handle \"0x...\"");
        out.has_stream = true;
        break;
      case Key::handle:
        if (!s.address(out.handle)) bad(key, "a handle \"0x...\"");
        out.has_handle = true;
        break;
      case Key::offset:
        u64(key, out.offset);
        break;
      case Key::recycled:
        if (!s.boolean(out.recycled)) bad(key, "true or false");
        break;
      case Key::granules:
        if (!s.boolean(out.granules)) bad(key, "true or false");
        break;
      case Key::stack:
        u64(key, u);
        if (u == 0 || u > kMaxStackId) bad(key, "a stack id (1 to 65536)");
        out.stack = static_cast<std::uint32_t>(u);
        break;
      case Key::flags:
        u64(key, u);
        if (u > UINT32_MAX) bad(key, "stream flags (32 bits)");
        out.flags = static_cast<std::uint32_t>(u);
        out.has_flags = true;
        break;
      case Key::rc:
        if (!s.i64(i) || i < INT32_MIN || i > INT32_MAX) bad(key, "an integer result code");
        out.rc = static_cast<int>(i);
        seen |= f_rc;
        break;
      case Key::dur:
        u64(key, out.dur_ns);
        seen |= f_dur;
        break;
      case Key::timed_for:
        u64(key, timed_for);
        if (timed_for == 0 || timed_for > UINT32_MAX) bad(key, "a call count from 1 (32 bits)");
        break;
      case Key::oom_class:
        name(key, out.oom_class, trace::kOomClassNames);
        break;
      case Key::reserved:
        u64(key, out.pool.reserved);
        has_pool = true;
        break;
      case Key::in_use:
        u64(key, out.pool.in_use);
        has_pool = true;
        break;
      case Key::largest_free:
        u64(key, out.pool.largest_free);
        has_pool = true;
        break;
      case Key::cached:
        u64(key, out.pool.cached);
        has_pool = true;
        break;
      case Key::quarantined:
        u64(key, out.pool.quarantined);
        has_pool = true;
        break;
      case Key::free_blocks:
        u64(key, u);
        if (u > UINT32_MAX) bad(key, "a block count (32 bits)");
        out.pool.free_blocks = static_cast<std::uint32_t>(u);
        has_pool = true;
        break;
      case Key::type: {
        std::string_view text;
        if (!s.string(text, scratch_) || text != trace::line::event) bad(key, "\"event\"");
        break;
      }
      case Key::unknown:  // a key from a newer minor version
        if (!s.skip_value()) fail(s.error);
        break;
      }
      if (s.eat(',')) continue;
      if (s.eat('}')) break;
      if (!s.ok()) fail(s.error);
      s.expect(',', "',' or '}'");
      fail(s.error);
    }
  }
  if (!s.at_end()) {
    s.set_error(fmt::format("text after the end of the object at column {}", s.column()));
    fail(s.error);
  }
  const std::uint32_t required = kRequired | (header_.major == 1 ? static_cast<std::uint32_t>(f_dur) : 0u);
  if ((seen & required) != required) {
    for (const auto& [bit, key] : kRequiredNames)
      if ((required & bit) && !(seen & bit)) fail(fmt::format("event has no \"{}\"", key));
  }
  if (!(seen & f_dur) && timed_for != 1) fail(fmt::format("event has \"{}\" but no \"{}\"", tk::timed_for, tk::dur));
  out.timed_for = seen & f_dur ? static_cast<std::uint32_t>(timed_for) : 0;
  out.has_pool = has_pool;
  return !unknown_kind;
}

}  // namespace cupool
