// UTF-8 validation (utf8.h): well-formed sequences, and U+FFFD for each byte that begins none.
#include "utf8.h"

#include <cstring>

namespace cupool {

std::size_t utf8_sequence(const unsigned char* p, const unsigned char* end) {
  const unsigned char c = *p;
  if (c < 0x80) return 1;
  const std::size_t n = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 && c < 0xf0 ? 3 : c >= 0xc2 && c <= 0xdf ? 2 : 0;
  if (n == 0 || static_cast<std::size_t>(end - p) < n) return 0;
  for (std::size_t i = 1; i < n; ++i)
    if ((p[i] & 0xc0) != 0x80) return 0;
  if (n == 3) {
    const unsigned cp = ((c & 0x0fu) << 12) | ((p[1] & 0x3fu) << 6);
    if (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  }
  if (n == 4) {
    const unsigned cp = ((c & 0x07u) << 18) | ((p[1] & 0x3fu) << 12);
    if (cp < 0x10000 || cp > 0x10ffff) return 0;
  }
  return n;
}

std::size_t append_utf8_or_replacement(std::string& out, const unsigned char* p, const unsigned char* end) {
  const std::size_t n = utf8_sequence(p, end);
  if (n == 0) {
    out += kReplacementCharacter;
    return 1;
  }
  out.append(reinterpret_cast<const char*>(p), n);
  return n;
}

bool is_ascii(std::string_view s) {
  const char* p = s.data();
  std::size_t n = s.size();
  std::uint64_t any = 0;
  for (; n >= 8; p += 8, n -= 8) {
    std::uint64_t w;
    std::memcpy(&w, p, 8);
    any |= w;
  }
  for (; n > 0; ++p, --n) any |= static_cast<unsigned char>(*p);
  return (any & 0x8080808080808080ull) == 0;
}

bool is_valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = p + s.size();
  while (p < end) {
    const std::size_t n = utf8_sequence(p, end);
    if (n == 0) return false;
    p += n;
  }
  return true;
}

std::string valid_utf8(std::string_view s) {
  if (is_ascii(s) || is_valid_utf8(s)) return std::string(s);
  std::string out;
  out.reserve(s.size() + 8);
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = p + s.size();
  while (p < end) p += append_utf8_or_replacement(out, p, end);
  return out;
}

}  // namespace cupool
