// cupool top and cupool metrics: the shared budgets on this node (policy/shared_budget.h) and who
// holds what in them, as a live view and as Prometheus metrics. Both read the segments without
// joining them (tools/share_view.h).
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <atomic>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "cli.h"
#include "http_request.h"
#include "commands.h"
#include "output.h"
#include "share_view.h"

namespace cupool::tools {

const char* const kTopHelp =
    "usage: cupool top [--json] [--once] [--interval DURATION] [--dir DIR]\n"
    "\n"
    "Shows every shared budget on this node (CUPOOL_SHARE; their segments are the files named\n"
    "cupool-share-* in /dev/shm): per budget its name, limit, and per device the budget and what\n"
    "its members hold; per member its pid, command, whether it is alive or gone (a process that\n"
    "died holding memory, until another member reclaims it), and per device it uses the bytes it\n"
    "holds of the budget, has in use, has reserved and waits for, and its out-of-memory count.\n"
    "On a terminal the view is redrawn every interval until interrupted (Ctrl-C); otherwise, or\n"
    "with --once or --json, it is printed once. Segments that cannot be read are skipped with a\n"
    "warning.\n"
    "\n"
    "options:\n"
    "  --json               print one JSON document ({\"format\":\"cupool-top\",...}) and exit\n"
    "  --once               print the view once, even on a terminal\n"
    "  --interval DURATION  time between redraws (default 1s)\n"
    "  --dir DIR            where the segments are (default /dev/shm)\n"
    "  --help               this text\n"
    "\n";

const char* const kMetricsHelp =
    "usage: cupool metrics [--listen HOST:PORT | --textfile PATH] [--interval DURATION] [--dir DIR] [--once]\n"
    "\n"
    "The figures of `cupool top` as Prometheus metrics (text exposition format 0.0.4):\n"
    "cupool_share_budget_bytes, cupool_share_budget_ratio, cupool_share_held_bytes,\n"
    "cupool_share_members, cupool_member_up, cupool_member_held_bytes, cupool_member_in_use_bytes,\n"
    "cupool_member_reserved_bytes, cupool_member_waiting_bytes, cupool_member_out_of_memory_total,\n"
    "cupool_share_segments_unreadable (docs/cli.md lists their labels). With neither --listen nor\n"
    "--textfile they are printed once.\n"
    "\n"
    "options:\n"
    "  --listen HOST:PORT   serve them over HTTP at /metrics until interrupted (SIGINT, SIGTERM);\n"
    "                       port 0 picks a free port; the address is said on stderr\n"
    "  --textfile PATH      write them to PATH (for node_exporter's textfile collector: name it\n"
    "                       *.prom), replaced whole every interval until interrupted\n"
    "  --once               with --textfile: write the file once and exit\n"
    "  --interval DURATION  with --textfile: time between writes (default 15s)\n"
    "  --dir DIR            where the segments are (default /dev/shm)\n"
    "  --help               this text\n"
    "\n";

namespace {

constexpr const char* kDefaultDir = "/dev/shm";

volatile std::sig_atomic_t g_stop = 0;
void on_stop_signal(int) { g_stop = 1; }

// SIGINT and SIGTERM end the live views, with status 0. They stay blocked but while waiting:
// ppoll unblocks them atomically, so one that comes between two waits is not lost.
class StopSignals {
 public:
  StopSignals() {
    struct sigaction sa{};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    sigprocmask(SIG_BLOCK, &stop, &waiting_);
    sigdelset(&waiting_, SIGINT);
    sigdelset(&waiting_, SIGTERM);
  }
  // False when told to stop.
  bool sleep(std::uint64_t ns) {
    const std::uint64_t deadline = now_ns() + ns;
    while (!g_stop) {
      const std::uint64_t now = now_ns();
      if (now >= deadline) return true;
      const timespec left = to_timespec(deadline - now);
      ppoll(nullptr, 0, &left, &waiting_);
    }
    return false;
  }
  // Until `fd` is readable (true) or told to stop (false).
  bool readable(int fd) {
    pollfd p{fd, POLLIN, 0};
    while (!g_stop)
      if (ppoll(&p, 1, nullptr, &waiting_) > 0) return true;
    return false;
  }

