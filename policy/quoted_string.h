// Quoted strings: the one escaping rule for text that cupool writes between double quotes, in
// its messages (a value named in a configuration error) and in the trace's strings. The result is
// one line of valid UTF-8, and a valid string literal of the trace's line format.
#pragma once

#include <string>
#include <string_view>

namespace cupool {

// Writes the ASCII byte `c` (below 0x80) as it stands inside a quoted string, at `p`: \" \\ \n \r
// \t \b \f, \u00XX for the other control characters and DEL, else the byte itself. Returns the
// end (at most 6 bytes written).
inline char* escape_ascii(char* p, unsigned char c) {
  static constexpr char kHex[] = "0123456789abcdef";
  char short_form = 0;
  switch (c) {
    case '"': short_form = '"'; break;
    case '\\': short_form = '\\'; break;
    case '\n': short_form = 'n'; break;
    case '\r': short_form = 'r'; break;
    case '\t': short_form = 't'; break;
    case '\b': short_form = 'b'; break;
    case '\f': short_form = 'f'; break;
    default:
      if (c < 0x20 || c == 0x7f) {
        *p++ = '\\';
        *p++ = 'u';
        *p++ = '0';
        *p++ = '0';
        *p++ = kHex[c >> 4];
        *p++ = kHex[c & 15];
      } else {
        *p++ = static_cast<char>(c);
      }
      return p;
  }
  *p++ = '\\';
  *p++ = short_form;
  return p;
}

// Appends `s` in double quotes, escaped by escape_ascii(); bytes that are not valid UTF-8 become
// U+FFFD (utf8.h), so the output is always valid.
void append_quoted(std::string& out, std::string_view s);

}  // namespace cupool
