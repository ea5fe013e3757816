#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "context_pool.h"
#include "log.h"
#include "config_json.h"
#include "options.h"
#include "quoted_string.h"
#include "trace_file_name.h"

using namespace cupool;

namespace {

using Env = std::map<std::string, std::string>;

std::variant<Config, OptionError> parse(const Env& env) {
  return parse_options([&](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

Config ok(const Env& env) {
  auto r = parse(env);
  if (auto* e = std::get_if<OptionError>(&r)) FAIL(e->message);
  return std::get<Config>(r);
}

std::string error(const Env& env) {
  auto r = parse(env);
  REQUIRE(std::holds_alternative<OptionError>(r));
  return std::get<OptionError>(r).message;
}

std::uint64_t size_of(const std::string& text) { return ok({{"CUPOOL_GROWTH_CHUNK", text}}).growth_chunk; }

}  // namespace

TEST_CASE("defaults", "[options]") {
  const Config c = ok({});
  CHECK(c.policy == PolicyKind::growth);
  CHECK(c.free_mode == FreeMode::deferred);
  CHECK(!c.limit.all);
  CHECK(c.limit.per_device.empty());
  CHECK(c.preallocate.percent == 75.0);
  CHECK(!c.preallocate_grow);
  CHECK(c.growth_chunk == 32ull << 20);
  CHECK(c.growth_chunk_max == 512ull << 20);
  CHECK(!c.release_idle_ns);
  CHECK(c.trace_path.empty());
  CHECK(c.trace_flush_ns == 100'000'000);
  CHECK(c.trace_buffer_events == 16384);
  CHECK(c.log_level == "info");
  // An empty value is the same as unset.
  CHECK(ok({{"CUPOOL_POLICY", ""}}).policy == PolicyKind::growth);
}

// The defaults are written twice: in Config's fields (config.h) and in the table's default_text,
// which the docs show. Giving each option its documented default must change nothing; an option
// whose default is no value ("unset ...", "none") must leave its field empty.
TEST_CASE("every option's documented default is what Config holds when it is unset", "[options]") {
  const Config defaults{};
  for (const OptionInfo& o : kOptions) {
    INFO(o.name << " default " << o.default_text);
    const std::string text(o.default_text);
    if (text.rfind("unset", 0) == 0 || text == "none") {
      switch (o.id) {
        case Option::limit: CHECK(defaults.limit == LimitSpec{}); break;
        case Option::share_limit: CHECK(defaults.share_limit == LimitSpec{}); break;
        case Option::share: CHECK(defaults.share.empty()); break;
        case Option::trace: CHECK(defaults.trace_path.empty()); break;
        default: FAIL("an option documented as having no default value: say here which field stays empty");
      }
      continue;
    }
    Config c = defaults;
    REQUIRE_FALSE(o.parse(text, c).has_value());
    CHECK(c == defaults);
  }
}

TEST_CASE("the table names every variable once, with everything filled in", "[options]") {
  std::set<std::string_view> names;
  for (const auto& o : kOptions) {
    CHECK(names.insert(o.name).second);
    CHECK(o.name.substr(0, 7) == "CUPOOL_");
    CHECK(!o.type.empty());
    CHECK(!o.default_text.empty());
    CHECK(!o.accepted.empty());
    CHECK(!o.meaning.empty());
    CHECK(o.parse != nullptr);
  }
  CHECK(names.size() == cupool::kOptionCount);
}

TEST_CASE("CUPOOL_POLICY", "[options]") {
  CHECK(ok({{"CUPOOL_POLICY", "growth"}}).policy == PolicyKind::growth);
  CHECK(ok({{"CUPOOL_POLICY", "preallocate"}}).policy == PolicyKind::preallocate);
  CHECK(ok({{"CUPOOL_POLICY", "passthrough"}}).policy == PolicyKind::passthrough);
  CHECK(ok({{"CUPOOL_POLICY", "Passthrough"}}).policy == PolicyKind::passthrough);
  CHECK(ok({{"CUPOOL_POLICY", "vmm"}}).policy == PolicyKind::vmm);
  CHECK(error({{"CUPOOL_POLICY", "grwoth"}}) ==
        "cupool: CUPOOL_POLICY=\"grwoth\" is not valid; accepted: growth, preallocate, passthrough, vmm");
  CHECK(std::get<OptionError>(parse({{"CUPOOL_POLICY", "x"}})).variable == "CUPOOL_POLICY");
}

TEST_CASE("CUPOOL_FREE", "[options]") {
  CHECK(ok({{"CUPOOL_FREE", "sync"}}).free_mode == FreeMode::sync);
  CHECK(ok({{"CUPOOL_FREE", "deferred"}}).free_mode == FreeMode::deferred);
  CHECK(error({{"CUPOOL_FREE", "async"}}) == "cupool: CUPOOL_FREE=\"async\" is not valid; accepted: sync, deferred");
}

TEST_CASE("sizes: units, fractions, overflow", "[options]") {
  CHECK(size_of("4096") == 4096);
  CHECK(size_of("4096B") == 4096);
  CHECK(size_of("4096b") == 4096);
  CHECK(size_of("4K") == 4096);
  CHECK(size_of("4KB") == 4096);  // KB is 1024-based, like K and KiB
  CHECK(size_of("4KiB") == 4096);
  CHECK(size_of("4kib") == 4096);
  CHECK(size_of("3M") == 3ull << 20);
  CHECK(size_of("3MB") == 3ull << 20);
  CHECK(size_of("3MiB") == 3ull << 20);
  CHECK(size_of("2G") == 2ull << 30);
  CHECK(size_of("2GB") == 2ull << 30);
  CHECK(size_of("2GiB") == 2ull << 30);
  CHECK(size_of("1.5GiB") == 3ull << 29);
  CHECK(size_of("0.5 MiB") == 1ull << 19);
  CHECK(size_of(" 64MiB ") == 64ull << 20);
  CHECK(size_of(".25K") == 256);
  CHECK(size_of("1.0001K") == 1024);  // rounded down to whole bytes
  CHECK(size_of("16777215T") == 16777215ull << 40);
  CHECK(size_of("18446744073709551615") == 18446744073709551615ull);

  const Env too_big = {{"CUPOOL_GROWTH_CHUNK", "16777216TiB"}};
  CHECK(error(too_big).find("the size is too large") != std::string::npos);
  CHECK(error({{"CUPOOL_GROWTH_CHUNK", "18446744073709551616"}}).find("too large") != std::string::npos);
  CHECK(error({{"CUPOOL_GROWTH_CHUNK", "99999999999999999999999GiB"}}).find("too large") != std::string::npos);
  CHECK(error({{"CUPOOL_GROWTH_CHUNK", "1.5"}}).find("whole number") != std::string::npos);
  CHECK(error({{"CUPOOL_GROWTH_CHUNK", "1.5B"}}).find("whole number") != std::string::npos);
  CHECK(error({{"CUPOOL_GROWTH_CHUNK", "12PB"}}) ==
        "cupool: CUPOOL_GROWTH_CHUNK=\"12PB\" is not valid: unknown unit \"PB\"; accepted: bytes, or a number "
        "(fractions allowed) with B, K, KB, KiB, M, MB, MiB, G, GB, GiB, T, TB, TiB (all 1024-based)");
  CHECK(error({{"CUPOOL_GROWTH_CHUNK", "-1M"}}).find("not a number") != std::string::npos);
  CHECK(error({{"CUPOOL_GROWTH_CHUNK", "M"}}).find("not a number") != std::string::npos);
  CHECK(error({{"CUPOOL_GROWTH_CHUNK", "0"}}).find("more than 0") != std::string::npos);
  CHECK(error({{"CUPOOL_GROWTH_CHUNK", "50%"}}).find("CUPOOL_GROWTH_CHUNK=\"50%\" is not valid") != std::string::npos);
}

TEST_CASE("CUPOOL_GROWTH_CHUNK and CUPOOL_GROWTH_CHUNK_MAX together", "[options]") {
  Config c = ok({{"CUPOOL_GROWTH_CHUNK", "64MiB"}, {"CUPOOL_GROWTH_CHUNK_MAX", "2GiB"}});
  CHECK(c.growth_chunk == 64ull << 20);
  CHECK(c.growth_chunk_max == 2ull << 30);
  // An unset maximum follows a larger first chunk.
  c = ok({{"CUPOOL_GROWTH_CHUNK", "1GiB"}});
  CHECK(c.growth_chunk_max == 1ull << 30);
  CHECK(error({{"CUPOOL_GROWTH_CHUNK_MAX", "16MiB"}}) ==
        "cupool: CUPOOL_GROWTH_CHUNK_MAX=\"16MiB\" is not valid: it is less than CUPOOL_GROWTH_CHUNK (32MiB); "
        "accepted: a size at least CUPOOL_GROWTH_CHUNK");
}

TEST_CASE("CUPOOL_LIMIT", "[options]") {
  Config c = ok({{"CUPOOL_LIMIT", "8GiB"}});
  REQUIRE(c.limit.all);
  CHECK(c.limit.all->bytes == 8ull << 30);
  CHECK(c.limit.per_device.empty());

  c = ok({{"CUPOOL_LIMIT", "50%"}});
  REQUIRE(c.limit.all);
  CHECK(c.limit.all->percent == 50.0);
  CHECK(c.limit.all->resolve(1000) == 500);

  c = ok({{"CUPOOL_LIMIT", "12.5%"}});
  CHECK(c.limit.all->percent == 12.5);

  c = ok({{"CUPOOL_LIMIT", "0:8GiB,1:50%"}});
  CHECK(!c.limit.all);
  REQUIRE(c.limit.per_device.size() == 2);
  CHECK(c.limit.for_device(0)->bytes == 8ull << 30);
  CHECK(c.limit.for_device(1)->percent == 50.0);
  CHECK(!c.limit.for_device(2));

  c = ok({{"CUPOOL_LIMIT", "8GiB, 1:4GiB"}});
  CHECK(c.limit.for_device(0)->bytes == 8ull << 30);
  CHECK(c.limit.for_device(1)->bytes == 4ull << 30);
  CHECK(c.limit.for_device(7)->bytes == 8ull << 30);
  c = ok({{"CUPOOL_LIMIT", "1:4GiB,8GiB"}});  // the unprefixed entry may come anywhere
  CHECK(c.limit.for_device(3)->bytes == 8ull << 30);

  CHECK(ok({{"CUPOOL_LIMIT", "100%"}}).limit.all->percent == 100.0);
  CHECK(error({{"CUPOOL_LIMIT", "0%"}}).find("a percent must be more than 0 and at most 100") != std::string::npos);
  CHECK(error({{"CUPOOL_LIMIT", "101%"}}).find("at most 100") != std::string::npos);
  CHECK(error({{"CUPOOL_LIMIT", "-5%"}}).find("not a percent") != std::string::npos);
  CHECK(error({{"CUPOOL_LIMIT", "abc%"}}).find("not a percent") != std::string::npos);
  CHECK(error({{"CUPOOL_LIMIT", "0"}}).find("more than 0") != std::string::npos);
  CHECK(error({{"CUPOOL_LIMIT", "8GiB,4GiB"}}).find("more than one value without a device prefix") != std::string::npos);
  CHECK(error({{"CUPOOL_LIMIT", "0:8GiB,0:4GiB"}}).find("device 0 is given twice") != std::string::npos);
  CHECK(error({{"CUPOOL_LIMIT", "x:8GiB"}}).find("\"x\" is not a device index") != std::string::npos);
  CHECK(error({{"CUPOOL_LIMIT", "-1:8GiB"}}).find("is not a device index") != std::string::npos);
  CHECK(error({{"CUPOOL_LIMIT", "1:"}}).find("device 1: not a number") != std::string::npos);
  CHECK(error({{"CUPOOL_LIMIT", "8GiB,"}}).find("empty entry") != std::string::npos);
  CHECK(error({{"CUPOOL_LIMIT", "1:8XB"}}).rfind("cupool: CUPOOL_LIMIT=\"1:8XB\" is not valid: device 1: unknown unit \"XB\"; accepted: a size", 0) == 0);
}

TEST_CASE("CUPOOL_PREALLOCATE and CUPOOL_PREALLOCATE_GROW", "[options]") {
  CHECK(ok({{"CUPOOL_PREALLOCATE", "12GiB"}}).preallocate.bytes == 12ull << 30);
  CHECK(!ok({{"CUPOOL_PREALLOCATE", "12GiB"}}).preallocate.is_percent());
  CHECK(ok({{"CUPOOL_PREALLOCATE", "90%"}}).preallocate.percent == 90.0);
  CHECK(error({{"CUPOOL_PREALLOCATE", "200%"}}).find("CUPOOL_PREALLOCATE=\"200%\" is not valid: a percent") != std::string::npos);
  CHECK(error({{"CUPOOL_PREALLOCATE", "lots"}}).find("not a number") != std::string::npos);
  // Less than one chunk would reserve nothing and refuse every allocation ("reserved 0 B").
  CHECK(error({{"CUPOOL_PREALLOCATE", "1"}}) ==
        "cupool: CUPOOL_PREALLOCATE=\"1\" is not valid: less than the pool's chunk granularity (2MiB); accepted: a "
        "size of at least 2MiB (12GiB) or percent of device memory (75%)");
  CHECK(error({{"CUPOOL_PREALLOCATE", "2047KiB"}}).find("chunk granularity (2MiB)") != std::string::npos);
  CHECK(ok({{"CUPOOL_PREALLOCATE", "2MiB"}}).preallocate.bytes == 2u << 20);
  CHECK(ok({{"CUPOOL_PREALLOCATE", "0.5%"}}).preallocate.percent == 0.5);
  STATIC_REQUIRE(kMinPreallocateBytes == ContextPool::kChunkGranularity);

  CHECK(ok({{"CUPOOL_PREALLOCATE_GROW", "true"}}).preallocate_grow);
  CHECK(ok({{"CUPOOL_PREALLOCATE_GROW", "1"}}).preallocate_grow);
  CHECK(!ok({{"CUPOOL_PREALLOCATE_GROW", "false"}}).preallocate_grow);
  CHECK(!ok({{"CUPOOL_PREALLOCATE_GROW", "0"}}).preallocate_grow);
  CHECK(error({{"CUPOOL_PREALLOCATE_GROW", "yes please"}}) ==
        "cupool: CUPOOL_PREALLOCATE_GROW=\"yes please\" is not valid; accepted: true, false (or 1, 0)");
}

TEST_CASE("CUPOOL_VMM_CACHE", "[options]") {
  CHECK(ok({}).vmm_cache);
  CHECK(ok({{"CUPOOL_VMM_CACHE", "on"}}).vmm_cache);
  CHECK(ok({{"CUPOOL_VMM_CACHE", "TRUE"}}).vmm_cache);
  CHECK(!ok({{"CUPOOL_VMM_CACHE", "off"}}).vmm_cache);
  CHECK(!ok({{"CUPOOL_VMM_CACHE", "0"}}).vmm_cache);
  CHECK(error({{"CUPOOL_VMM_CACHE", "maybe"}}) ==
        "cupool: CUPOOL_VMM_CACHE=\"maybe\" is not valid; accepted: on, off (or true, false, 1, 0)");
}

TEST_CASE("CUPOOL_RELEASE", "[options]") {
  CHECK(!ok({{"CUPOOL_RELEASE", "never"}}).release_idle_ns);
  CHECK(*ok({{"CUPOOL_RELEASE", "30s"}}).release_idle_ns == 30'000'000'000ull);
  CHECK(*ok({{"CUPOOL_RELEASE", "500ms"}}).release_idle_ns == 500'000'000ull);
  CHECK(*ok({{"CUPOOL_RELEASE", "2m"}}).release_idle_ns == 120'000'000'000ull);
  CHECK(*ok({{"CUPOOL_RELEASE", "2min"}}).release_idle_ns == 120'000'000'000ull);
  CHECK(*ok({{"CUPOOL_RELEASE", "1h"}}).release_idle_ns == 3'600'000'000'000ull);
  CHECK(*ok({{"CUPOOL_RELEASE", "1.5s"}}).release_idle_ns == 1'500'000'000ull);
  CHECK(*ok({{"CUPOOL_RELEASE", "250us"}}).release_idle_ns == 250'000ull);
  CHECK(*ok({{"CUPOOL_RELEASE", "0s"}}).release_idle_ns == 0);
  CHECK(error({{"CUPOOL_RELEASE", "30"}}).find("a duration needs a unit") != std::string::npos);
  CHECK(error({{"CUPOOL_RELEASE", "30d"}}).find("unknown unit \"d\"") != std::string::npos);
  CHECK(error({{"CUPOOL_RELEASE", "sometimes"}}).find("not a duration") != std::string::npos);
  CHECK(error({{"CUPOOL_RELEASE", "9999999999999h"}}).find("too long") != std::string::npos);
  CHECK(error({{"CUPOOL_RELEASE", "soon"}}).find("; accepted: never, or a duration") != std::string::npos);
}

TEST_CASE("CUPOOL_TRACE, CUPOOL_TRACE_FLUSH_MS, CUPOOL_TRACE_BUFFER", "[options]") {
  CHECK(ok({{"CUPOOL_TRACE", "/tmp/t.%p.jsonl"}}).trace_path == "/tmp/t.%p.jsonl");
  CHECK(ok({{"CUPOOL_TRACE_FLUSH_MS", "250"}}).trace_flush_ns == 250'000'000ull);
  CHECK(ok({{"CUPOOL_TRACE_FLUSH_MS", "1"}}).trace_flush_ns == 1'000'000ull);
  CHECK(error({{"CUPOOL_TRACE_FLUSH_MS", "0"}}).find("out of range") != std::string::npos);
  CHECK(error({{"CUPOOL_TRACE_FLUSH_MS", "60001"}}).find("out of range") != std::string::npos);
  CHECK(error({{"CUPOOL_TRACE_FLUSH_MS", "1.5"}}).find("not a whole number") != std::string::npos);
  CHECK(error({{"CUPOOL_TRACE_FLUSH_MS", "99999999999999999999999"}}).find("out of range") != std::string::npos);
  CHECK(ok({{"CUPOOL_TRACE_BUFFER", "1024"}}).trace_buffer_events == 1024);
  CHECK(ok({{"CUPOOL_TRACE_BUFFER", "4194304"}}).trace_buffer_events == 4194304);
  CHECK(error({{"CUPOOL_TRACE_BUFFER", "8"}}) ==
        "cupool: CUPOOL_TRACE_BUFFER=\"8\" is not valid: out of range; accepted: a whole number from 16 to 4194304 "
        "(rounded up to a power of two)");
  CHECK(error({{"CUPOOL_TRACE_BUFFER", "lots"}}).find("not a whole number") != std::string::npos);
}

TEST_CASE("CUPOOL_TRACE_STACKS", "[options]") {
  CHECK(ok({}).trace_stacks == 0);
  CHECK(ok({{"CUPOOL_TRACE_STACKS", "off"}}).trace_stacks == 0);
  CHECK(ok({{"CUPOOL_TRACE_STACKS", "0"}}).trace_stacks == 0);
  CHECK(ok({{"CUPOOL_TRACE_STACKS", "on"}}).trace_stacks == kTraceStacksOn);
  CHECK(ok({{"CUPOOL_TRACE_STACKS", "all"}}).trace_stacks == 1);
  CHECK(ok({{"CUPOOL_TRACE_STACKS", "1"}}).trace_stacks == 1);
  CHECK(ok({{"CUPOOL_TRACE_STACKS", "1000000"}}).trace_stacks == 1'000'000);
  CHECK(error({{"CUPOOL_TRACE_STACKS", "1000001"}}) ==
        "cupool: CUPOOL_TRACE_STACKS=\"1000001\" is not valid: out of range; accepted: off, on (one allocation in 64), "
        "all, or a whole number N from 1 to 1000000 (one allocation in N)");
  CHECK(error({{"CUPOOL_TRACE_STACKS", "sometimes"}}).find("not a whole number") != std::string::npos);
  CHECK(error({{"CUPOOL_TRACE_STACKS", "-4"}}).find("accepted: off, on") != std::string::npos);
  const Config c = ok({{"CUPOOL_TRACE_STACKS", "16"}});
  CHECK(describe(c).find(" trace_stacks=1/16 ") != std::string::npos);
  CHECK(nlohmann::json::parse(config_json(c))["trace_stacks"] == 16);
}

TEST_CASE("CUPOOL_LOG_LEVEL", "[options]") {
  for (const char* level : {"trace", "debug", "info", "warn", "error", "off"}) CHECK(ok({{"CUPOOL_LOG_LEVEL", level}}).log_level == level);
  CHECK(ok({{"CUPOOL_LOG_LEVEL", "DEBUG"}}).log_level == "debug");
  CHECK(error({{"CUPOOL_LOG_LEVEL", "verbose"}}) ==
        "cupool: CUPOOL_LOG_LEVEL=\"verbose\" is not valid; accepted: trace, debug, info, warn, error, off");
}

TEST_CASE("an error message is one line, whatever the value holds", "[options]") {
  const std::string m = error({{"CUPOOL_POLICY", "a\nb\"c"}});
  CHECK(m.find('\n') == std::string::npos);
  CHECK(m == "cupool: CUPOOL_POLICY=\"a\\nb\\\"c\" is not valid; accepted: growth, preallocate, passthrough, vmm");
}

TEST_CASE("unknown CUPOOL_ variables are reported", "[options]") {
  std::string a = "CUPOOL_POLCY=growth", b = "CUPOOL_POLICY=growth", c = "PATH=/bin", d = "CUPOOL_ZZZZZZZZZZZZ=1",
              e = "CUPOOL_LIBRARY=/opt/cupool/libcupool.so", f = "CUPOOL_TRACE_ROOT_PID=1:/tmp/t.jsonl";
  char* env[] = {a.data(), b.data(), c.data(), d.data(), e.data(), f.data(), nullptr};
  const auto lines = unknown_variables(env);
  REQUIRE(lines.size() == 2);
  CHECK(lines[0].rfind("unknown variable CUPOOL_POLCY ignored (did you mean CUPOOL_POLICY?); known: CUPOOL_POLICY, CUPOOL_FREE,", 0) == 0);
  CHECK(lines[0].find("CUPOOL_LOG_LEVEL") != std::string::npos);
  CHECK(lines[1].rfind("unknown variable CUPOOL_ZZZZZZZZZZZZ ignored; known: ", 0) == 0);
  CHECK(unknown_variables(nullptr).empty());
}

TEST_CASE("describe and config_json", "[options]") {
  const Config c = ok({{"CUPOOL_LIMIT", "8GiB,1:50%"}, {"CUPOOL_RELEASE", "30s"}, {"CUPOOL_TRACE", "/tmp/a \"b\".jsonl"}});
  CHECK(describe(c) ==
        "policy=growth free=deferred limit=8GiB,1:50% preallocate=75% preallocate_grow=false growth_chunk=32MiB "
        "growth_chunk_max=512MiB release=30s thread_cache=on vmm_cache=on trace=/tmp/a \"b\".jsonl trace_flush_ms=100 trace_buffer=16384 trace_stacks=off log=info");
  CHECK(describe(ok({})).find("limit=none") != std::string::npos);
  CHECK(describe(ok({})).find("release=never") != std::string::npos);

  const auto j = nlohmann::json::parse(config_json(c));
  CHECK(j["policy"] == "growth");
  CHECK(j["free"] == "deferred");
  CHECK(j["limit"]["all"]["bytes"] == 8ull << 30);
  CHECK(j["limit"]["devices"]["1"]["percent"] == 50.0);
  CHECK(j["preallocate"]["percent"] == 75.0);
  CHECK(j["preallocate_grow"] == false);
  CHECK(j["growth_chunk"] == 32ull << 20);
  CHECK(j["growth_chunk_max"] == 512ull << 20);
  CHECK(j["release_idle_ns"] == 30'000'000'000ull);
  CHECK(j["trace"] == "/tmp/a \"b\".jsonl");
  CHECK(j["trace_flush_ns"] == 100'000'000);
  CHECK(j["trace_buffer_events"] == 16384);
  CHECK(j["log_level"] == "info");
  const auto d = nlohmann::json::parse(config_json(ok({})));
  CHECK(d["limit"].is_null());
  CHECK(d["release_idle_ns"].is_null());
}

TEST_CASE("append_quoted always yields valid JSON", "[options]") {
  std::string all;
  for (int i = 0; i < 256; ++i) all += static_cast<char>(i);
  all += "\xe2\x82\xac \xf0\x9f\x98\x80 \xed\xa0\x80 \xc0\xaf \xe2\x82";  // good, good, surrogate, overlong, cut
  std::string out;
  append_quoted(out, all);
  const auto j = nlohmann::json::parse(out);
  const std::string back = j.get<std::string>();
  CHECK(back.substr(0, 128) == all.substr(0, 128));
  CHECK(back.find("\xe2\x82\xac \xf0\x9f\x98\x80 ") != std::string::npos);
}

TEST_CASE("trace path expansion and checking", "[options]") {
  CHECK(expand_trace_path("/tmp/t.%p.jsonl", 1234) == "/tmp/t.1234.jsonl");
  CHECK(expand_trace_path("%p-%p", 7) == "7-7");
  CHECK(expand_trace_path("100%%-%x-%", 7) == "100%-%x-%");
  CHECK(!check_trace_path("/tmp/cupool-check-" + std::to_string(getpid()) + ".jsonl"));
  CHECK(!check_trace_path("relative-file.jsonl"));
  CHECK(*check_trace_path("/nonexistent-dir-cupool/t.jsonl") ==
        "cupool: CUPOOL_TRACE: cannot write the trace to \"/nonexistent-dir-cupool/t.jsonl\": directory "
        "\"/nonexistent-dir-cupool\": No such file or directory");
  CHECK(check_trace_path("/tmp")->find("it is a directory") != std::string::npos);
  CHECK(check_trace_path("")->find("the path is empty") != std::string::npos);
  if (geteuid() != 0) CHECK(check_trace_path("/proc/cupool.jsonl").has_value());
}

TEST_CASE("README.md and docs/options.md hold the generated options table", "[options]") {
  const std::string table = options_markdown();
  CHECK(table.rfind("| Variable | Type | Default | Accepted values | Meaning |\n|---|---|---|---|---|\n", 0) == 0);
  for (const auto& o : kOptions) CHECK(table.find("| `" + std::string(o.name) + "` |") != std::string::npos);

  const char* root = std::getenv("CUPOOL_SOURCE_ROOT");
  if (root == nullptr) {
    WARN("CUPOOL_SOURCE_ROOT is not set: README.md and docs/options.md not checked against options_markdown()");
    return;
  }
  auto slurp = [](const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  };
  for (const std::string file : {"README.md", "docs/options.md"}) {
    INFO(file);
    const std::string text = slurp(std::string(root) + "/" + file);
    const std::string begin = "<!-- options:begin -->\n", end = "<!-- options:end -->";
    const auto b = text.find(begin);
    const auto e = text.find(end);
    REQUIRE(b != std::string::npos);
    REQUIRE(e != std::string::npos);
    REQUIRE(b < e);
    CHECK(text.substr(b + begin.size(), e - b - begin.size()) == table);
  }
}

TEST_CASE("log levels", "[options]") {
  log_init("warn");
  CHECK(!log_debug_enabled());
  log_init("debug");
  CHECK(log_debug_enabled());
  CHECK(!log_trace_enabled());
  log_init("off");
  log_error("not shown");
  log_init("info");
}
