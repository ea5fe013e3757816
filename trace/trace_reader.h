// Reading a trace back (docs/trace-format.md), streaming, for the cupool command and the tests.
// Event lines go through a hand-written parser (flat objects, known keys in any order, unknown
// keys skipped) with no heap allocation per event; nlohmann is used only for the few header,
// device and footer lines.
//
// A trace compressed with gzip (or zstd, when built with libzstd) is decompressed as it is read,
// recognised by its first bytes, whatever its name. Bytes that are not valid UTF-8 become U+FFFD
// as each line is read, so every string the reader hands out is valid UTF-8.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <istream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "config.h"
#include "config_decode.h"  // decode_config, for the header's configuration
#include "trace_schema.h"
#include "utf8.h"           // valid_utf8: the one policy for bad bytes, which the reader applies

namespace cupool {

// "<source>:<line>: <what is wrong>", or "<source>: ..." for what concerns the whole file.
class TraceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// The last line ends without its newline, inside a JSON value: what a process killed while its
// trace was written leaves. Readers may end the trace there, with a warning.
class TraceCutShort : public TraceError {
 public:
  using TraceError::TraceError;
};

struct Header {
  int major = 0, minor = 0;
  std::string cupool_version;
  std::int64_t pid = 0, ppid = 0;
  std::string host;
  std::vector<std::string> cmdline;
  std::uint64_t start_unix_ns = 0, start_mono_ns = 0;
  nlohmann::json config;
};

// One event line as read: the values the writer wrote (trace::EventValues, the one definition),
// and the API name as text.
struct Event : trace::EventValues {
  std::string api;
};

struct DeviceInfo {
  int index = 0;
  std::string name;
  std::uint64_t total_bytes = 0;
};

// A native call stack (CUPOOL_TRACE_STACKS, format 3.3), innermost frame first.
struct StackFrame {
  std::uint64_t pc = 0;             // the return address
  std::string module;               // the file it lies in ("" when none: code made at run time)
  std::uint64_t offset = 0;         // pc - 1 from the module's load address
  std::string symbol;               // demangled; "" when the module exports none there
  std::uint64_t symbol_offset = 0;  // pc - 1 from the symbol's start
};
using Stack = std::vector<StackFrame>;
// "symbol+0x40" where the module exports a symbol there, else "libfoo.so+0x1234" (the module's
// file name; "?" when none), else "0x7f...": how the report and the exports name a frame.
std::string frame_name(const StackFrame& f);

struct Footer {
  std::uint64_t events = 0;   // event lines the writer wrote
  std::uint64_t dropped = 0;  // events it could not write (full per-thread buffers)
  std::uint64_t allocs = 0;   // alloc events with rc == 0
  std::uint64_t frees = 0;    // free events with rc == 0
  std::uint64_t ooms = 0;     // alloc events with rc != 0
  std::uint64_t end_mono_ns = 0;
  std::vector<DeviceInfo> devices;
  // A member of a shared budget: its waits for room and their total time (format 3.1).
  std::optional<std::uint64_t> share_waits, share_wait_ns;
};

class TraceInputStream;  // trace_input_stream.h: the file or stream, decompressed

class TraceReader {
 public:
  // Reads and checks the header line; throws TraceError (also for a newer major version).
  TraceReader(std::istream& in, std::string source_name);
  // Opens the file `path` ("-": standard input) and reads its header. Throws TraceError naming
  // the path and what is wrong (missing, a directory, unreadable, not a trace).
  static std::unique_ptr<TraceReader> open(const std::string& path);
  ~TraceReader();
  TraceReader(const TraceReader&) = delete;
  TraceReader& operator=(const TraceReader&) = delete;

  const Header& header() const { return header_; }

  // The next event, in file order (each thread's events in order; threads interleaved). Device,
  // drop and footer lines met on the way are taken in. False at the end of the file. Throws
  // TraceError for a line that is not valid.
  bool next(Event& out);

  // Empty until the footer has been read, and for good when the process was killed before it.
  const std::optional<Footer>& footer() const { return footer_; }
  // Devices from "device" lines read so far (and the footer's).
  const std::vector<DeviceInfo>& devices() const { return devices_; }
  // A stack line read so far, by id (an event's `stack`); nullptr when unknown.
  const Stack* stack(std::uint32_t id) const { return id != 0 && id <= stacks_.size() && !stacks_[id - 1].empty() ? &stacks_[id - 1] : nullptr; }
  // The sum of the "drop" lines read so far.
  std::uint64_t dropped() const { return dropped_; }
  std::uint64_t events_read() const { return events_read_; }
  // The line last read (1 is the header).
  std::uint64_t line_number() const { return line_; }
  const std::string& source() const { return source_; }
  // Bytes taken from the file so far (compressed bytes when it is compressed), for progress.
  std::uint64_t bytes_read() const;
  // "gzip", "zstd", or "" for a plain trace.
  const char* compression() const;

 private:
  enum class Parsed { event, skipped };
  static constexpr std::uint64_t kMaxStackId = 1u << 16;  // trace/stack_table.h: StackTable::kMaxStacks
  TraceReader(std::unique_ptr<TraceInputStream> in, std::string source_name);
  bool read_line(std::string_view& line);
  Parsed parse_line(std::string_view line, Event& out);
  bool parse_event(std::string_view line, Event& out);  // trace_event_decoder.cpp; false: a kind from a newer minor version
  void parse_other(const nlohmann::json& j, std::string_view type);
  void read_header();
  void add_device(DeviceInfo d);
  void add_stack(const nlohmann::json& j);
  [[noreturn, gnu::cold]] void fail(const std::string& what) const;

  std::unique_ptr<TraceInputStream> in_;
  std::string source_;
  Header header_;
  std::optional<Footer> footer_;
  std::vector<DeviceInfo> devices_;
  std::vector<Stack> stacks_;  // id - 1
  std::uint64_t dropped_ = 0;
  std::uint64_t events_read_ = 0;
  std::uint64_t line_ = 0;
  bool last_line_cut_ = false;  // the line being parsed had no newline at the end of the file

  std::vector<char> buf_;
  std::size_t begin_ = 0, end_ = 0;
  bool eof_ = false;
  std::string scratch_;  // decoded names, reused
  std::string fixed_;    // the current line with its bad UTF-8 replaced (rare)
};

}  // namespace cupool
