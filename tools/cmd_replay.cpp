// cupool replay: what other policies would have done with a recorded run.
#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>

#include "cli.h"
#include "commands.h"
#include "config_json.h"
#include "options.h"
#include "replay.h"
#include "report.h"
#include "shared_budget.h"

namespace cupool::tools {

const char* const kReplayHelp =
    "usage: cupool replay [OPTIONS] TRACE... [--policy P[,P...]]\n"
    "\n"
    "Drives the recorded calls, in order, through each policy on a simulated device (no GPU\n"
    "needed), each process by the object libcupool.so runs (its pools, the memory it holds outside\n"
    "them, its cap, the VMM mapping cache), and prints side by side: peak requested / in use /\n"
    "reserved, fragmentation, chunks taken from and returned to the device, out-of-memory count\n"
    "and the first allocation that would fail, and why. The recorded run is the first column.\n"
    "Several traces are replayed together, sharing each simulated device.\n"
    "\n"
    "  passthrough is the library's: every allocation goes to the driver on its own, charged its\n"
    "  exact size. Allocations that failed in the recording are tried again; if they succeed they\n"
    "  are freed at once (the program kept nothing). Memory a pool never serves (managed,\n"
    "  stream-ordered, arrays, cuMemCreate) is held outside the replayed pools and counts against\n"
    "  their cap. docs/cli.md says what is and is not modelled.\n"
    "\n"
    "options:\n"
    "  --policy P[,P...]       growth, preallocate, passthrough (default: these three), vmm, or\n"
    "                          recorded: each trace under the configuration its header records\n"
    "                          (the options below do not change it; shown as \"replayed\")\n"
    "  --capacity SIZE         memory of each simulated device (default: the trace's device total,\n"
    "                          else 80 GiB)\n"
    "  --limit SIZE            CUPOOL_LIMIT for the replayed pools (8GiB, 50%, 8GiB,1:50%)\n"
    "  --preallocate SIZE      CUPOOL_PREALLOCATE\n"
    "  --preallocate-grow B    CUPOOL_PREALLOCATE_GROW (true, false)\n"
    "  --growth-chunk SIZE     CUPOOL_GROWTH_CHUNK\n"
    "  --growth-chunk-max SIZE CUPOOL_GROWTH_CHUNK_MAX\n"
    "  --release DURATION      CUPOOL_RELEASE (never, 30s...): idle chunks go back, on the trace's clock\n"
    "  --free sync|deferred    CUPOOL_FREE (default here: sync; the simulated device runs no work,\n"
    "                          so nothing freed needs a fence before its reuse)\n"
    "  --share-limit SIZE      every replayed process draws from one budget of SIZE per device\n"
    "                          (CUPOOL_SHARE_LIMIT syntax): its first refusal (who held what), the\n"
    "                          refusals (class share) and the peak of all processes' claims\n"
    "  --share-wait DURATION   CUPOOL_SHARE_WAIT: a refused allocation makes every other process give\n"
    "                          back its wholly free chunks, then is tried once more (no time passes)\n"
    "  --min-budget            bisect the smallest shared budget under which no allocation the\n"
    "                          recording got is refused by it (with --share-wait if given)\n"
    "  --min-capacity          bisect the smallest device each policy fits in (no allocation the\n"
    "                          recording got fails, whatever the class), in MiB, beside the peak live\n"
    "                          bytes (the difference: what the policy needs beyond them, to within\n"
    "                          one step), with the event that fails one step below; exit status 1\n"
    "                          when a policy does not fit the recorded device. Both searches go by\n"
    "                          2 MiB steps (or end at the upper bound itself) and read the traces\n"
    "                          again for each step tried\n"
    "  --json                  print JSON instead of text\n"
    "  --no-progress           no progress line\n"
    "  --help                  this text\n"
    "Options not given take cupool's defaults (not the recorded configuration).\n"
    "\n";

namespace {

struct Column {
  std::string name;
  const Analysis* analysis;
};

std::string ratio(double r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", r);
  return buf;
}

// Per device, over every trace: the summed peaks and the counts.
struct DeviceNumbers {
  std::uint64_t peak_requested = 0, peak_in_use = 0, peak_reserved = 0;
  double frag_at_peak = 0, frag_mean = 0, frag_max = 0;
  std::uint64_t grows = 0, grow_bytes = 0, releases = 0, release_bytes = 0, ooms = 0, failed_allocs = 0;
};

DeviceNumbers numbers(const Analysis& a, int device) {
  DeviceNumbers n;
  if (auto t = a.totals().find(device); t != a.totals().end()) {
    n.peak_requested = t->second.peak_requested;
    n.peak_in_use = t->second.peak_in_use;
    n.peak_reserved = t->second.peak_reserved;
  }
  std::uint64_t weight = 0;
  for (const auto& s : a.sources()) {
    auto it = s.devices.find(device);
    if (it == s.devices.end()) continue;
    const DeviceStats& d = it->second;
    // Fragmentation of several processes: the one with the most free memory at its peak speaks.
    if (d.peak_in_use_memory.free >= weight) {
      weight = d.peak_in_use_memory.free;
      n.frag_at_peak = d.peak_in_use_memory.fragmentation();
    }
    n.frag_mean = std::max(n.frag_mean, d.frag_mean());
    n.frag_max = std::max(n.frag_max, d.frag_max);
    n.grows += d.grows;
    n.grow_bytes += d.grow_bytes;
    n.releases += d.releases;
    n.release_bytes += d.release_bytes;
    n.ooms += d.ooms;
    n.failed_allocs += d.failed_allocs;
  }
  return n;
}

nlohmann::json numbers_json(const Analysis& a, const Replayer* r) {
  nlohmann::json devices = nlohmann::json::array();
  for (const auto& [dev, total] : a.totals()) {
    const DeviceNumbers n = numbers(a, dev);
    nlohmann::json d = {{"device", dev},
                        {"peak_requested", n.peak_requested},
                        {"peak_in_use", n.peak_in_use},
                        {"peak_reserved", n.peak_reserved},
                        {"reserved_ratio", n.peak_in_use ? static_cast<double>(n.peak_reserved) / static_cast<double>(n.peak_in_use) : 0.0},
                        {"fragmentation", {{"at_peak_in_use", n.frag_at_peak}, {"mean", n.frag_mean}, {"max", n.frag_max}}},
                        {"chunks_taken", n.grows},
                        {"chunk_bytes_taken", n.grow_bytes},
                        {"chunks_returned", n.releases},
                        {"chunk_bytes_returned", n.release_bytes},
                        {"failed_allocs", n.failed_allocs}};
    if (r) d["capacity"] = r->capacity(dev);
    devices.push_back(d);
  }
  std::size_t src = 0;
  const OomInfo* first = a.first_oom(&src);
  nlohmann::json j = {{"devices", devices}, {"oom_count", a.oom_count()}};
  if (first) {
    j["first_failure"] = oom_json(*first, a.origin());
    j["first_failure"]["trace"] = a.sources()[src].meta.path;
  } else {
    j["first_failure"] = nullptr;
  }
  return j;
}

// The steps of both searches: the pool's chunk granularity (and the VMM allocation granularity).
constexpr std::uint64_t kSearchGranularity = 2ull << 20;

// The smallest device, or budget, one policy needs (--min-capacity, --min-budget).
struct Search {
  bool fits = true;             // at the upper bound (min-capacity: the recorded device)
  std::uint64_t upper = 0;      // the bound searched below
  std::optional<ReplayFailure> at_upper;  // what failed there (fits is false)
  Smallest smallest;
};

Search min_capacity_of(const std::vector<std::string>& paths, const Replayer& replayer, std::size_t run,
                       const ReplayOptions& options) {
  Search s;
  for (const auto& [dev, total] : replayer.analysis(run).totals()) s.upper = std::max(s.upper, replayer.capacity(dev));
  s.at_upper = replayer.first_failure(run);
  s.fits = !s.at_upper;
  if (!s.fits) return s;
  ReplayOptions probed = options;
  probed.stop = ReplayOptions::Stop::failure;
  s.smallest = smallest_fitting(s.upper, kSearchGranularity, [&](std::uint64_t capacity) {
    probed.capacity = capacity;
    return probe(paths, replayer.policy(run), probed).failure;
  });
  return s;
}

// The upper bound: the peak of every process's claims under a budget that refuses nothing (with
// it as the budget, the replay is the same, so it fits).
Search min_budget_of(const std::vector<std::string>& paths, const Replayer& replayer, std::size_t run,
                     const ReplayOptions& options) {
  Search s;
  ReplayOptions probed = options;
  probed.share_limit = LimitSpec{SizeSpec{~std::uint64_t{0} >> 1, 0}, {}};
  s.upper = probe(paths, replayer.policy(run), probed).share_peak;
  if (s.upper == 0) return s;
  probed.stop = ReplayOptions::Stop::share_refusal;
  s.smallest = smallest_fitting(s.upper, kSearchGranularity, [&](std::uint64_t budget) {
    probed.share_limit = LimitSpec{SizeSpec{budget, 0}, {}};
    return probe(paths, replayer.policy(run), probed).failure;
  });
  return s;
}

std::string trace_name(const Analysis& a, std::size_t source) {
  return source < a.sources().size() ? a.sources()[source].meta.path : std::string("?");
}

nlohmann::json failure_json(const ReplayFailure& f, const Analysis& a) {
  nlohmann::json j = oom_json(f.oom, a.origin());
  j["trace"] = trace_name(a, f.source);
  if (!f.held.empty()) {
    j["held"] = nlohmann::json::array();
    for (const auto& [source, bytes] : f.held) j["held"].push_back({{"trace", trace_name(a, source)}, {"bytes", bytes}});
  }
  return j;
}

std::string failure_text(const ReplayFailure& f, const Analysis& a) {
  std::string out = oom_text(f.oom, a.origin()) + " [" + trace_name(a, f.source) + "]";
  if (!f.held.empty()) {
    out += "; held:";
    for (std::size_t i = 0; i < f.held.size(); ++i)
      out += (i ? ", " : " ") + trace_name(a, f.held[i].first) + " " + human_size(f.held[i].second);
  }
  return out;
}

nlohmann::json search_json(const Search& s, const Analysis& a) {
  nlohmann::json j = {{"fits", s.fits}, {"upper", s.upper}, {"granularity", kSearchGranularity}};
  j["bytes"] = s.fits ? nlohmann::json(s.smallest.value) : nlohmann::json(nullptr);
  j["failure"] = s.at_upper ? failure_json(*s.at_upper, a) : nlohmann::json(nullptr);
  j["below"] = s.smallest.below ? nlohmann::json{{"bytes", s.smallest.below_value}, {"failure", failure_json(*s.smallest.below, a)}}
                                : nlohmann::json(nullptr);
  j["probes"] = s.smallest.probes;
  return j;
}

// A size the searches found, in MiB as they step: whole unless it is the upper bound itself.
std::string mib(std::uint64_t bytes) {
  char buf[48];
  if (bytes % (1ull << 20) == 0) std::snprintf(buf, sizeof buf, "%llu MiB", static_cast<unsigned long long>(bytes >> 20));
  else std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / static_cast<double>(1ull << 20));
  return buf;
}

std::string below_text(const Search& s, const Analysis& a, std::string (*size)(std::uint64_t)) {
  if (!s.smallest.below) return "";
  return "\n      at " + size(s.smallest.below_value) + ": " + failure_text(*s.smallest.below, a);
}

// The largest of every device's peak live bytes (what the program held at once).
// The most bytes the recorded program held at once: what every policy must fit, whatever it
// admitted beyond the recording (a replay on a larger device may grant what the recording refused).
std::uint64_t peak_live(const Analysis& a) {
  std::uint64_t peak = 0;
  for (const auto& [dev, total] : a.totals()) peak = std::max(peak, total.peak_requested);
  return peak;
}

}  // namespace

