// The trace writer's lines (trace_writer.h): an event, and the stack it names the first time,
// formatted into the writer's buffer without allocating (the writer thread, under its lock).
#include <fmt/format.h>

#include <cstring>
#include <string_view>

#include "quoted_string.h"
#include "trace_writer.h"

namespace cupool {

namespace tk = trace::key;

namespace {

// Formatting into the fixed buffer. The caller guarantees TraceWriter::kMaxLine bytes of room.
struct Out {
  static constexpr std::size_t kMaxApiChars = 128;  // api names are short identifiers; longer is cut
  char* p;
  void raw(std::string_view s) {
    std::memcpy(p, s.data(), s.size());
    p += s.size();
  }
  void key(std::string_view k) {  // ,"k":
    *p++ = ',';
    *p++ = '"';
    raw(k);
    *p++ = '"';
    *p++ = ':';
  }
  void u64(std::uint64_t v) {
    const fmt::format_int f(v);
    raw(std::string_view(f.data(), f.size()));
  }
  void i64(std::int64_t v) {
    const fmt::format_int f(v);
    raw(std::string_view(f.data(), f.size()));
  }
  void hex(std::uint64_t v) { p = fmt::format_to(p, "\"0x{:x}\"", v); }
  void name(std::string_view s) {  // a known identifier: no escaping needed
    *p++ = '"';
    raw(s);
    *p++ = '"';
  }
  // A C string from the caller, cut at kMaxApiChars: ASCII escaped as every quoted string is
  // (quoted_string.h); any other byte is taken for a Latin-1 character, \u00XX, which keeps the
  // line valid JSON (and valid UTF-8) without a look at the bytes around it.
  void text(const char* s) {
    *p++ = '"';
    for (std::size_t i = 0; s != nullptr && s[i] != '\0' && i < kMaxApiChars; ++i) {
      const auto c = static_cast<unsigned char>(s[i]);
      if (c < 0x80) p = escape_ascii(p, c);
      else p = fmt::format_to(p, "\\u{:04x}", c);
    }
    *p++ = '"';
  }
};

}  // namespace

void TraceWriter::write_stack_locked(std::uint32_t id) {
  if (id < stack_written_.size() && stack_written_[id]) return;
  const std::vector<std::uintptr_t> frames = stacks_.frames(id);
  if (frames.empty()) return;
  if (id >= stack_written_.size()) stack_written_.resize(std::max<std::size_t>(id + 1, stack_written_.size() * 2), false);
  stack_written_[id] = true;
  const std::string line = stack_line(id, frames, frames_);
  if (buf_used_ + line.size() > kBufferSize) write_buffer_locked();
  if (line.size() > kBufferSize) {
    write_all_locked(line.data(), line.size());
  } else {
    std::memcpy(buf_.get() + buf_used_, line.data(), line.size());
    buf_used_ += line.size();
  }
}

// Writes one event line. Called for a pass's events in time order.
void TraceWriter::format_event_locked(const trace::Record& r) {
  if (r.stack != 0) write_stack_locked(r.stack);
  if (buf_used_ + kMaxLine > kBufferSize) write_buffer_locked();
  const auto kind = static_cast<std::size_t>(r.kind);
  const auto path = static_cast<std::size_t>(r.path);
  const auto oom = static_cast<std::size_t>(r.oom_class);
  Out o{buf_.get() + buf_used_};
  o.raw(R"({"type":"event")");
  o.key(tk::t);
  o.u64(r.t_ns);
  o.key(tk::tid);
  o.u64(r.tid);
  o.key(tk::ev);
  o.name(trace::kEventKindNames[kind]);
  o.key(tk::api);
  o.text(r.api);
  o.key(tk::path);
  o.name(trace::kPathNames[path]);
  o.key(tk::dev);
  o.i64(r.device);
  o.key(tk::size);
  o.u64(r.size);
  o.key(tk::ptr);
  o.hex(r.ptr);
  if (r.has_stream) {
    o.key(tk::stream);
    o.hex(r.stream);
  }
  if (r.has_flags) {
    o.key(tk::flags);
    o.u64(r.flags);
  }
  if (r.has_handle) {
    o.key(tk::handle);
    o.hex(r.handle);
    o.key(tk::offset);
    o.u64(r.offset);
  }
  o.key(tk::rc);
  o.i64(r.rc);
  if (r.timed_for != 0) {
    o.key(tk::dur);
    o.u64(r.dur_ns);
  }
  if (r.timed_for > 1) {
    o.key(tk::timed_for);
    o.u64(r.timed_for);
  }
  if (r.oom_class != trace::OomClass::none) {
    o.key(tk::oom_class);
    o.name(trace::kOomClassNames[oom]);
  }
  if (r.has_pool) {
    o.key(tk::reserved);
    o.u64(r.pool.reserved);
    o.key(tk::in_use);
    o.u64(r.pool.in_use);
    o.key(tk::largest_free);
    o.u64(r.pool.largest_free);
    o.key(tk::quarantined);
    o.u64(r.pool.quarantined);
    if (r.pool.cached != 0) {
      o.key(tk::cached);
      o.u64(r.pool.cached);
    }
    o.key(tk::free_blocks);
    o.u64(r.pool.free_blocks);
  }
  if (r.recycled) {
    o.key(tk::recycled);
    o.raw("true");
  }
  if (r.granules) {
    o.key(tk::granules);
    o.raw("true");
  }
  if (r.stack != 0) {
    o.key(tk::stack);
    o.u64(r.stack);
  }
  o.raw("}\n");
  buf_used_ = static_cast<std::size_t>(o.p - buf_.get());
  ++events_;
  if (r.kind == trace::EventKind::alloc) {
    if (r.rc == 0) ++allocs_;
    else ++ooms_;
  } else if (r.kind == trace::EventKind::free && r.rc == 0) {
    ++frees_;
  }
  }

}  // namespace cupool
