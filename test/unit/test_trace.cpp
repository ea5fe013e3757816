#include <catch2/catch.hpp>
#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "config_json.h"
#include "event_clock.h"
#include "options.h"
#include "trace_reader.h"
#include "trace_writer.h"

using namespace cupool;

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/cupool-trace-test-XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~TempDir() { (void)std::system(("rm -rf '" + path + "'").c_str()); }
};

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

Config trace_config(const std::string& path, std::uint32_t ring = 8192) {
  Config c;
  c.trace_path = path;
  c.trace_flush_ns = 5'000'000;
  c.trace_buffer_events = ring;
  return c;
}

std::unique_ptr<TraceWriter> open_writer(const Config& c) {
  std::string error;
  auto w = TraceWriter::open(c, &error);
  INFO(error);
  REQUIRE(w);
  return w;
}

// Thread `thread`'s event number `i`, with fields that say who wrote it.
trace::Record make_record(std::uint32_t thread, std::uint64_t i) {
  trace::Record r;
  r.t_ns = 1'000'000 + i;
  r.dur_ns = i % 977;
  r.size = (std::uint64_t{thread} << 32) | i;
  r.ptr = 0x7f0000000000ull + i * 256;
  r.api = (i % 2) ? "cudaMalloc" : "cuMemAlloc_v2";
  r.tid = 1000 + thread;
  r.device = static_cast<std::int16_t>(thread % 3);
  r.kind = (i % 3 == 0) ? trace::EventKind::free : trace::EventKind::alloc;
  r.path = static_cast<trace::Path>(1 + i % 4);
  r.rc = (i % 101 == 0) ? 2 : 0;
  r.has_stream = i % 5 == 0;
  r.stream = r.has_stream ? 0x5000 + i : 0;
  r.has_pool = i % 7 == 0;
  if (r.has_pool) r.pool = trace::PoolState{i * 2, i, i / 2, i / 3, static_cast<std::uint32_t>(i % 11)};
  if (r.rc != 0) r.oom_class = trace::OomClass::limit;
  return r;
}

// The reader gives back every value the writer was given: the two share one definition of them
// (trace::EventValues), compared whole, so a field added to it is checked here too.
void check_same(const Event& e, const trace::Record& r) {
  CHECK(static_cast<const trace::EventValues&>(e) == static_cast<const trace::EventValues&>(r));
  CHECK(e.api == r.api);
}

std::vector<Event> read_all(const std::string& path, std::unique_ptr<TraceReader>* keep = nullptr,
                            std::ifstream* stream = nullptr) {
  std::ifstream local;
  std::ifstream& in = stream ? *stream : local;
  in.open(path);
  REQUIRE(in.good());
  auto reader = std::make_unique<TraceReader>(in, path);
  std::vector<Event> events;
  Event e;
  while (reader->next(e)) events.push_back(e);
  if (keep) *keep = std::move(reader);
  return events;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// An in-memory trace for the reader tests.
// The event line with one more field before its closing brace.
std::string with_field(std::string line, const std::string& field) {
  line.insert(line.rfind('}'), "," + field);
  return line;
}

std::string header_line(const std::string& version = "1.0") {
  return R"({"type":"header","format":"cupool-trace","version":")" + version +
         R"(","cupool_version":"0.1.0","pid":10,"ppid":1,"host":"h","cmdline":["a","b c"],"start_unix_ns":5,)"
         R"("start_mono_ns":6,"config":{"policy":"growth"},"devices":[]})" "\n";
}
const std::string kEvent =
    R"({"type":"event","t":100,"tid":7,"ev":"alloc","api":"cudaMalloc","path":"symbol","dev":0,"size":4096,)"
    R"("ptr":"0x7f00","rc":0,"dur":12})" "\n";
const std::string kFooter =
    R"({"type":"footer","events":1,"dropped":0,"allocs":1,"frees":0,"ooms":0,"end_mono_ns":200,"devices":[]})" "\n";

struct MemTrace {
  std::istringstream in;
  std::unique_ptr<TraceReader> reader;
  std::vector<Event> events;
  explicit MemTrace(const std::string& text) : in(text) {
    reader = std::make_unique<TraceReader>(in, "mem");
    Event e;
    while (reader->next(e)) events.push_back(e);
  }
};

// The trace's event lines as JSON objects, as any JSON reader sees them.
std::vector<nlohmann::json> event_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> events;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["type"] == "event") events.push_back(j);
  }
  return events;
}

