// A JSON scanner: one flat JSON object read in place, value by value, with no heap allocation for
// strings without escapes and integers read by hand. The trace reader decodes event lines with it
// (trace_event_decoder.cpp); errors come back as text, and the reader adds the place.
#pragma once

#include <fmt/format.h>

#include <array>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace cupool {

namespace json_scan {
inline constexpr int kMaxDepth = 64;  // nesting in skipped values

// Characters that end the plain run of a JSON string: the quote, an escape, a control character.
inline constexpr auto kStringStop = [] {
  std::array<bool, 256> stop{};
  for (int c = 0; c < 0x20; ++c) stop[static_cast<std::size_t>(c)] = true;
  stop['"'] = stop['\\'] = true;
  return stop;
}();
}  // namespace json_scan

class JsonScanner {
 public:
  JsonScanner(const char* p, const char* end) : p_(p), end_(end) {}

  std::string error;

  bool ok() const { return error.empty(); }
  void ws() {
    // The writer writes no whitespace: one comparison in the common case.
    if (p_ < end_ && static_cast<unsigned char>(*p_) > ' ') [[likely]]
      return;
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\r')) ++p_;
  }
  bool at_end() {
    ws();
    return p_ == end_;
  }
  bool eat(char c) {
    ws();
    if (p_ < end_ && *p_ == c) {
      ++p_;
      return true;
    }
    return false;
  }
  bool expect(char c, const char* what) {
    if (eat(c)) return true;
    return set_error(p_ < end_ ? fmt::format("expected {} at column {}", what, column())
                               : fmt::format("expected {}, the line ends", what));
  }
  bool set_error(std::string e) {
    if (error.empty()) error = std::move(e);
    return false;
  }
  std::size_t column() const { return static_cast<std::size_t>(p_ - start_) + 1; }
  void set_start(const char* s) { start_ = s; }

  // A string without escapes comes back as a view of the line; with escapes it is decoded into
  // `storage` and the view points there.
  bool string(std::string_view& out, std::string& storage) {
    ws();
    if (p_ >= end_ || *p_ != '"') return set_error(fmt::format("expected a string at column {}", column()));
    const char* s = ++p_;
    while (p_ < end_ && !json_scan::kStringStop[static_cast<unsigned char>(*p_)]) ++p_;
    if (p_ < end_ && *p_ == '"') {
      out = std::string_view(s, static_cast<std::size_t>(p_ - s));
      ++p_;
      return true;
    }
    storage.assign(s, p_);
    while (p_ < end_) {
      const char c = *p_++;
      if (c == '"') {
        out = storage;
        return true;
      }
      if (static_cast<unsigned char>(c) < 0x20) return set_error("a control character inside a string");
      if (c != '\\') {
        storage += c;
        continue;
      }
      if (p_ >= end_) break;
      switch (const char e = *p_++) {
        case '"': storage += '"'; break;
        case '\\': storage += '\\'; break;
        case '/': storage += '/'; break;
        case 'b': storage += '\b'; break;
        case 'f': storage += '\f'; break;
        case 'n': storage += '\n'; break;
        case 'r': storage += '\r'; break;
        case 't': storage += '\t'; break;
        case 'u': {
          std::uint32_t cp;
          if (!hex4(cp)) return set_error("a bad \\u escape");
          if (cp >= 0xd800 && cp <= 0xdbff) {  // a surrogate pair
            std::uint32_t low;
            if (end_ - p_ < 6 || p_[0] != '\\' || p_[1] != 'u') return set_error("a lone surrogate in \\u escape");
            p_ += 2;
            if (!hex4(low) || low < 0xdc00 || low > 0xdfff) return set_error("a lone surrogate in \\u escape");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
          } else if (cp >= 0xdc00 && cp <= 0xdfff) {
            return set_error("a lone surrogate in \\u escape");
          }
          append_utf8(storage, cp);
          break;
        }
        default:
          (void)e;
          return set_error("a bad escape in a string");
      }
    }
    return set_error("a string is not closed");
  }

  bool skip_string() {
    std::string_view ignored;
    return string(ignored, skip_storage_);
  }

  // A JSON number token (not checked beyond its characters).
  std::string_view number_token() {
    ws();
    const char* s = p_;
    while (p_ < end_ && ((*p_ >= '0' && *p_ <= '9') || *p_ == '-' || *p_ == '+' || *p_ == '.' || *p_ == 'e' ||
                         *p_ == 'E'))
      ++p_;
    return std::string_view(s, static_cast<std::size_t>(p_ - s));
  }

