// A small writer of Python pickles (protocols 2 to 4): dicts, lists, tuples of two, str, int
// (any 64-bit value, signed or not), bool, None and float. Enough for PyTorch's memory snapshot
// (`cupool export --memory-viz`), read by Python's pickle module and by the unpickler of
// PyTorch's memory_viz page (MemoryViz.js), which knows only the opcodes written here.
//
// Containers are built the way Python's own pickler builds them: an empty container, a mark,
// the items, then one APPENDS / SETITEMS per 1000 items (the page spreads each batch as function
// arguments, so a batch must stay small).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace cupool::tools {

class PickleWriter {
 public:
  // Writes to `out` (not closed) through a buffer; `protocol` is 2, 3 or 4.
  explicit PickleWriter(std::FILE* out, int protocol = 4);
  ~PickleWriter();
  PickleWriter(const PickleWriter&) = delete;
  PickleWriter& operator=(const PickleWriter&) = delete;

  void none();
  void boolean(bool v);
  void integer(std::int64_t v);
  void unsigned_integer(std::uint64_t v);  // values above 2^63 - 1 too
  void real(double v);
  void str(std::string_view s);
  // A string written many times (dict keys, action names): stored once in the pickle's memo and
  // fetched from it afterwards.
  void str_memo(std::string_view s);

  void begin_list();
  void begin_dict();
  // After each list item, or each key and value of a dict: closes a batch every 1000 items.
  void item();
  void end();  // of the innermost list or dict
  void tuple2();  // the last two values become a tuple

  void finish();  // STOP and flush; the pickle is complete

 private:
  void op(std::uint8_t code) { buf_.push_back(static_cast<char>(code)); }
  void u32(std::uint32_t v);
  void memo_put();
  void memo_get(std::uint32_t index);
  void flush();

  std::FILE* out_;
  int protocol_;
  std::string buf_;
  struct Open {
    std::uint32_t batch = 0;  // items in the current batch
    bool dict = false;
  };
  std::vector<Open> open_;  // the containers being written, innermost last
  std::unordered_map<std::string, std::uint32_t> memo_;
  std::uint32_t next_memo_ = 0;
};

}  // namespace cupool::tools