std::string error_of(const std::string& text) {
  try {
    MemTrace t(text);
  } catch (const TraceError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("events from many threads come back exactly once, in order per thread", "[trace]") {
  TempDir dir;
  const Config config = trace_config(dir.path + "/t.%p.jsonl");
  auto w = open_writer(config);
  CHECK(w->path() == dir.path + "/t." + std::to_string(getpid()) + ".jsonl");
  constexpr std::uint32_t kThreads = 8;
  constexpr std::uint64_t kPerThread = 5000;  // fits one ring: nothing can be dropped
  std::vector<std::thread> threads;
  for (std::uint32_t t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (std::uint64_t i = 0; i < kPerThread; ++i) w->record(make_record(t, i));
    });
  for (auto& th : threads) th.join();  // their rings are drained after their threads are gone
  w->write_device(0, "Simulated \"GPU\"\n0", 80ull << 30);
  w->write_device(0, "Simulated \"GPU\"\n0", 80ull << 30);  // the same again: no second line
  w->write_device(1, "Other", 40ull << 30);
  w->close();
  w->close();  // idempotent
  w->record(make_record(0, 0));  // after close: nothing happens

  std::unique_ptr<TraceReader> reader;
  std::ifstream in;
  const auto events = read_all(w->path(), &reader, &in);
  REQUIRE(events.size() == kThreads * kPerThread);
  std::map<std::uint32_t, std::uint64_t> next;
  for (const Event& e : events) {
    const std::uint32_t t = e.tid - 1000;
    const std::uint64_t i = e.size & 0xffffffff;
    REQUIRE(t < kThreads);
    REQUIRE(next[t] == i);  // in order, none missing, none twice
    ++next[t];
    if (i % 499 == 0) check_same(e, make_record(t, i));
  }
  const Header& h = reader->header();
  CHECK(h.major == trace::kFormatMajor);
  CHECK(h.minor == trace::kFormatMinor);
  CHECK(h.pid == getpid());
  CHECK(h.ppid == getppid());
  CHECK(!h.cmdline.empty());
  CHECK(!h.host.empty());
  CHECK(h.start_unix_ns > 1'600'000'000ull * 1'000'000'000ull);
  CHECK(h.config["trace_buffer_events"] == 8192);
  CHECK(h.config["policy"] == "growth");
  REQUIRE(reader->footer());
  const Footer& f = *reader->footer();
  CHECK(f.events == kThreads * kPerThread);
  CHECK(f.dropped == 0);
  CHECK(reader->dropped() == 0);
  std::uint64_t allocs = 0, frees = 0, ooms = 0;
  for (const Event& e : events) {
    if (e.kind == trace::EventKind::alloc) (e.rc == 0 ? allocs : ooms)++;
    if (e.kind == trace::EventKind::free && e.rc == 0) ++frees;
  }
  CHECK(f.allocs == allocs);
  CHECK(f.frees == frees);
  CHECK(f.ooms == ooms);
  CHECK(f.end_mono_ns >= h.start_mono_ns);
  REQUIRE(f.devices.size() == 2);
  CHECK(f.devices[0].name == "Simulated \"GPU\"\n0");
  CHECK(f.devices[0].total_bytes == 80ull << 30);
  CHECK(f.devices[1].index == 1);
  REQUIRE(reader->devices().size() == 2);
  CHECK(reader->events_read() == f.events);

  // Every line is a JSON object nlohmann accepts too; the header is first, the footer last.
  std::istringstream lines(slurp(w->path()));
  std::string line;
  std::vector<std::string> types;
  while (std::getline(lines, line)) types.push_back(nlohmann::json::parse(line)["type"]);
  CHECK(types.front() == "header");
  CHECK(types.back() == "footer");
  CHECK(std::count(types.begin(), types.end(), "device") == 2);
}

TEST_CASE("every field of every kind of event round-trips", "[trace]") {
  TempDir dir;
  auto w = open_writer(trace_config(dir.path + "/t.jsonl"));
  std::vector<trace::Record> records;
  for (int k = 0; k < static_cast<int>(trace::EventKind::count_); ++k)
    for (int o = 0; o < static_cast<int>(trace::OomClass::count_); ++o) {
      trace::Record r = make_record(1, static_cast<std::uint64_t>(k * 10 + o));
      r.kind = static_cast<trace::EventKind>(k);
      r.oom_class = static_cast<trace::OomClass>(o);
      r.path = static_cast<trace::Path>(k % static_cast<int>(trace::Path::count_));
      r.has_stream = true;
      r.stream = ~0ull;
      r.ptr = (k == 0) ? 0 : ~0ull - static_cast<std::uint64_t>(k);
      r.size = ~0ull;
      r.rc = (o == 0) ? 0 : -5;
      r.device = (o == 1) ? -1 : 7;
      r.has_pool = true;
      r.pool = trace::PoolState{~0ull, 1, 2, 3, 4, ~0u};
      r.has_flags = (k + o) % 2 == 0;
      r.flags = r.has_flags ? 1 : 0;
      r.recycled = o == 1;
      r.granules = o == 2;
      r.has_handle = k % 3 == 0;
      r.handle = r.has_handle ? ~0ull - 7 : 0;
      r.offset = r.has_handle ? static_cast<std::uint64_t>(k) << 21 : 0;
      records.push_back(r);
      w->record(r);
    }
  trace::Record odd = make_record(2, 3);
  odd.api = "a \"quoted\"\\ api\n\x01\xff";
  odd.tid = 0;  // the writer fills in the thread's own id
  odd.t_ns = 2'000'000;  // a thread records its events in time order, and the writer writes in time order
  w->record(odd);
  w->close();
  const auto events = read_all(w->path());
  REQUIRE(events.size() == records.size() + 1);
  for (std::size_t i = 0; i < records.size(); ++i) check_same(events[i], records[i]);
  CHECK(events.back().api == "a \"quoted\"\\ api\n\x01\xc3\xbf");  // \u00ff: JSON text is UTF-8
  CHECK(events.back().tid == static_cast<std::uint32_t>(gettid()));
}

TEST_CASE("the header, device lines and footer round-trip: what the writer knew, the reader gives back", "[trace]") {
  TempDir dir;
  Config config = trace_config(dir.path + "/t.jsonl");
  config.policy = PolicyKind::preallocate;
  config.limit.per_device.emplace_back(1, SizeSpec{0, 37.5});
  auto w = open_writer(config);
  w->write_device(0, "first \"device\"", 80ull << 30);
  w->write_device(1, "second", 141ull << 30);
  std::uint64_t allocs = 0, frees = 0, ooms = 0;
  for (std::uint64_t i = 0; i < 300; ++i) {
    const trace::Record r = make_record(0, i);
    w->record(r);
    if (r.kind == trace::EventKind::alloc) (r.rc == 0 ? allocs : ooms) += 1;
    if (r.kind == trace::EventKind::free && r.rc == 0) ++frees;
  }
  w->close();
  std::unique_ptr<TraceReader> reader;
  const auto events = read_all(w->path(), &reader);
  CHECK(events.size() == 300);
  const Header& h = reader->header();
  CHECK(h.major == trace::kFormatMajor);
  CHECK(h.minor == trace::kFormatMinor);
  CHECK(h.pid == getpid());
  CHECK(h.ppid == getppid());
  CHECK_FALSE(h.cmdline.empty());
  CHECK(h.start_mono_ns > 0);
  const auto decoded = decode_config(h.config);
  REQUIRE(decoded);
  CHECK(*decoded == config);
  const std::vector<DeviceInfo> want = {{0, "first \"device\"", 80ull << 30}, {1, "second", 141ull << 30}};
  auto same = [](const std::vector<DeviceInfo>& a, const std::vector<DeviceInfo>& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
      if (a[i].index != b[i].index || a[i].name != b[i].name || a[i].total_bytes != b[i].total_bytes) return false;
    return true;
  };
  CHECK(same(reader->devices(), want));
  REQUIRE(reader->footer());
  const Footer& f = *reader->footer();
  CHECK(f.events == 300);
  CHECK(f.dropped == 0);
  CHECK(f.allocs == allocs);
  CHECK(f.frees == frees);
  CHECK(f.ooms == ooms);
  CHECK(f.end_mono_ns >= h.start_mono_ns);
  CHECK(same(f.devices, want));
  CHECK_FALSE(f.share_waits);  // not a member of a shared budget
  CHECK_FALSE(f.share_wait_ns);
}

TEST_CASE("the footer of a shared budget's member says how often and how long it waited", "[trace]") {
  TempDir dir;
  Config config = trace_config(dir.path + "/t.jsonl");
  config.share = "train";
  auto w = open_writer(config);
  w->record(make_record(0, 0));
  w->close(TraceWriter::ShareWaits{3, 1'234'567'890'123ull});
  std::unique_ptr<TraceReader> reader;
  read_all(w->path(), &reader);
  REQUIRE(reader->footer());
  CHECK(reader->footer()->share_waits == 3u);
  CHECK(reader->footer()->share_wait_ns == 1'234'567'890'123ull);
}

TEST_CASE("the recorded configuration decodes to the configuration that was encoded", "[trace]") {
  std::mt19937_64 rng(7);
  auto size = [&]() {
    SizeSpec s;
    if (rng() % 2) s.percent = static_cast<double>(rng() % 10000) / 100.0 + 0.01;
    else s.bytes = rng() >> (rng() % 64);
    return s;
  };
  for (int i = 0; i < 500; ++i) {
    Config c;
    c.policy = static_cast<PolicyKind>(rng() % 3);
    c.free_mode = static_cast<FreeMode>(rng() % 2);
    if (rng() % 2) c.limit.all = size();
    for (int d = 0, n = static_cast<int>(rng() % 3); d < n; ++d) c.limit.per_device.emplace_back(d * 3, size());
    c.preallocate = size();
    c.preallocate_grow = rng() % 2;
    c.growth_chunk = rng();
    c.growth_chunk_max = rng();
    if (rng() % 2) c.release_idle_ns = rng();
    c.thread_cache = rng() % 2;
    c.vmm_cache = rng() % 2;
    c.trace_path = i % 2 ? "/tmp/t-%p.jsonl" : "";
    c.trace_flush_ns = rng();
    c.trace_buffer_events = static_cast<std::uint32_t>(rng());
    c.trace_stacks = static_cast<std::uint32_t>(rng() % 1'000'001);
    c.log_level = i % 3 ? "info" : "debug";
    if (i % 4 == 0) {
      c.share = "train-" + std::to_string(i);
      if (rng() % 2) c.share_limit.all = size();
      if (rng() % 2) c.share_limit.per_device.emplace_back(1, size());
      c.share_wait_ns = rng() % 2 ? rng() : 0;
      c.share_group = rng() % 2;
    }
    std::string why;
    const auto back = decode_config(nlohmann::json::parse(config_json(c)), &why);
    INFO(config_json(c) << " " << why);
    REQUIRE(back.has_value());
    CHECK(*back == c);
  }
  // What a trace of another version may hold is refused with a reason, not guessed.
  std::string why;
  CHECK_FALSE(decode_config(nlohmann::json::parse(R"({"policy":"grow"})"), &why));
  CHECK(why.find("grow") != std::string::npos);
  CHECK_FALSE(decode_config(nlohmann::json::parse("[]"), &why));
}

// One option, one line (policy/options.def): every row is a key of the header, and the decoder
// keeps each row's presence rule.
TEST_CASE("the header's configuration has one key per option, each decoded by its row's rule", "[trace][config]") {
  const Config defaults;
  const nlohmann::json j = nlohmann::json::parse(config_json(defaults));
  CHECK(j.size() == kOptionCount);
  std::vector<std::string> keys;
#define CUPOOL_OPTION(id, variable, type, field, default_value, json_key, ...) keys.push_back(json_key);
#include "options.def"
#undef CUPOOL_OPTION
  REQUIRE(keys.size() == kOptionCount);
  for (const std::string& key : keys) {
    INFO(key);
    CHECK(j.contains(key));
    nlohmann::json without = j;
    without.erase(key);
    std::string why;
    const auto back = decode_config(without, &why);
    // Required keys are in every trace since 1.0; the others were added later (or are the
    // shared budget's, present together), and their absence means the default.
    const bool required = key == "policy" || key == "free" || key == "limit" || key == "preallocate" ||
                          key == "preallocate_grow" || key == "growth_chunk" || key == "growth_chunk_max" ||
                          key == "release_idle_ns" || (key.rfind("share_", 0) == 0);
    if (required) {
      CHECK_FALSE(back.has_value());
      CHECK(why.find(key) != std::string::npos);
    } else {
      REQUIRE(back.has_value());
      CHECK(*back == defaults);
    }
  }
  // A value of the wrong kind is refused, named, and cut short in the message.
  nlohmann::json bad = j;
  bad["growth_chunk"] = std::string(1000, 'x');
  std::string why;
  CHECK_FALSE(decode_config(bad, &why).has_value());
  CHECK(why.find("growth_chunk") != std::string::npos);
  CHECK(why.size() < 200);
  // Lenient keys (the trace's own settings) fall back to the default.
  bad = j;
  bad["trace_buffer_events"] = -5;
  const auto lenient = decode_config(bad, &why);
  REQUIRE(lenient.has_value());
  CHECK(lenient->trace_buffer_events == defaults.trace_buffer_events);
}

TEST_CASE("an event the VMM mapping cache served says \"recycled\":true; others have no such key", "[trace]") {
  TempDir dir;
  auto w = open_writer(trace_config(dir.path + "/t.jsonl"));
  trace::Record served = make_record(0, 1), real = make_record(0, 2);
  served.kind = real.kind = trace::EventKind::vmm_create;
  served.recycled = true;
  w->record(served);
  w->record(real);
  w->close();
  const std::vector<nlohmann::json> events = event_lines(w->path());
  REQUIRE(events.size() == 2);
  CHECK(events[0]["recycled"] == true);
  CHECK_FALSE(events[1].contains("recycled"));
  CHECK(read_all(w->path()).size() == 2);  // readers of 1.0 skip the key
}

TEST_CASE("calls not timed have no \"dur\"; a sampled timing says how many calls it stands for", "[trace]") {
  TempDir dir;
  auto w = open_writer(trace_config(dir.path + "/t.jsonl"));
  trace::Record untimed = make_record(0, 1), sampled = make_record(0, 2), timed = make_record(0, 3);
  untimed.timed_for = 0;
  sampled.timed_for = trace::kCacheTimingSample;
  w->record(untimed);
  w->record(sampled);
  w->record(timed);
  w->close();
  const std::vector<nlohmann::json> events = event_lines(w->path());
  REQUIRE(events.size() == 3);
  CHECK_FALSE(events[0].contains("dur"));
  CHECK_FALSE(events[0].contains("timed_for"));
  CHECK(events[1]["dur"] == sampled.dur_ns);
  CHECK(events[1]["timed_for"] == trace::kCacheTimingSample);
  CHECK(events[2]["dur"] == timed.dur_ns);
  CHECK_FALSE(events[2].contains("timed_for"));
  const std::vector<Event> back = read_all(w->path());
  REQUIRE(back.size() == 3);
  CHECK(back[0].timed_for == 0);
  CHECK(back[0].dur_ns == 0);
  CHECK(back[1].timed_for == trace::kCacheTimingSample);
  CHECK(back[1].dur_ns == sampled.dur_ns);
  CHECK(back[2].timed_for == 1);
}

TEST_CASE("events a thread cache served get in_use and cached from the last locked event of their pool", "[trace]") {
  TempDir dir;
  const std::string path = dir.path + "/t.jsonl";
  auto w = open_writer(trace_config(path));
  auto ev = [](std::uint64_t t, std::int16_t dev, std::uint64_t in_use, std::uint64_t cached, std::int64_t delta) {
    trace::Record r;
    r.t_ns = t;
    r.api = "cudaMalloc";
    r.device = dev;
    r.has_pool = true;
    r.pool.reserved = 32 << 20;
    r.pool.in_use = in_use;
    r.pool.cached = cached;
    r.pool.cache_delta = delta;
    r.pool.pool = 100 + static_cast<std::uint64_t>(dev);  // one pool per device here
    return r;
  };
  // Recorded out of order: the writer derives in time order.
  w->record(ev(30, 0, 0, 0, -512));  // a free into a cache
  w->record(ev(10, 0, 1000, 512, 0));  // locked: the device's values
  w->record(ev(20, 0, 0, 0, 256));   // an allocation from a cache
  w->record(ev(15, 1, 5, 0, 0));
  w->record(ev(25, 1, 0, 0, 256));   // more than pool 101 had cached: never below zero
  w->close();
  const auto events = read_all(path);
  REQUIRE(events.size() == 5);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> got;
  for (const Event& e : events) got.emplace_back(e.pool.in_use, e.pool.cached);
  CHECK(got == std::vector<std::pair<std::uint64_t, std::uint64_t>>{{1000, 512}, {5, 0}, {1256, 256}, {261, 0}, {744, 768}});
}

TEST_CASE("stamped events are written in CLOCK_MONOTONIC nanoseconds", "[trace]") {
  TempDir dir;
  const std::string path = dir.path + "/t.jsonl";
  auto w = open_writer(trace_config(path));
  // As the hooks stamp them: an allocation is placed at its end, a free at its start.
  auto timed = [](trace::EventKind kind, std::uint64_t* before, std::uint64_t* after) {
    trace::Record r;
    r.api = "cudaMalloc";
    r.kind = kind;
    r.stamped = true;
    *before = EventClock::now();
    const std::uint64_t start = EventClock::stamp();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const std::uint64_t end = EventClock::stamp();
    *after = EventClock::now();
    r.t_ns = trace::timed_at_end(kind) ? end : start;
    r.dur_ns = end - start;
    return r;
  };
  std::uint64_t alloc_before = 0, alloc_after = 0, free_before = 0, free_after = 0;
  w->record(timed(trace::EventKind::alloc, &alloc_before, &alloc_after));
  w->record(timed(trace::EventKind::free, &free_before, &free_after));
  // An untimed alloc (a thread's cache served it outside the sample): one stamp, its start.
  trace::Record untimed;
  untimed.api = "cudaMalloc";
  untimed.stamped = true;
  untimed.timed_for = 0;
  const std::uint64_t untimed_before = EventClock::now();
  untimed.t_ns = EventClock::stamp();
  const std::uint64_t untimed_after = EventClock::now();
  w->record(untimed);
  w->close();
  const auto events = read_all(path);
  REQUIRE(events.size() == 3);
  CHECK(events[2].timed_for == 0);
  CHECK(events[2].dur_ns == 0);
  CHECK(events[2].t_ns >= untimed_before);
  CHECK(events[2].t_ns <= untimed_after);
  const Event& a = events[0];
  const Event& f = events[1];
  CHECK(a.kind == trace::EventKind::alloc);
  CHECK(a.t_ns - a.dur_ns >= alloc_before);
  CHECK(a.t_ns <= alloc_after);
  CHECK(a.dur_ns >= 2'000'000);
  CHECK(f.kind == trace::EventKind::free);
  CHECK(f.t_ns >= free_before);
  CHECK(f.t_ns + f.dur_ns <= free_after);
  CHECK(f.dur_ns >= 2'000'000);
}

// The hooks' way (shim/hooks_memory.h): an event is built and timed only if the thread's ring has
// room (full_here), else counted with drop_here. What is lost is still counted, line by line.
TEST_CASE("events a hook drops at a full ring are counted as dropped", "[trace]") {
  TempDir dir;
  auto w = open_writer(trace_config(dir.path + "/t.jsonl", /*ring=*/4));
  w->set_writer_delay_for_testing(20'000'000);  // the writer falls far behind
  constexpr std::uint32_t kThreads = 4;
  constexpr std::uint64_t kPerThread = 3000;
  std::atomic<std::uint64_t> skipped{0};
  std::vector<std::thread> threads;
  for (std::uint32_t t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (std::uint64_t i = 0; i < kPerThread; ++i) {
        if (w->full_here()) {
          w->drop_here();
          skipped.fetch_add(1);
        } else {
          w->record(make_record(t, i));
        }
      }
    });
  for (auto& th : threads) th.join();
  w->close();

  std::unique_ptr<TraceReader> reader;
  std::ifstream in;
  const auto events = read_all(w->path(), &reader, &in);
  REQUIRE(reader->footer());
  CHECK(skipped.load() > 0);  // the rings did fill
  CHECK(reader->dropped() >= skipped.load());
  CHECK(reader->footer()->dropped == reader->dropped());
  CHECK(events.size() + reader->dropped() == kThreads * kPerThread);  // nothing lost silently
  CHECK(w->stats().dropped == reader->dropped());
}