 private:
  static std::uint64_t now_ns() {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
  }
  static timespec to_timespec(std::uint64_t ns) {
    return timespec{static_cast<time_t>(ns / 1'000'000'000ull), static_cast<long>(ns % 1'000'000'000ull)};
  }
  sigset_t waiting_;
};

std::uint64_t interval_option(const Args& args, std::uint64_t default_ns) {
  const auto text = args.value("--interval");
  if (!text) return default_ns;
  const std::uint64_t ns = parse_duration_ns(*text, "--interval");
  if (ns == 0) throw UsageError("--interval: \"" + *text + "\" is not more than 0");
  return ns;
}

// The segments in `dir`; a directory that cannot be read is a usage error (--dir names it).
ShareScan scan_or_throw(const std::string& dir) {
  ShareScan scan;
  std::string error;
  if (!scan_shares(dir, scan, &error)) throw UsageError("cannot read the segments' directory " + error);
  return scan;
}

// A segment that cannot be read is said once, not at every refresh or request.
class SkipWarnings {
 public:
  explicit SkipWarnings(const char* command) : command_(command) {}
  void operator()(const ShareScan& scan) {
    std::lock_guard lock(mu_);  // the server's clients are served on threads of their own
    for (const std::string& s : scan.skipped)
      if (said_.insert(s).second)
        std::fprintf(stderr, "cupool %s: warning: skipping %s\n", command_, clean_text(s, true).c_str());
  }

