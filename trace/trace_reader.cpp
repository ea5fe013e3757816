// The trace reader (trace_reader.h): the lines of a trace, one by one, and the header, device,
// drop, stack and footer lines. Event lines are decoded in trace_event_decoder.cpp, the bytes come
// from trace_input_stream.cpp, bad UTF-8 is replaced by the rule of policy/utf8.h.
#include "trace_reader.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

#include "trace_input_stream.h"

namespace cupool {
namespace {

constexpr std::size_t kInitialBuffer = 64 << 10;  // grows for longer lines
constexpr std::size_t kMaxLine = 64 << 20;  // a header with a huge command line still fits

// nlohmann accessors with messages in the reader's words.
struct JsonFields {
  const nlohmann::json& j;
  std::string_view what;  // "header", "footer", "device line"

  const nlohmann::json& need(const char* key) const {
    const auto it = j.find(key);
    if (it == j.end()) throw std::invalid_argument(fmt::format("{} has no \"{}\"", what, key));
    return *it;
  }
  std::uint64_t u64(const char* key) const {
    const auto& v = need(key);
    if (!v.is_number_unsigned()) throw std::invalid_argument(fmt::format("{} field \"{}\": expected a non-negative integer", what, key));
    return v.get<std::uint64_t>();
  }
  std::int64_t i64(const char* key) const {
    const auto& v = need(key);
    if (!v.is_number_integer()) throw std::invalid_argument(fmt::format("{} field \"{}\": expected an integer", what, key));
    return v.get<std::int64_t>();
  }
  int int_in(const char* key, std::int64_t lo, std::int64_t hi) const {
    const std::int64_t v = i64(key);
    if (v < lo || v > hi) throw std::invalid_argument(fmt::format("{} field \"{}\": {} is out of range", what, key, v));
    return static_cast<int>(v);
  }
  std::string str(const char* key) const {
    const auto& v = need(key);
    if (!v.is_string()) throw std::invalid_argument(fmt::format("{} field \"{}\": expected a string", what, key));
    return v.get<std::string>();
  }
};

DeviceInfo device_from(const nlohmann::json& j, std::string_view what) {
  if (!j.is_object()) throw std::invalid_argument(fmt::format("{}: expected an object", what));
  const JsonFields f{j, what};
  namespace dk = trace::device_key;
  return DeviceInfo{f.int_in(dk::index, 0, 1 << 20), f.str(dk::name), f.u64(dk::total_bytes)};
}

}  // namespace

TraceReader::TraceReader(std::istream& in, std::string source_name)
    : TraceReader(std::make_unique<TraceInputStream>(in, valid_utf8(source_name)), source_name) {}

TraceReader::TraceReader(std::unique_ptr<TraceInputStream> in, std::string source_name)
    : in_(std::move(in)), source_(valid_utf8(source_name)), buf_(kInitialBuffer) {
  read_header();
}

TraceReader::~TraceReader() = default;

std::unique_ptr<TraceReader> TraceReader::open(const std::string& path) {
  if (path == "-") return std::unique_ptr<TraceReader>(new TraceReader(std::make_unique<TraceInputStream>(0, false, "-"), path));
  const std::string name = valid_utf8(path);
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    if (errno == ENOENT) throw TraceError(name + ": cannot open: no such file");
    throw TraceError(fmt::format("{}: cannot open for reading: {}", name, std::strerror(errno)));
  }
  auto in = std::make_unique<TraceInputStream>(fd, true, name);
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) throw TraceError(name + ": is a directory, not a trace");
  return std::unique_ptr<TraceReader>(new TraceReader(std::move(in), path));
}

std::uint64_t TraceReader::bytes_read() const { return in_->raw_bytes(); }

const char* TraceReader::compression() const { return in_->compression(); }

void TraceReader::fail(const std::string& what) const {
  if (last_line_cut_)
    throw TraceCutShort(fmt::format("{}:{}: the last line is cut short (was the process killed while writing?): {}",
                                 source_, line_, what));
  throw TraceError(fmt::format("{}:{}: {}", source_, line_, what));
}

bool TraceReader::read_line(std::string_view& line) {
  for (;;) {
    if (begin_ < end_) {
      const char* s = buf_.data() + begin_;
      if (const void* nl = std::memchr(s, '\n', end_ - begin_)) {
        const auto len = static_cast<std::size_t>(static_cast<const char*>(nl) - s);
        line = std::string_view(s, len);
        begin_ += len + 1;
        ++line_;
        last_line_cut_ = false;
        break;
      }
    }
    if (eof_) {
      if (begin_ == end_) return false;
      line = std::string_view(buf_.data() + begin_, end_ - begin_);
      begin_ = end_;
      ++line_;
      last_line_cut_ = true;
      break;
    }
    // Keep the partial line, make room, read more.
    if (begin_ > 0) {
      std::memmove(buf_.data(), buf_.data() + begin_, end_ - begin_);
      end_ -= begin_;
      begin_ = 0;
    }
    if (end_ == buf_.size()) {
      if (buf_.size() >= kMaxLine) {
        ++line_;
        fail(fmt::format("a line longer than {} bytes; not a cupool trace", kMaxLine));
      }
      buf_.resize(buf_.size() * 2);
    }
    const std::size_t got = in_->read(buf_.data() + end_, buf_.size() - end_);
    end_ += got;
    if (got == 0) eof_ = true;
  }
  // Bad UTF-8 becomes U+FFFD here, before any parser sees the line (docs/trace-format.md).
  if (!is_ascii(line) && !is_valid_utf8(line)) {
    fixed_ = valid_utf8(line);
    line = fixed_;
  }
  return true;
}

