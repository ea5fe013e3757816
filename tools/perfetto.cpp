// `cupool export --perfetto`: traces as Chrome trace event JSON (perfetto.h).
#include "perfetto.h"

#include <algorithm>
#include <cinttypes>

#include "cli.h"
#include "quoted_string.h"

namespace cupool::tools {

using trace::EventKind;

namespace {

// A name as a JSON string (quoted_string.h: the one escaping rule; a stray byte becomes U+FFFD).
std::string json_string(const std::string& s) {
  std::string out;
  append_quoted(out, s);
  return out;
}

}  // namespace

PerfettoWriter::PerfettoWriter(std::FILE* out, const Analysis& analysis, std::uint64_t slow_ns)
    : out_(out), analysis_(analysis), slow_ns_(slow_ns) {
  std::fputs("{\"displayTimeUnit\":\"ns\",\"otherData\":{\"source\":\"cupool export --perfetto\"},\"traceEvents\":[\n", out_);
}

void PerfettoWriter::line(const std::string& text) {
  if (!first_line_) std::fputs(",\n", out_);
  first_line_ = false;
  std::fwrite(text.data(), 1, text.size(), out_);
  ++written_;
}

std::string PerfettoWriter::ts(std::uint64_t t) const {
  // Microseconds since the first event, to the nanosecond.
  const std::uint64_t rel = t > analysis_.origin() ? t - analysis_.origin() : 0;
  char buf[40];
  std::snprintf(buf, sizeof buf, "%" PRIu64 ".%03" PRIu64, rel / 1000, rel % 1000);
  return buf;
}

void PerfettoWriter::begin(std::size_t source, TraceInput& input) {
  while (pids_.size() <= source) {
    const std::size_t i = pids_.size();
    std::int64_t p = analysis_.sources()[i].meta.pid;
    // Two traces with one pid (other hosts, pid reuse): keep their tracks apart.
    while (std::find(pids_.begin(), pids_.end(), p) != pids_.end()) p += 1'000'000;
    pids_.push_back(p);
    const std::string name = analysis_.sources()[i].meta.label() + " [" + input.meta().path + "]";
    line("{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" + std::to_string(p) + ",\"tid\":0,\"args\":{\"name\":" +
         json_string(name) + "}}");
  }
}

void PerfettoWriter::visit(std::size_t source, const Event& e, TraceInput& input) {
  if (source >= pids_.size()) begin(source, input);
  const std::string p = std::to_string(pid(source));
  const std::string tid = std::to_string(e.tid);
  const std::string dev = "GPU " + std::to_string(e.device);

  // Slow calls: a slice on the calling thread. Timed allocations are stamped when they return;
  // untimed calls (served by a thread's cache outside the sample) have no duration to show.
  if ((e.kind == EventKind::alloc || e.kind == EventKind::free) && e.timed_for != 0 && e.dur_ns >= slow_ns_) {
    const std::uint64_t start = e.kind == EventKind::alloc && e.t_ns >= e.dur_ns ? e.t_ns - e.dur_ns : e.t_ns;
    char dur[40];
    std::snprintf(dur, sizeof dur, "%" PRIu64 ".%03" PRIu64, e.dur_ns / 1000, e.dur_ns % 1000);
    std::string name = e.api.empty() ? std::string(kind_name(e.kind)) : e.api;
    if (e.kind == EventKind::alloc) name += " " + human_size(e.size);
    line("{\"ph\":\"X\",\"name\":" + json_string(name) + ",\"cat\":\"slow\",\"pid\":" + p + ",\"tid\":" + tid +
         ",\"ts\":" + ts(start) + ",\"dur\":" + dur + ",\"args\":{\"device\":" + std::to_string(e.device) +
         ",\"size\":" + std::to_string(e.size) + ",\"ptr\":\"" + hex_ptr(e.ptr) + "\",\"rc\":" + std::to_string(e.rc) +
         "}}");
  }

  // Out of memory, grow and release: instants (out of memory on the whole process).
  if (e.kind == EventKind::oom || e.kind == EventKind::grow || e.kind == EventKind::release ||
      (e.kind == EventKind::alloc && e.rc == 2)) {
    std::string name;
    std::string scope = "t";
    std::string args = "\"device\":" + std::to_string(e.device) + ",\"size\":" + std::to_string(e.size);
    if (e.kind == EventKind::oom) {
      name = "out of memory (" + std::string(oom_name(e.oom_class)) + ") " + human_size(e.size);
      scope = "p";
    } else if (e.kind == EventKind::alloc) {
      name = e.api + " failed " + human_size(e.size) + " (rc " + std::to_string(e.rc) + ")";
      scope = "p";
    } else {
      name = std::string(kind_name(e.kind)) + " " + human_size(e.size);
      args += ",\"ptr\":\"" + hex_ptr(e.ptr) + "\"";
    }
    if (e.has_pool)
      args += ",\"reserved\":" + std::to_string(e.pool.reserved) + ",\"in_use\":" + std::to_string(e.pool.in_use) +
              ",\"largest_free\":" + std::to_string(e.pool.largest_free) +
              ",\"quarantined\":" + std::to_string(e.pool.quarantined) +
              ",\"free_blocks\":" + std::to_string(e.pool.free_blocks);
    line("{\"ph\":\"i\",\"s\":\"" + scope + "\",\"name\":" + json_string(name) + ",\"cat\":\"" +
         std::string(kind_name(e.kind)) + "\",\"pid\":" + p + ",\"tid\":" + tid + ",\"ts\":" + ts(e.t_ns) +
         ",\"args\":{" + args + "}}");
  }

  // Counters: the analysis has already folded this event in.
  if (e.device < 0) return;
  const auto& devices = analysis_.sources()[source].devices;
  auto it = devices.find(e.device);
  if (it == devices.end()) return;
  const Memory& m = it->second.fold.now();
  Track* track = nullptr;
  for (Track& t : tracks_)
    if (t.source == source && t.device == e.device) track = &t;
  if (!track) {
    tracks_.push_back(Track{source, e.device, {}, false});
    track = &tracks_.back();
  }
  auto counter = [&](const char* what, std::uint64_t now, std::uint64_t before) {
    if (track->any && now == before) return;
    line("{\"ph\":\"C\",\"name\":\"" + dev + " " + what + "\",\"pid\":" + p + ",\"tid\":0,\"ts\":" + ts(e.t_ns) +
         ",\"args\":{\"bytes\":" + std::to_string(now) + "}}");
  };
  counter("requested", m.requested, track->last.requested);
  counter("in use", m.in_use, track->last.in_use);
  counter("reserved", m.reserved, track->last.reserved);
  counter("largest free", m.largest_free, track->last.largest_free);
  track->last = m;
  track->any = true;
}

void PerfettoWriter::finish() { std::fputs("\n]}\n", out_); }

}  // namespace cupool::tools
