// cupool run: preload libcupool.so into a program, wait for it, summarise its trace.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "analysis.h"
#include "cli.h"
#include "commands.h"
#include "clock.h"  // monotonic_ns()
#include "options.h"
#include "trace_file_name.h"
#include "trace_input.h"

extern char** environ;

namespace cupool::tools {

const char* const kRunHelp =
    "usage: cupool run [OPTIONS] [--] PROGRAM [ARGS...]\n"
    "\n"
    "Runs PROGRAM with libcupool.so preloaded (LD_PRELOAD, keeping what was there) and the\n"
    "CUPOOL_* variables set from the options, waits for it, prints a summary of its trace to\n"
    "stderr (peak in use, peak reserved, out-of-memory count, trace path) and exits with its status.\n"
    "\n"
    "options (each sets a CUPOOL_* variable, and wins over one already in the environment):\n"
    "  --policy growth|preallocate|passthrough|vmm   CUPOOL_POLICY\n"
    "  --limit SIZE          CUPOOL_LIMIT: cap per device (8GiB, 50%, 8GiB,1:50%)\n"
    "  --preallocate SIZE    CUPOOL_PREALLOCATE: what the preallocate policy takes up front\n"
    "  --free sync|deferred  CUPOOL_FREE\n"
    "  --trace PATH          CUPOOL_TRACE (%p: the process id). Default: CUPOOL_TRACE from the\n"
    "                        environment, else $TMPDIR/cupool-UID/runN-%p.jsonl (a private directory;\n"
    "                        TMPDIR defaults to /tmp; N is cupool's pid); the traces are kept, for\n"
    "                        cupool report; the summary covers every traced process of the run\n"
    "  --stacks off|on|all|N CUPOOL_TRACE_STACKS: the native stack of one allocation in N (on: 64),\n"
    "                        shown by cupool report beside the largest allocations\n"
    "  --share NAME          CUPOOL_SHARE: join the budget NAME shared by the processes of this node\n"
    "  --share-limit SIZE    CUPOOL_SHARE_LIMIT: the shared budget per device (every member the same)\n"
    "  --share-wait D        CUPOOL_SHARE_WAIT: how long an allocation waits for room (30s, 500ms)\n"
    "  --sim                 run on cupool's simulated CUDA (the build tree's test/sim, put first on\n"
    "                        LD_LIBRARY_PATH): try cupool on a machine without a GPU\n"
    "  --takeover            turn the frameworks' own caches off so every tensor goes through cupool:\n"
    "                        PYTORCH_NO_CUDA_MEMORY_CACHING=1, XLA_PYTHON_CLIENT_ALLOCATOR=platform,\n"
    "                        XLA_PYTHON_CLIENT_PREALLOCATE=false, TF_GPU_ALLOCATOR=cuda_malloc\n"
    "  --no-summary          print no summary\n"
    "  --help                this text\n"
    "\n"
    "libcupool.so is found next to cupool: ../shim/libcupool.so (build tree), ../lib/libcupool.so,\n"
    "../lib/*/libcupool.so (installed); the variable CUPOOL_LIBRARY overrides.\n"
    "\n"
    "exit status: the program's own; 128+N if it was killed by signal N; 127 if PROGRAM was not\n"
    "found, 126 if it could not be executed; 2 for a usage error (bad option or CUPOOL_* value);\n"
    "4 when cupool cannot start it (libcupool.so not found, no safe directory for the traces).\n";

namespace {

std::string octal_mode(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0%o", static_cast<unsigned>(mode & 07777));
  return buf;
}

bool is_file(const std::string& p) {
  struct stat st{};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string self_dir() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  std::string path(buf, static_cast<std::size_t>(n));
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// Where libcupool.so is, or "" with the places tried in `tried`.
std::string find_library(std::string& tried) {
  if (const char* env = std::getenv(kLibraryVariable); env && *env) {
    tried = std::string(kLibraryVariable) + "=" + env;
    if (!is_file(env)) return {};
    char real[PATH_MAX];  // absolute: the program may change directory before it loads CUDA
    return ::realpath(env, real) ? std::string(real) : std::string(env);
  }
  const std::string dir = self_dir();
  std::vector<std::string> candidates = {dir + "/../shim/libcupool.so", dir + "/../lib/libcupool.so",
                                         dir + "/../lib64/libcupool.so", dir + "/libcupool.so"};
#if defined(__x86_64__)
  candidates.push_back(dir + "/../lib/x86_64-linux-gnu/libcupool.so");
#elif defined(__aarch64__)
  candidates.push_back(dir + "/../lib/aarch64-linux-gnu/libcupool.so");
#endif
  for (const auto& c : candidates) {
    tried += (tried.empty() ? "" : ", ") + c;
    if (is_file(c)) {
      char real[PATH_MAX];
      return ::realpath(c.c_str(), real) ? std::string(real) : c;
    }
  }
  return {};
}

// LD_PRELOAD with the library first, everything that was there kept, except that a sanitizer
// runtime (which must be loaded first) stays in front.
std::string preload_with(const std::string& library, const char* old) {
  std::vector<std::string> front, back;
  bool present = false;
  for (std::string_view rest = old ? old : ""; !rest.empty();) {
    const std::size_t end = std::min(rest.find_first_of(": "), rest.size());
    const std::string entry(rest.substr(0, end));
    rest.remove_prefix(std::min(end + 1, rest.size()));
    if (entry.empty()) continue;
    const std::string base = entry.substr(entry.rfind('/') == std::string::npos ? 0 : entry.rfind('/') + 1);
    if (entry == library) present = true;
    const bool sanitizer = base.rfind("libasan", 0) == 0 || base.rfind("libtsan", 0) == 0 ||
                           base.rfind("libhwasan", 0) == 0 || base.rfind("libmsan", 0) == 0;
    (sanitizer ? front : back).push_back(entry);
  }
  if (!present) front.push_back(library);
  std::string out;
  for (const auto* list : {&front, &back})
    for (const auto& e : *list) out += (out.empty() ? "" : ":") + e;
  return out;
}

pid_t g_child = 0;
extern "C" void forward_signal(int sig) {
  if (g_child > 0) ::kill(g_child, sig);
}

// The directory of the traces `cupool run` names itself: $TMPDIR/cupool-<uid>. In a shared /tmp,
// another user could otherwise plant links or files where the traces go.
std::string private_trace_dir() {
  const char* tmp = std::getenv("TMPDIR");
  return std::string(tmp && *tmp ? tmp : "/tmp") + "/cupool-" + std::to_string(::geteuid());
}

// Creates `dir` (0700) if it is missing. Returns "" when it is safe to use, else why not.
std::string make_private_trace_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return dir + ": " + std::strerror(errno);
  struct stat st{};
  if (::lstat(dir.c_str(), &st) != 0) return dir + ": " + std::strerror(errno);
  if (S_ISLNK(st.st_mode)) return dir + ": it is a symbolic link, not a directory of yours";
  if (!S_ISDIR(st.st_mode)) return dir + ": it is not a directory";
  if (st.st_uid != ::geteuid()) return dir + ": it belongs to another user (uid " + std::to_string(st.st_uid) + ")";
  if (st.st_mode & 077) return dir + ": other users have access to it (mode " + octal_mode(st.st_mode) + "; chmod 700 it)";
  return {};
}

// Every trace of the run: each process the program started writes its own (docs/trace-format.md,
// "Fork, and programs a traced program starts"): the pattern with %p expanded, or without %p the
// path and "<path>.<pid>". Those in the pattern's directory that are ours, were opened between
// `from` and `to` (monotonic ns) and say they were written for this CUPOOL_TRACE. The program's
// own first, then by start time.
std::vector<std::string> run_traces(const std::string& pattern, pid_t child, std::uint64_t from, std::uint64_t to) {
  const std::size_t slash = pattern.rfind('/');
  const std::string dir_pattern = slash == std::string::npos ? "" : pattern.substr(0, slash + 1);
  const std::string base = slash == std::string::npos ? pattern : pattern.substr(slash + 1);
  std::vector<std::string> candidates;
  if (has_pid_placeholder(dir_pattern)) {
    candidates.push_back(expand_trace_path(pattern, child));  // one process's, as before
  } else {
    const std::string dir = expand_trace_path(dir_pattern, 0);  // only %% to expand
    if (DIR* d = ::opendir(dir.empty() ? "." : dir.c_str())) {
      while (const dirent* entry = ::readdir(d)) {
        const std::string_view name = entry->d_name;
        if (is_trace_file_name(base, name)) candidates.push_back(dir + std::string(name));
      }
      ::closedir(d);
    }
  }
  struct Found {
    std::string path;
    bool own;
    std::uint64_t start;
  };
  std::vector<Found> found;
  const std::string wanted = valid_utf8(pattern);
  for (const std::string& path : candidates) {
    struct stat st{};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) continue;
    try {
      const TraceInput input(path);
      const TraceMeta& m = input.meta();
      if (m.start_mono_ns < from || m.start_mono_ns > to || m.trace_pattern != wanted) continue;
      found.push_back(Found{path, m.pid == child, m.start_mono_ns});
    } catch (const TraceError&) {
      continue;  // not a trace of this run
    }
  }
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
    return a.own != b.own ? a.own : a.start != b.start ? a.start < b.start : a.path < b.path;
  });
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.path));
  return out;
}

