// UTF-8 validation: the one rule for what is well-formed (RFC 3629) and the one policy for what is
// not (each such byte becomes U+FFFD). The trace reader, the quoted strings of messages and of the
// trace writer, and the cupool command's text views all follow it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace cupool {

// U+FFFD, the replacement character, as UTF-8.
inline constexpr std::string_view kReplacementCharacter = "\xef\xbf\xbd";

// The length of the well-formed UTF-8 sequence at p (1 to 4), or 0 if none begins there (no
// overlong forms, no surrogates, nothing above U+10FFFF). p < end.
std::size_t utf8_sequence(const unsigned char* p, const unsigned char* end);

// Appends the well-formed sequence at p, or U+FFFD when none begins there; returns the bytes it
// stands for (the sequence's length, or 1). p < end.
std::size_t append_utf8_or_replacement(std::string& out, const unsigned char* p, const unsigned char* end);

// Only bytes below 0x80? Eight bytes at a time: almost every trace line is ASCII.
bool is_ascii(std::string_view s);

// Is `s` well-formed UTF-8 throughout?
bool is_valid_utf8(std::string_view s);

// `s` with every byte that does not begin a well-formed UTF-8 sequence replaced by U+FFFD.
std::string valid_utf8(std::string_view s);

}  // namespace cupool
