// libFuzzer target: the metrics server's reading of a request head (tools/http_request.cpp), as
// any client on the network can send it. Besides "no crash, no sanitizer error": a head is
// complete by the server's rule once it holds kMaxRequestHead bytes, and a parsed request has a
// non-empty method and a path with no query and no line break.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "http_request.h"

#define FUZZ_CHECK(cond)                                                      \
  do {                                                                        \
    if (!(cond)) {                                                            \
      std::fprintf(stderr, "fuzz_http_request: check failed: %s\n", #cond);   \
      std::abort();                                                           \
    }                                                                         \
  } while (0)

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view head(reinterpret_cast<const char*>(data), size);
  using namespace cupool::tools;
  if (size >= kMaxRequestHead) FUZZ_CHECK(http_head_complete(head));
  if (const auto req = parse_http_request(head)) {
    FUZZ_CHECK(!req->method.empty() && !req->path.empty());
    FUZZ_CHECK(req->path.find('?') == std::string::npos);
    FUZZ_CHECK(req->path.find_first_of("\r\n") == std::string::npos);
    FUZZ_CHECK(req->method.find_first_of(" \r\n") == std::string::npos);
  }
  return 0;
}
