// libFuzzer target: the trace reader (trace/trace_reader.h) on any bytes, plain, gzip or zstd.
//
// Reads the input as `cupool report` does: the header, then every event to the end. A broken
// trace must end in a TraceError and nothing else (any other exception escapes and is reported
// as a crash). Besides "no crash, no sanitizer error", it checks what the reader promises: every
// string it hands out is valid UTF-8, and the fields it checks are in range.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "config_json.h"
#include "options.h"
#include "trace_reader.h"

namespace {

// Not assert(): it must hold in every build type, and say which check failed.
#define FUZZ_CHECK(cond)                                                     \
  do {                                                                       \
    if (!(cond)) {                                                           \
      std::fprintf(stderr, "fuzz_trace_reader: check failed: %s\n", #cond);  \
      std::abort();                                                          \
    }                                                                        \
  } while (0)

bool utf8(const std::string& s) { return cupool::valid_utf8(s) == s; }

void check_devices(const std::vector<cupool::DeviceInfo>& devices) {
  for (const auto& d : devices) {
    FUZZ_CHECK(d.index >= 0);
    FUZZ_CHECK(utf8(d.name));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  try {
    cupool::TraceReader reader(in, "fuzz.jsonl");
    const cupool::Header& h = reader.header();
    FUZZ_CHECK(h.major >= 1 && h.major <= cupool::trace::kFormatMajor);
    FUZZ_CHECK(utf8(h.cupool_version) && utf8(h.host));
    for (const auto& arg : h.cmdline) FUZZ_CHECK(utf8(arg));
    FUZZ_CHECK(h.config.is_object());
    // The recorded configuration decodes to a valid one, or to nothing with a reason.
    std::string why;
    if (auto c = cupool::decode_config(h.config, &why)) {
      const auto again = cupool::decode_config(nlohmann::json::parse(cupool::config_json(*c)));
      FUZZ_CHECK(again && *again == *c);  // what it decoded encodes back to itself
    } else {
      FUZZ_CHECK(!why.empty());
    }
    cupool::Event e;
    std::uint64_t events = 0;
    while (reader.next(e)) {
      ++events;
      FUZZ_CHECK(utf8(e.api));
      FUZZ_CHECK(e.device >= -1);
      FUZZ_CHECK(e.kind < cupool::trace::EventKind::count_ && e.path < cupool::trace::Path::count_ &&
                 e.oom_class < cupool::trace::OomClass::count_);
      FUZZ_CHECK(e.timed_for != 0 || e.dur_ns == 0);
    }
    FUZZ_CHECK(reader.events_read() == events);
    check_devices(reader.devices());
    if (reader.footer()) check_devices(reader.footer()->devices);
  } catch (const cupool::TraceError& error) {
    // What a broken trace must give: one message naming the source. Commands show it as is, and
    // `cupool report` puts a cut last line's message in its report, which must be valid UTF-8.
    const std::string what = error.what();
    FUZZ_CHECK(what.rfind("fuzz.jsonl:", 0) == 0);
    FUZZ_CHECK(utf8(what));
  }
  return 0;
}
