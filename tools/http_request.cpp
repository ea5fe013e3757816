// The metrics server's reading of an HTTP/1.0 request head (http_request.h).
#include "http_request.h"

namespace cupool::tools {

bool http_head_complete(std::string_view received) {
  return received.size() >= kMaxRequestHead || received.find("\r\n\r\n") != std::string_view::npos ||
         received.find("\n\n") != std::string_view::npos;
}

std::optional<HttpRequest> parse_http_request(std::string_view head) {
  const std::string_view line = head.substr(0, head.find_first_of("\r\n"));
  const std::size_t sp1 = line.find(' ');
  if (sp1 == std::string_view::npos || sp1 == 0) return std::nullopt;
  const std::size_t sp2 = line.find(' ', sp1 + 1);
  std::string_view path = line.substr(sp1 + 1, sp2 == std::string_view::npos ? std::string_view::npos : sp2 - sp1 - 1);
  path = path.substr(0, path.find('?'));
  if (path.empty()) return std::nullopt;
  return HttpRequest{std::string(line.substr(0, sp1)), std::string(path)};
}

}  // namespace cupool::tools