  // Integers by hand: this is most of the work of reading an event line.
  bool u64(std::uint64_t& out) {
    ws();
    const char* p = p_;
    const char* const end = end_;
    std::uint64_t v = 0;
    int digits = 0;
    while (p < end && static_cast<unsigned>(*p - '0') < 10) {
      const auto d = static_cast<unsigned>(*p - '0');
      if (digits >= 19) [[unlikely]] {  // only a 20th digit can overflow, and only past 18446744073709551615
        constexpr std::uint64_t kMaxDiv10 = UINT64_MAX / 10;
        if (digits > 19 || v > kMaxDiv10 || (v == kMaxDiv10 && d > UINT64_MAX % 10)) return false;
      }
      v = v * 10 + d;
      ++digits;
      ++p;
    }
    p_ = p;
    if (digits == 0) return false;
    if (p < end && (*p == '.' || *p == 'e' || *p == 'E')) return false;  // not an integer
    out = v;
    return true;
  }
  bool i64(std::int64_t& out) {
    ws();
    const bool negative = p_ < end_ && *p_ == '-';
    if (negative) ++p_;
    if (p_ < end_ && *p_ == '-') return false;
    std::uint64_t v;
    if (!u64(v)) return false;
    if (v > static_cast<std::uint64_t>(INT64_MAX) + (negative ? 1 : 0)) return false;
    out = negative ? static_cast<std::int64_t>(0 - v) : static_cast<std::int64_t>(v);
    return true;
  }
  // "0x7f00" (as the writer writes addresses and handles), or a plain number.
  bool address(std::uint64_t& out) {
    ws();
    if (p_ < end_ && *p_ != '"') return u64(out);
    const char* at = p_;
    std::string_view s;
    if (raw_string(s) && parse_hex(s, out)) return true;
    rewind(at);  // escapes, or not an address: the careful way
    return string(s, skip_storage_) && parse_hex(s, out);
  }
  static bool parse_hex(std::string_view s, std::uint64_t& out) {
    if (s.size() < 3 || s.size() > 18 || s[0] != '0' || (s[1] != 'x' && s[1] != 'X')) return false;
    const auto [q, ec] = std::from_chars(s.data() + 2, s.data() + s.size(), out, 16);
    return ec == std::errc() && q == s.data() + s.size();
  }

  const char* pos() const { return p_; }
  void rewind(const char* at) { p_ = at; }
  // The bytes up to the next quote, unchecked: callers take the result only when it matches
  // something known (which has no escapes), and otherwise rewind and call string().
  bool raw_string(std::string_view& out) {
    ws();
    if (p_ >= end_ || *p_ != '"') return false;
    const char* s = p_ + 1;
    const auto* q = static_cast<const char*>(std::memchr(s, '"', static_cast<std::size_t>(end_ - s)));
    if (q == nullptr) return false;
    out = std::string_view(s, static_cast<std::size_t>(q - s));
    p_ = q + 1;
    return true;
  }

  // Any JSON value; nested objects and arrays are checked for balance only.
  bool skip_value() {
    ws();
    if (p_ >= end_) return set_error("a value is missing, the line ends");
    const char c = *p_;
    if (c == '"') return skip_string();
    if (c == '{' || c == '[') {
      char stack[json_scan::kMaxDepth];
      int depth = 0;
      while (p_ < end_) {
        const char d = *p_;
        if (d == '"') {
          if (!skip_string()) return false;
          continue;
        }
        ++p_;
        if (d == '{' || d == '[') {
          if (depth == json_scan::kMaxDepth) return set_error("a value nested too deep");
          stack[depth++] = d == '{' ? '}' : ']';
        } else if (d == '}' || d == ']') {
          if (depth == 0 || stack[depth - 1] != d) return set_error("unbalanced brackets");
          if (--depth == 0) return true;
        }
      }
      return set_error("a value is not closed");
    }
    for (std::string_view lit : {"true", "false", "null"})
      if (static_cast<std::size_t>(end_ - p_) >= lit.size() && std::string_view(p_, lit.size()) == lit) {
        p_ += lit.size();
        return true;
      }
    const std::string_view tok = number_token();
    double ignored;
    const auto [q, ec] = std::from_chars(tok.data(), tok.data() + tok.size(), ignored);
    if (tok.empty() || ec != std::errc() || q != tok.data() + tok.size())
      return set_error(fmt::format("not a JSON value at column {}", column()));
    return true;
  }

  bool boolean(bool& v) {
    for (const bool candidate : {true, false}) {
      const std::string_view lit = candidate ? "true" : "false";
      if (static_cast<std::size_t>(end_ - p_) >= lit.size() && std::string_view(p_, lit.size()) == lit) {
        p_ += lit.size();
        v = candidate;
        return true;
      }
    }
    return set_error(fmt::format("not true or false at column {}", column()));
  }

 private:
  bool hex4(std::uint32_t& cp) {
    if (end_ - p_ < 4) return false;
    const auto [q, ec] = std::from_chars(p_, p_ + 4, cp, 16);
    if (ec != std::errc() || q != p_ + 4) return false;
    p_ += 4;
    return true;
  }
  static void append_utf8(std::string& s, std::uint32_t cp) {
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else if (cp < 0x800) {
      s += static_cast<char>(0xc0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      s += static_cast<char>(0xe0 | (cp >> 12));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      s += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      s += static_cast<char>(0xf0 | (cp >> 18));
      s += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      s += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }

  const char* p_;
  const char* end_;
  const char* start_ = nullptr;
  std::string skip_storage_;
};

}  // namespace cupool
