// The metrics server's reading of an HTTP/1.0 request head (`cupool metrics --listen`): pure, so
// that a fuzz target drives it (test/fuzz/fuzz_http_request.cpp).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace cupool::tools {

// The most of a request head the server reads; a longer one is answered as it stands.
inline constexpr std::size_t kMaxRequestHead = 16384;

// Has `received` a whole head (ended by an empty line), or as much as the server reads?
bool http_head_complete(std::string_view received);

struct HttpRequest {
  std::string method;  // as sent ("GET", "HEAD", ...)
  std::string path;    // without the query
};
// The request line of `head`: nothing if it has none that names a method and a path.
std::optional<HttpRequest> parse_http_request(std::string_view head);

}  // namespace cupool::tools