void print_summary(const std::vector<std::string>& traces, const std::string& child_trace) {
  if (traces.empty()) {
    std::fprintf(stderr,
                 "cupool: no trace at %s: the program never reached CUDA (a trace is written from its first "
                 "CUDA call), or it could not be preloaded (a statically linked or setuid program cannot be)\n",
                 child_trace.c_str());
    return;
  }
  Analysis a;
  try {
    analyze(traces, a, false, "cupool run");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cupool: cannot read the trace: %s\n", e.what());
    return;
  }
  std::string line = "cupool:";
  std::uint64_t dropped = 0;
  for (const SourceStats& s : a.sources()) dropped += s.dropped;
  if (traces.size() == 1) {
    for (const auto& [dev, d] : a.sources().front().devices)
      if (dev >= 0)  // -1: calls no device answered for (memory info with no context)
        line += " device " + std::to_string(dev) + ": peak in use " + human_size(d.peak_in_use) + ", peak reserved " +
                human_size(d.peak_reserved) + ";";
  } else {
    // Several processes: the peaks of their sum at each moment (what the device had to hold).
    line += " " + std::to_string(traces.size()) + " processes traced;";
    for (const auto& [dev, t] : a.totals())
      if (dev >= 0)
        line += " device " + std::to_string(dev) + ": peak in use " + human_size(t.peak_in_use) + ", peak reserved " +
              human_size(t.peak_reserved) + " (all processes);";
  }
  bool any_device = false;
  for (const auto& [dev, t] : a.totals()) any_device = any_device || dev >= 0;
  if (!any_device) line += " no device memory was allocated;";
  line += " " + std::to_string(a.oom_count()) + " out of memory;";
  if (dropped) line += " " + std::to_string(dropped) + " events dropped by the writer;";
  constexpr std::size_t kListed = 8;
  line += traces.size() == 1 ? " trace " : " traces ";
  for (std::size_t i = 0; i < traces.size() && i < kListed; ++i) line += (i ? " " : "") + traces[i];
  if (traces.size() > kListed) line += " and " + std::to_string(traces.size() - kListed) + " more";
  std::fprintf(stderr, "%s\n", line.c_str());
}

}  // namespace