 private:
  const char* command_;
  std::mutex mu_;
  std::set<std::string> said_;
};

std::string top_header(const ShareScan& scan, const std::string& dir) {
  std::size_t members = 0;
  for (const auto& b : scan.budgets) members += b.members.size();
  return "cupool top: " + std::to_string(scan.budgets.size()) + (scan.budgets.size() == 1 ? " budget, " : " budgets, ") +
         std::to_string(members) + (members == 1 ? " member" : " members") + " in " + clean_text(dir, true);
}

// The live view: the cursor goes home and each line clears what the last frame left after
// it, so the screen is redrawn without flicker.
int top_live(const std::string& dir, std::uint64_t interval) {
  StopSignals signals;
  std::fputs("\x1b[?25l\x1b[H\x1b[2J", stdout);  // hide the cursor, clear the screen
  do {
    std::string header, body;
    ShareScan scan;
    std::string error;
    const std::time_t now = std::time(nullptr);
    char clock[16] = "";
    std::strftime(clock, sizeof clock, "%H:%M:%S", std::localtime(&now));
    if (scan_shares(dir, scan, &error)) {
      body = top_text(scan, top_header(scan, dir) + "   " + clock + "   every " + human_duration(interval) + ", Ctrl-C quits",
                      true);
    } else {
      body = "cupool top: cannot read " + clean_text(error, true) + "   " + clock + "\n";
    }
    std::string frame = "\x1b[H";
    for (std::size_t start = 0; start < body.size();) {
      std::size_t end = body.find('\n', start);
      if (end == std::string::npos) end = body.size();
      frame.append(body, start, end - start);
      frame += "\x1b[K\n";
      start = end + 1;
    }
    frame += "\x1b[J";
    std::fwrite(frame.data(), 1, frame.size(), stdout);
    if (std::fflush(stdout) != 0) break;  // main() says so (exit 4)
  } while (signals.sleep(interval));
  std::fputs("\x1b[?25h", stdout);  // the cursor back
  return kExitOk;
}

// --textfile: node_exporter runs as another user, so the file is readable by all (as far as the
// umask lets) rather than 0600 like cupool's other output; it holds pids and command names, which
// any user sees in /proc anyway.
void write_textfile(const std::string& path, const std::string& text, mode_t mode) {
  OutputFile out(path, false);
  struct stat st{};
  // A regular file here is our new temporary file; never chmod what is written in place (/dev/null).
  if (fstat(fileno(out.stream()), &st) == 0 && S_ISREG(st.st_mode)) fchmod(fileno(out.stream()), mode);
  std::fwrite(text.data(), 1, text.size(), out.stream());
  out.commit();
}

struct ListenAddress {
  std::string host;  // "" for every address
  std::string port;
};

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

}  // namespace

int cmd_top(const std::vector<std::string>& raw) {
  const char* const cmd = "top";
  try {
    Args args(raw, {"--interval", "--dir"}, {"--json", "--once", "--help"});
    if (args.flag("--help")) {
      std::fputs(kTopHelp, stdout);
      std::fputs(exit_codes_help({kExitOk, kExitUsage, kExitInternal}).c_str(), stdout);
      return kExitOk;
    }
    if (!args.positional().empty()) return usage_error(cmd, "unexpected argument \"" + args.positional()[0] + "\"");
    const std::uint64_t interval = interval_option(args, 1'000'000'000);
    const std::string dir = args.value("--dir").value_or(kDefaultDir);
    const ShareScan scan = scan_or_throw(dir);
    if (!args.flag("--json") && !args.flag("--once") && isatty(STDOUT_FILENO) == 1) return top_live(dir, interval);

    SkipWarnings warn(cmd);
    warn(scan);
    std::string text = args.flag("--json")
                           ? top_json(scan).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n"
                           : top_text(scan, top_header(scan, dir), false);
    std::fwrite(text.data(), 1, text.size(), stdout);
    return kExitOk;
  } catch (const UsageError& e) {
    return usage_error(cmd, e.what());
  }
}

int cmd_metrics(const std::vector<std::string>& raw) {
  const char* const cmd = "metrics";
  try {
    Args args(raw, {"--listen", "--textfile", "--interval", "--dir"}, {"--once", "--help"});
    if (args.flag("--help")) {
      std::fputs(kMetricsHelp, stdout);
      std::fputs(exit_codes_help({kExitOk, kExitUsage, kExitInternal}).c_str(), stdout);
      return kExitOk;
    }
    if (!args.positional().empty()) return usage_error(cmd, "unexpected argument \"" + args.positional()[0] + "\"");
    const auto listen = args.value("--listen");
    const auto textfile = args.value("--textfile");
    if (listen && textfile) return usage_error(cmd, "give --listen or --textfile, not both");
    if (listen && args.flag("--once")) return usage_error(cmd, "--once does not apply to --listen, which serves until interrupted");
    if (args.value("--interval") && !textfile)
      return usage_error(cmd, "--interval applies to --textfile (--listen reads the figures at each request)");
    const std::uint64_t interval = interval_option(args, 15'000'000'000);
    const std::string dir = args.value("--dir").value_or(kDefaultDir);
    const std::optional<ListenAddress> where = listen ? std::optional(parse_listen(*listen)) : std::nullopt;
    ShareScan scan = scan_or_throw(dir);

    if (where) return serve_metrics(*where, *listen, dir);
    SkipWarnings warn(cmd);
    if (!textfile) {
      warn(scan);
      const std::string text = metrics_text(scan);
      std::fwrite(text.data(), 1, text.size(), stdout);
      return kExitOk;
    }
    const mode_t mask = umask(0);
    umask(mask);
    const mode_t mode = 0644 & ~mask;
    if (args.flag("--once")) {
      warn(scan);
      write_textfile(*textfile, metrics_text(scan), mode);
      return kExitOk;
    }
    StopSignals signals;
    do {
      std::string error;
      if (!scan_shares(dir, scan, &error)) {
        std::fprintf(stderr, "cupool %s: cannot read %s\n", cmd, error.c_str());
        return kExitInternal;
      }
      warn(scan);
      write_textfile(*textfile, metrics_text(scan), mode);
    } while (signals.sleep(interval));
    return kExitOk;
  } catch (const UsageError& e) {
    return usage_error(cmd, e.what());
  }
}

}  // namespace cupool::tools
