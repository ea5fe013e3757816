// CUPOOL_* environment variables -> cupool::Config. Every variable is one row of kOptions: its
// name, type, default, accepted values and meaning, and the function that parses it. The docs
// (docs/options.md, README.md) are generated from the same table by options_markdown().
//
// Linked into libcupool.so: no nlohmann, no exceptions out of these functions.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "config.h"

namespace cupool {

// Parses one value into `out`. Returns nothing on success, or why the value is wrong (may be
// empty when "not one of the accepted values" says it all).
using OptionParser = std::optional<std::string> (*)(std::string_view value, Config& out);

// The options, one per row of policy/options.def, in its order: kOptions, Config's fields and the
// trace header's keys come from the same rows.
enum class Option : std::uint8_t {
#define CUPOOL_OPTION(id, ...) id,
#include "options.def"
#undef CUPOOL_OPTION
  count
};
inline constexpr std::size_t kOptionCount = static_cast<std::size_t>(Option::count);

struct OptionInfo {
  Option id;
  std::string_view name;          // "CUPOOL_POLICY"
  std::string_view type;          // "enum", "size", "size or percent", ...
  std::string_view default_text;  // what an unset (or empty) variable means
  std::string_view accepted;      // the accepted values, as shown in error messages and docs
  std::string_view meaning;       // one line
  OptionParser parse;
};

// The least CUPOOL_PREALLOCATE given as a size: the pool's chunk granularity
// (ContextPool::kChunkGranularity; a unit test checks they agree).
inline constexpr std::uint64_t kMinPreallocateBytes = 2ull << 20;
extern const std::array<OptionInfo, kOptionCount> kOptions;

// A configuration error: the process should refuse to start. `message` is one complete line,
// prefixed "cupool: ", naming the variable, the value and what is accepted. It is meant to be
// written to stderr as is (logging is not set up yet: its level is part of the configuration).
struct OptionError {
  std::string variable;
  std::string message;
};

// `lookup(name)` returns the variable's value or nullptr (std::getenv fits). An empty value counts
// as unset. Checks each variable, then the combinations (CUPOOL_GROWTH_CHUNK_MAX >= CHUNK).
std::variant<Config, OptionError> parse_options(const std::function<const char*(const char*)>& lookup);

// "<pid>:<CUPOOL_TRACE>", set by the first traced process for the processes it starts
// (trace/trace_writer.cpp): not an option, and not warned about.
inline constexpr const char* kTraceRootVariable = "CUPOOL_TRACE_ROOT_PID";
// Where `cupool run` finds libcupool.so (tools/cmd_run.cpp): the command's, which the programs it
// runs inherit; not an option of the library, and not warned about.
inline constexpr const char* kLibraryVariable = "CUPOOL_LIBRARY";

// One warning per CUPOOL_* variable in `environ` that kOptions does not know, e.g.
// `unknown variable CUPOOL_POLCY ignored (did you mean CUPOOL_POLICY?); known: CUPOOL_POLICY, ...`.
// Lines carry no "cupool: " prefix: they are meant for log_warn().
std::vector<std::string> unknown_variables(char** environ);

// One line for the startup log: "policy=growth free=sync limit=none ... log=info".
std::string describe(const Config& config);

// The names of the policies and free modes, as the trace header records them, and back.
std::string_view policy_name(PolicyKind policy);
std::string_view free_mode_name(FreeMode mode);
std::optional<PolicyKind> policy_named(std::string_view name);
std::optional<FreeMode> free_mode_named(std::string_view name);

// Can `path` (already expanded) be created or overwritten? Nothing when it can; otherwise one
// complete line, prefixed "cupool: ", naming CUPOOL_TRACE and the reason. Creates nothing.
std::optional<std::string> check_trace_path(const std::string& path);

// The options reference: a Markdown table, one row per kOptions entry, ending with a newline.
// README.md (between <!-- options:begin --> and <!-- options:end -->) and docs/options.md hold
// exactly this text; a unit test checks it.
std::string options_markdown();

// A size: "8GiB", "1.5G", "4096", "64 MiB" (units 1024-based; kSizeAccepted says which). False,
// with why, when it is not one. The one size parser: the CUPOOL_* options and the cupool command.
bool parse_size(std::string_view text, std::uint64_t& out, std::string& why);
extern const std::string_view kSizeAccepted;
// A duration: "30s", "500ms", "2m" (kDurationAccepted says which units), in ns. The one duration
// parser, likewise.
bool parse_duration(std::string_view text, std::uint64_t& ns, std::string& why);
extern const std::string_view kDurationAccepted;

// Helpers shared with the trace writer and the tests.
// "8GiB" when `bytes` is a whole number of a binary unit, else the plain number ("1000").
std::string format_size(std::uint64_t bytes);
// "50%" or "8GiB".
std::string format_size_spec(const SizeSpec& spec);
// "8GiB,1:50%" (CUPOOL_LIMIT's syntax); "" for no limit at all.
std::string format_limit_spec(const LimitSpec& limit);
}  // namespace cupool
