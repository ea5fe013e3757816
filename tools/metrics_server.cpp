// The HTTP server of `cupool metrics --listen` (metrics_server.h).
#include "metrics_server.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include "cli.h"
#include "commands.h"
#include "http_request.h"
#include "share_view.h"
#include "share_watch.h"

namespace cupool::tools {

ListenAddress parse_listen(const std::string& text) {
  const std::size_t colon = text.rfind(':');
  if (colon == std::string::npos)
    throw UsageError("--listen: \"" + text + "\" is not HOST:PORT (e.g. 127.0.0.1:9400, [::1]:9400, :9400)");
  ListenAddress a{text.substr(0, colon), text.substr(colon + 1)};
  if (a.host.size() >= 2 && a.host.front() == '[' && a.host.back() == ']') a.host = a.host.substr(1, a.host.size() - 2);
  unsigned port = 0;
  const auto [end, ec] = std::from_chars(a.port.data(), a.port.data() + a.port.size(), port);
  if (a.port.empty() || ec != std::errc() || end != a.port.data() + a.port.size() || port > 65535)
    throw UsageError("--listen: \"" + a.port + "\" is not a port (0 to 65535; 0 picks a free one)");
  return a;
}

namespace {

bool send_all(int fd, const std::string& data) {
  for (std::size_t done = 0; done < data.size();) {
    const ssize_t n = send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

std::string http_response(const char* status, const char* content_type, const std::string& body, bool head,
                          const char* extra_header = "") {
  std::string r = std::string("HTTP/1.0 ") + status + "\r\nContent-Type: " + content_type +
                  "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n" + extra_header +
                  "Connection: close\r\n\r\n";
  if (!head) r += body;
  return r;
}

// One request, HTTP/1.0 style: read the head, answer, close. The head must come whole within
// kHeadSeconds, however it drips (a byte every few seconds held every scrape for 45 s when the
// limit was per read); each client has a thread of its own, so none holds the others.
constexpr int kHeadSeconds = 5;
void serve_one(int fd, const std::string& dir, SkipWarnings& warn) {
  const timeval send_timeout{kHeadSeconds, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof send_timeout);
  timespec start{};
  clock_gettime(CLOCK_MONOTONIC, &start);
  std::string request;
  char buf[4096];
  while (!http_head_complete(request)) {
    timespec now{};
    clock_gettime(CLOCK_MONOTONIC, &now);
    const long long left_ms = kHeadSeconds * 1000ll - ((now.tv_sec - start.tv_sec) * 1000ll +
                                                       (now.tv_nsec - start.tv_nsec) / 1'000'000);
    if (left_ms <= 0) return;  // too slow: dropped without an answer
    pollfd p{fd, POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(left_ms));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return;
    const ssize_t n = recv(fd, buf, std::min(sizeof buf, kMaxRequestHead - request.size()), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    request.append(buf, static_cast<std::size_t>(n));
  }
  const char* const kText = "text/plain; charset=utf-8";
  const std::optional<HttpRequest> req = parse_http_request(request);
  if (!req) {
    if (!request.empty()) send_all(fd, http_response("400 Bad Request", kText, "bad request\n", false));
    return;
  }
  const bool head = req->method == "HEAD";
  if (req->path != "/metrics") {
    send_all(fd, http_response("404 Not Found", kText, "not found: the metrics are at /metrics\n", head));
  } else if (req->method != "GET" && !head) {
    send_all(fd, http_response("405 Method Not Allowed", kText, "only GET and HEAD\n", false, "Allow: GET, HEAD\r\n"));
  } else {
    ShareScan scan;
    std::string error;
    if (!scan_shares(dir, scan, &error)) {
      send_all(fd, http_response("500 Internal Server Error", kText, "cannot read " + error + "\n", head));
      return;
    }
    warn(scan);
    send_all(fd, http_response("200 OK", "text/plain; version=0.0.4; charset=utf-8", metrics_text(scan), head));
  }
}

// Clients served at once; one more is answered 503 at once rather than queued behind them.
constexpr int kMaxClients = 64;

}  // namespace

int serve_metrics(const ListenAddress& where, const std::string& listen_text, const std::string& dir) {
  const char* const cmd = "metrics";
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(where.host.empty() ? nullptr : where.host.c_str(), where.port.c_str(), &hints, &found);
      rc != 0)
    return usage_error(cmd, "--listen: cannot resolve \"" + where.host + "\": " + gai_strerror(rc));
  // Every address (":PORT"): IPv6's "::" first, open to IPv4 too, so that one socket serves
  // both; IPv4's "0.0.0.0" where IPv6 is not available.
  std::vector<const addrinfo*> candidates;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) candidates.push_back(a);
  if (where.host.empty())
    std::stable_partition(candidates.begin(), candidates.end(), [](const addrinfo* a) { return a->ai_family == AF_INET6; });
  int fd = -1;
  int err = 0;
  for (const addrinfo* a : candidates) {
    if (fd >= 0) break;
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    const int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // restart at once after a stop
    if (a->ai_family == AF_INET6 && where.host.empty()) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 64) != 0) {
      err = errno;
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) {
    std::fprintf(stderr, "cupool %s: cannot listen on %s: %s\n", cmd, listen_text.c_str(), std::strerror(err));
    return kExitInternal;
  }
  // The address actually bound (port 0 picks one): said, so that whoever started us can connect.
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  char host[NI_MAXHOST] = "?", port[NI_MAXSERV] = "?";
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) == 0)
    getnameinfo(reinterpret_cast<sockaddr*>(&bound), len, host, sizeof host, port, sizeof port,
                NI_NUMERICHOST | NI_NUMERICSERV);
  const bool v6 = bound.ss_family == AF_INET6;
  std::fprintf(stderr, "cupool %s: serving http://%s%s%s:%s/metrics\n", cmd, v6 ? "[" : "", host, v6 ? "]" : "", port);

  StopSignals signals;
  static SkipWarnings warn(cmd);  // outlives detached client threads
  static std::atomic<int> clients{0};
  while (signals.readable(fd)) {
    const int client = accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) {
      if (errno == EMFILE || errno == ENFILE) signals.sleep(100'000'000);  // not a busy loop while out of descriptors
      continue;
    }
    if (clients.load() >= kMaxClients) {
      send_all(client, http_response("503 Service Unavailable", "text/plain; charset=utf-8", "busy\n", false));
      close(client);
      continue;
    }
    clients.fetch_add(1);
    std::thread([client, dir] {
      serve_one(client, dir, warn);
      close(client);
      clients.fetch_sub(1);
    }).detach();
  }
  close(fd);
  // Clients still being served finish or time out (each within kHeadSeconds of reading).
  for (int i = 0; i < 100 * (kHeadSeconds + 1) && clients.load() > 0; ++i) usleep(10'000);
  return kExitOk;
}

}  // namespace cupool::tools
