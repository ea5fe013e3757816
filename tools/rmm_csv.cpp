// `cupool export --rmm-csv`: traces as the log RMM's logging_resource_adaptor writes (rmm_csv.h).
#include "rmm_csv.h"

#include <algorithm>
#include <cinttypes>
#include <ctime>
#include <string_view>

namespace cupool::tools {

using trace::EventKind;

RmmCsvWriter::RmmCsvWriter(std::FILE* out, const Analysis& analysis) : out_(out), analysis_(analysis) {
  std::fputs("Thread,Time,Action,Pointer,Size,Stream\n", out_);
}

void RmmCsvWriter::row(const Source& s, std::uint32_t tid, std::uint64_t t, const char* action, std::uint64_t ptr,
                       std::uint64_t size, std::uint64_t stream) {
  // RMM stamps rows with the time of day, to the microsecond (spdlog's %H:%M:%S.%f); here in UTC,
  // from the trace's wall-clock start.
  std::uint64_t unix_ns = t;
  if (s.start_unix_ns != 0 && t >= s.start_mono_ns) unix_ns = s.start_unix_ns + (t - s.start_mono_ns);
  else if (s.start_unix_ns != 0) unix_ns = s.start_unix_ns;
  const auto secs = static_cast<std::time_t>(unix_ns / 1'000'000'000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  // Pointers as printf's %p writes them ((nil) for none), streams as an ostream writes a
  // pointer in hex (0 for the default stream): what RMM's own log holds.
  char pointer[24] = "(nil)";
  if (ptr != 0) std::snprintf(pointer, sizeof pointer, "0x%" PRIx64, ptr ^ s.tag);
  char stream_text[24] = "0";
  if (stream != 0) std::snprintf(stream_text, sizeof stream_text, "0x%" PRIx64, stream);
  std::fprintf(out_, "%" PRIu32 ",%02d:%02d:%02d.%06" PRIu64 ",%s,%s,%" PRIu64 ",%s\n", tid, tm.tm_hour, tm.tm_min,
               tm.tm_sec, (unix_ns / 1000) % 1'000'000, action, pointer, size, stream_text);
  ++rows_;
}

void RmmCsvWriter::allocated(Source& s, const Event& e, std::uint64_t ptr, std::uint64_t size, std::uint64_t stream) {
  const std::uint32_t tid = e.tid;
  const std::uint64_t t = e.t_ns;
  if (auto old = s.live.find(ptr); old != s.live.end()) {
    // The free of the earlier allocation was lost (a writer drop): free it first, or the replay
    // would hold two allocations under one pointer.
    row(s, tid, t, "free", ptr, old->second.size, stream);
    s.live.erase(old);
  }
  row(s, tid, t, "allocate", ptr, size, stream);
  s.live[ptr] = Source::Live{size, e.device};
  if (auto early = s.early_frees.find(ptr); early != s.early_frees.end()) {
    const Free f = early->second;
    s.early_frees.erase(early);
    if (f.t >= t) freed(s, f.tid, f.t, ptr, f.stream);  // its free, read before it
  }
}

void RmmCsvWriter::freed(Source& s, std::uint32_t tid, std::uint64_t t, std::uint64_t ptr, std::uint64_t stream) {
  auto it = s.live.find(ptr);
  if (it == s.live.end()) {
    // Allocated before tracing began, or its allocation comes later in the file: RMM's replay
    // needs the allocation first (it frees by the pointer it allocated), so wait for it.
    s.early_frees[ptr] = Free{t, stream, tid};
    return;
  }
  row(s, tid, t, "free", ptr, it->second.size, stream);  // RMM's free names the size allocated
  s.live.erase(it);
}

void RmmCsvWriter::visit(std::size_t source, const Event& e, TraceInput&) {
  while (sources_.size() <= source) {
    const TraceMeta& m = analysis_.sources()[sources_.size()].meta;
    Source s;
    s.start_unix_ns = m.start_unix_ns;
    s.start_mono_ns = m.start_mono_ns;
    s.tag = static_cast<std::uint64_t>(sources_.size()) << 48;  // the first trace's pointers stay as they are
    sources_.push_back(std::move(s));
  }
  Source& s = sources_[source];
  const std::uint64_t stream = e.has_stream ? e.stream : 0;
  switch (e.kind) {
    case EventKind::alloc:
      if (e.rc != 0) row(s, e.tid, e.t_ns, "allocate failure", 0, e.size, stream);
      else if (e.ptr != 0) allocated(s, e, e.ptr, e.size, stream);
      break;
    case EventKind::vmm_create:  // physical memory, named by its handle
      if (e.rc != 0) row(s, e.tid, e.t_ns, "allocate failure", 0, e.size, 0);
      else if (e.ptr != 0) allocated(s, e, e.ptr, e.size, 0);
      break;
    case EventKind::free:
      if (e.rc == 0 && e.ptr != 0) freed(s, e.tid, e.t_ns, e.ptr, stream);
      break;
    case EventKind::vmm_release:
      // cupool's own release of a mapping it kept ("cupool") is no call of the program's.
      if (e.rc == 0 && e.ptr != 0 && e.api != "cupool") freed(s, e.tid, e.t_ns, e.ptr, 0);
      break;
    case EventKind::context_reset: {
      // The driver took back everything of the device; the program frees none of it. In
      // address order, so that the log does not depend on the hash table's.
      std::vector<std::pair<std::uint64_t, std::uint64_t>> gone;
      for (const auto& [ptr, live] : s.live)
        if (live.device == e.device) gone.emplace_back(ptr, live.size);
      std::sort(gone.begin(), gone.end());
      for (const auto& [ptr, size] : gone) {
        row(s, e.tid, e.t_ns, "free", ptr, size, 0);
        s.live.erase(ptr);
      }
      break;
    }
    default:
      break;
  }
}

}  // namespace cupool::tools
