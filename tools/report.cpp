// `cupool report` output (report.h): text, JSON and the HTML page, from one Analysis.
#include "report.h"

#include <algorithm>
#include <cstdio>

#include "cli.h"

namespace cupool::tools {

std::string Table::render(const std::string& indent) const {
  std::vector<std::size_t> width;
  for (const auto& r : rows_)
    for (std::size_t i = 0; i < r.size(); ++i) {
      if (width.size() <= i) width.push_back(0);
      width[i] = std::max(width[i], r[i].size());
    }
  std::string out;
  for (const auto& r : rows_) {
    std::string line = indent;
    for (std::size_t i = 0; i < r.size(); ++i) {
      const std::size_t pad = width[i] - r[i].size();
      const char a = i < align_.size() ? align_[i] : (i == 0 ? 'l' : 'r');
      if (i > 0) line += "  ";
      if (a == 'l') line += r[i] + std::string(pad, ' ');
      else line += std::string(pad, ' ') + r[i];
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

std::string at_time(std::uint64_t t, std::uint64_t origin) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f s", static_cast<double>(t > origin ? t - origin : 0) / 1e9);
  return buf;
}

std::string device_title(const DeviceInfo& info, int device) {
  std::string out = device < 0 ? std::string("device ?") : "device " + std::to_string(device);
  if (!info.name.empty() || info.total_bytes) {
    out += " (";
    if (!info.name.empty()) out += info.name;
    if (info.total_bytes) out += (info.name.empty() ? "" : ", ") + human_size(info.total_bytes);
    out += ")";
  }
  return out;
}

std::string oom_text(const OomInfo& o, std::uint64_t origin) {
  std::string out = "at " + at_time(o.t, origin) + (o.line ? ", line " + std::to_string(o.line) : "") + ", device " +
                    std::to_string(o.device) + ": " + (o.api.empty() ? std::string("alloc") : o.api) + " " +
                    human_size(o.size) + " refused: " + std::string(oom_name(o.oom_class));
  if (o.rc) out += " (rc " + std::to_string(o.rc) + ")";
  return out;
}

std::string pool_state_text(const trace::PoolState& p) {
  return "reserved " + human_size(p.reserved) + ", in use " + human_size(p.in_use) + ", largest free " +
         human_size(p.largest_free) + ", quarantined " + human_size(p.quarantined) + ", " +
         std::to_string(p.free_blocks) + " free blocks";
}

nlohmann::json pool_state_json(const trace::PoolState& p) {
  return {{"reserved", p.reserved},
          {"in_use", p.in_use},
          {"largest_free", p.largest_free},
          {"quarantined", p.quarantined},
          {"free_blocks", p.free_blocks}};
}

namespace {

std::string ratio(double r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", r);
  return buf;
}

std::string count(std::uint64_t n) { return std::to_string(n); }

std::string trace_title(const SourceStats& s) { return s.meta.path + ": " + s.meta.label(); }

void device_lines(std::string& out, const DeviceStats& d, std::uint64_t origin) {
  out += "  " + device_title(d.info, d.device);
  if (d.cap && d.cap != d.info.total_bytes) out += ", cap " + human_size(d.cap);
  out += "\n";
  Table t("lrl");
  t.row({"peak requested", human_size(d.peak_requested), ""});
  t.row({"peak in use", human_size(d.peak_in_use), "at " + at_time(d.peak_in_use_t, origin)});
  t.row({"peak reserved", human_size(d.peak_reserved), "at " + at_time(d.peak_reserved_t, origin)});
  t.row({"reserved / in use", ratio(d.reserved_ratio()), "at the peaks"});
  t.row({"fragmentation", percent(d.peak_in_use_memory.fragmentation()), "at peak in use"});
  t.row({"", percent(d.frag_mean()), "mean over time"});
  t.row({"", percent(d.frag_max), "max"});
  t.row({"allocations", count(d.allocs), d.failed_allocs ? count(d.failed_allocs) + " failed" : ""});
  t.row({"frees", count(d.frees), d.fold.unmatched_frees() ? count(d.fold.unmatched_frees()) + " of unknown pointers" : ""});
  t.row({"chunks taken", count(d.grows), human_size(d.grow_bytes)});
  t.row({"chunks returned", count(d.releases), human_size(d.release_bytes)});
  t.row({"out of memory", count(d.ooms), ""});
  out += t.render("    ");
}

// A native stack (CUPOOL_TRACE_STACKS), innermost first: the program's call into CUDA on top.
constexpr std::size_t kStackLinesShown = 16;
void stack_lines(std::string& out, const Stack& stack, const char* indent) {
  for (std::size_t i = 0; i < stack.size() && i < kStackLinesShown; ++i) {
    const StackFrame& f = stack[i];
    out += indent + frame_name(f);
    if (!f.symbol.empty() && !f.module.empty()) out += "  (" + f.module.substr(f.module.rfind('/') + 1) + ")";
    out += "\n";
  }
  if (stack.size() > kStackLinesShown)
    out += indent + std::string("... ") + count(stack.size() - kStackLinesShown) + " more frames (--json has them all)\n";
}
nlohmann::json stack_json(const Stack& stack) {
  nlohmann::json frames = nlohmann::json::array();
  for (const StackFrame& f : stack)
    frames.push_back({{"name", frame_name(f)}, {"module", f.module}, {"offset", hex_ptr(f.offset)}, {"pc", hex_ptr(f.pc)}});
  return frames;
}

void oom_line(std::string& out, const OomInfo& o, std::uint64_t origin) {
  out += "    " + oom_text(o, origin) + "\n";
  if (o.has_pool) out += "      pool: " + pool_state_text(o.pool) + "\n";
  if (!o.stack.empty()) {
    out += "      stack:\n";
    stack_lines(out, o.stack, "        ");
  }
}

void source_section(std::string& out, const SourceStats& s, std::uint64_t origin) {
  out += "== " + trace_title(s) + "\n";
  std::string line = "  ";
  if (!s.meta.policy.empty()) line += "policy " + s.meta.policy + ", free " + s.meta.free_mode + "; ";
  line += count(s.events) + " events over " + human_duration(s.last_t - s.first_t);
  out += line + "\n";
  if (s.dropped) out += "  WRITER DROPS: " + count(s.dropped) + " events were dropped by the trace writer\n";
  if (!s.has_footer) out += "  no footer: the process did not exit normally (killed?); the trace ends early\n";
  if (!s.truncated.empty()) out += "  " + s.truncated + ": ignored\n";
  out += "\n";
  for (const auto& [dev, d] : s.devices) {
    device_lines(out, d, origin);
    out += "\n";
  }

  Table lat;
  lat.row({"latency", "calls", "p50", "p99", "max"});
  for (const ApiStats& a : s.apis) {
    if (a.latency.count() == 0 && a.untimed == 0) continue;
    if (a.latency.count() == 0) {  // every call a thread's cache served, none in the timed sample
      lat.row({a.api, count(a.count), "-", "-", "-"});
      continue;
    }
    lat.row({a.api, count(a.count), human_duration(a.latency.quantile(0.50)),
             human_duration(a.latency.quantile(0.99)), human_duration(a.latency.max())});
  }
  if (lat.rows() > 1) out += lat.render("  ") + "\n";

  Table calls;
  std::vector<std::string> head = {"calls by API and path"};
  for (int p = 1; p < static_cast<int>(trace::Path::count_); ++p) head.emplace_back(path_name(static_cast<trace::Path>(p)));
  head.emplace_back("failed");
  head.emplace_back("bytes");
  calls.row(head);
  for (const ApiStats& a : s.apis) {
    std::vector<std::string> r = {a.api};
    for (int p = 1; p < static_cast<int>(trace::Path::count_); ++p) r.push_back(count(a.per_path[static_cast<std::size_t>(p)]));
    r.push_back(count(a.failures));
    r.push_back(a.kind == trace::EventKind::alloc ? human_size(a.bytes) : "");
    calls.row(r);
  }
  if (calls.rows() > 1) out += calls.render("  ") + "\n";

  if (!s.largest.empty()) {
    out += "  largest allocations\n";
    Table t("rllll");
    for (const AllocInfo& l : s.largest)
      t.row({human_size(l.size), l.api, "device " + std::to_string(l.device), "at " + at_time(l.t, origin), hex_ptr(l.ptr)});
    out += t.render("    ") + "\n";
    // Their stacks, where CUPOOL_TRACE_STACKS sampled them.
    const std::uint32_t every = s.meta.config ? s.meta.config->trace_stacks : 0;
    if (every != 0) {
      out += every == 1 ? "  stacks of the largest allocations (every allocation's recorded)\n"
                        : "  stacks of the largest allocations (one allocation in " + count(every) + " recorded)\n";
      for (std::size_t i = 0; i < s.largest.size(); ++i) {
        const AllocInfo& l = s.largest[i];
        out += "    " + human_size(l.size) + " at " + at_time(l.t, origin);
        std::size_t same = 0;  // a stack shown above is named, not repeated (allocations of one loop)
        while (same < i && !(s.largest[same].stack.size() == l.stack.size() &&
                             std::equal(l.stack.begin(), l.stack.end(), s.largest[same].stack.begin(),
                                        [](const StackFrame& a, const StackFrame& b) { return a.pc == b.pc; })))
          ++same;
        if (l.stack.empty()) out += ": not sampled\n";
        else if (same < i) out += ": the stack of allocation " + count(same + 1) + " above\n";
        else {
          out += ":\n";
          stack_lines(out, l.stack, "      ");
        }
      }
      out += "\n";
    }
  }

  out += "  out of memory: " + count(s.oom_count) + "\n";
  for (const OomInfo& o : s.ooms) oom_line(out, o, origin);
  if (s.oom_count > s.ooms.size()) out += "    ... and " + count(s.oom_count - s.ooms.size()) + " more\n";
  out += "\n";
}

}  // namespace

std::string report_text(const Analysis& a) {
  std::string out;
  const auto& sources = a.sources();
  out += "cupool report: " + count(sources.size()) + (sources.size() == 1 ? " trace, " : " traces, ") +
         count(a.events()) + " events over " + human_duration(a.end() - a.origin()) +
         "; times are since the first event\n\n";
  for (const auto& s : sources) source_section(out, s, a.origin());

  if (sources.size() > 1) {
    // Side by side: one column per trace, then every device summed at each moment.
    for (const auto& [dev, total] : a.totals()) {
      out += "== " + device_title(total.info, dev) + ": side by side\n";
      Table t;
      std::vector<std::string> head = {""};
      for (std::size_t i = 0; i < sources.size(); ++i) head.push_back("#" + std::to_string(i + 1) + " pid " + std::to_string(sources[i].meta.pid));
      head.emplace_back("all (summed)");
      t.row(head);
      auto add = [&](const std::string& name, auto per, const std::string& all) {
        std::vector<std::string> r = {name};
        for (const auto& s : sources) {
          auto it = s.devices.find(dev);
          r.push_back(it == s.devices.end() ? "-" : per(it->second));
        }
        r.push_back(all);
        t.row(r);
      };
      add("peak requested", [](const DeviceStats& d) { return human_size(d.peak_requested); }, human_size(total.peak_requested));
      add("peak in use", [](const DeviceStats& d) { return human_size(d.peak_in_use); }, human_size(total.peak_in_use));
      add("peak reserved", [](const DeviceStats& d) { return human_size(d.peak_reserved); }, human_size(total.peak_reserved));
      add("reserved / in use", [](const DeviceStats& d) { return ratio(d.reserved_ratio()); },
          ratio(total.peak_in_use ? static_cast<double>(total.peak_reserved) / static_cast<double>(total.peak_in_use) : 0.0));
      add("fragmentation at peak", [](const DeviceStats& d) { return percent(d.peak_in_use_memory.fragmentation()); }, "");
      add("out of memory", [](const DeviceStats& d) { return count(d.ooms); }, "");
      out += t.render("  ") + "\n";
    }
    out += "  traces: ";
    for (std::size_t i = 0; i < sources.size(); ++i) out += (i ? ", #" : "#") + std::to_string(i + 1) + " " + sources[i].meta.path;
    out += "\n";
  }
  return out;
}

namespace {

nlohmann::json device_json(const DeviceStats& d, std::uint64_t origin) {
  auto rel = [origin](std::uint64_t t) { return t > origin ? t - origin : 0; };
  return {{"device", d.device},
          {"name", d.info.name},
          {"total_bytes", d.info.total_bytes},
          {"cap", d.cap},
          {"peak_requested", d.peak_requested},
          {"peak_in_use", d.peak_in_use},
          {"peak_in_use_t", rel(d.peak_in_use_t)},
          {"peak_reserved", d.peak_reserved},
          {"peak_reserved_t", rel(d.peak_reserved_t)},
          {"reserved_ratio", d.reserved_ratio()},
          {"fragmentation", {{"at_peak_in_use", d.peak_in_use_memory.fragmentation()}, {"mean", d.frag_mean()}, {"max", d.frag_max}}},
          {"allocs", d.allocs},
          {"failed_allocs", d.failed_allocs},
          {"frees", d.frees},
          {"unmatched_frees", d.fold.unmatched_frees()},
          {"chunks_taken", d.grows},
          {"chunk_bytes_taken", d.grow_bytes},
          {"chunks_returned", d.releases},
          {"chunk_bytes_returned", d.release_bytes},
          {"ooms", d.ooms}};
}

}  // namespace

nlohmann::json oom_json(const OomInfo& o, std::uint64_t origin) {
  nlohmann::json j = {{"t", o.t > origin ? o.t - origin : 0}, {"line", o.line}, {"device", o.device},
                      {"api", o.api}, {"size", o.size}, {"class", std::string(oom_name(o.oom_class))},
                      {"rc", o.rc}, {"tid", o.tid}};
  j["pool"] = o.has_pool ? pool_state_json(o.pool) : nlohmann::json(nullptr);
  if (!o.stack.empty()) j["stack"] = stack_json(o.stack);
  return j;
}

nlohmann::json report_json(const Analysis& a) {
  const std::uint64_t origin = a.origin();
  nlohmann::json traces = nlohmann::json::array();
  for (const auto& s : a.sources()) {
    nlohmann::json devices = nlohmann::json::array();
    for (const auto& [dev, d] : s.devices) devices.push_back(device_json(d, origin));
    nlohmann::json apis = nlohmann::json::array();
    for (const ApiStats& api : s.apis) {
      nlohmann::json paths = nlohmann::json::object();
      for (int p = 0; p < static_cast<int>(trace::Path::count_); ++p)
        if (api.per_path[static_cast<std::size_t>(p)]) paths[std::string(path_name(static_cast<trace::Path>(p)))] = api.per_path[static_cast<std::size_t>(p)];
      nlohmann::json j = {{"api", api.api}, {"event", std::string(kind_name(api.kind))}, {"count", api.count},
                          {"failures", api.failures}, {"paths", paths}};
      if (api.kind == trace::EventKind::alloc) j["bytes"] = api.bytes;
      if (api.latency.count())
        j["latency_ns"] = {{"p50", api.latency.quantile(0.5)}, {"p99", api.latency.quantile(0.99)}, {"max", api.latency.max()}};
      apis.push_back(j);
    }
    nlohmann::json largest = nlohmann::json::array();
    for (const AllocInfo& l : s.largest) {
      largest.push_back({{"size", l.size}, {"api", l.api}, {"device", l.device}, {"t", l.t > origin ? l.t - origin : 0}, {"ptr", hex_ptr(l.ptr)}});
      if (!l.stack.empty()) largest.back()["stack"] = stack_json(l.stack);
    }
    nlohmann::json ooms = nlohmann::json::array();
    for (const OomInfo& o : s.ooms) ooms.push_back(oom_json(o, origin));
    traces.push_back({{"path", s.meta.path}, {"pid", s.meta.pid}, {"cmdline", s.meta.cmdline}, {"policy", s.meta.policy},
                      {"free", s.meta.free_mode}, {"events", s.events}, {"duration_ns", s.last_t - s.first_t},
                      {"dropped", s.dropped}, {"complete", s.has_footer}, {"truncated", s.truncated.empty() ? nlohmann::json(nullptr) : nlohmann::json(s.truncated)},
                      {"devices", devices}, {"apis", apis},
                      {"largest", largest}, {"oom_count", s.oom_count}, {"ooms", ooms}});
  }
  nlohmann::json totals = nlohmann::json::array();
  for (const auto& [dev, t] : a.totals())
    totals.push_back({{"device", dev}, {"name", t.info.name}, {"total_bytes", t.info.total_bytes}, {"processes", t.processes},
                      {"peak_requested", t.peak_requested}, {"peak_in_use", t.peak_in_use},
                      {"peak_in_use_t", t.peak_in_use_t > origin ? t.peak_in_use_t - origin : 0},
                      {"peak_reserved", t.peak_reserved},
                      {"peak_reserved_t", t.peak_reserved_t > origin ? t.peak_reserved_t - origin : 0}});
  return {{"format", "cupool-report"}, {"version", 1}, {"events", a.events()}, {"duration_ns", a.end() - a.origin()},
          {"traces", traces}, {"devices", totals}};
}

}  // namespace cupool::tools