TEST_CASE("a full ring drops events, counts them, and says so", "[trace]") {
  TempDir dir;
  auto w = open_writer(trace_config(dir.path + "/t.jsonl", /*ring=*/4));
  w->set_writer_delay_for_testing(20'000'000);  // the writer falls far behind
  constexpr std::uint32_t kThreads = 4;
  constexpr std::uint64_t kPerThread = 3000;
  std::vector<std::thread> threads;
  for (std::uint32_t t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (std::uint64_t i = 0; i < kPerThread; ++i) w->record(make_record(t, i));
    });
  for (auto& th : threads) th.join();
  w->close();
  const auto stats = w->stats();

  std::unique_ptr<TraceReader> reader;
  std::ifstream in;
  const auto events = read_all(w->path(), &reader, &in);
  REQUIRE(reader->footer());
  CHECK(reader->dropped() > 0);
  CHECK(reader->footer()->dropped == reader->dropped());  // every drop has its line
  CHECK(reader->footer()->events == events.size());
  CHECK(events.size() + reader->dropped() == kThreads * kPerThread);  // nothing lost silently
  CHECK(stats.dropped == reader->dropped());
  CHECK(stats.events == events.size());
  std::map<std::uint32_t, std::uint64_t> last;
  for (const Event& e : events) {  // what was kept is still in order
    const std::uint64_t i = e.size & 0xffffffff;
    if (last.count(e.tid)) CHECK(i > last[e.tid]);
    last[e.tid] = i;
  }
  const std::string text = slurp(w->path());
  CHECK(text.find(R"({"type":"drop",)") != std::string::npos);
}