void TraceReader::read_header() {
  std::string_view line;
  if (!read_line(line)) throw TraceError(fmt::format("{}: the file is empty; not a cupool trace", source_));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line.begin(), line.end());
  } catch (const nlohmann::json::exception&) {
    fail("the first line is not JSON; not a cupool trace");
  }
  if (!j.is_object() || !j.contains("type") || j["type"] != std::string(trace::line::header))
    fail("the first line is not a cupool trace header");
  namespace hk = trace::header_key;
  if (!j.contains(hk::format) || j[hk::format] != std::string(trace::kFormatName))
    fail(fmt::format("not a cupool trace (the header's \"{}\" is not \"{}\")", hk::format, trace::kFormatName));
  const auto version = j.find(hk::version);
  if (version == j.end() || !version->is_string()) fail("header field \"version\": expected a string \"MAJOR.MINOR\"");
  const std::string v = version->get<std::string>();
  int major = 0, minor = 0;
  const auto dot = v.find('.');
  const char* b = v.data();
  const char* e = v.data() + v.size();
  if (dot == std::string::npos || std::from_chars(b, b + dot, major).ptr != b + dot ||
      std::from_chars(b + dot + 1, e, minor).ptr != e || dot == 0 || dot + 1 == v.size())
    fail(fmt::format("header field \"version\": \"{}\" is not \"MAJOR.MINOR\"", v));
  if (major > trace::kFormatMajor)
    throw TraceError(fmt::format("{}: trace format version {} is newer than this cupool understands ({}.x); upgrade cupool",
                                 source_, v, trace::kFormatMajor));
  if (major < trace::kOldestReadMajor)
    throw TraceError(fmt::format("{}: trace format version {} is older than this cupool reads ({}.x to {}.x)", source_,
                                 v, trace::kOldestReadMajor, trace::kFormatMajor));
  try {
    const JsonFields f{j, "header"};
    header_.major = major;
    header_.minor = minor;
    header_.cupool_version = f.str(hk::cupool_version);
    header_.pid = f.i64(hk::pid);
    header_.ppid = f.i64(hk::ppid);
    header_.host = f.str(hk::host);
    const auto& cmdline = f.need(hk::cmdline);
    if (!cmdline.is_array()) throw std::invalid_argument("header field \"cmdline\": expected an array of strings");
    for (const auto& arg : cmdline) {
      if (!arg.is_string()) throw std::invalid_argument("header field \"cmdline\": expected an array of strings");
      header_.cmdline.push_back(arg.get<std::string>());
    }
    header_.start_unix_ns = f.u64(hk::start_unix_ns);
    header_.start_mono_ns = f.u64(hk::start_mono_ns);
    header_.config = f.need(hk::config);
    if (!header_.config.is_object()) throw std::invalid_argument("header field \"config\": expected an object");
    if (const auto d = j.find(hk::devices); d != j.end()) {
      if (!d->is_array()) throw std::invalid_argument("header field \"devices\": expected an array");
      for (const auto& dev : *d) add_device(device_from(dev, "header device"));
    }
  } catch (const std::invalid_argument& e) {
    fail(e.what());
  }
}

bool TraceReader::next(Event& out) {
  std::string_view line;
  while (read_line(line)) {
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;  // blank
    if (footer_) fail("a line after the footer");
    if (parse_line(line, out) == Parsed::event) {
      ++events_read_;
      return true;
    }
  }
  return false;
}

TraceReader::Parsed TraceReader::parse_line(std::string_view line, Event& out) {
  // The writer always starts event lines so; anything else takes the general road.
  static constexpr std::string_view kEventStart = R"({"type":"event",)";
  if (line.substr(0, kEventStart.size()) == kEventStart) {
    return parse_event(line, out) ? Parsed::event : Parsed::skipped;
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line.begin(), line.end());
  } catch (const nlohmann::json::exception& e) {
    const std::string what = e.what();
    // valid_utf8: nlohmann quotes the bytes it stopped at, which may end inside a character.
    fail("not valid JSON: " + valid_utf8(what.substr(what.find("] ") == std::string::npos ? 0 : what.find("] ") + 2)));
  }
  if (!j.is_object()) fail("not a JSON object");
  const auto type = j.find("type");
  if (type == j.end()) fail("a line without \"type\"");
  if (!type->is_string()) fail("\"type\": expected a string");
  const std::string& t = type->get_ref<const std::string&>();
  if (t == trace::line::event) {
    return parse_event(line, out) ? Parsed::event : Parsed::skipped;
  }
  parse_other(j, t);
  return Parsed::skipped;
}

