// Writes one pickle of known values with tools/pickle_writer (protocol from argv[1]) to standard
// output: check_tools.py ("formats") loads it with Python's pickle and compares every value.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "pickle_writer.h"

int main(int argc, char** argv) {
  const int protocol = argc > 1 ? std::atoi(argv[1]) : 4;
  cupool::tools::PickleWriter p(stdout, protocol);
  p.begin_dict();
  p.str_memo("ints");
  p.begin_list();
  const std::int64_t ints[] = {0, 1, 255, 256, 65535, 65536, -1, -128, -129, INT32_MAX, INT32_MIN,
                               std::int64_t{INT32_MAX} + 1, std::int64_t{INT32_MIN} - 1, INT64_MAX, INT64_MIN,
                               std::int64_t{1} << 40, -(std::int64_t{1} << 40)};
  for (std::int64_t v : ints) {
    p.integer(v);
    p.item();
  }
  p.end();
  p.item();
  p.str_memo("unsigned");
  p.begin_list();
  for (std::uint64_t v : {std::uint64_t{0}, std::uint64_t{INT64_MAX}, std::uint64_t{INT64_MAX} + 1, UINT64_MAX,
                          std::uint64_t{0x7f0000000000}}) {
    p.unsigned_integer(v);
    p.item();
  }
  p.end();
  p.item();
  p.str_memo("floats");
  p.begin_list();
  for (double v : {0.0, -1.5, 3.141592653589793, 1e300}) {
    p.real(v);
    p.item();
  }
  p.end();
  p.item();
  p.str_memo("other");
  p.begin_list();
  p.boolean(true); p.item();
  p.boolean(false); p.item();
  p.none(); p.item();
  p.integer(1); p.integer(2); p.tuple2(); p.item();
  p.str(""); p.item();
  p.str("h\xc3\xa9llo \xe2\x82\xac"); p.item();  // UTF-8 text
  p.str(std::string(300, 'x')); p.item();        // longer than a short string
  p.end();
  p.item();
  // 2500 items (three batches) of dicts whose keys come from the memo, more than 256 of them.
  p.str_memo("many");
  p.begin_list();
  for (int i = 0; i < 2500; ++i) {
    p.begin_dict();
    p.str_memo("key" + std::to_string(i % 300)); p.integer(i); p.item();
    p.str_memo("same"); p.str_memo("value"); p.item();
    p.end();
    p.item();
  }
  p.end();
  p.item();
  p.end();
  p.finish();
  return std::fflush(stdout) == 0 ? 0 : 1;
}
