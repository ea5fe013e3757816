// What `cupool top` and `cupool metrics` show (share_view.h): the shared budgets read from their
// segments, as text, JSON and Prometheus metrics.
#include "share_view.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <ctime>
#include <map>
#include <set>

#include "cli.h"
#include "options.h"
#include "utf8.h"

namespace cupool::tools {
namespace {

constexpr std::string_view kSegmentPrefix = "cupool-share-";
constexpr int kMaxDevices = SharedBudget::kMaxDevices;

std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

// The budget's limit as a LimitSpec, through the one parser of CUPOOL_SHARE_LIMIT (the segment
// holds it as that parser normalized it). Nothing when the text does not parse.
std::optional<LimitSpec> parse_limit_text(const std::string& text) {
  if (text.empty()) return LimitSpec{};
  auto parsed = parse_options([&](const char* name) -> const char* {
    if (std::strcmp(name, "CUPOOL_SHARE") == 0) return "top";
    if (std::strcmp(name, "CUPOOL_SHARE_LIMIT") == 0) return text.c_str();
    return nullptr;
  });
  if (const Config* c = std::get_if<Config>(&parsed)) return c->share_limit;
  return std::nullopt;
}

// A segment another process is creating right now is all zeros until its creator fills it in:
// not worth a warning, unless it has stayed so (its creator died before finishing it).
bool being_set_up(const std::string& path) {
  // O_NONBLOCK: a FIFO planted at the name must not hang the reader (issue 26).
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return false;
  std::uint64_t magic = 1;
  struct stat st{};
  const bool zero = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
                    pread(fd, &magic, sizeof magic, 0) == static_cast<ssize_t>(sizeof magic) && magic == 0;
  close(fd);
  return zero && std::time(nullptr) - st.st_mtime < 5;
}

// The number of characters a terminal shows for valid UTF-8 (one column each: close enough
// for command names).
std::size_t columns(std::string_view s) {
  std::size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}
std::string right(std::string s, std::size_t width) {
  const std::size_t w = columns(s);
  return w >= width ? s : std::string(width - w, ' ') + s;
}
std::string left(std::string s, std::size_t width) {
  const std::size_t w = columns(s);
  return w >= width ? s : s + std::string(width - w, ' ');
}

std::string device_budget_text(const ShareDevice& d) {
  if (!d.budget) return "none";
  if (d.budget->is_percent()) return format_size_spec(*d.budget) + " of device";
  return human_size(d.budget->bytes);
}

// Prometheus label values: UTF-8, with backslash, double quote and newline escaped.
std::string label_value(std::string_view raw) {
  const std::string s = clean_text(raw, false);
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

using Labels = std::vector<std::pair<std::string_view, std::string>>;

class Exposition {
 public:
  void family(std::string_view name, std::string_view help, std::string_view type) {
    out_ += "# HELP ";
    out_ += name;
    out_ += ' ';
    out_ += help;  // our own text: nothing to escape
    out_ += "\n# TYPE ";
    out_ += name;
    out_ += ' ';
    out_ += type;
    out_ += '\n';
  }
  void sample(std::string_view name, const Labels& labels, std::string_view value) {
    out_ += name;
    if (!labels.empty()) {
      out_ += '{';
      for (std::size_t i = 0; i < labels.size(); ++i) {
        if (i) out_ += ',';
        out_ += labels[i].first;
        out_ += "=\"";
        out_ += label_value(labels[i].second);
        out_ += '"';
      }
      out_ += '}';
    }
    out_ += ' ';
    out_ += value;
    out_ += '\n';
  }
  void sample(std::string_view name, const Labels& labels, std::uint64_t value) {
    sample(name, labels, std::to_string(value));
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

std::string double_text(double v) {
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);  // shortest text that reads back exactly
  return ec == std::errc() ? std::string(buf, end) : std::string("NaN");
}

// A pid reused while the slot of its earlier process is still there (dead members are
// reclaimed only when someone needs room) would give two series the same labels, and a scrape
// with duplicate series is rejected whole: one series per pid and command, the live member's.
std::vector<const SharedBudget::Member*> exposed_members(const ShareBudgetView& b) {
  std::vector<const SharedBudget::Member*> out;
  std::map<std::pair<int, std::string>, std::size_t> seen;
  for (const SharedBudget::Member& m : b.members) {
    const auto key = std::make_pair(m.pid, clean_text(m.command, false));
    const auto [it, fresh] = seen.emplace(key, out.size());
    if (fresh) out.push_back(&m);
    else if (!out[it->second]->alive && m.alive) out[it->second] = &m;
  }
  return out;
}

}  // namespace

std::string clean_text(std::string_view s, bool printable) {
  std::string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  for (std::size_t i = 0; i < n;) {
    const std::size_t len = utf8_sequence(p + i, p + n);  // utf8.h: the one rule
    if (len == 0) {
      out += kReplacementCharacter;
      ++i;
      continue;
    }
    // C0 and C1 controls and DEL: a terminal acts on them (C1 too, in some). C1 is U+0080 to
    // U+009F: 0xC2 then 0x80 to 0x9F.
    const unsigned char c = p[i];
    const bool control = len == 1 ? c < 0x20 || c == 0x7F : len == 2 && c == 0xC2 && p[i + 1] < 0xA0;
    if (printable && control) out += '?';
    else out.append(s.substr(i, len));
    i += len;
  }
  return out;
}

bool member_uses(const SharedBudget::Member& m, int device) {
  return m.held[device] || m.in_use[device] || m.reserved[device] || m.waiting[device];
}

bool scan_shares(const std::string& dir, ShareScan& out, std::string* error) {
  out = ShareScan{};
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) {
    *error = dir + ": " + std::strerror(errno);
    return false;
  }
  const std::string base = dir.empty() || dir.back() == '/' ? dir : dir + "/";
  std::vector<std::string> paths;
  while (const dirent* e = readdir(d))
    if (std::string_view(e->d_name).starts_with(kSegmentPrefix)) paths.push_back(base + e->d_name);
  closedir(d);
  std::sort(paths.begin(), paths.end());

  for (const std::string& path : paths) {
    std::string why;
    std::unique_ptr<SharedBudget> budget = SharedBudget::observe(path, &why);
    if (!budget) {
      struct stat st{};
      if (lstat(path.c_str(), &st) != 0 && errno == ENOENT) continue;  // removed since the directory was read
      if (being_set_up(path)) continue;
      out.skipped.push_back(why);
      continue;
    }
    ShareBudgetView v;
    v.name = budget->name();
    v.segment = path;
    const std::string file = path.substr(path.rfind('/') + 1);
    const std::size_t dash = file.find('-', kSegmentPrefix.size());
    v.owner = dash == std::string::npos ? std::string() : file.substr(kSegmentPrefix.size(), dash - kSegmentPrefix.size());
    // The owner its name gives must be the file's (issue 26: anyone may plant a file named as
    // another user's budget, and top showed it as theirs).
    const bool group = v.owner.starts_with("g");
    const std::string file_owner = group ? "g" + std::to_string(budget->owner_gid()) : std::to_string(budget->owner_uid());
    if (v.owner != file_owner) {
      out.skipped.push_back(path + ": owned by " + (group ? "gid " : "uid ") + file_owner.substr(group ? 1 : 0) +
                            ", not the " + (group ? "group" : "user") + " its name gives: not shown");
      continue;
    }
    v.limit = budget->limit_text();
    // Members that are gone drop out of the views (their slots are emptied by the next member that
    // needs room); what they still hold is counted apart.
    std::vector<SharedBudget::Member> gone;
    for (SharedBudget::Member& m : budget->members()) (m.alive ? v.members : gone).push_back(std::move(m));
    v.gone = gone.size();
    std::sort(v.members.begin(), v.members.end(), [](const auto& a, const auto& b) {
      return a.pid != b.pid ? a.pid < b.pid : a.start_ticks < b.start_ticks;
    });

    const std::optional<LimitSpec> limit = parse_limit_text(v.limit);
    std::set<int> devices;
    for (const auto* list : {&v.members, &gone})
      for (const auto& m : *list)
        for (int dev = 0; dev < kMaxDevices; ++dev)
          if (member_uses(m, dev)) devices.insert(dev);
    if (limit)
      for (const auto& [dev, spec] : limit->per_device) devices.insert(dev);
    for (int dev : devices) {
      ShareDevice sd;
      sd.device = dev;
      if (limit) sd.budget = limit->for_device(dev);
      if (sd.budget && !sd.budget->is_percent()) sd.budget_bytes = sd.budget->bytes;
      if (dev < kMaxDevices) {
        for (const auto& m : gone) sd.held_by_gone = saturating_add(sd.held_by_gone, m.held[dev]);
        sd.held = sd.held_by_gone;
        for (const auto& m : v.members) sd.held = saturating_add(sd.held, m.held[dev]);
      }
      v.devices.push_back(sd);
    }
    out.budgets.push_back(std::move(v));
  }
  return true;
}

std::string top_text(const ShareScan& scan, const std::string& header, bool skipped_lines) {
  std::string out = header + "\n";
  if (scan.budgets.empty()) out += "\nno shared budgets\n";
  for (const ShareBudgetView& b : scan.budgets) {
    out += "\nbudget " + clean_text(b.name, true) + "   limit " +
           (b.limit.empty() ? std::string("none") : clean_text(b.limit, true)) + "   " + clean_text(b.segment, true) + "\n";
    if (b.devices.empty()) {
      out += "  no device used\n";
    } else {
      out += "  " + right("DEVICE", 6) + right("BUDGET", 16) + right("HELD", 12) + right("OF BUDGET", 11) + "\n";
      for (const ShareDevice& d : b.devices) {
        std::string share;
        if (d.budget_bytes && *d.budget_bytes > 0)
          share = percent(static_cast<double>(d.held) / static_cast<double>(*d.budget_bytes));
        out += "  " + right(std::to_string(d.device), 6) + right(device_budget_text(d), 16) + right(human_size(d.held), 12) +
               right(share, 11) + "\n";
      }
    }
    std::uint64_t by_gone = 0;
    for (const ShareDevice& d : b.devices) by_gone = saturating_add(by_gone, d.held_by_gone);
    if (b.gone)
      out += "  " + std::to_string(b.gone) + (b.gone == 1 ? " member" : " members") + " gone, holding " +
             human_size(by_gone) + " until the next member that needs room empties their slots\n";
    if (b.members.empty()) {
      out += "  no members\n";
      continue;
    }
    out += "  " + right("PID", 8) + "  " + left("COMMAND", 16) + left("STATE", 6) + right("DEVICE", 7) + right("HELD", 12) +
           right("IN USE", 12) + right("RESERVED", 12) + right("WAITING", 12) + right("OOMS", 6) + "\n";
    for (const SharedBudget::Member& m : b.members) {
      const std::string who = "  " + right(std::to_string(m.pid), 8) + "  " + left(clean_text(m.command, true), 16) +
                              left(m.alive ? "alive" : "gone", 6);
      const std::string blank(columns(who), ' ');
      bool first = true;
      for (int dev = 0; dev < kMaxDevices; ++dev) {
        if (!member_uses(m, dev)) continue;
        out += (first ? who : blank) + right(std::to_string(dev), 7) + right(human_size(m.held[dev]), 12) +
               right(human_size(m.in_use[dev]), 12) + right(human_size(m.reserved[dev]), 12) +
               right(human_size(m.waiting[dev]), 12) + (first ? right(std::to_string(m.ooms), 6) : std::string()) + "\n";
        first = false;
      }
      if (first) out += who + right("-", 7) + right("-", 12) + right("-", 12) + right("-", 12) + right("-", 12) +
                        right(std::to_string(m.ooms), 6) + "\n";
    }
  }
  if (skipped_lines && !scan.skipped.empty()) {
    out += "\n";
    for (const std::string& s : scan.skipped) out += "skipped " + clean_text(s, true) + "\n";
  }
  // The columns' padding leaves spaces at the ends of lines: none in the output.
  std::string trimmed;
  trimmed.reserve(out.size());
  for (std::size_t start = 0; start < out.size();) {
    std::size_t end = out.find('\n', start);
    if (end == std::string::npos) end = out.size();
    std::size_t last = end;
    while (last > start && out[last - 1] == ' ') --last;
    trimmed.append(out, start, last - start);
    if (end < out.size()) trimmed += '\n';
    start = end + 1;
  }
  return trimmed;
}

nlohmann::json top_json(const ShareScan& scan) {
  using nlohmann::json;
  json budgets = json::array();
  for (const ShareBudgetView& b : scan.budgets) {
    json devices = json::array();
    for (const ShareDevice& d : b.devices) {
      devices.push_back({{"device", d.device},
                         {"budget", d.budget ? json(format_size_spec(*d.budget)) : json(nullptr)},
                         {"budget_bytes", d.budget_bytes ? json(*d.budget_bytes) : json(nullptr)},
                         {"held_bytes", d.held},
                         {"held_by_gone_bytes", d.held_by_gone}});
    }
    json members = json::array();
    for (const SharedBudget::Member& m : b.members) {
      json used = json::array();
      for (int dev = 0; dev < kMaxDevices; ++dev) {
        if (!member_uses(m, dev)) continue;
        used.push_back({{"device", dev},
                        {"held_bytes", m.held[dev]},
                        {"in_use_bytes", m.in_use[dev]},
                        {"reserved_bytes", m.reserved[dev]},
                        {"waiting_bytes", m.waiting[dev]}});
      }
      members.push_back(
          {{"pid", m.pid}, {"command", m.command}, {"alive", m.alive}, {"ooms", m.ooms}, {"devices", std::move(used)}});
    }
    budgets.push_back({{"name", b.name},
                       {"owner", b.owner},
                       {"limit", b.limit.empty() ? json(nullptr) : json(b.limit)},
                       {"segment", b.segment},
                       {"devices", std::move(devices)},
                       {"members", std::move(members)},
                       {"gone_members", b.gone}});
  }
  return {{"format", "cupool-top"}, {"version", 1}, {"budgets", std::move(budgets)}, {"skipped", scan.skipped}};
}

std::string metrics_text(const ShareScan& scan) {
  Exposition x;
  auto share_labels = [](const ShareBudgetView& b) { return Labels{{"share", b.name}, {"owner", b.owner}}; };
  auto device_labels = [&](const ShareBudgetView& b, int device) {
    Labels l = share_labels(b);
    l.emplace_back("device", std::to_string(device));
    return l;
  };
  auto member_labels = [&](const ShareBudgetView& b, const SharedBudget::Member& m) {
    Labels l = share_labels(b);
    l.emplace_back("pid", std::to_string(m.pid));
    l.emplace_back("command", m.command);
    return l;
  };

  x.family("cupool_share_budget_bytes", "The shared budget on the device, in bytes (budgets given in bytes).", "gauge");
  for (const auto& b : scan.budgets)
    for (const auto& d : b.devices)
      if (d.budget_bytes) x.sample("cupool_share_budget_bytes", device_labels(b, d.device), *d.budget_bytes);

  x.family("cupool_share_budget_ratio",
           "The shared budget on the device as a fraction of the device's memory (budgets given in percent).", "gauge");
  for (const auto& b : scan.budgets)
    for (const auto& d : b.devices)
      if (d.budget && d.budget->is_percent())
        x.sample("cupool_share_budget_ratio", device_labels(b, d.device), double_text(d.budget->percent / 100.0));

  x.family("cupool_share_held_bytes", "Bytes the budget's members hold on the device, members gone included.", "gauge");
  for (const auto& b : scan.budgets)
    for (const auto& d : b.devices) x.sample("cupool_share_held_bytes", device_labels(b, d.device), d.held);

  x.family("cupool_share_members", "Live members of the budget.", "gauge");
  for (const auto& b : scan.budgets) x.sample("cupool_share_members", share_labels(b), b.members.size());
  x.family("cupool_share_gone_members", "Members gone whose slots the next member that needs room empties.", "gauge");
  for (const auto& b : scan.budgets) x.sample("cupool_share_gone_members", share_labels(b), b.gone);

  x.family("cupool_member_up", "1 if the member process is running, 0 if it is gone.", "gauge");
  for (const auto& b : scan.budgets)
    for (const auto* m : exposed_members(b)) x.sample("cupool_member_up", member_labels(b, *m), m->alive ? 1 : 0);

  struct PerDevice {
    const char* name;
    const char* help;
    const std::uint64_t (SharedBudget::Member::*values)[kMaxDevices];
  };
  static constexpr PerDevice kPerDevice[] = {
      {"cupool_member_held_bytes", "Bytes of the budget the member holds on the device.", &SharedBudget::Member::held},
      {"cupool_member_in_use_bytes", "Bytes the member's program has allocated on the device.",
       &SharedBudget::Member::in_use},
      {"cupool_member_reserved_bytes", "Bytes the member's pools have reserved from the device.",
       &SharedBudget::Member::reserved},
      {"cupool_member_waiting_bytes", "Bytes the member is waiting for room in the budget for, now.",
       &SharedBudget::Member::waiting},
  };
  for (const PerDevice& f : kPerDevice) {
    x.family(f.name, f.help, "gauge");
    for (const auto& b : scan.budgets)
      for (const auto* m : exposed_members(b))
        for (int dev = 0; dev < kMaxDevices; ++dev) {
          if (!member_uses(*m, dev)) continue;
          Labels l = member_labels(b, *m);
          l.emplace_back("device", std::to_string(dev));
          x.sample(f.name, l, (m->*f.values)[dev]);
        }
  }

  x.family("cupool_member_out_of_memory_total", "Allocations the budget refused the member for want of room.", "counter");
  for (const auto& b : scan.budgets)
    for (const auto* m : exposed_members(b)) x.sample("cupool_member_out_of_memory_total", member_labels(b, *m), m->ooms);

  x.family("cupool_share_segments_unreadable", "Files named cupool-share-* that could not be read as budgets.", "gauge");
  x.sample("cupool_share_segments_unreadable", {}, scan.skipped.size());
  return x.take();
}

}  // namespace cupool::tools
