// The device's admission chain (policy/device_admission.h) as ProcessMemory drives it for the
// shim and replay: the cap, then the shared budget, for a pool's chunks and for memory outside
// the pools; the refusal's class; the oom event both record; and the pools giving back through
// the interface they register, never called by name.
#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "process_memory.h"
#include "shared_budget.h"
#include "sim_upstream.h"
#include "trace_schema.h"

using namespace cupool;
using trace::OomClass;

namespace {

constexpr std::uint64_t MiB = 1ull << 20;
constexpr std::uint64_t GiB = 1ull << 30;

class OomSink : public PoolObserver {
 public:
  void pool_event(const PoolEvent& e) override {
    std::lock_guard lock(mu);
    if (e.kind == PoolEvent::Kind::oom) ooms.push_back(e);
  }
  std::mutex mu;
  std::vector<PoolEvent> ooms;
};

Config growth_cfg(std::uint64_t chunk) {
  Config c;
  c.policy = PolicyKind::growth;
  c.free_mode = FreeMode::sync;
  c.growth_chunk = chunk;
  c.growth_chunk_max = chunk;
  c.share_wait_ns = 0;  // a refusal at once: these tests wait for no one
  return c;
}

// One process's memory on one simulated device of `capacity`.
struct Process {
  Process(const Config& cfg, std::uint64_t capacity, SharedBudget* share = nullptr)
      : up(capacity), memory(cfg, &sink, nullptr, share) {
    memory.set_warnings(false);
    c = memory.find_or_add(1, [&](ContextMemory& m) {
      m.device = 0;
      m.upstream = &up;
      return true;
    });
    REQUIRE(c != nullptr);
  }
  // A driver allocation outside the pools (cudaMallocManaged, say) of `bytes` at key `key`.
  OutsideAnswer outside(std::uint64_t bytes, std::uint64_t key) {
    return memory.allocate_outside(c, bytes, "cuMemAllocManaged", [&](std::uint64_t* made) {
      *made = key;
      return OutsideAnswer::ok;
    });
  }
  SimUpstream up;
  OomSink sink;
  ProcessMemory memory;
  ContextMemory* c = nullptr;
};

std::unique_ptr<SharedBudget> private_budget(std::uint64_t bytes) {
  LimitSpec limit;
  limit.all = SizeSpec{bytes, 0};
  std::string error;
  auto b = SharedBudget::create_private(limit, &error);
  INFO(error);
  REQUIRE(b != nullptr);
  return b;
}

}  // namespace

TEST_CASE("admission: a refusal outside the pools is an oom event of the cap's class, as a pool's is",
          "[admission]") {
  SECTION("with a limit: class limit") {
    Config cfg = growth_cfg(32 * MiB);
    cfg.limit.all = SizeSpec{100 * MiB, 0};
    Process p(cfg, 4 * GiB);
    CHECK(p.outside(80 * MiB, 0x1000) == OutsideAnswer::ok);
    CHECK(p.outside(40 * MiB, 0x2000) == OutsideAnswer::refused_by_cap);
    CHECK(p.memory.refusal_class(OutsideAnswer::refused_by_cap, 0) == OomClass::limit);
    REQUIRE(p.sink.ooms.size() == 1);
    CHECK(p.sink.ooms[0].oom == OomClass::limit);
    CHECK(p.sink.ooms[0].size == 40 * MiB);
    CHECK(p.sink.ooms[0].device == 0);
    // The pool refuses past the same cap, with the same class.
    const AllocResult r = p.memory.allocate(*p.c, 32 * MiB, "cudaMalloc");
    CHECK(r.ptr == 0);
    CHECK(r.oom == OomClass::limit);
    // Given back, the room is there again.
    std::uint64_t bytes = 0;
    CHECK(p.memory.forget_outside(0x1000, &bytes));
    CHECK(bytes == 80 * MiB);
    CHECK(p.c->pool->admission().charged() == 0);
    CHECK(p.outside(90 * MiB, 0x3000) == OutsideAnswer::ok);
  }
  SECTION("without one: the cap is the device's size, and the refusal the device's") {
    Process p(growth_cfg(32 * MiB), 256 * MiB);
    CHECK(p.outside(200 * MiB, 0x1000) == OutsideAnswer::ok);
    CHECK(p.outside(100 * MiB, 0x2000) == OutsideAnswer::refused_by_cap);
    CHECK(p.memory.refusal_class(OutsideAnswer::refused_by_cap, 0) == OomClass::device);
    REQUIRE(p.sink.ooms.size() == 1);
    CHECK(p.sink.ooms[0].oom == OomClass::device);
  }
}

