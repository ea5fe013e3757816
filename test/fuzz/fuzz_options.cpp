// libFuzzer target: parse_options() (policy/options.cpp) on an environment made of the input.
//
// The input is the environment as text: a line starting "CUPOOL_" begins a variable
// ("CUPOOL_LIMIT=0:8GiB,1:50%"), any other line continues the previous value after a newline (a
// value may hold one), and one newline at the very end is dropped. A value ends at its first NUL
// byte, as a real one does. Besides "no crash, no sanitizer error", it checks what the callers
// rely on: an error is one line of valid UTF-8 naming a known variable; a configuration makes a
// JSON object for the trace header (the trace reader insists on one there).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "config_json.h"
#include "options.h"
#include "trace_file_name.h"

namespace {

// Not assert(): it must hold in every build type, and say which check failed.
#define FUZZ_CHECK(cond)                                                   \
  do {                                                                     \
    if (!(cond)) {                                                         \
      std::fprintf(stderr, "fuzz_options: check failed: %s\n", #cond);     \
      std::abort();                                                        \
    }                                                                      \
  } while (0)

// The entries "NAME=VALUE" of the environment the input stands for (above).
std::vector<std::string> environment(std::string_view text) {
  if (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  std::vector<std::string> entries;
  while (true) {
    const std::size_t nl = text.find('\n');
    const std::string_view line = text.substr(0, nl);
    if (line.substr(0, 7) == "CUPOOL_" || entries.empty()) {
      entries.emplace_back(line);
    } else {
      entries.back() += '\n';
      entries.back() += line;
    }
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
  return entries;
}

bool valid_utf8(const std::string& s) {
  try {
    (void)nlohmann::json(s).dump();  // throws on bytes that are not UTF-8
    return true;
  } catch (const nlohmann::json::type_error&) {
    return false;
  }
}

bool is_known(std::string_view name) {
  return std::any_of(cupool::kOptions.begin(), cupool::kOptions.end(),
                     [&](const cupool::OptionInfo& o) { return o.name == name; });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> entries = environment(std::string_view(reinterpret_cast<const char*>(data), size));

  // getenv(): the first entry whose name (the text before its first '=') matches.
  auto lookup = [&](const char* name) -> const char* {
    const std::string_view n(name);
    for (const std::string& e : entries)
      if (e.size() > n.size() && e[n.size()] == '=' && e.compare(0, n.size(), n) == 0) return e.c_str() + n.size() + 1;
    return nullptr;
  };

  const auto result = cupool::parse_options(lookup);
  if (const auto* error = std::get_if<cupool::OptionError>(&result)) {
    FUZZ_CHECK(is_known(error->variable));
    FUZZ_CHECK(error->message.rfind("cupool: " + error->variable + "=", 0) == 0);
    FUZZ_CHECK(error->message.find('\n') == std::string::npos);
    FUZZ_CHECK(valid_utf8(error->message));  // it is written to a terminal or a log as is
  } else {
    const auto& config = std::get<cupool::Config>(result);
    FUZZ_CHECK(config.growth_chunk > 0 && config.growth_chunk_max >= config.growth_chunk);
    FUZZ_CHECK(config.trace_buffer_events >= 16 && config.trace_flush_ns >= 1'000'000);
    const auto json = nlohmann::json::parse(cupool::config_json(config), nullptr, /*allow_exceptions=*/false);
    FUZZ_CHECK(json.is_object());
    FUZZ_CHECK(!cupool::describe(config).empty());
    (void)cupool::expand_trace_path(config.trace_path, 4242);
  }

  // The same entries as `environ`, for the check of misspelled names.
  std::vector<char*> environ_view;
  for (std::string& e : entries) environ_view.push_back(e.data());
  environ_view.push_back(nullptr);
  for (const std::string& line : cupool::unknown_variables(environ_view.data()))
    FUZZ_CHECK(line.rfind("unknown variable CUPOOL_", 0) == 0);
  return 0;
}
