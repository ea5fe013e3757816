// `cupool metrics --listen`: the figures of the shared budgets served over HTTP at /metrics, one
// request per connection, each client on a thread of its own (tools/http_request.h reads the
// requests).
#pragma once

#include <string>

namespace cupool::tools {

struct ListenAddress {
  std::string host;  // "" for every address
  std::string port;
};

// --listen's HOST:PORT ("[::1]:9400", ":9400" for every address); a usage error if it is not one.
ListenAddress parse_listen(const std::string& text);

// Serves the metrics of the segments in `dir` on `where` (`listen_text` as given, for messages)
// until SIGINT or SIGTERM. Returns the exit status.
int serve_metrics(const ListenAddress& where, const std::string& listen_text, const std::string& dir);

}  // namespace cupool::tools
