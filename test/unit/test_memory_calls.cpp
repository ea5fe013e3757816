// The table of allocation APIs (policy/memory_calls.h) is the one list the shim and replay share:
// every API in it is hooked (shim/hooks.def), every allocation API hooked is in it, and replay
// serves each as its line says (a pool or the driver), with nothing of its own to edit.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "memory_calls.h"
#include "replay.h"
#include "trace_input.h"
#include "trace_writer.h"

using namespace cupool;

namespace {

std::string source_root() {
  const char* root = std::getenv("CUPOOL_SOURCE_ROOT");
  return root ? root : ".";
}

// Every symbol hooks.def hooks, and (`bases`) the base names cuGetProcAddress hands them out under.
std::set<std::string> hooked_names(std::set<std::string>* bases) {
  std::ifstream in(source_root() + "/shim/hooks.def");
  REQUIRE(in);
  std::stringstream text;
  text << in.rdbuf();
  const std::string s = text.str();
  std::set<std::string> names;
  // Lines `CUPOOL_RUNTIME_HOOK(name, ...)` / `CUPOOL_DRIVER_HOOK(name, base, ...)`: read by hand
  // (std::regex trips a false -Wmaybe-uninitialized of GCC 12's <regex> under ASan).
  auto identifier = [](const std::string& line, std::size_t* at) {
    std::size_t end = *at;
    while (end < line.size() && (std::isalnum(static_cast<unsigned char>(line[end])) || line[end] == '_')) ++end;
    std::string word = line.substr(*at, end - *at);
    *at = end;
    return word;
  };
  std::istringstream lines(s);
  for (std::string line; std::getline(lines, line);) {
    std::size_t at = 0;
    for (const char* prefix : {"CUPOOL_RUNTIME_HOOK(", "CUPOOL_DRIVER_HOOK("})
      if (line.rfind(prefix, 0) == 0) at = std::string(prefix).size();
    if (at == 0) continue;
    const std::string name = identifier(line, &at);
    if (name.empty()) continue;
    names.insert(name);
    if (at < line.size() && line[at] == ',') {
      ++at;
      while (at < line.size() && std::isspace(static_cast<unsigned char>(line[at]))) ++at;
      if (std::string base = identifier(line, &at); !base.empty()) bases->insert(base);
    }
  }
  REQUIRE(names.count("cudaMalloc"));
  return names;
}

}  // namespace

TEST_CASE("every API of the table is hooked, and every allocation API hooked is in the table", "[memory_calls]") {
  std::set<std::string> bases;
  const std::set<std::string> hooked = hooked_names(&bases);
  std::set<std::string> table;
  for (const MemoryCall& c : kMemoryCalls) {
    INFO(c.name);
    CHECK(table.insert(c.name).second);  // once
    CHECK((hooked.count(c.name) || bases.count(c.name)));
    CHECK(find_memory_call(c.name) == &c);
  }
  // An allocation API, by its name: memory of the device, managed memory, arrays, VMM memory.
  auto allocates = [](const std::string& n) {
    return n.rfind("cudaMalloc", 0) == 0 || n.rfind("cuMemAlloc", 0) == 0 || n == "cuMemCreate" ||
           (n.rfind("cu", 0) == 0 && n.find("ArrayCreate") != std::string::npos);
  };
  for (const std::string& name : hooked) {
    INFO(name);
    if (allocates(name)) CHECK(table.count(name));
  }
  CHECK(find_memory_call("cudaMallocHost_not_an_api") == nullptr);
  CHECK(memory_call(MemoryApi::cudaMalloc).serve == Serve::pool);
  CHECK(!memory_call(MemoryApi::cudaMallocManaged).on_device());
}

TEST_CASE("replay serves every API of the table as its line says, with no list of its own", "[memory_calls]") {
  char dir[] = "/tmp/cupool-calls-test-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  std::string path;
  {
    Config c;
    c.trace_path = std::string(dir) + "/t.jsonl";
    std::string error;
    auto w = TraceWriter::open(c, &error);
    INFO(error);
    REQUIRE(w);
    w->write_device(0, "simulated", 80ull << 30);
    w->close();
    path = w->path();
  }
  for (const PolicyKind kind : {PolicyKind::growth, PolicyKind::passthrough}) {
    for (const MemoryCall& call : kMemoryCalls) {
      if (call.serve == Serve::mapping) continue;  // cuMemCreate is a vmm_create event of its own
      INFO(call.name << (kind == PolicyKind::growth ? " under growth" : " under passthrough"));
      tools::ReplayOptions options;
      Config config;
      config.policy = kind;
      options.policies.push_back(tools::ReplayPolicy{"p", config});
      tools::Replayer replayer(std::move(options));
      tools::TraceInput input(path);
      Event e;
      e.kind = trace::EventKind::alloc;
      e.api = call.name;
      e.size = 1 << 20;
      e.ptr = 0x7f0000000000;
      e.device = 0;
      e.t_ns = 1000;
      replayer.visit(0, e, input);
      const tools::DeviceStats& d = replayer.analysis(0).sources().at(0).devices.at(0);
      CHECK(d.allocs == 1);
      CHECK(d.failed_allocs == 0);
      CHECK((d.grows > 0) == (call.serve == Serve::pool && kind == PolicyKind::growth));
    }
  }
  (void)std::system(("rm -rf '" + std::string(dir) + "'").c_str());
}