int cmd_run(const std::vector<std::string>& raw) {
  const char* const cmd = "run";
  try {
    Args args(raw, {"--policy", "--limit", "--preallocate", "--free", "--trace", "--stacks", "--share", "--share-limit",
                    "--share-wait"},
              {"--takeover", "--help", "--no-summary", "--sim"},
              /*stop_at_first_positional=*/true);
    if (args.flag("--help")) {
      std::fputs(kRunHelp, stdout);
      return kExitOk;
    }
    if (args.positional().empty()) return usage_error(cmd, "no program given (cupool run [OPTIONS] -- PROGRAM [ARGS...])");

    // CUPOOL_* from the options, over the environment.
    std::map<std::string, std::string> set;
    if (auto v = args.value("--policy")) set["CUPOOL_POLICY"] = *v;
    if (auto v = args.value("--limit")) set["CUPOOL_LIMIT"] = *v;
    if (auto v = args.value("--preallocate")) set["CUPOOL_PREALLOCATE"] = *v;
    if (auto v = args.value("--free")) set["CUPOOL_FREE"] = *v;
    if (auto v = args.value("--stacks")) set["CUPOOL_TRACE_STACKS"] = *v;
    if (auto v = args.value("--share")) set["CUPOOL_SHARE"] = *v;
    if (auto v = args.value("--share-limit")) set["CUPOOL_SHARE_LIMIT"] = *v;
    if (auto v = args.value("--share-wait")) set["CUPOOL_SHARE_WAIT"] = *v;
    if (args.flag("--sim")) {
      const std::string sim = self_dir() + "/../test/sim";
      if (!is_file(sim + "/libcuda.so.1")) {
        std::fprintf(stderr, "cupool run: --sim: no simulated CUDA at %s (it is built with cupool's build tree, "
                             "build/test/sim)\n", sim.c_str());
        return kExitInternal;
      }
      char real[PATH_MAX];
      const std::string dir = ::realpath(sim.c_str(), real) ? std::string(real) : sim;
      const char* old = std::getenv("LD_LIBRARY_PATH");
      set["LD_LIBRARY_PATH"] = dir + (old && *old ? ":" + std::string(old) : "");
    }
    std::string trace_pattern;
    const char* env_trace = std::getenv("CUPOOL_TRACE");
    const bool default_trace = !args.value("--trace") && !(env_trace && *env_trace);
    if (auto v = args.value("--trace")) {
      trace_pattern = *v;
    } else if (!default_trace) {
      trace_pattern = env_trace;
    } else {
      // cupool's pid keeps this run's traces apart from those of runs beside it.
      trace_pattern = private_trace_dir() + "/run" + std::to_string(::getpid()) + "-%p.jsonl";
    }
    set["CUPOOL_TRACE"] = trace_pattern;

    // The same check the library makes at load, made here first so the message names the option.
    auto parsed = parse_options([&](const char* name) -> const char* {
      if (auto it = set.find(name); it != set.end()) return it->second.c_str();
      return std::getenv(name);
    });
    if (auto* err = std::get_if<OptionError>(&parsed)) {
      std::string msg = err->message;
      if (msg.rfind("cupool: ", 0) == 0) msg = msg.substr(8);
      return usage_error(cmd, msg);
    }

    if (default_trace) {  // made only now: a usage error leaves nothing behind
      if (const std::string why = make_private_trace_dir(private_trace_dir()); !why.empty()) {
        std::fprintf(stderr, "cupool run: cannot keep traces in %s\n", why.c_str());
        return kExitInternal;
      }
    }

    std::string tried;
    const std::string library = find_library(tried);
    if (library.empty()) {
      std::fprintf(stderr, "cupool run: libcupool.so not found (tried %s); set CUPOOL_LIBRARY=/path/to/libcupool.so\n",
                   tried.c_str());
      return kExitInternal;
    }
    set["LD_PRELOAD"] = preload_with(library, std::getenv("LD_PRELOAD"));

    if (args.flag("--takeover")) {
      const std::pair<const char*, const char*> takeover[] = {{"PYTORCH_NO_CUDA_MEMORY_CACHING", "1"},
                                                              {"XLA_PYTHON_CLIENT_ALLOCATOR", "platform"},
                                                              {"XLA_PYTHON_CLIENT_PREALLOCATE", "false"},
                                                              {"TF_GPU_ALLOCATOR", "cuda_malloc"}};
      std::string said = "cupool: --takeover set";
      for (const auto& [k, v] : takeover) {
        set[k] = v;
        said += std::string(" ") + k + "=" + v;
      }
      std::fprintf(stderr, "%s\n", said.c_str());
    }
    for (const auto& [k, v] : set) ::setenv(k.c_str(), v.c_str(), 1);

    std::vector<char*> argv;
    for (const auto& a : args.positional()) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);

    // The child says through this pipe whether the program could not be run (closed unwritten by
    // a successful exec): then nothing ran, and there is no trace to summarise or explain.
    int exec_failed[2];
    if (::pipe2(exec_failed, O_CLOEXEC) != 0) {
      std::fprintf(stderr, "cupool run: pipe: %s\n", std::strerror(errno));
      return kExitInternal;
    }
    std::fflush(nullptr);
    const std::uint64_t started = monotonic_ns();
    const pid_t child = ::fork();
    if (child < 0) {
      std::fprintf(stderr, "cupool run: fork: %s\n", std::strerror(errno));
      return kExitInternal;
    }
    if (child == 0) {
      ::close(exec_failed[0]);
      ::execvp(argv[0], argv.data());
      const int err = errno;
      std::fprintf(stderr, "cupool run: cannot run %s: %s\n", argv[0], std::strerror(err));
      (void)!::write(exec_failed[1], &err, sizeof err);
      ::_exit(err == ENOENT ? 127 : 126);
    }
    ::close(exec_failed[1]);
    int exec_errno = 0;
    ssize_t got;
    while ((got = ::read(exec_failed[0], &exec_errno, sizeof exec_errno)) < 0 && errno == EINTR) {
    }
    ::close(exec_failed[0]);
    const bool ran = got != static_cast<ssize_t>(sizeof exec_errno);
    g_child = child;
    // The terminal sends SIGINT/SIGQUIT to the program too: cupool waits for it to act on them.
    // Signals meant for cupool alone (SIGTERM, SIGHUP) are passed on.
    struct sigaction ignore{}, forward{};
    ignore.sa_handler = SIG_IGN;
    forward.sa_handler = forward_signal;
    sigemptyset(&forward.sa_mask);
    ::sigaction(SIGINT, &ignore, nullptr);
    ::sigaction(SIGQUIT, &ignore, nullptr);
    ::sigaction(SIGTERM, &forward, nullptr);
    ::sigaction(SIGHUP, &forward, nullptr);

    int status = 0;
    while (::waitpid(child, &status, 0) < 0) {
      if (errno != EINTR) {
        std::fprintf(stderr, "cupool run: waitpid: %s\n", std::strerror(errno));
        return kExitInternal;
      }
    }
    const std::uint64_t ended = monotonic_ns();
    int code = 0;
    if (WIFEXITED(status)) {
      code = WEXITSTATUS(status);
    } else if (WIFSIGNALED(status)) {
      code = 128 + WTERMSIG(status);
      std::fprintf(stderr, "cupool: %s was killed by signal %d (%s)\n", argv[0], WTERMSIG(status), strsignal(WTERMSIG(status)));
    }
    if (ran && !args.flag("--no-summary"))
      // 1 ms either side: the traces' clock may be the TSC fitted to CLOCK_MONOTONIC, within
      // microseconds of it (trace/event_clock.h).
      print_summary(run_traces(trace_pattern, child, started - 1'000'000, ended + 1'000'000),
                    expand_trace_path(trace_pattern, child));
    return code;
  } catch (const UsageError& e) {
    return usage_error(cmd, e.what());
  }
}

}  // namespace cupool::tools
