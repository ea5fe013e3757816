// Quoted strings (quoted_string.h): ASCII escaped, well-formed UTF-8 kept, other bytes U+FFFD.
#include "quoted_string.h"

#include "utf8.h"

namespace cupool {

void append_quoted(std::string& out, std::string_view s) {
  out += '"';
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = p + s.size();
  while (p < end) {
    if (*p < 0x80) {
      char escaped[6];
      out.append(escaped, escape_ascii(escaped, *p));
      ++p;
      continue;
    }
    p += append_utf8_or_replacement(out, p, end);
  }
  out += '"';
}

}  // namespace cupool