int cmd_replay(const std::vector<std::string>& raw) {
  const char* const cmd = "replay";
  try {
    Args args(raw,
              {"--policy", "--capacity", "--limit", "--preallocate", "--preallocate-grow", "--growth-chunk",
               "--growth-chunk-max", "--release", "--free", "--share-limit", "--share-wait"},
              {"--json", "--no-progress", "--help", "--min-budget", "--min-capacity"});
    if (args.flag("--help")) {
      std::fputs(kReplayHelp, stdout);
      std::fputs(exit_codes_help({kExitOk, kExitOutOfMemory, kExitUsage, kExitBadTrace, kExitInternal}).c_str(), stdout);
      return kExitOk;
    }
    if (args.positional().empty()) return usage_error(cmd, "no trace given");

    std::vector<std::string> names;
    for (const std::string& list : args.values("--policy")) {
      std::size_t start = 0;
      while (start <= list.size()) {
        const std::size_t comma = std::min(list.find(',', start), list.size());
        if (comma > start) names.push_back(list.substr(start, comma - start));
        start = comma + 1;
      }
    }
    if (names.empty()) names = {"growth", "preallocate", "passthrough"};

    std::map<std::string, std::string> vars;
    const std::pair<const char*, const char*> option_vars[] = {
        {"--limit", "CUPOOL_LIMIT"},           {"--preallocate", "CUPOOL_PREALLOCATE"},
        {"--preallocate-grow", "CUPOOL_PREALLOCATE_GROW"}, {"--growth-chunk", "CUPOOL_GROWTH_CHUNK"},
        {"--growth-chunk-max", "CUPOOL_GROWTH_CHUNK_MAX"}, {"--release", "CUPOOL_RELEASE"},
        {"--free", "CUPOOL_FREE"}};
    // Frees are reusable at once unless asked otherwise: the library's default (deferred) waits
    // for the device's work, and the simulated device has none in flight.
    vars["CUPOOL_FREE"] = "sync";
    for (const auto& [opt, var] : option_vars)
      if (auto v = args.value(opt)) vars[var] = *v;

    // The replayed configuration is read by the same table as the library's (policy/options.cpp).
    auto parse_vars = [](const std::map<std::string, std::string>& vs) -> Config {
      auto parsed = parse_options([&](const char* var) -> const char* {
        auto it = vs.find(var);
        return it == vs.end() ? nullptr : it->second.c_str();
      });
      if (auto* err = std::get_if<OptionError>(&parsed)) {
        std::string msg = err->message;
        if (msg.rfind("cupool: ", 0) == 0) msg = msg.substr(8);
        if (err->variable == "CUPOOL_POLICY") msg += " (or recorded)";
        throw UsageError(msg);
      }
      return std::get<Config>(parsed);
    };

    ReplayOptions options;
    if (auto c = args.value("--capacity")) {
      options.capacity = parse_size(*c, "--capacity");
      if (*options.capacity == 0) return usage_error(cmd, "--capacity: must be more than 0");
    }
    for (const std::string& name : names) {
      if (name == "recorded") {
        options.policies.push_back(ReplayPolicy{name, Config{}, true});
        continue;
      }
      vars["CUPOOL_POLICY"] = name;
      options.policies.push_back(ReplayPolicy{name, parse_vars(vars)});
    }

    const bool min_budget = args.flag("--min-budget"), min_capacity = args.flag("--min-capacity");
    if (args.value("--share-limit") || args.value("--share-wait")) {
      if (!args.value("--share-limit") && !min_budget)
        return usage_error(cmd, "--share-wait: needs --share-limit or --min-budget");
      std::map<std::string, std::string> share_vars = {{"CUPOOL_SHARE", "replay"}};
      if (auto v = args.value("--share-limit")) share_vars["CUPOOL_SHARE_LIMIT"] = *v;
      if (auto v = args.value("--share-wait")) share_vars["CUPOOL_SHARE_WAIT"] = *v;
      const Config share = parse_vars(share_vars);
      if (args.value("--share-limit")) options.share_limit = share.share_limit;
      options.share_wait_ns = share.share_wait_ns;
    }
    if ((options.share_limit || min_budget) && args.positional().size() > SharedBudget::kMaxMembers)
      return usage_error(cmd, "a shared budget has at most " + std::to_string(SharedBudget::kMaxMembers) +
                                  " members (traces)");
    if (min_budget || min_capacity)
      for (const std::string& path : args.positional())
        if (path == "-") return usage_error(cmd, "--min-budget and --min-capacity read the traces again: not from standard input");

    Analysis recorded;
    Replayer replayer(options);
    try {
      analyze(args.positional(), recorded, !args.flag("--no-progress"), "cupool replay", &replayer);
    } catch (const TraceError& e) {
      std::fprintf(stderr, "cupool replay: %s\n", e.what());
      return kExitBadTrace;
    }
    replayer.finish(recorded);

    std::vector<Search> capacities, budgets;
    for (std::size_t i = 0; i < replayer.runs().size(); ++i) {
      if (min_capacity) capacities.push_back(min_capacity_of(args.positional(), replayer, i, options));
      if (min_budget) budgets.push_back(min_budget_of(args.positional(), replayer, i, options));
    }

    std::vector<Column> columns = {{"recorded", &recorded}};
    for (std::size_t i = 0; i < replayer.runs().size(); ++i)
      // The trace's own column is "recorded": its replay under the same configuration is "replayed".
      columns.push_back({replayer.policy(i).recorded ? "replayed" : replayer.policy(i).name, &replayer.analysis(i)});
    bool any_oom = false;
    for (std::size_t i = 1; i < columns.size(); ++i) any_oom = any_oom || columns[i].analysis->oom_count() > 0;

    if (args.flag("--json")) {
      nlohmann::json policies = nlohmann::json::array();
      for (std::size_t i = 0; i < replayer.runs().size(); ++i) {
        nlohmann::json j = numbers_json(replayer.analysis(i), &replayer);
        j["policy"] = replayer.policy(i).name;
        // "recorded" replays each trace under its own configuration: one per trace then.
        if (replayer.policy(i).recorded && recorded.sources().size() > 1) {
          j["config"] = nlohmann::json::array();
          for (std::size_t s = 0; s < recorded.sources().size(); ++s)
            j["config"].push_back(nlohmann::json::parse(config_json(replayer.config(i, s))));
        } else {
          j["config"] = nlohmann::json::parse(config_json(replayer.config(i, 0)));
        }
        const Analysis& a = replayer.analysis(i);
        if (options.share_limit) {
          nlohmann::json peak = nlohmann::json::object();
          for (const auto& [dev, bytes] : replayer.share_peak(i)) peak[std::to_string(dev)] = bytes;
          const auto& first = replayer.first_refusal(i);
          j["share"] = {{"refusals", replayer.share_refusals(i)}, {"peak", peak},
                        {"first_refusal", first ? failure_json(*first, a) : nlohmann::json(nullptr)}};
        }
        if (min_budget) j["min_budget"] = search_json(budgets[i], a);
        if (min_capacity) {
          j["min_capacity"] = search_json(capacities[i], a);
          j["min_capacity"]["peak_requested"] = peak_live(recorded);
        }
        policies.push_back(j);
      }
      nlohmann::json traces = nlohmann::json::array();
      for (const auto& s : recorded.sources()) traces.push_back(s.meta.path);
      nlohmann::json out = {{"format", "cupool-replay"}, {"version", 1}, {"traces", traces},
                            {"events", recorded.events()}, {"skipped", replayer.skipped()},
                            {"recorded", numbers_json(recorded, nullptr)}, {"policies", policies},
                            {"out_of_memory", any_oom}};
      std::string text = out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fputc('\n', stdout);
      return any_oom ? kExitOutOfMemory : kExitOk;
    }

    std::string out = "cupool replay: " + std::to_string(args.positional().size()) +
                      (args.positional().size() == 1 ? " trace, " : " traces, ") +
                      std::to_string(recorded.events()) + " events";
    out += "\n\n";
    for (const auto& [dev, total] : recorded.totals()) {
      out += device_title(total.info, dev) + ", simulated with " + human_size(replayer.capacity(dev)) + "\n";
      Table t;
      std::vector<std::string> head = {""};
      for (const auto& c : columns) head.push_back(c.name);
      t.row(head);
      std::vector<DeviceNumbers> n;
      for (const auto& c : columns) n.push_back(numbers(*c.analysis, dev));
      auto add = [&](const std::string& name, auto cell) {
        std::vector<std::string> r = {name};
        for (std::size_t i = 0; i < n.size(); ++i) r.push_back(cell(n[i], i));
        t.row(r);
      };
      add("peak requested", [](const DeviceNumbers& x, std::size_t) { return human_size(x.peak_requested); });
      add("peak in use", [](const DeviceNumbers& x, std::size_t) { return human_size(x.peak_in_use); });
      add("peak reserved", [](const DeviceNumbers& x, std::size_t) { return human_size(x.peak_reserved); });
      add("reserved / in use", [](const DeviceNumbers& x, std::size_t) {
        return ratio(x.peak_in_use ? static_cast<double>(x.peak_reserved) / static_cast<double>(x.peak_in_use) : 0.0);
      });
      add("fragmentation at peak", [](const DeviceNumbers& x, std::size_t) { return percent(x.frag_at_peak); });
      add("fragmentation mean", [](const DeviceNumbers& x, std::size_t) { return percent(x.frag_mean); });
      add("chunks taken", [](const DeviceNumbers& x, std::size_t) { return std::to_string(x.grows); });
      add("  bytes", [](const DeviceNumbers& x, std::size_t) { return human_size(x.grow_bytes); });
      add("chunks returned", [](const DeviceNumbers& x, std::size_t) { return std::to_string(x.releases); });
      add("  bytes", [](const DeviceNumbers& x, std::size_t) { return human_size(x.release_bytes); });
      add("failed allocations", [](const DeviceNumbers& x, std::size_t) { return std::to_string(x.failed_allocs); });
      add("out of memory", [](const DeviceNumbers& x, std::size_t) { return std::to_string(x.ooms); });
      out += t.render("  ") + "\n";
    }
    out += "first allocation that fails:\n";
    for (const auto& c : columns) {
      std::size_t src = 0;
      const OomInfo* first = c.analysis->first_oom(&src);
      out += "  " + c.name + ": ";
      if (!first) {
        out += "none\n";
        continue;
      }
      out += oom_text(*first, c.analysis->origin());
      if (c.analysis->sources().size() > 1) out += " [" + c.analysis->sources()[src].meta.path + "]";
      out += "\n";
      if (first->has_pool) out += "      pool: " + pool_state_text(first->pool) + "\n";
    }
    if (options.share_limit) {
      out += "\nshared budget " + format_limit_spec(*options.share_limit) + " per device, every process a member, " +
             (options.share_wait_ns ? "a refusal waits (the others give back, then one more try)"
                                    : "no wait") + ":\n";
      for (std::size_t i = 0; i < replayer.runs().size(); ++i) {
        std::string peaks;
        for (const auto& [dev, bytes] : replayer.share_peak(i))
          peaks += (peaks.empty() ? "" : ", ") + human_size(bytes) + " on device " + std::to_string(dev);
        const auto& first = replayer.first_refusal(i);
        out += "  " + columns[i + 1].name + ": " + std::to_string(replayer.share_refusals(i)) +
               " refused (class share), peak held " + (peaks.empty() ? std::string("0 B") : peaks) + "\n";
        if (first) out += "      first refusal " + failure_text(*first, replayer.analysis(i)) + "\n";
      }
    }
    if (min_budget) {
      out += "\nsmallest shared budget (2 MiB steps; fits: no allocation the recording got is refused by it):\n";
      for (std::size_t i = 0; i < replayer.runs().size(); ++i) {
        const Search& s = budgets[i];
        out += "  " + columns[i + 1].name + ": " + human_size(s.smallest.value) + " (peak held with no limit " +
               human_size(s.upper) + ")" + below_text(s, replayer.analysis(i), human_size) + "\n";
      }
    }
    bool misfit = false;
    if (min_capacity) {
      out += "\nsmallest device (searched in 2 MiB steps; fits: no allocation the recording got fails):\n";
      for (std::size_t i = 0; i < replayer.runs().size(); ++i) {
        const Search& s = capacities[i];
        const Analysis& a = replayer.analysis(i);
        out += "  " + columns[i + 1].name + ": ";
        if (!s.fits) {
          misfit = true;
          out += "does not fit the recorded " + mib(s.upper) + "\n      " + failure_text(*s.at_upper, a) + "\n";
          continue;
        }
        // Over the peak live bytes: what the policy needs beyond them, or the search's step.
        const std::uint64_t live = peak_live(recorded);
        const std::uint64_t over = s.smallest.value > live ? s.smallest.value - live : 0;
        out += mib(s.smallest.value) + (over == 0 ? ", the peak live bytes themselves"
                                                  : ", " + mib(over) + " above the peak live " + mib(live) +
                                                        (over < kSearchGranularity ? " (less than one step)" : "")) +
               below_text(s, a, mib) + "\n";
      }
    }
    if (misfit) out += "\nexit status 1: a policy does not fit the recorded device\n";
    else if (any_oom) out += "\nexit status 1: a replayed policy ran out of memory\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
    return any_oom ? kExitOutOfMemory : kExitOk;
  } catch (const UsageError& e) {
    return usage_error(cmd, e.what());
  }
}

}  // namespace cupool::tools