TEST_CASE("the file is complete up to the last flush while the process runs", "[trace]") {
  TempDir dir;
  auto w = open_writer(trace_config(dir.path + "/t.jsonl"));
  for (std::uint64_t i = 0; i < 100; ++i) w->record(make_record(0, i));
  // The writer thread flushes every trace_flush_ns (5 ms here) without being asked. How soon
  // depends on the machine's load, so the test waits as long as it takes (a writer that never
  // flushes hangs it, and the test's timeout fails it).
  std::vector<Event> events;
  while (events.size() < 100) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::unique_ptr<TraceReader> reader;
    std::ifstream in;
    events = read_all(w->path(), &reader, &in);
    CHECK(!reader->footer());  // a killed process leaves no footer: not an error
  }
  CHECK(events.size() == 100);
  w->flush();
  w->close();
}

TEST_CASE("threads that exit, and threads that move to a new writer", "[trace]") {
  TempDir dir;
  for (int round = 0; round < 3; ++round) {
    auto w = open_writer(trace_config(dir.path + "/t" + std::to_string(round) + ".jsonl", 64));
    std::vector<std::thread> threads;
    for (std::uint32_t t = 0; t < 16; ++t)
      threads.emplace_back([&, t] {
        for (std::uint64_t i = 0; i < 40; ++i) w->record(make_record(t, i));
      });
    for (std::uint64_t i = 0; i < 40; ++i) w->record(make_record(99, i));  // this thread, every round
    for (auto& th : threads) th.join();
    w.reset();  // the destructor closes
    const auto events = read_all(dir.path + "/t" + std::to_string(round) + ".jsonl");
    CHECK(events.size() == 17 * 40);
  }
}