void TraceReader::parse_other(const nlohmann::json& j, std::string_view type) {
  try {
    if (type == trace::line::device) {
      add_device(device_from(j, "device line"));
    } else if (type == trace::line::drop) {
      dropped_ += JsonFields{j, "drop line"}.u64(trace::drop_key::count);
    } else if (type == trace::line::footer) {
      const JsonFields f{j, "footer"};
      Footer footer;
      namespace fk = trace::footer_key;
      footer.events = f.u64(fk::events);
      footer.dropped = f.u64(fk::dropped);
      footer.allocs = f.u64(fk::allocs);
      footer.frees = f.u64(fk::frees);
      footer.ooms = f.u64(fk::ooms);
      footer.end_mono_ns = f.u64(fk::end_mono_ns);
      if (j.contains(fk::share_waits)) footer.share_waits = f.u64(fk::share_waits);
      if (j.contains(fk::share_wait_ns)) footer.share_wait_ns = f.u64(fk::share_wait_ns);
      const auto& devices = f.need(fk::devices);
      if (!devices.is_array()) throw std::invalid_argument("footer field \"devices\": expected an array");
      for (const auto& d : devices) {
        footer.devices.push_back(device_from(d, "footer device"));
        add_device(footer.devices.back());
      }
      footer_ = std::move(footer);
    } else if (type == trace::line::stack) {
      add_stack(j);
    } else if (type == trace::line::header) {
      throw std::invalid_argument("a second header line");
    }
    // Any other type comes from a newer minor version: skipped.
  } catch (const std::invalid_argument& e) {
    fail(e.what());
  } catch (const nlohmann::json::exception& e) {
    fail(e.what());
  }
}

std::string frame_name(const StackFrame& f) {
  if (!f.symbol.empty()) return fmt::format("{}+0x{:x}", f.symbol, f.symbol_offset);
  if (!f.module.empty()) {
    const std::size_t slash = f.module.rfind('/');
    return fmt::format("{}+0x{:x}", slash == std::string::npos ? f.module : f.module.substr(slash + 1), f.offset);
  }
  return fmt::format("0x{:x}", f.pc);
}

void TraceReader::add_stack(const nlohmann::json& j) {
  namespace sk = trace::stack_key;
  const JsonFields f{j, "stack line"};
  const std::uint64_t id = f.u64(sk::id);
  // The writer numbers at most StackTable::kMaxStacks stacks; a larger id is no trace of ours.
  if (id == 0 || id > kMaxStackId)
    throw std::invalid_argument(fmt::format("stack line field \"id\": {} is out of range (1 to {})", id, kMaxStackId));
  const auto& frames = f.need(sk::frames);
  if (!frames.is_array()) throw std::invalid_argument("stack line field \"frames\": expected an array");
  auto hex = [](const JsonFields& ff, const char* key) {
    const std::string text = ff.str(key);
    std::uint64_t v = 0;
    if (text.size() < 3 || text[0] != '0' || text[1] != 'x')
      throw std::invalid_argument(fmt::format("{} field \"{}\": expected \"0x...\"", ff.what, key));
    const char* e = text.data() + text.size();
    const auto r = std::from_chars(text.data() + 2, e, v, 16);
    if (r.ec != std::errc() || r.ptr != e)
      throw std::invalid_argument(fmt::format("{} field \"{}\": expected \"0x...\" (64 bits)", ff.what, key));
    return v;
  };
  Stack stack;
  for (const auto& fr : frames) {
    if (!fr.is_object()) throw std::invalid_argument("stack frame: expected an object");
    const JsonFields ff{fr, "stack frame"};
    StackFrame frame;
    frame.pc = hex(ff, sk::pc);
    if (fr.contains(sk::module)) frame.module = valid_utf8(ff.str(sk::module));
    if (fr.contains(sk::offset)) frame.offset = hex(ff, sk::offset);
    if (fr.contains(sk::symbol)) {
      frame.symbol = valid_utf8(ff.str(sk::symbol));
      if (fr.contains(sk::symbol_offset)) frame.symbol_offset = hex(ff, sk::symbol_offset);
    }
    stack.push_back(std::move(frame));
  }
  if (stack.empty()) throw std::invalid_argument("stack line: no frames");
  if (stacks_.size() < id) stacks_.resize(id);
  stacks_[id - 1] = std::move(stack);
}

void TraceReader::add_device(DeviceInfo d) {
  for (DeviceInfo& known : devices_)
    if (known.index == d.index) {
      known = std::move(d);
      return;
    }
  devices_.push_back(std::move(d));
}

}  // namespace cupool