TEST_CASE("admission: the shared budget admits the pools' chunks and memory outside them alike", "[admission][share]") {
  auto budget = private_budget(96 * MiB);
  Process p(growth_cfg(32 * MiB), 4 * GiB, budget.get());
  DeviceAdmission& admission = p.c->pool->admission();
  CHECK(admission.share() == budget.get());

  const AllocResult a = p.memory.allocate(*p.c, MiB, "cudaMalloc");
  REQUIRE(a.ptr != 0);
  CHECK(budget->held_mine(0) == 32 * MiB);  // the pool's chunk
  CHECK(p.outside(48 * MiB, 0x1000) == OutsideAnswer::ok);
  CHECK(budget->held_mine(0) == 80 * MiB);
  CHECK(admission.outside() == 48 * MiB);

  // No room in the budget: refused, class share, for either.
  CHECK(p.outside(32 * MiB, 0x2000) == OutsideAnswer::refused_by_share);
  CHECK(p.memory.refusal_class(OutsideAnswer::refused_by_share, 0) == OomClass::share);
  const AllocResult b = p.memory.allocate(*p.c, 40 * MiB, "cudaMalloc");
  CHECK(b.ptr == 0);
  CHECK(b.oom == OomClass::share);
  REQUIRE(p.sink.ooms.size() >= 2);
  CHECK(p.sink.ooms.front().oom == OomClass::share);  // the outside refusal's, recorded as the pool's is
  CHECK(p.sink.ooms.back().oom == OomClass::share);
  CHECK(admission.charged() == 80 * MiB);  // a refusal by the budget leaves the cap's account as it was
  CHECK(budget->held_mine(0) == 80 * MiB);

  // The budget gets back what the driver gets back.
  CHECK(p.memory.forget_outside(0x1000));
  CHECK(budget->held_mine(0) == 32 * MiB);
  p.memory.free(*p.c, a.ptr, "cudaFree", nullptr, nullptr);
  p.c->pool->trim();
  CHECK(budget->held_mine(0) == 0);
  CHECK(admission.charged() == 0);
}

TEST_CASE("admission: short of room, the device's pools give back through the interface they register",
          "[admission][share]") {
  SECTION("the cap: a wholly free chunk goes back before memory outside the pools is refused") {
    Config cfg = growth_cfg(64 * MiB);
    cfg.limit.all = SizeSpec{100 * MiB, 0};
    Process p(cfg, 4 * GiB);
    const AllocResult a = p.memory.allocate(*p.c, MiB, "cudaMalloc");
    REQUIRE(a.ptr != 0);
    p.memory.free(*p.c, a.ptr, "cudaFree", nullptr, nullptr);
    CHECK(p.c->pool->state().reserved == 64 * MiB);
    CHECK(p.outside(80 * MiB, 0x1000) == OutsideAnswer::ok);
    CHECK(p.c->pool->state().reserved == 0);
    CHECK(p.sink.ooms.empty());
  }
  SECTION("the shared budget: the same, before the budget refuses") {
    auto budget = private_budget(100 * MiB);
    Process p(growth_cfg(64 * MiB), 4 * GiB, budget.get());
    const AllocResult a = p.memory.allocate(*p.c, MiB, "cudaMalloc");
    REQUIRE(a.ptr != 0);
    p.memory.free(*p.c, a.ptr, "cudaFree", nullptr, nullptr);
    CHECK(budget->held_mine(0) == 64 * MiB);
    CHECK(p.outside(80 * MiB, 0x1000) == OutsideAnswer::ok);
    CHECK(p.c->pool->state().reserved == 0);
    CHECK(budget->held_mine(0) == 80 * MiB);
    CHECK(p.sink.ooms.empty());
  }
  SECTION("two contexts of one device hold one admission: one's idle chunk makes room outside the other") {
    Config cfg = growth_cfg(64 * MiB);
    cfg.limit.all = SizeSpec{100 * MiB, 0};
    Process p(cfg, 4 * GiB);
    ContextMemory* other = p.memory.find_or_add(2, [&](ContextMemory& m) {
      m.device = 0;
      m.upstream = &p.up;
      return true;
    });
    REQUIRE(other != nullptr);
    CHECK(&other->pool->admission() == &p.c->pool->admission());
    const AllocResult a = p.memory.allocate(*p.c, MiB, "cudaMalloc");
    REQUIRE(a.ptr != 0);
    p.memory.free(*p.c, a.ptr, "cudaFree", nullptr, nullptr);
    const OutsideAnswer b = p.memory.allocate_outside(other, 64 * MiB, "cuMemAllocManaged", [](std::uint64_t* made) {
      *made = 0x1000;
      return OutsideAnswer::ok;
    });
    CHECK(b == OutsideAnswer::ok);  // 64 + 64 would pass 100: the first context's idle chunk went back
    CHECK(p.c->pool->state().reserved == 0);
    CHECK(p.sink.ooms.empty());
  }
}

TEST_CASE("admission: a context that goes gives its admission back everything it held", "[admission][share]") {
  auto budget = private_budget(GiB);
  Process p(growth_cfg(32 * MiB), 4 * GiB, budget.get());
  REQUIRE(p.memory.allocate(*p.c, MiB, "cudaMalloc").ptr != 0);
  CHECK(p.outside(16 * MiB, 0x1000) == OutsideAnswer::ok);
  DeviceAdmission& admission = p.c->pool->admission();
  CHECK(admission.charged() == 48 * MiB);
  CHECK(budget->held_mine(0) == 48 * MiB);
  p.memory.drop(1, nullptr);
  CHECK(admission.charged() == 0);
  CHECK(admission.outside() == 0);
  CHECK(budget->held_mine(0) == 0);
}