// [fork]: ThreadSanitizer cannot follow threads started in the child of a multi-threaded fork
// ("dup thread with used id"); run it with "[trace]~[fork]".
TEST_CASE("stacks: one line per stack and file, before the first event naming it, read back", "[trace][stacks][fork]") {
  TempDir dir;
  const std::string path = dir.path + "/s.jsonl";
  auto w = open_writer(trace_config(path));
  // Return addresses: one in a library (an exported function: a symbol), one in no module at all.
  const std::uintptr_t in_libc = reinterpret_cast<std::uintptr_t>(&::write) + 1;
  const std::uintptr_t a[] = {in_libc, 0x10};
  const std::uint32_t id = w->intern_stack(a, 2);
  CHECK(id == 1);
  CHECK(w->intern_stack(a, 2) == id);  // the same frames: the same id
  CHECK(w->intern_stack(a, 1) == 2);   // a prefix is another stack
  CHECK(w->intern_stack(a, 0) == 0);   // nothing captured: no stack
  for (std::uint64_t i = 0; i < 6; ++i) {
    trace::Record r = make_record(0, i);
    r.kind = trace::EventKind::alloc;
    r.stack = i < 4 ? id : 2;
    w->record(r);
  }
  auto forked_child = [&] {
    w->prepare_fork();
    const pid_t child = fork();
    if (child == 0) {
      w->child_after_fork();
      trace::Record r = make_record(1, 0);
      r.kind = trace::EventKind::alloc;
      r.stack = id;  // interned by the parent: its line goes into the child's file too
      w->record(r);
      w->close();
      _exit(0);
    }
    w->parent_after_fork();
    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
    CHECK(status == 0);
    return child;
  };
  // The writer thread wrote the six events itself: it is past its start, so the fork finds no
  // thread starting (under ASan a starting thread holds the sanitizer allocator's lock, which
  // the child would inherit held, and the child's own writer thread would wait for it forever).
  while (w->stats().events < 6) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const pid_t child = forked_child();
  w->close();

  // The raw file: each stack's line once, before the first event that names it.
  std::istringstream lines(slurp(path));
  std::map<std::uint64_t, int> defined;
  std::string line;
  int events_with_stack = 0;
  while (std::getline(lines, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j["type"] == "stack") CHECK(++defined[j["id"].get<std::uint64_t>()] == 1);
    if (j["type"] == "event" && j.contains("stack")) {
      CHECK(defined.count(j["stack"].get<std::uint64_t>()) == 1);
      ++events_with_stack;
    }
  }
  CHECK(events_with_stack == 6);
  CHECK(defined.size() == 2);

  std::unique_ptr<TraceReader> reader;
  std::ifstream in;
  const auto events = read_all(path, &reader, &in);
  REQUIRE(events.size() == 6);
  CHECK(events[0].stack == id);
  CHECK(events[5].stack == 2);
  const Stack* s = reader->stack(id);
  REQUIRE(s != nullptr);
  REQUIRE(s->size() == 2);
  CHECK((*s)[0].pc == in_libc);
  // A library's file (libc's, or the sanitizer runtime's that intercepts write under ASan).
  CHECK((*s)[0].module.find(".so") != std::string::npos);
  CHECK_FALSE((*s)[0].symbol.empty());
  CHECK((*s)[0].symbol_offset == 0);  // pc - 1 is the function's first byte
  CHECK(frame_name((*s)[0]) == (*s)[0].symbol + "+0x0");
  CHECK((*s)[1].module.empty());
  CHECK(frame_name((*s)[1]) == "0x10");
  CHECK(reader->stack(3) == nullptr);
  CHECK(reader->stack(0) == nullptr);

  // The child's file names the stack it used again.
  std::unique_ptr<TraceReader> child_reader;
  std::ifstream child_in;
  const auto child_events = read_all(path + "." + std::to_string(child), &child_reader, &child_in);
  REQUIRE(child_events.size() == 1);
  REQUIRE(child_reader->stack(id) != nullptr);
  CHECK(child_reader->stack(id)->size() == 2);
}

TEST_CASE("a forked child writes a file of its own", "[trace][fork]") {
  TempDir dir;
  const std::string path = dir.path + "/parent.jsonl";  // no %p: the child appends .<pid>
  auto w = open_writer(trace_config(path));
  w->write_device(0, "GPU0", 1ull << 34);
  for (std::uint64_t i = 0; i < 50; ++i) w->record(make_record(0, i));

  // Another thread keeps recording across the fork: the child must not deadlock on it.
  std::atomic<bool> stop{false};
  std::uint64_t busy_count = 0;
  std::thread busy([&] {
    while (!stop.load()) w->record(make_record(5, busy_count++));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(10));

  w->prepare_fork();
  const pid_t child = fork();
  if (child == 0) {
    w->child_after_fork();
    for (std::uint64_t i = 0; i < 30; ++i) w->record(make_record(1, i));
    std::thread t([&] {
      for (std::uint64_t i = 0; i < 20; ++i) w->record(make_record(2, i));
    });
    t.join();
    w->close();
    _exit(0);
  }
  w->parent_after_fork();
  REQUIRE(child > 0);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  for (std::uint64_t i = 50; i < 60; ++i) w->record(make_record(0, i));
  stop = true;
  busy.join();
  w->close();

  {
    std::unique_ptr<TraceReader> reader;
    std::ifstream in;
    const auto events = read_all(path, &reader, &in);
    std::uint64_t mine = 0, busy_seen = 0;
    for (const Event& e : events) {
      CHECK(e.tid != 1001);
      CHECK(e.tid != 1002);
      if (e.tid == 1000) ++mine;
      if (e.tid == 1005) ++busy_seen;
    }
    CHECK(mine == 60);
    CHECK(busy_seen + reader->dropped() == busy_count);
    CHECK(reader->header().pid == getpid());
  }
  {
    const std::string child_path = path + "." + std::to_string(child);
    REQUIRE(exists(child_path));
    std::unique_ptr<TraceReader> reader;
    std::ifstream in;
    const auto events = read_all(child_path, &reader, &in);
    CHECK(reader->header().pid == child);
    CHECK(reader->header().ppid == getpid());
    REQUIRE(reader->footer());
    CHECK(reader->footer()->events == 50);
    CHECK(events.size() == 50);
    for (const Event& e : events) CHECK((e.tid == 1001 || e.tid == 1002));
    REQUIRE(reader->devices().size() == 1);  // the parent's devices, repeated
    CHECK(reader->devices()[0].name == "GPU0");
  }
}

TEST_CASE("a forked child with %p in the path, and one that records nothing", "[trace][fork]") {
  TempDir dir;
  auto w = open_writer(trace_config(dir.path + "/t.%p.jsonl"));
  w->record(make_record(0, 0));
  for (bool records : {true, false}) {
    w->prepare_fork();
    const pid_t child = fork();
    if (child == 0) {
      w->child_after_fork();
      if (records) w->record(make_record(1, 0));
      w->close();
      _exit(0);
    }
    w->parent_after_fork();
    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
    const std::string child_path = dir.path + "/t." + std::to_string(child) + ".jsonl";
    CHECK(exists(child_path) == records);
    if (records) CHECK(read_all(child_path).size() == 1);
  }
  w->close();
  CHECK(read_all(w->path()).size() == 1);
}

TEST_CASE("open refuses a path it cannot write", "[trace]") {
  std::string error;
  CHECK(!TraceWriter::open(trace_config("/nonexistent-cupool-dir/t.jsonl"), &error));
  CHECK(error == "cupool: CUPOOL_TRACE: cannot write the trace to \"/nonexistent-cupool-dir/t.jsonl\": No such file or "
                 "directory");
}

TEST_CASE("open writes no trace through a symbolic link, and makes the file private", "[trace]") {
  TempDir dir;
  const std::string victim = dir.path + "/victim.txt", link = dir.path + "/t.jsonl";
  { std::ofstream(victim) << "precious\n"; }
  REQUIRE(::symlink(victim.c_str(), link.c_str()) == 0);
  std::string error;
  CHECK(!TraceWriter::open(trace_config(link), &error));
  CHECK(error == "cupool: CUPOOL_TRACE: cannot write the trace to \"" + link +
                     "\": it is a symbolic link (cupool does not write through links)");
  CHECK(slurp(victim) == "precious\n");

  // Mode 0600 whatever the umask (a trace holds command lines), also for a file that was there;
  // its old content is gone; the descriptor is not inherited by programs the process runs.
  const std::string path = dir.path + "/u.jsonl";
  { std::ofstream(path) << "an older trace, and more text than the header is long\n"; }
  REQUIRE(::chmod(path.c_str(), 0666) == 0);
  const mode_t old_mask = ::umask(0);
  auto w = open_writer(trace_config(path));
  w->write_device(0, "test device", 1);  // the file is made at the first event or device
  ::umask(old_mask);
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0600);
  int fd_flags = -1;
  for (int fd = 0; fd < 1024; ++fd) {
    char target[4096];
    const ssize_t n = ::readlink(("/proc/self/fd/" + std::to_string(fd)).c_str(), target, sizeof target);
    if (n > 0 && std::string(target, static_cast<std::size_t>(n)) == path) fd_flags = ::fcntl(fd, F_GETFD);
  }
  CHECK(fd_flags == FD_CLOEXEC);
  w->close();
  CHECK(slurp(path).find("an older trace") == std::string::npos);
  CHECK(read_all(path).empty());

  if (::geteuid() == 0) {  // another user's file (root can make one): left alone
    const std::string theirs = dir.path + "/theirs.jsonl";
    { std::ofstream(theirs) << "theirs\n"; }
    REQUIRE(::chown(theirs.c_str(), 65534, 65534) == 0);
    CHECK(!TraceWriter::open(trace_config(theirs), &error));
    CHECK(error.find("it belongs to another user (uid 65534)") != std::string::npos);
    CHECK(slurp(theirs) == "theirs\n");
  }
}

