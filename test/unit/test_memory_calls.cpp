// The table of allocation APIs (policy/memory_calls.h) is the one list the shim and replay share:
// every API in it is hooked (shim/hooks.def), every allocation API hooked is in it, and replay
// serves each as its line says (a pool or the driver), with nothing of its own to edit.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <regex>
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
  const std::regex hook(R"(^CUPOOL_(?:RUNTIME|DRIVER)_HOOK\((\w+)(?:,\s*(\w+))?)", std::regex::multiline);
  for (auto it = std::sregex_iterator(s.begin(), s.end(), hook); it != std::sregex_iterator(); ++it) {
    names.insert((*it)[1]);
    if ((*it)[2].matched) bases->insert((*it)[2]);
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
  const std::regex allocates(R"(^(cudaMalloc\w*|cuMemAlloc\w*|cuMemCreate|cu\w*ArrayCreate\w*)$)");
  for (const std::string& name : hooked) {
    INFO(name);
    if (std::regex_match(name, allocates)) CHECK(table.count(name));
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
