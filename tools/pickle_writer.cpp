// The small writer of Python pickles (pickle_writer.h) for `cupool export --memory-viz`.
#include "pickle_writer.h"

#include <bit>
#include <stdexcept>

#include "output.h"

namespace cupool::tools {

namespace {

// Opcodes (Python's Lib/pickletools.py documents each).
enum : std::uint8_t {
  kProto = 0x80,
  kStop = '.',
  kNone = 'N',
  kNewTrue = 0x88,
  kNewFalse = 0x89,
  kBinInt1 = 'K',
  kBinInt2 = 'M',
  kBinInt = 'J',
  kLong1 = 0x8a,
  kBinFloat = 'G',
  kShortBinUnicode = 0x8c,  // protocol 4
  kBinUnicode = 'X',
  kEmptyList = ']',
  kEmptyDict = '}',
  kMark = '(',
  kAppends = 'e',
  kSetItems = 'u',
  kTuple2 = 0x86,
  kMemoize = 0x94,  // protocol 4
  kBinPut = 'q',
  kLongBinPut = 'r',
  kBinGet = 'h',
  kLongBinGet = 'j',
};

constexpr std::uint32_t kBatch = 1000;  // items per APPENDS / SETITEMS, as Python writes them
constexpr std::size_t kFlushAt = 1 << 16;

}  // namespace

PickleWriter::PickleWriter(std::FILE* out, int protocol) : out_(out), protocol_(protocol) {
  if (protocol < 2 || protocol > 4) throw std::invalid_argument("pickle protocol must be 2, 3 or 4");
  op(kProto);
  op(static_cast<std::uint8_t>(protocol));
}

PickleWriter::~PickleWriter() = default;

void PickleWriter::u32(std::uint32_t v) {
  for (int i = 0; i < 4; ++i) buf_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void PickleWriter::none() { op(kNone); }

void PickleWriter::boolean(bool v) { op(v ? kNewTrue : kNewFalse); }

void PickleWriter::integer(std::int64_t v) {
  if (v >= 0 && v < 256) {
    op(kBinInt1);
    op(static_cast<std::uint8_t>(v));
  } else if (v >= 0 && v < 65536) {
    op(kBinInt2);
    op(static_cast<std::uint8_t>(v & 0xff));
    op(static_cast<std::uint8_t>(v >> 8));
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    op(kBinInt);
    u32(static_cast<std::uint32_t>(static_cast<std::int32_t>(v)));
  } else {
    // LONG1: little-endian two's complement, as few bytes as keep the sign.
    const auto u = static_cast<std::uint64_t>(v);
    int n = 8;
    while (n > 1) {
      const auto top = static_cast<std::uint8_t>(u >> (8 * (n - 1)));
      const auto next_sign = static_cast<std::uint8_t>((u >> (8 * (n - 2))) & 0x80);
      if ((top == 0x00 && next_sign == 0) || (top == 0xff && next_sign != 0)) --n;
      else break;
    }
    op(kLong1);
    op(static_cast<std::uint8_t>(n));
    for (int i = 0; i < n; ++i) op(static_cast<std::uint8_t>((u >> (8 * i)) & 0xff));
  }
  flush();
}

void PickleWriter::unsigned_integer(std::uint64_t v) {
  if (v <= static_cast<std::uint64_t>(INT64_MAX)) return integer(static_cast<std::int64_t>(v));
  // Nine bytes: the eight of the value and a zero that keeps it positive.
  op(kLong1);
  op(9);
  for (int i = 0; i < 8; ++i) op(static_cast<std::uint8_t>((v >> (8 * i)) & 0xff));
  op(0);
  flush();
}

void PickleWriter::real(double v) {
  op(kBinFloat);
  const auto bits = std::bit_cast<std::uint64_t>(v);
  for (int i = 7; i >= 0; --i) op(static_cast<std::uint8_t>((bits >> (8 * i)) & 0xff));  // big-endian
}

void PickleWriter::str(std::string_view s) {
  if (s.size() > UINT32_MAX) throw OutputError("a string too long for a pickle");
  if (protocol_ >= 4 && s.size() < 256) {
    op(kShortBinUnicode);
    op(static_cast<std::uint8_t>(s.size()));
  } else {
    op(kBinUnicode);
    u32(static_cast<std::uint32_t>(s.size()));
  }
  buf_.append(s);
  flush();
}

void PickleWriter::memo_put() {
  const std::uint32_t index = next_memo_++;
  if (protocol_ >= 4) {
    op(kMemoize);  // the next free index, implicitly
  } else if (index < 256) {
    op(kBinPut);
    op(static_cast<std::uint8_t>(index));
  } else {
    op(kLongBinPut);
    u32(index);
  }
}

void PickleWriter::memo_get(std::uint32_t index) {
  if (index < 256) {
    op(kBinGet);
    op(static_cast<std::uint8_t>(index));
  } else {
    op(kLongBinGet);
    u32(index);
  }
}

void PickleWriter::str_memo(std::string_view s) {
  auto it = memo_.find(std::string(s));
  if (it != memo_.end()) {
    memo_get(it->second);
    return;
  }
  str(s);
  memo_.emplace(std::string(s), next_memo_);
  memo_put();
}

void PickleWriter::begin_list() {
  op(kEmptyList);
  op(kMark);
  open_.push_back(Open{0, false});
}

void PickleWriter::begin_dict() {
  op(kEmptyDict);
  op(kMark);
  open_.push_back(Open{0, true});
}

void PickleWriter::item() {
  Open& o = open_.back();
  if (++o.batch < kBatch) return;
  o.batch = 0;
  op(o.dict ? kSetItems : kAppends);
  op(kMark);
}

void PickleWriter::end() {
  op(open_.back().dict ? kSetItems : kAppends);
  open_.pop_back();
  flush();
}

void PickleWriter::tuple2() { op(kTuple2); }

void PickleWriter::finish() {
  op(kStop);
  flush();
  if (!buf_.empty() && std::fwrite(buf_.data(), 1, buf_.size(), out_) != buf_.size())
    throw OutputError("cannot write the pickle");
  buf_.clear();
}

void PickleWriter::flush() {
  if (buf_.size() < kFlushAt) return;
  if (std::fwrite(buf_.data(), 1, buf_.size(), out_) != buf_.size()) throw OutputError("cannot write the pickle");
  buf_.clear();
}

}  // namespace cupool::tools