TEST_CASE("reader: a minimal trace, with and without a footer", "[trace]") {
  MemTrace full(header_line() + kEvent + kFooter);
  REQUIRE(full.events.size() == 1);
  const Event& e = full.events[0];
  CHECK(e.kind == trace::EventKind::alloc);
  CHECK(e.api == "cudaMalloc");
  CHECK(e.path == trace::Path::symbol);
  CHECK(e.device == 0);
  CHECK(e.t_ns == 100);
  CHECK(e.tid == 7);
  CHECK(e.size == 4096);
  CHECK(e.ptr == 0x7f00);
  CHECK(!e.has_stream);
  CHECK(!e.has_pool);
  CHECK(e.dur_ns == 12);
  CHECK(full.reader->header().cmdline == std::vector<std::string>{"a", "b c"});
  CHECK(full.reader->header().config["policy"] == "growth");
  REQUIRE(full.reader->footer());
  CHECK(full.reader->footer()->allocs == 1);
  CHECK(full.reader->line_number() == 3);

  MemTrace killed(header_line() + kEvent + kEvent);  // the process was killed: no footer
  CHECK(killed.events.size() == 2);
  CHECK(!killed.reader->footer());

  MemTrace blank(header_line() + "\n" + kEvent + "  \n" + kFooter);
  CHECK(blank.events.size() == 1);
}

TEST_CASE("reader: any key order, escapes, unknown keys and lines of a newer minor version", "[trace]") {
  const std::string shuffled =
      R"({"dur":12,"rc":-2,"future":{"a":[1,{"b":"}"}]},"ptr":"0xFFFFFFFFFFFFFFFF","size":1,"dev":-1,"path":"dlsym",)"
      R"("api":"cuda\u004dalloc\ud83d\ude00","ev":"free","tid":4294967295,"t":0,"type":"event","x":null,"y":-1.5e3,)"
      R"("stream":"0x10","oom":"fragmentation","reserved":9,"free_blocks":3})" "\n";
  MemTrace t(header_line("1.9") + shuffled + R"({"type":"something_new","x":1})" "\n" + kEvent);
  REQUIRE(t.events.size() == 2);
  const Event& e = t.events[0];
  CHECK(e.kind == trace::EventKind::free);
  CHECK(e.api == "cudaMalloc\xf0\x9f\x98\x80");
  CHECK(e.path == trace::Path::dlsym);
  CHECK(e.device == -1);
  CHECK(e.rc == -2);
  CHECK(e.ptr == ~0ull);
  CHECK(e.tid == 4294967295u);
  CHECK(e.has_stream);
  CHECK(e.stream == 0x10);
  CHECK(e.oom_class == trace::OomClass::fragmentation);
  CHECK(e.has_pool);
  CHECK(e.pool.reserved == 9);
  CHECK(e.pool.free_blocks == 3);
  CHECK(e.pool.in_use == 0);
  // The optional fields of one event do not leak into the next.
  CHECK(!t.events[1].has_stream);
  CHECK(!t.events[1].has_pool);
  CHECK(t.events[1].oom_class == trace::OomClass::none);
  CHECK(t.reader->header().minor == 9);

  MemTrace d(header_line() + R"({"type":"device","t":1,"index":2,"name":"X","total_bytes":5})" "\n" +
             R"({"type":"drop","t":2,"tid":3,"count":7})" "\n" + R"({"type":"drop","t":2,"tid":4,"count":5})" "\n");
  REQUIRE(d.reader->devices().size() == 1);
  CHECK(d.reader->devices()[0].index == 2);
  CHECK(d.reader->dropped() == 12);
}

TEST_CASE("reader: bytes that are not UTF-8 become U+FFFD, wherever they are", "[trace]") {
  const std::string bad_header =
      R"({"type":"header","format":"cupool-trace","version":"2.0","cupool_version":"0.1.0","pid":10,"ppid":1,)"
      "\"host\":\"h\xff\",\"cmdline\":[\"python\xc3\",\"ok\xc3\xa9\"],"
      R"("start_unix_ns":5,"start_mono_ns":6,"config":{"policy":"growth"},"devices":[]})" "\n";
  const std::string bad_device = "{\"type\":\"device\",\"t\":1,\"index\":0,\"name\":\"GPU\xe2\x82\",\"total_bytes\":5}\n";
  std::string bad_event = kEvent;
  bad_event.replace(bad_event.find("cudaMalloc"), 10, "cuda\xc0\xafMalloc\xed\xa0\x80");
  MemTrace t(bad_header + bad_device + bad_event);
  const std::string fffd = "\xef\xbf\xbd";
  CHECK(t.reader->header().host == "h" + fffd);
  CHECK(t.reader->header().cmdline == std::vector<std::string>{"python" + fffd, "ok\xc3\xa9"});
  REQUIRE(t.reader->devices().size() == 1);
  CHECK(t.reader->devices()[0].name == "GPU" + fffd + fffd);
  REQUIRE(t.events.size() == 1);
  // Overlong forms and surrogates are not UTF-8 either: one U+FFFD per byte, as the writer does.
  CHECK(t.events[0].api == "cuda" + fffd + fffd + "Malloc" + fffd + fffd + fffd);
  CHECK(valid_utf8("caf\xc3\xa9 \xf0\x9f\x98\x80") == "caf\xc3\xa9 \xf0\x9f\x98\x80");
  CHECK(valid_utf8("\xf4\x90\x80\x80") == fffd + fffd + fffd + fffd);  // above U+10FFFF
  CHECK(valid_utf8("a\xe2\x82") == "a" + fffd + fffd);                  // cut short
}

namespace {

std::string gzip_of(const std::string& text) {
  z_stream z{};
  REQUIRE(deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) == Z_OK);
  std::string out(deflateBound(&z, text.size()) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  z.avail_in = static_cast<uInt>(text.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  REQUIRE(deflate(&z, Z_FINISH) == Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

}  // namespace

TEST_CASE("reader: a gzip trace is read as it is decompressed, recognised by its bytes", "[trace]") {
  std::string text = header_line("2.0");
  for (int i = 0; i < 20000; ++i) text += kEvent;  // several buffers' worth, compressed and not
  text += kFooter;
  MemTrace plain(text);
  MemTrace gz(gzip_of(text));
  CHECK(gz.events.size() == 20000);
  CHECK(gz.events.size() == plain.events.size());
  CHECK(gz.reader->footer().has_value());
  CHECK(std::string(gz.reader->compression()) == "gzip");
  CHECK(std::string(plain.reader->compression()).empty());
  // Members one after another (cat a.gz b.gz), split in the middle of a line.
  const std::size_t half = text.size() / 2 + 3;
  MemTrace members(gzip_of(text.substr(0, half)) + gzip_of(text.substr(half)));
  CHECK(members.events.size() == 20000);
  // Cut short: an error that says so, after the events before the cut.
  const std::string gzipped = gzip_of(text);
  CHECK(error_of(gzipped.substr(0, gzipped.size() - 64)) == "mem: the gzip data ends early (the file is cut short)");
  CHECK(error_of(gzipped.substr(0, 10) + std::string(100, 'x')).rfind("mem: not valid gzip data", 0) == 0);
}

TEST_CASE("reader: open() names the path and what is wrong", "[trace]") {
  TempDir dir;
  auto error_opening = [](const std::string& path) -> std::string {
    try {
      TraceReader::open(path);
    } catch (const TraceError& e) {
      return e.what();
    }
    return "no error";
  };
  CHECK(error_opening(dir.path + "/missing.jsonl") == dir.path + "/missing.jsonl: cannot open: no such file");
  CHECK(error_opening(dir.path) == dir.path + ": is a directory, not a trace");
  { std::ofstream(dir.path + "/t.jsonl.gz", std::ios::binary) << gzip_of(header_line("2.0") + kEvent); }
  auto reader = TraceReader::open(dir.path + "/t.jsonl.gz");
  Event e;
  CHECK(reader->next(e));
  CHECK(!reader->next(e));
  CHECK(reader->bytes_read() == std::filesystem::file_size(dir.path + "/t.jsonl.gz"));
}

TEST_CASE("reader: errors name the source, the line and the problem", "[trace]") {
  CHECK(error_of("") == "mem: the file is empty; not a cupool trace");
  CHECK(error_of("hello\n") == "mem:1: the first line is not JSON; not a cupool trace");
  CHECK(error_of(R"({"type":"event"})" "\n") == "mem:1: the first line is not a cupool trace header");
  CHECK(error_of(header_line("4.0") + kEvent) ==
        "mem: trace format version 4.0 is newer than this cupool understands (3.x); upgrade cupool");
  CHECK(error_of(header_line("0.9")) == "mem: trace format version 0.9 is older than this cupool reads (1.x to 3.x)");
  CHECK(error_of(header_line("one")) == "mem:1: header field \"version\": \"one\" is not \"MAJOR.MINOR\"");
  CHECK(error_of(R"({"type":"header","format":"cupool-trace","version":"1.0"})" "\n") ==
        "mem:1: header has no \"cupool_version\"");

  // Stack lines (format 3.3): broken ones are named by their line.
  CHECK(error_of(header_line() + R"({"type":"stack","id":1,"frames":[{"pc":"12"}]})" "\n") ==
        "mem:2: stack frame field \"pc\": expected \"0x...\"");
  CHECK(error_of(header_line() + R"({"type":"stack","id":0,"frames":[{"pc":"0x12"}]})" "\n") ==
        "mem:2: stack line field \"id\": 0 is out of range (1 to 65536)");
  CHECK(error_of(header_line() + R"({"type":"stack","id":1,"frames":[]})" "\n") == "mem:2: stack line: no frames");
  CHECK(error_of(header_line() + R"({"type":"stack","id":1,"frames":[{"pc":"0x1ffffffffffffffff"}]})" "\n") ==
        "mem:2: stack frame field \"pc\": expected \"0x...\" (64 bits)");
  CHECK(error_of(header_line() + R"({"type":"stack","id":65537,"frames":[{"pc":"0x12"}]})" "\n") ==
        "mem:2: stack line field \"id\": 65537 is out of range (1 to 65536)");
  CHECK(error_of(header_line() + R"({"type":"stack","id":1})" "\n") == "mem:2: stack line has no \"frames\"");
  CHECK(error_of(header_line() + with_field(kEvent, R"("stack":0)")) ==
        "mem:2: event field \"stack\": expected a stack id (1 to 65536)");

  // Broken JSON, with its line number.
  CHECK(error_of(header_line() + kEvent + "{\"type\":\"event\",\"t\":1,,}\n").rfind("mem:3: ", 0) == 0);
  CHECK(error_of(header_line() + kEvent + "{\"type\":\"device\",\n").rfind("mem:3: not valid JSON: ", 0) == 0);
  CHECK(error_of(header_line() + "[1,2]\n") == "mem:2: not a JSON object");
  CHECK(error_of(header_line() + "{\"t\":1}\n") == "mem:2: a line without \"type\"");

  // Missing fields and wrong types.
  auto without = [](const std::string& key) {
    std::string line = kEvent;
    const auto at = line.find("\"" + key + "\":");
    const auto comma = line.find_first_of(",}", line.find(':', at));
    line.erase(at, comma - at + (line[comma] == ',' ? 1 : 0));
    if (line[line.size() - 3] == ',') line.erase(line.size() - 3, 1);
    return line;
  };
  for (const char* key : {"t", "tid", "ev", "api", "path", "dev", "size", "ptr", "rc", "dur"}) {
    INFO(key);
    CHECK(error_of(header_line() + without(key)) == "mem:2: event has no \"" + std::string(key) + "\"");
  }
  // From 2.0 on a call may be untimed (no "dur"), but "timed_for" needs a "dur".
  CHECK(error_of(header_line("2.0") + without("dur")) == "no error");
  CHECK(error_of(header_line("2.0") + with_field(without("dur"), "\"timed_for\":16")) ==
        "mem:2: event has \"timed_for\" but no \"dur\"");
  CHECK(error_of(header_line("2.0") + with_field(kEvent, "\"timed_for\":0")) ==
        "mem:2: event field \"timed_for\": expected a call count from 1 (32 bits)");
  auto with = [](const std::string& from, const std::string& to) {
    std::string line = kEvent;
    line.replace(line.find(from), from.size(), to);
    return header_line() + line;
  };
  CHECK(error_of(with("\"t\":100", "\"t\":\"100\"")) == "mem:2: event field \"t\": expected a non-negative integer");
  CHECK(error_of(with("\"t\":100", "\"t\":-1")) == "mem:2: event field \"t\": expected a non-negative integer");
  CHECK(error_of(with("\"t\":100", "\"t\":1.5")) == "mem:2: event field \"t\": expected a non-negative integer");
  CHECK(error_of(with("\"t\":100", "\"t\":18446744073709551616")) ==
        "mem:2: event field \"t\": expected a non-negative integer");
  CHECK(error_of(with("\"ev\":\"alloc\"", "\"ev\":\"allot\"")) == "mem:2: event field \"ev\": unknown value \"allot\"");
  CHECK(error_of(with("\"ev\":\"alloc\"", "\"ev\":3")) == "mem:2: event field \"ev\": expected a string at column 38");
  CHECK(error_of(with("\"ptr\":\"0x7f00\"", "\"ptr\":\"7f00\"")) == "mem:2: event field \"ptr\": expected an address \"0x...\"");
  CHECK(error_of(with("\"dev\":0", "\"dev\":-2")) == "mem:2: event field \"dev\": expected a device index (-1 when unknown)");
  CHECK(error_of(with("\"rc\":0", "\"rc\":4294967296")) == "mem:2: event field \"rc\": expected an integer result code");
  CHECK(error_of(with("\"tid\":7", "\"tid\":4294967296")) == "mem:2: event field \"tid\": expected a thread id (32 bits)");
  CHECK(error_of(with("\"dur\":12}", "\"dur\":12} x")) == "mem:2: text after the end of the object at column 133");
  CHECK(error_of(with("\"api\":\"cudaMalloc\"", "\"api\":\"a\\qb\"")) == "mem:2: event field \"api\": a bad escape in a string");

  // Footer and device lines.
  CHECK(error_of(header_line() + kFooter + kEvent) == "mem:3: a line after the footer");
  CHECK(error_of(header_line() + R"({"type":"footer","events":1})" "\n") == "mem:2: footer has no \"dropped\"");
  CHECK(error_of(header_line() + R"({"type":"device","index":"0","name":"x","total_bytes":1})" "\n") ==
        "mem:2: device line field \"index\": expected an integer");
  CHECK(error_of(header_line() + header_line()) == "mem:2: a second header line");

  // A last line cut short (the process was killed in the middle of a write).
  const std::string cut = kEvent.substr(0, 60);
  CHECK(error_of(header_line() + kEvent + cut).rfind("mem:3: the last line is cut short (was the process killed while writing?): ", 0) == 0);
  // ...but a complete last line without its newline is fine.
  CHECK(MemTrace(header_line() + kEvent + kFooter.substr(0, kFooter.size() - 1)).reader->footer());
}

TEST_CASE("reader fuzz: mutated lines are read or refused with TraceError, never worse", "[trace]") {
  std::vector<std::string> seeds = {
      kEvent,
      kFooter,
      R"({"type":"event","t":100,"tid":7,"ev":"free","api":"cu\"M\\em\u0041","path":"proc-address","dev":-1,"size":1,"ptr":"0x0","stream":"0xabc","rc":2,"dur":12,"oom":"limit","reserved":1,"in_use":2,"largest_free":3,"quarantined":4,"free_blocks":5,"extra":[{"x":[1,2,{"y":"]"}]}]})" "\n",
      R"({"type":"device","t":1,"index":2,"name":"X\n","total_bytes":5})" "\n",
      R"({"type":"drop","t":2,"tid":3,"count":7})" "\n",
  };
  std::mt19937_64 rng(12345);
  const std::string specials = "{}[]\":,\\0-+.eE \t\x01\xff\x80uxn";
  auto mutate = [&](std::string s) {
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < edits && !s.empty(); ++k) {
      const std::size_t at = rng() % s.size();
      switch (rng() % 6) {
        case 0: s[at] = static_cast<char>(rng()); break;
        case 1: s[at] = specials[rng() % specials.size()]; break;
        case 2: s.insert(at, 1, specials[rng() % specials.size()]); break;
        case 3: s.erase(at, 1 + rng() % 8); break;
        case 4: s.insert(at, s.substr(rng() % s.size(), rng() % 16)); break;
        case 5: s.resize(at); break;
      }
    }
    return s;
  };
  std::uint64_t ok = 0, refused = 0;
  for (int iter = 0; iter < 30000; ++iter) {
    std::string text;
    if (iter % 10 == 0) {
      text = mutate(header_line()) + kEvent;
    } else {
      text = header_line();
      for (int l = 0; l < 3; ++l) text += mutate(seeds[rng() % seeds.size()]);
    }
    try {
      MemTrace t(text);
      ++ok;
    } catch (const TraceError&) {
      ++refused;
    } catch (const std::exception& e) {
      FAIL("not a TraceError: " << e.what() << "\n" << text);
    }
  }
  CHECK(ok > 0);
  CHECK(refused > 0);
}

TEST_CASE("docs/trace-format.md names every key, line type and value of the schema", "[trace]") {
  const char* root = std::getenv("CUPOOL_SOURCE_ROOT");
  if (root == nullptr) {
    WARN("CUPOOL_SOURCE_ROOT is not set: docs/trace-format.md not checked against trace_schema.h");
    return;
  }
  const std::string doc = slurp(std::string(root) + "/docs/trace-format.md");
  REQUIRE(!doc.empty());
  auto named = [&](std::string_view word) { return doc.find("`" + std::string(word) + "`") != std::string::npos; };
  for (auto k : {trace::key::type, trace::key::t, trace::key::tid, trace::key::ev, trace::key::api, trace::key::path,
                 trace::key::dev, trace::key::size, trace::key::ptr, trace::key::stream, trace::key::rc, trace::key::dur,
                 trace::key::oom_class, trace::key::reserved, trace::key::in_use, trace::key::largest_free,
                 trace::key::quarantined, trace::key::free_blocks, trace::key::flags, trace::key::cached, trace::key::name,
                 trace::key::timed_for, trace::key::recycled, trace::key::handle, trace::key::offset,
                 trace::key::granules, trace::key::stack})
    CHECK(named(k));
  namespace sk = trace::stack_key;
  for (const char* k : {sk::id, sk::frames, sk::pc, sk::module, sk::offset, sk::symbol, sk::symbol_offset}) CHECK(named(k));
  namespace hk = trace::header_key;
  namespace fk = trace::footer_key;
  namespace dk = trace::device_key;
  for (const char* k : {hk::format, hk::version, hk::cupool_version, hk::pid, hk::ppid, hk::host, hk::cmdline,
                        hk::start_unix_ns, hk::start_mono_ns, hk::config, hk::devices, dk::index, dk::name,
                        dk::total_bytes, trace::drop_key::count, fk::events, fk::dropped, fk::allocs, fk::frees,
                        fk::ooms, fk::end_mono_ns, fk::devices})
    CHECK(named(k));
  for (auto n : trace::kEventKindNames) CHECK(named(n));
  for (auto n : trace::kPathNames) CHECK(named(n));
  for (auto n : trace::kOomClassNames) CHECK(named(n));
  for (auto n : {trace::line::header, trace::line::event, trace::line::device, trace::line::drop, trace::line::stack,
                 trace::line::footer})
    CHECK(named(n));
  CHECK(doc.find("Version " + std::to_string(trace::kFormatMajor) + "." + std::to_string(trace::kFormatMinor)) !=
        std::string::npos);
}
