#include <catch2/catch.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "context_pool.h"
#include "trace_schema.h"
#include "sim_upstream.h"

using namespace cupool;
using trace::EventKind;
using trace::OomClass;

namespace {

constexpr std::uint64_t MiB = 1ull << 20;
constexpr std::uint64_t GiB = 1ull << 30;

// The pool's events, as the trace writer would write them.
class RecordingSink : public PoolObserver {
 public:
  void pool_event(const PoolEvent& e) override {
    std::lock_guard lock(mu);
    events.push_back(trace::record_of(e));
  }
  std::vector<trace::Record> of(EventKind k) {
    std::lock_guard lock(mu);
    std::vector<trace::Record> out;
    for (const auto& e : events)
      if (e.kind == k) out.push_back(e);
    return out;
  }
  std::mutex mu;
  std::vector<trace::Record> events;
};

struct FakeClock {
  std::uint64_t t = 1'000'000;
  static std::uint64_t read(void* self) { return static_cast<FakeClock*>(self)->t; }
};

// Sync frees unless a test asks for deferred ones (the options' default).
Config growth_config(std::uint64_t chunk = 32 * MiB, std::uint64_t chunk_max = 128 * MiB) {
  Config c;
  c.policy = PolicyKind::growth;
  c.free_mode = FreeMode::sync;
  c.growth_chunk = chunk;
  c.growth_chunk_max = chunk_max;
  return c;
}

Config with_limit(Config c, std::uint64_t bytes) {
  c.limit.all = SizeSpec{bytes, 0};
  return c;
}

}  // namespace

TEST_CASE("pool: growth takes doubling chunks, large requests get their own size", "[pool]") {
  SimUpstream up(4 * GiB);
  RecordingSink sink;
  ContextPool pool(growth_config(32 * MiB, 128 * MiB), 3, up, &sink);
  CHECK(pool.state().reserved == 0);

  AllocResult a = pool.allocate(1 * MiB);
  REQUIRE(a.ptr != 0);
  CHECK(a.oom == OomClass::none);
  CHECK(pool.state().reserved == 32 * MiB);
  CHECK(pool.state().in_use == 1 * MiB);
  auto grows = sink.of(EventKind::grow);
  REQUIRE(grows.size() == 1);
  CHECK(grows[0].size == 32 * MiB);
  CHECK(grows[0].api == std::string("pool"));
  CHECK(grows[0].has_pool);
  CHECK(grows[0].device == 3);
  CHECK(grows[0].pool.reserved == 32 * MiB);
  CHECK(grows[0].pool.in_use == 1 * MiB);
  CHECK(grows[0].t_ns > 0);

  // Filling the first chunk makes the next miss take 64 MiB, then 128 MiB, then 128 MiB again.
  REQUIRE(pool.allocate(31 * MiB).ptr != 0);
  REQUIRE(pool.allocate(1 * MiB).ptr != 0);
  CHECK(pool.state().reserved == (32 + 64) * MiB);
  REQUIRE(pool.allocate(63 * MiB).ptr != 0);
  REQUIRE(pool.allocate(1 * MiB).ptr != 0);
  CHECK(pool.state().reserved == (32 + 64 + 128) * MiB);
  REQUIRE(pool.allocate(127 * MiB).ptr != 0);
  REQUIRE(pool.allocate(1 * MiB).ptr != 0);
  CHECK(pool.state().reserved == (32 + 64 + 128 + 128) * MiB);
  // A request above the step gets round_up(size, 2 MiB).
  REQUIRE(pool.allocate(300 * MiB + 5).ptr != 0);
  CHECK(sink.of(EventKind::grow).back().size == 302 * MiB);
  CHECK(up.counters().reserve_calls == 5);
}

TEST_CASE("pool: the cap bounds growth; a short chunk is taken when the step does not fit", "[pool]") {
  SimUpstream up(4 * GiB);
  RecordingSink sink;
  ContextPool pool(with_limit(growth_config(64 * MiB, 512 * MiB), 100 * MiB), 0, up, &sink);
  CHECK(pool.cap() == 100 * MiB);
  REQUIRE(pool.allocate(64 * MiB).ptr != 0);  // chunk 1: 64 MiB; step is now 128 MiB
  AllocResult b = pool.allocate(10 * MiB);    // only 36 MiB left under the cap: take that
  REQUIRE(b.ptr != 0);
  CHECK(pool.state().reserved == 100 * MiB);
  REQUIRE(pool.allocate(26 * MiB).ptr != 0);  // fits in the short chunk
  AllocResult c = pool.allocate(1 * MiB);
  CHECK(c.ptr == 0);
  CHECK(c.oom == OomClass::limit);
  auto ooms = sink.of(EventKind::oom);
  REQUIRE(ooms.size() == 1);
  CHECK(ooms[0].oom_class == OomClass::limit);
  CHECK(ooms[0].size == 1 * MiB);
  CHECK(ooms[0].pool.reserved == 100 * MiB);
  CHECK(ooms[0].has_pool);
}

TEST_CASE("pool: wholly free chunks are given back before reporting out of memory", "[pool]") {
  SECTION("the driver is full") {
    SimUpstream up(256 * MiB);
    RecordingSink sink;
    ContextPool pool(growth_config(64 * MiB, 64 * MiB), 0, up, &sink);
    std::vector<std::uint64_t> p;
    for (int i = 0; i < 4; ++i) p.push_back(pool.allocate(64 * MiB).ptr);
    for (auto x : p) REQUIRE(x != 0);
    CHECK(pool.state().reserved == 256 * MiB);
    pool.deallocate(p[2]);  // adjacent on the device: the driver can give 128 MiB once they are back
    pool.deallocate(p[3]);
    AllocResult big = pool.allocate(128 * MiB);
    REQUIRE(big.ptr != 0);
    CHECK(sink.of(EventKind::release).size() == 2);
    CHECK(pool.state().reserved == 256 * MiB);
    CHECK(up.counters().release_calls == 2);
  }
  SECTION("the cap is reached") {
    SimUpstream up(4 * GiB);
    ContextPool pool(with_limit(growth_config(64 * MiB, 64 * MiB), 128 * MiB), 0, up, nullptr);
    std::uint64_t a = pool.allocate(64 * MiB).ptr;
    std::uint64_t b = pool.allocate(64 * MiB).ptr;
    REQUIRE(a != 0);
    REQUIRE(b != 0);
    pool.deallocate(a);
    pool.deallocate(b);
    AllocResult big = pool.allocate(128 * MiB);
    REQUIRE(big.ptr != 0);
    CHECK(pool.state().reserved == 128 * MiB);
  }
}

TEST_CASE("pool: a chunk wholly free for release_idle_ns is given back", "[pool]") {
  SimUpstream up(4 * GiB);
  RecordingSink sink;
  Config cfg = growth_config(64 * MiB, 64 * MiB);
  cfg.release_idle_ns = 1000;
  FakeClock clock;
  ContextPool pool(cfg, 0, up, &sink);
  pool.set_clock(&FakeClock::read, &clock);

  std::uint64_t x = pool.allocate(64 * MiB).ptr;  // chunk 1
  std::uint64_t y = pool.allocate(64 * MiB).ptr;  // chunk 2
  REQUIRE(x != 0);
  REQUIRE(y != 0);
  clock.t += 100;
  pool.deallocate(x);  // chunk 1 idle from here
  clock.t += 800;
  pool.deallocate(y);  // chunk 2 idle from here
  clock.t += 150;      // chunk 1 idle 950 ns: not yet
  CHECK(pool.block_size(pool.allocate(0).ptr) == 0);  // size 0 touches nothing
  std::uint64_t z = pool.allocate(512).ptr;
  REQUIRE(z != 0);
  CHECK(up.counters().release_calls == 0);
  pool.deallocate(z);
  clock.t += 60;  // chunk 1 idle 1010 ns, chunk 2 (freed again just now) 60 ns
  std::uint64_t w = pool.allocate(512).ptr;
  REQUIRE(w != 0);
  CHECK(up.counters().release_calls == 1);
  CHECK(pool.state().reserved == 64 * MiB);
  REQUIRE(sink.of(EventKind::release).size() == 1);
  CHECK(sink.of(EventKind::release)[0].pool.reserved == 64 * MiB);
  pool.deallocate(w);
  clock.t += 2000;
  pool.deallocate(pool.allocate(512).ptr);  // the check on allocate releases the other one...
  CHECK(up.counters().release_calls == 2);  // ...before the allocation grows a new chunk
  CHECK(up.counters().reserve_calls == 3);
}

TEST_CASE("pool: no idle release unless configured", "[pool]") {
  SimUpstream up(4 * GiB);
  FakeClock clock;
  ContextPool pool(growth_config(), 0, up, nullptr);
  pool.set_clock(&FakeClock::read, &clock);
  pool.deallocate(pool.allocate(MiB).ptr);
  clock.t += 1'000'000'000'000ull;
  pool.deallocate(pool.allocate(MiB).ptr);
  CHECK(up.counters().release_calls == 0);
  CHECK(pool.state().reserved == 32 * MiB);
}

TEST_CASE("pool: preallocate reserves once and never grows past it", "[pool]") {
  SimUpstream up(1 * GiB);
  RecordingSink sink;
  Config cfg;
  cfg.policy = PolicyKind::preallocate;
  cfg.preallocate = SizeSpec{256 * MiB, 0};
  ContextPool pool(cfg, 0, up, &sink);
  CHECK(pool.state().reserved == 0);  // nothing until first use
  std::vector<std::uint64_t> p;
  for (int i = 0; i < 4; ++i) p.push_back(pool.allocate(64 * MiB).ptr);
  for (auto x : p) REQUIRE(x != 0);
  CHECK(up.counters().reserve_calls == 1);
  CHECK(pool.state().reserved == 256 * MiB);

  AllocResult full = pool.allocate(1 * MiB);
  CHECK(full.ptr == 0);
  // No limit is set: the region used up is not a limit's refusal (issue 27, item 4). The pool will
  // not grow, so the device's memory, as far as the policy goes, is used up.
  CHECK(full.oom == OomClass::device);

  pool.deallocate(p[0]);
  pool.deallocate(p[2]);
  AllocResult frag = pool.allocate(100 * MiB);  // 128 MiB free, but in two 64 MiB holes
  CHECK(frag.ptr == 0);
  CHECK(frag.oom == OomClass::fragmentation);
  CHECK(pool.state().largest_free == 64 * MiB);
  CHECK(up.counters().reserve_calls == 1);
  CHECK(up.counters().release_calls == 0);  // the preallocation is not trimmed on the way
  auto ooms = sink.of(EventKind::oom);
  REQUIRE(ooms.size() == 2);
  CHECK(ooms[1].oom_class == OomClass::fragmentation);
  CHECK(ooms[1].pool.free_blocks == 2);
}

TEST_CASE("pool: preallocate a share of the device, clamped to the cap, optionally growing", "[pool]") {
  SimUpstream up(1 * GiB);
  Config cfg;
  cfg.policy = PolicyKind::preallocate;
  cfg.preallocate = SizeSpec{0, 75.0};
  SECTION("percent of the device") {
    ContextPool pool(cfg, 0, up, nullptr);
    REQUIRE(pool.allocate(1).ptr != 0);
    CHECK(pool.state().reserved == 768 * MiB);
  }
  SECTION("clamped to the cap") {
    ContextPool pool(with_limit(cfg, 512 * MiB), 0, up, nullptr);
    REQUIRE(pool.allocate(1).ptr != 0);
    CHECK(pool.state().reserved == 512 * MiB);
  }
  SECTION("with grow") {
    cfg.preallocate = SizeSpec{64 * MiB, 0};
    cfg.preallocate_grow = true;
    cfg.growth_chunk = 32 * MiB;
    ContextPool pool(cfg, 0, up, nullptr);
    REQUIRE(pool.allocate(64 * MiB).ptr != 0);
    CHECK(pool.state().reserved == 64 * MiB);
    REQUIRE(pool.allocate(1 * MiB).ptr != 0);
    CHECK(pool.state().reserved == 96 * MiB);
  }
  SECTION("the driver refuses the preallocation: retry with what it has free") {
    up.set_foreign_bytes(512 * MiB);
    ContextPool pool(cfg, 0, up, nullptr);
    REQUIRE(pool.allocate(1).ptr != 0);
    CHECK(pool.state().reserved == 512 * MiB);
  }
  SECTION("explicit trim gives the preallocation back; the next use takes it again") {
    cfg.preallocate = SizeSpec{64 * MiB, 0};
    ContextPool pool(cfg, 0, up, nullptr);
    pool.deallocate(pool.allocate(1).ptr);
    pool.trim();
    CHECK(pool.state().reserved == 0);
    REQUIRE(pool.allocate(1).ptr != 0);
    CHECK(pool.state().reserved == 64 * MiB);
    CHECK(up.counters().reserve_calls == 2);
  }
}

TEST_CASE("pool: outside charges count against the cap", "[pool]") {
  SimUpstream up(4 * GiB);
  RecordingSink sink;
  ContextPool pool(with_limit(growth_config(32 * MiB, 32 * MiB), 256 * MiB), 0, up, &sink);
  DeviceAdmission& admission = pool.admission();
  CHECK(admission.admit_outside(200 * MiB, nullptr) == OomClass::none);
  CHECK(admission.outside() == 200 * MiB);
  AllocResult a = pool.allocate(60 * MiB);
  CHECK(a.ptr == 0);
  CHECK(a.oom == OomClass::limit);
  CHECK(sink.of(EventKind::oom).back().oom_class == OomClass::limit);
  REQUIRE(pool.allocate(50 * MiB).ptr != 0);  // 56 MiB left: a 50 MiB chunk
  CHECK(admission.admit_outside(10 * MiB, nullptr) == OomClass::limit);
  admission.release_outside(200 * MiB);
  CHECK(admission.admit_outside(150 * MiB, nullptr) == OomClass::none);
  admission.release_outside(150 * MiB);
  CHECK(admission.outside() == 0);

  // A wholly free chunk is given back rather than refusing an outside allocation.
  ContextPool pool2(with_limit(growth_config(128 * MiB, 128 * MiB), 256 * MiB), 0, up, nullptr);
  pool2.deallocate(pool2.allocate(MiB).ptr);
  CHECK(pool2.state().reserved == 128 * MiB);
  CHECK(pool2.admission().admit_outside(200 * MiB, nullptr) == OomClass::none);
  CHECK(pool2.state().reserved == 0);
}

TEST_CASE("pool: mem_info reports the cap and what the process could still get", "[pool]") {
  SimUpstream up(1 * GiB);
  std::size_t free = 0, total = 0;
  SECTION("with a cap") {
    ContextPool pool(with_limit(growth_config(32 * MiB), 512 * MiB), 0, up, nullptr);
    pool.mem_info(&free, &total);
    CHECK(total == 512 * MiB);
    CHECK(free == 512 * MiB);
    REQUIRE(pool.allocate(1 * MiB).ptr != 0);
    pool.mem_info(&free, &total);
    CHECK(free == 511 * MiB);  // (512 - 32) under the cap + 31 free in the pool
    CHECK(pool.admission().admit_outside(100 * MiB, nullptr) == OomClass::none);
    pool.mem_info(&free, &total);
    CHECK(free == 411 * MiB);
    up.set_foreign_bytes(800 * MiB);  // the driver has only 1024 - 32 - 800 = 192 MiB
    pool.mem_info(&free, &total);
    CHECK(free == (192 + 31) * MiB);
  }
  SECTION("without a cap") {
    ContextPool pool(growth_config(32 * MiB), 0, up, nullptr);
    CHECK(pool.cap() == 1 * GiB);
    REQUIRE(pool.allocate(1 * MiB).ptr != 0);
    pool.mem_info(&free, &total);
    CHECK(total == 1 * GiB);
    CHECK(free == 1023 * MiB);
  }
  SECTION("percent cap") {
    Config cfg = growth_config();
    cfg.limit.all = SizeSpec{0, 50.0};
    cfg.limit.per_device = {{1, SizeSpec{0, 25.0}}};
    ContextPool p0(cfg, 0, up, nullptr);
    ContextPool p1(cfg, 1, up, nullptr);
    CHECK(p0.cap() == 512 * MiB);
    CHECK(p1.cap() == 256 * MiB);
  }
}

TEST_CASE("pool: driver out of memory is class device with the driver's code", "[pool]") {
  SimUpstream up(1 * GiB);
  RecordingSink sink;
  ContextPool pool(growth_config(), 0, up, &sink);
  up.fail_next_reserves(4);
  AllocResult a = pool.allocate(1 * MiB);
  CHECK(a.ptr == 0);
  CHECK(a.oom == OomClass::device);
  CHECK(a.driver_code == SimUpstream::kOutOfMemoryCode);
  auto ooms = sink.of(EventKind::oom);
  REQUIRE(ooms.size() == 1);
  CHECK(ooms[0].oom_class == OomClass::device);
  CHECK(ooms[0].rc == SimUpstream::kOutOfMemoryCode);
  // Recovers once the driver has room again.
  up.fail_next_reserves(0);
  REQUIRE(pool.allocate(1 * MiB).ptr != 0);

  SECTION("a step larger than the driver can give falls back to what is needed") {
    SimUpstream dev(1 * GiB);
    dev.fail_reserves_above(16 * MiB);
    ContextPool p(growth_config(64 * MiB), 0, dev, nullptr);
    AllocResult r = p.allocate(10 * MiB);
    REQUIRE(r.ptr != 0);
    CHECK(p.state().reserved == 10 * MiB);
    AllocResult big = p.allocate(40 * MiB);
    CHECK(big.oom == OomClass::device);
  }
  SECTION("without a configured limit, the device total is the bound, and running past it is class device") {
    SimUpstream small(40 * MiB);
    ContextPool p(growth_config(64 * MiB), 0, small, nullptr);
    REQUIRE(p.allocate(10 * MiB).ptr != 0);
    CHECK(p.state().reserved == 40 * MiB);  // the step is cut to what the device has
    AllocResult big = p.allocate(40 * MiB);
    CHECK(big.oom == OomClass::device);
  }
  SECTION("fragmentation takes precedence when the pool holds enough free bytes") {
    SimUpstream dev(128 * MiB);
    ContextPool p(growth_config(64 * MiB, 64 * MiB), 0, dev, nullptr);
    std::uint64_t a1 = p.allocate(32 * MiB).ptr;
    std::uint64_t a2 = p.allocate(32 * MiB).ptr;
    std::uint64_t b1 = p.allocate(32 * MiB).ptr;
    std::uint64_t b2 = p.allocate(32 * MiB).ptr;
    REQUIRE((a1 && a2 && b1 && b2));
    p.deallocate(a1);
    p.deallocate(b2);
    AllocResult r = p.allocate(48 * MiB);
    CHECK(r.ptr == 0);
    CHECK(r.oom == OomClass::fragmentation);
  }
}

TEST_CASE("pool: double free and foreign pointers leave the pool intact", "[pool]") {
  SimUpstream up(1 * GiB);
  ContextPool pool(growth_config(), 0, up, nullptr);
  std::uint64_t a = pool.allocate(4096).ptr;
  std::uint64_t b = pool.allocate(8192).ptr;
  REQUIRE(a != 0);
  REQUIRE(b != 0);
  CHECK(pool.deallocate(a) == FreeResult::freed);
  trace::PoolState before = pool.state();
  CHECK(pool.deallocate(a) == FreeResult::double_free);
  CHECK(pool.deallocate(b + 512) == FreeResult::not_owned);
  CHECK(pool.deallocate(0x1000) == FreeResult::not_owned);
  CHECK(pool.deallocate(0) == FreeResult::not_owned);
  trace::PoolState after = pool.state();
  CHECK(after.in_use == before.in_use);
  CHECK(after.free_blocks == before.free_blocks);
  CHECK(after.reserved == before.reserved);
  CHECK(pool.block_size(b) == 8192);
  CHECK(pool.owns(b + 100));
  CHECK(pool.owns(a));  // inside the pool: its frees belong here even when bogus
  CHECK_FALSE(pool.owns(0x1000));
  CHECK(pool.block_size(a) == 0);

  std::uint64_t base = 0;
  std::size_t size = 0;
  REQUIRE(pool.block_range(b + 8000, &base, &size));
  CHECK(base == b);
  CHECK(size == 8192);
  CHECK_FALSE(pool.block_range(a + 1, &base, &size));  // freed memory is nobody's block
  CHECK(pool.deallocate(b) == FreeResult::freed);
  CHECK(pool.state().in_use == 0);
  CHECK(pool.state().free_blocks == 1);
}

TEST_CASE("pool: the destructor releases chunks; abandon forgets them", "[pool]") {
  SimUpstream up(1 * GiB);
  {
    ContextPool pool(growth_config(32 * MiB, 32 * MiB), 0, up, nullptr);
    pool.allocate(32 * MiB);
    pool.allocate(32 * MiB);
  }
  CHECK(up.counters().release_calls == 2);
  CHECK(up.counters().bad_releases == 0);
  CHECK(up.live_chunks() == 0);
  {
    ContextPool pool(growth_config(32 * MiB, 32 * MiB), 0, up, nullptr);
    std::uint64_t p = pool.allocate(32 * MiB).ptr;
    pool.abandon();
    CHECK(pool.state().reserved == 0);
    CHECK_FALSE(pool.owns(p));
    CHECK(pool.deallocate(p) == FreeResult::not_owned);
    CHECK(pool.allocate(1).ptr == 0);
  }
  CHECK(up.counters().release_calls == 2);  // nothing more
  CHECK(up.live_chunks() == 1);             // the context would have taken it with it
}

TEST_CASE("pool: sync free waits for the device on every free", "[pool]") {
  SimUpstream up(1 * GiB);
  ContextPool pool(growth_config(), 0, up, nullptr);
  std::uint64_t a = pool.allocate(MiB).ptr;
  pool.deallocate(a);
  CHECK(up.counters().synchronizes == 1);
  CHECK(pool.allocate(MiB).ptr == a);  // reusable at once
}

TEST_CASE("pool: deferred free", "[pool]") {
  SimUpstream up(1 * GiB);
  RecordingSink sink;
  Config cfg = growth_config(32 * MiB, 32 * MiB);
  cfg.free_mode = FreeMode::deferred;

  SECTION("one stream: reuse at once, no fence, no wait") {
    up.set_needs_fences(false);
    ContextPool pool(cfg, 0, up, &sink);
    std::uint64_t a = pool.allocate(MiB).ptr;
    CHECK(pool.deallocate(a) == FreeResult::freed);
    CHECK(pool.allocate(MiB).ptr == a);
    CHECK(up.counters().synchronizes == 0);
    CHECK(up.counters().fences_placed == 0);
  }
  SECTION("fences pending: a miss the quarantine can serve waits for it rather than grow") {
    up.set_pending_work(true);
    ContextPool pool(cfg, 0, up, &sink);
    std::uint64_t a = pool.allocate(32 * MiB).ptr;
    REQUIRE(a != 0);
    CHECK(pool.deallocate(a) == FreeResult::freed);
    CHECK(pool.state().quarantined == 32 * MiB);
    CHECK(pool.state().in_use == 0);
    CHECK(pool.deallocate(a) == FreeResult::double_free);  // quarantined: still a double free
    CHECK(pool.block_size(a) == 0);
    std::uint64_t b = pool.allocate(32 * MiB).ptr;  // the quarantine holds enough: wait, reuse
    CHECK(b == a);
    CHECK(up.counters().fences_placed == 1);
    CHECK(up.counters().fence_waits == 1);
    CHECK(pool.state().quarantined == 0);
    CHECK(pool.state().reserved == 32 * MiB);
    auto retired = sink.of(EventKind::fence_retired);
    REQUIRE(retired.size() == 1);
    CHECK(retired[0].size == 32 * MiB);
  }
  SECTION("fences pending: a miss the quarantine cannot serve grows without waiting") {
    up.set_pending_work(true);
    ContextPool pool(cfg, 0, up, &sink);
    std::uint64_t a = pool.allocate(16 * MiB).ptr;
    std::uint64_t keep = pool.allocate(16 * MiB).ptr;
    REQUIRE((a && keep));
    CHECK(pool.deallocate(a) == FreeResult::freed);
    std::uint64_t b = pool.allocate(32 * MiB).ptr;  // 16 MiB quarantined is not enough: grow
    REQUIRE(b != 0);
    CHECK(up.counters().fence_waits == 0);
    CHECK(pool.state().reserved >= 64 * MiB);  // a second chunk
    up.complete_all();
    std::uint64_t c = pool.allocate(16 * MiB).ptr;  // retired: reused, no growth
    CHECK(c == a);
    CHECK(pool.state().quarantined == 0);
  }
  SECTION("fences pending and no room to grow: wait for the oldest fence") {
    up.set_pending_work(true);
    ContextPool pool(with_limit(cfg, 64 * MiB), 0, up, &sink);
    std::uint64_t a = pool.allocate(32 * MiB).ptr;
    std::uint64_t b = pool.allocate(32 * MiB).ptr;
    REQUIRE((a && b));
    pool.deallocate(a);
    std::uint64_t c = pool.allocate(32 * MiB).ptr;
    CHECK(c == a);
    CHECK(up.counters().fence_waits == 1);
    CHECK(pool.state().quarantined == 0);
    CHECK(sink.of(EventKind::oom).empty());
  }
  SECTION("frees are batched: one fence per batch") {
    up.set_pending_work(true);
    ContextPool pool(cfg, 0, up, &sink);
    FakeClock clock;
    pool.set_clock(&FakeClock::read, &clock);
    std::vector<std::uint64_t> p;
    for (std::size_t i = 0; i < Quarantine::kBatchBlocks * 2; ++i) p.push_back(pool.allocate(4096).ptr);
    for (std::size_t i = 0; i < p.size(); ++i) {
      if (i == Quarantine::kBatchBlocks) clock.t += Quarantine::kSealIntervalNs;
      pool.deallocate(p[i]);
    }
    CHECK(up.counters().fences_placed == 2);
    CHECK(pool.state().quarantined == Quarantine::kBatchBlocks * 2 * 4096);
    up.complete_all();
    clock.t += Quarantine::kSealIntervalNs;
    // The next seal polls the oldest fences and frees their blocks.
    std::vector<std::uint64_t> q;
    for (std::size_t i = 0; i < Quarantine::kBatchBlocks; ++i) q.push_back(pool.allocate(4096).ptr);
    for (auto x : q) pool.deallocate(x);
    CHECK(up.counters().fences_placed == 3);
    CHECK(pool.state().quarantined == Quarantine::kBatchBlocks * 4096);
    CHECK(pool.state().reserved == 32 * MiB);
  }
  SECTION("frees seal at most once per interval; a miss seals at once") {
    up.set_pending_work(true);
    ContextPool pool(with_limit(cfg, 32 * MiB), 0, up, &sink);
    FakeClock clock;
    pool.set_clock(&FakeClock::read, &clock);
    constexpr std::size_t kBlock = 128 * 1024;  // 256 of them fill the one chunk the cap allows
    std::vector<std::uint64_t> p;
    for (std::size_t i = 0; i < 256; ++i) p.push_back(pool.allocate(kBlock).ptr);
    REQUIRE(p.back() != 0);
    for (std::size_t i = 0; i < Quarantine::kBatchBlocks * 3; ++i) pool.deallocate(p[i]);  // within one interval
    CHECK(up.counters().fences_placed == 1);
    CHECK(pool.state().quarantined == Quarantine::kBatchBlocks * 3 * kBlock);
    // The chunk is full: this allocation misses and seals what is pending behind a second fence
    // (the simulated device still has work, so that one stays open); the first fence has retired,
    // so its blocks serve the allocation without growing or waiting.
    up.complete_all();
    CHECK(pool.allocate(kBlock).ptr != 0);
    CHECK(up.counters().fences_placed == 2);
    CHECK(up.counters().fence_waits == 0);
    CHECK(pool.state().quarantined == Quarantine::kBatchBlocks * 2 * kBlock);
    CHECK(pool.state().reserved == 32 * MiB);
  }
  SECTION("a quarantine past its bound makes allocations wait for old fences, not new ones") {
    up.set_pending_work(true);
    Config big = growth_config(64 * MiB, 64 * MiB);
    big.free_mode = FreeMode::deferred;
    ContextPool pool(big, 0, up, &sink);
    FakeClock clock;
    pool.set_clock(&FakeClock::read, &clock);
    std::vector<std::uint64_t> p;
    for (int i = 0; i < 8; ++i) p.push_back(pool.allocate(64 * MiB).ptr);
    REQUIRE(pool.allocate(4096).ptr != 0);  // a ninth chunk, with room: the allocations below never miss
    for (auto x : p) pool.deallocate(x);    // at one instant: the first seals, the rest stay open
    REQUIRE(up.counters().fences_placed == 1);
    REQUIRE(pool.state().quarantined == 512 * MiB);  // past the bound (256 MiB; an eighth is less)
    // The one fence is younger than an interval: an allocation does not wait for it.
    CHECK(pool.allocate(4096).ptr != 0);
    CHECK(up.counters().fence_waits == 0);
    CHECK(up.counters().fences_placed == 1);
    // An interval later the allocation seals the full open batch, then waits for the free's fence.
    clock.t += Quarantine::kSealIntervalNs + 1;
    CHECK(pool.allocate(4096).ptr != 0);
    CHECK(up.counters().fence_waits == 1);
    CHECK(up.counters().fences_placed == 2);
    CHECK(pool.state().quarantined == 448 * MiB);
    // A fence sealed at an allocation may cover work issued after the frees: the bound never
    // waits for it, however old; it retires when the device has passed it.
    clock.t += 10 * Quarantine::kSealIntervalNs;
    CHECK(pool.allocate(4096).ptr != 0);
    CHECK(up.counters().fence_waits == 1);
    CHECK(pool.state().quarantined == 448 * MiB);
    up.complete_all();
    CHECK(pool.allocate(4096).ptr != 0);
    CHECK(up.counters().fence_waits == 1);
    CHECK(pool.state().quarantined == 0);
    CHECK(pool.state().reserved == 576 * MiB);
  }
  SECTION("the first free seals at any clock reading, and the bound follows an eighth of reserved") {
    SimUpstream up8(8 * GiB);
    up8.set_pending_work(true);
    Config big = growth_config(512 * MiB, 512 * MiB);
    big.free_mode = FreeMode::deferred;
    ContextPool pool(big, 0, up8, &sink);
    FakeClock clock;
    clock.t = 0;  // a clock that starts at zero (replay of a hand-made trace)
    pool.set_clock(&FakeClock::read, &clock);
    std::vector<std::uint64_t> p;
    for (int i = 0; i < 8; ++i) p.push_back(pool.allocate(512 * MiB).ptr);  // 4 GiB: the bound is 512 MiB
    REQUIRE(pool.allocate(4096).ptr != 0);
    pool.deallocate(p[0]);
    CHECK(up8.counters().fences_placed == 1);
    clock.t += Quarantine::kSealIntervalNs;
    pool.deallocate(p[1]);
    CHECK(up8.counters().fences_placed == 2);
    CHECK(pool.state().quarantined == 1024 * MiB);
    // 1 GiB held, past 512 MiB: the oldest fence goes (old enough), then the quarantine is within.
    clock.t += Quarantine::kSealIntervalNs;
    CHECK(pool.allocate(4096).ptr != 0);
    CHECK(up8.counters().fence_waits == 1);
    CHECK(pool.state().quarantined == 512 * MiB);
  }
  SECTION("large frees seal a batch by bytes") {
    up.set_pending_work(true);
    ContextPool pool(cfg, 0, up, &sink);
    pool.deallocate(pool.allocate(Quarantine::kBatchBytes).ptr);
    CHECK(up.counters().fences_placed == 1);
  }
}

// ---- per-thread caches ---------------------------------------------------------------------------

namespace {
Config cached_config(FreeMode mode = FreeMode::sync) {
  Config c = growth_config();
  c.thread_cache = true;
  c.free_mode = mode;
  return c;
}
}  // namespace

TEST_CASE("thread cache: a thread's freed block serves its next allocation of that size", "[pool][cache]") {
  SimUpstream up(1 * GiB);
  RecordingSink sink;
  ContextPool pool(cached_config(), 0, up, &sink);
  const std::uint64_t p = pool.allocate(4096).ptr;
  REQUIRE(p != 0);
  trace::PoolState s;
  std::size_t size = 0;
  REQUIRE(pool.deallocate(p, &size, &s) == FreeResult::freed);
  CHECK(size == 4096);
  CHECK(s.cache_delta == -4096);  // no lock taken: the trace writer derives in_use and cached
  CHECK(pool.thread_cached() == 4096);
  CHECK(pool.state().in_use == 0);
  CHECK(pool.block_size(p) == 0);  // free to the program
  std::size_t free_before = 0, total = 0;
  pool.mem_info(&free_before, &total);

  AllocResult again = pool.allocate(4000, &s);  // rounds to the same 4096
  CHECK(again.ptr == p);
  CHECK(s.cache_delta == 4096);
  CHECK(s.reserved == 32 * MiB);
  CHECK(pool.thread_cached() == 0);
  CHECK(pool.block_size(p) == 4096);
  CHECK(up.counters().reserve_calls == 1);
  std::size_t free_after = 0;
  pool.mem_info(&free_after, &total);
  CHECK(free_before - free_after == 4096);  // cached bytes counted as free

  CHECK(pool.deallocate(p) == FreeResult::freed);
}

TEST_CASE("thread cache: a large block waits only for its thread's next allocation", "[pool][cache]") {
  SimUpstream up(1 * GiB);
  RecordingSink sink;
  Config cfg = cached_config();
  cfg.growth_chunk = 128 * MiB;  // room beside the block: only giving it back makes it serve the next call
  ContextPool pool(cfg, 0, up, &sink);
  const std::uint64_t big = pool.allocate(64 * MiB).ptr;
  REQUIRE(big != 0);
  const std::uint64_t reserves = up.counters().reserve_calls;
  trace::PoolState s;
  REQUIRE(pool.deallocate(big, nullptr, &s) == FreeResult::freed);
  CHECK(s.cache_delta == -static_cast<std::int64_t>(64 * MiB));  // kept, without the lock
  CHECK(pool.thread_cached() == 64 * MiB);
  CHECK(pool.state().in_use == 0);
  CHECK(pool.block_size(big) == 0);  // free to the program

  SECTION("an allocation of the same size takes it") {
    CHECK(pool.allocate(64 * MiB, &s).ptr == big);
    CHECK(s.cache_delta == static_cast<std::int64_t>(64 * MiB));
    CHECK(pool.thread_cached() == 0);
    CHECK(up.counters().reserve_calls == reserves);
  }
  SECTION("an allocation of another size gives it back first, so it coalesces") {
    const std::uint64_t small = pool.allocate(4096, &s).ptr;
    CHECK(small == big);  // carved from the block given back
    CHECK(s.cache_delta == 0);  // a locked call: the whole state
    CHECK(s.in_use == 4096);
    CHECK(s.largest_free == 128 * MiB - 4096);
    CHECK(pool.thread_cached() == 0);
    CHECK(up.counters().reserve_calls == reserves);
    CHECK(pool.deallocate(small) == FreeResult::freed);
  }
  SECTION("one large block is kept, the first freed since the thread's last allocation") {
    const std::uint64_t other = pool.allocate(64 * MiB).ptr;  // takes the kept one
    const std::uint64_t third = pool.allocate(8 * MiB).ptr;
    REQUIRE(pool.deallocate(other) == FreeResult::freed);
    REQUIRE(pool.deallocate(third) == FreeResult::freed);
    CHECK(pool.thread_cached() == 64 * MiB);
  }
  SECTION("a second free is a double free, from any thread") {
    CHECK(pool.deallocate(big) == FreeResult::double_free);
    FreeResult other = FreeResult::freed;
    std::thread([&] { other = pool.deallocate(big); }).join();
    CHECK(other == FreeResult::double_free);
    CHECK(pool.allocate(64 * MiB).ptr == big);  // still handed out exactly once
    CHECK(pool.allocate(64 * MiB).ptr != big);
  }
}

TEST_CASE("thread cache: a kept large block goes back even when the bins serve the next allocation",
          "[pool][cache]") {
  SimUpstream up(1 * GiB);
  RecordingSink sink;
  ContextPool pool(cached_config(), 0, up, &sink);
  const std::uint64_t small = pool.allocate(4096).ptr;
  const std::uint64_t big = pool.allocate(64 * MiB).ptr;
  REQUIRE(pool.deallocate(small) == FreeResult::freed);
  REQUIRE(pool.deallocate(big) == FreeResult::freed);
  CHECK(pool.thread_cached() == 64 * MiB + 4096);
  trace::PoolState s;
  CHECK(pool.allocate(4096, &s).ptr == small);
  CHECK(pool.thread_cached() == 0);
  CHECK(s.cache_delta == 0);  // it took the lock to give the large block back: the whole state
  CHECK(s.in_use == 4096);
  CHECK(pool.block_size(big) == 0);
}

TEST_CASE("thread cache: another thread may free a large block; its owner then cannot", "[pool][cache]") {
  SimUpstream up(1 * GiB);
  ContextPool pool(cached_config(), 0, up, nullptr);
  const std::uint64_t big = pool.allocate(16 * MiB).ptr;
  FreeResult other = FreeResult::double_free;
  std::thread([&] { other = pool.deallocate(big); }).join();
  CHECK(other == FreeResult::freed);
  CHECK(pool.deallocate(big) == FreeResult::double_free);  // the owner's table forgot it
  CHECK(pool.thread_cached() == 0);
  CHECK(pool.state().in_use == 0);
}

TEST_CASE("thread cache: double frees and frees from other threads", "[pool][cache]") {
  SimUpstream up(1 * GiB);
  ContextPool pool(cached_config(), 0, up, nullptr);
  const std::uint64_t p = pool.allocate(8192).ptr;
  const std::uint64_t q = pool.allocate(8192).ptr;
  REQUIRE(p != 0);
  REQUIRE(q != 0);
  REQUIRE(pool.deallocate(p) == FreeResult::freed);  // into this thread's cache
  const trace::PoolState before = pool.state();
  CHECK(pool.deallocate(p) == FreeResult::double_free);
  FreeResult other_double = FreeResult::freed, other_free = FreeResult::double_free;
  std::thread([&] {
    other_double = pool.deallocate(p);  // already in the first thread's cache
    other_free = pool.deallocate(q);    // allocated by the first thread, freed here: fine
  }).join();
  CHECK(other_double == FreeResult::double_free);
  CHECK(other_free == FreeResult::freed);
  CHECK(pool.deallocate(q) == FreeResult::double_free);  // the first thread no longer counts it live
  const trace::PoolState after = pool.state();
  CHECK(after.reserved == before.reserved);
  CHECK(after.in_use == before.in_use - 8192);  // q went back
  // p is handed out once more, and exactly once.
  const std::uint64_t r = pool.allocate(8192).ptr;
  const std::uint64_t t = pool.allocate(8192).ptr;
  CHECK(r == p);
  CHECK(t != p);
}

TEST_CASE("thread cache: blocks go back to the pool before it grows or refuses", "[pool][cache]") {
  SimUpstream up(1 * GiB);
  Config cfg = with_limit(cached_config(), 32 * MiB);
  ContextPool pool(cfg, 0, up, nullptr);
  std::vector<std::uint64_t> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(pool.allocate(1 * MiB).ptr);
  for (std::uint64_t b : blocks) REQUIRE(pool.deallocate(b) == FreeResult::freed);
  CHECK(pool.thread_cached() == 8 * MiB);
  // Only with the cached megabytes back is there room for this under the 32 MiB cap.
  const AllocResult big = pool.allocate(31 * MiB);
  CHECK(big.ptr != 0);
  CHECK(pool.thread_cached() == 0);
  CHECK(pool.state().reserved == 32 * MiB);
  CHECK(up.counters().reserve_calls == 1);
}

TEST_CASE("thread cache: a thread that exits gives its blocks back", "[pool][cache]") {
  SimUpstream up(1 * GiB);
  ContextPool pool(cached_config(), 0, up, nullptr);
  std::uint64_t p = 0;
  std::thread([&] {
    p = pool.allocate(64 * 1024).ptr;
    pool.deallocate(p);
    CHECK(pool.thread_cached() == 64 * 1024);
  }).join();
  CHECK(pool.thread_cached() == 0);
  CHECK(pool.state().in_use == 0);
  CHECK(pool.state().free_blocks == 1);  // coalesced back into the chunk
  // A new thread adopts the retired cache.
  std::thread([&] { CHECK(pool.deallocate(pool.allocate(512).ptr) == FreeResult::freed); }).join();
  CHECK(pool.thread_cached() == 0);
}

TEST_CASE("thread cache: no reuse without a fence once streams can overlap", "[pool][cache]") {
  SimUpstream up(1 * GiB);
  up.set_needs_fences(false);
  ContextPool pool(cached_config(FreeMode::deferred), 0, up, nullptr);
  const std::uint64_t p = pool.allocate(4096).ptr;
  REQUIRE(pool.deallocate(p) == FreeResult::freed);
  CHECK(pool.thread_cached() == 4096);  // one order of work: reusable at once
  CHECK(pool.allocate(4096).ptr == p);

  REQUIRE(pool.deallocate(p) == FreeResult::freed);
  CHECK(pool.thread_cached() == 4096);
  // A second stream appears while work is in flight: the cached block must wait for a fence.
  up.set_needs_fences(true);
  up.set_pending_work(true);
  const std::uint64_t q = pool.allocate(4096).ptr;
  CHECK(q != p);
  CHECK(pool.thread_cached() == 0);
  CHECK(pool.state().quarantined == 4096);
  REQUIRE(pool.deallocate(q) == FreeResult::freed);
  CHECK(pool.thread_cached() == 0);  // with fences, frees go to quarantine
  CHECK(pool.state().quarantined == 8192);
  up.complete_all();
  up.set_pending_work(false);
}

// ---- admission under a cap: growths in flight wait for each other --------------------------------

namespace {
// Holds the first reservation in flight until released: a second thread's miss then finds the
// first one's bytes in transit.
struct ReserveGate {
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false, open = false;
  void pass() {
    std::unique_lock lk(mu);
    if (open) return;
    entered = true;
    cv.notify_all();
    cv.wait(lk, [&] { return open; });
  }
  void wait_entered() {
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return entered; });
  }
  void release() {
    std::lock_guard lk(mu);
    open = true;
    cv.notify_all();
  }
};
}  // namespace

TEST_CASE("pool: an allocation waits for another thread's growth in flight instead of refusing", "[pool][cap]") {
  // Cap 64 MiB, first chunk 64 MiB: while thread A's chunk is in flight, all 64 MiB count against
  // the cap, so thread B could only refuse (what prog_threads saw under CUPOOL_LIMIT=128MiB) or
  // wait for A's chunk, which has room for both.
  for (FreeMode mode : {FreeMode::sync, FreeMode::deferred}) {
    SimUpstream up(1 * GiB);
    ReserveGate gate;
    up.set_reserve_gate([&] { gate.pass(); });
    Config cfg = with_limit(growth_config(64 * MiB, 64 * MiB), 64 * MiB);
    cfg.free_mode = mode;
    RecordingSink sink;
    ContextPool pool(cfg, 0, up, &sink);
    AllocResult a, b;
    std::atomic<bool> b_done{false};
    std::thread ta([&] { a = pool.allocate(MiB); });
    gate.wait_entered();
    std::thread tb([&] {
      b = pool.allocate(MiB);
      b_done = true;
    });
    // B either refuses at once (the defect) or waits on the pool for A's chunk: nothing else it
    // can do until the gate opens. Give it every chance to finish first, without a timing bound.
    for (int i = 0; i < 1000 && !b_done; ++i) std::this_thread::yield();
    gate.release();
    ta.join();
    tb.join();
    INFO("free mode " << static_cast<int>(mode));
    CHECK(a.ptr != 0);
    CHECK(b.ptr != 0);
    CHECK(b.oom == OomClass::none);
    CHECK(sink.of(EventKind::oom).empty());
    CHECK(up.counters().reserve_calls == 1);  // one chunk served both: B did not grow beside A
    CHECK(up.counters().peak_reserved_bytes <= 64 * MiB);
  }
}

TEST_CASE("pool: an outside charge waits for a growth in flight instead of refusing", "[pool][cap]") {
  SimUpstream up(1 * GiB);
  ReserveGate gate;
  up.set_reserve_gate([&] { gate.pass(); });
  ContextPool pool(with_limit(growth_config(32 * MiB, 32 * MiB), 64 * MiB), 0, up, nullptr);
  std::uint64_t a = 0;
  std::thread ta([&] { a = pool.allocate(MiB).ptr; });
  gate.wait_entered();  // 32 MiB in flight: a 40 MiB outside charge fits only if A's chunk...
  bool charged = false;
  std::thread tb([&] { charged = pool.admission().admit_outside(32 * MiB, nullptr) == OomClass::none; });
  for (int i = 0; i < 1000; ++i) std::this_thread::yield();
  gate.release();
  ta.join();
  tb.join();
  CHECK(a != 0);
  CHECK(charged);  // 32 MiB chunk + 32 MiB outside = the cap exactly
  CHECK(pool.admission().outside() == 32 * MiB);
}

TEST_CASE("pool: many threads at the edge of the cap are never refused while their memory fits", "[pool][cap]") {
  // Blocks of one size (no fragmentation is possible) and 2 MiB chunks: 8 threads each keep at
  // most 4 blocks of 1 MiB live, 32 MiB in all, which is exactly the cap. Every allocation fits
  // once the pool has given back what is free, so none may be refused, and the device must never
  // hold more than the cap.
  for (FreeMode mode : {FreeMode::sync, FreeMode::deferred}) {
    for (bool thread_cache : {true, false}) {
      SimUpstream up(1 * GiB);
      up.set_pending_work(mode == FreeMode::deferred);
      Config cfg = with_limit(growth_config(2 * MiB, 2 * MiB), 32 * MiB);
      cfg.free_mode = mode;
      cfg.thread_cache = thread_cache;
      RecordingSink sink;
      ContextPool pool(cfg, 0, up, &sink);
      std::atomic<int> refused{0};
      std::atomic<bool> stop{false};
      // In deferred mode fences retire only when this thread lets them (or a waiter waits).
      std::thread device([&] {
        while (!stop) {
          up.complete_all();
          std::this_thread::yield();
        }
      });
      std::vector<std::thread> workers;
      for (int t = 0; t < 8; ++t)
        workers.emplace_back([&, t] {
          std::vector<std::uint64_t> mine;
          std::uint32_t x = 2463534242u + static_cast<std::uint32_t>(t);
          for (int i = 0; i < 3000; ++i) {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            if (mine.size() < 4 && (mine.empty() || x % 2)) {
              AllocResult r = pool.allocate(MiB);
              if (r.ptr) mine.push_back(r.ptr);
              else ++refused;
            } else {
              pool.deallocate(mine.back());
              mine.pop_back();
            }
          }
          for (std::uint64_t p : mine) pool.deallocate(p);
        });
      for (auto& w : workers) w.join();
      stop = true;
      device.join();
      INFO("free mode " << static_cast<int>(mode) << ", thread cache " << thread_cache);
      CHECK(refused == 0);
      CHECK(sink.of(EventKind::oom).empty());
      CHECK(up.counters().peak_reserved_bytes <= 32 * MiB);
    }
  }
}

// ---- stream capture: no fence, poll or wait while one is in progress -----------------------------

TEST_CASE("pool: during a stream capture nothing is fenced, polled or waited for", "[pool][capture]") {
  SimUpstream up(1 * GiB);
  up.set_pending_work(true);
  Config cfg = growth_config(32 * MiB, 32 * MiB);

  SECTION("deferred: frees wait in the open batch; it is sealed once the capture has ended") {
    cfg.free_mode = FreeMode::deferred;
    ContextPool pool(cfg, 0, up, nullptr);
    std::vector<std::uint64_t> blocks;
    for (int i = 0; i < 200; ++i) blocks.push_back(pool.allocate(MiB).ptr);  // 200 MiB, several chunks
    up.set_capturing(true);
    for (std::uint64_t p : blocks) CHECK(pool.deallocate(p) == FreeResult::freed);  // full batches
    // Allocations that miss: the quarantine cannot be fenced, so the pool grows instead.
    for (int i = 0; i < 40; ++i) CHECK(pool.allocate(8 * MiB).ptr != 0);
    CHECK(up.counters().fence_calls_while_capturing == 0);
    CHECK(pool.state().quarantined == 200 * MiB);
    up.set_capturing(false);
    // A miss the quarantine can serve: the open batch is sealed now, and waited for.
    const std::uint64_t reserved = pool.state().reserved;
    CHECK(pool.allocate(16 * MiB).ptr != 0);
    CHECK(up.counters().fences_placed > 0);
    CHECK(pool.state().reserved == reserved);  // served by the quarantine, not by growth
  }
  SECTION("sync: a free waits as cudaFree does, and its block is reused only after the capture") {
    cfg.free_mode = FreeMode::sync;
    ContextPool pool(cfg, 0, up, nullptr);
    const std::uint64_t a = pool.allocate(MiB).ptr;
    up.set_capturing(true);
    CHECK(pool.deallocate(a) == FreeResult::freed);
    CHECK(up.counters().synchronizes == 1);  // the upstream's wait covers the uncaptured work
    CHECK(pool.state().quarantined == MiB);
    const std::uint64_t b = pool.allocate(MiB).ptr;
    CHECK(b != a);  // not before the capture has ended
    CHECK(up.counters().fence_calls_while_capturing == 0);
    up.set_capturing(false);
    CHECK(pool.deallocate(b) == FreeResult::freed);
    up.set_pending_work(false);
    const std::uint64_t reserved = pool.state().reserved;
    CHECK(pool.allocate(32 * MiB).ptr != 0);  // a miss seals the leftover, and it is reused
    CHECK(pool.state().quarantined == 0);
    CHECK(pool.state().reserved == reserved);
  }
  SECTION("deferred, one order of work: a capture changes nothing") {
    cfg.free_mode = FreeMode::deferred;
    up.set_needs_fences(false);
    ContextPool pool(cfg, 0, up, nullptr);
    const std::uint64_t a = pool.allocate(MiB).ptr;
    up.set_capturing(true);
    CHECK(pool.deallocate(a) == FreeResult::freed);
    CHECK(pool.allocate(MiB).ptr == a);
    CHECK(up.counters().fence_calls_while_capturing == 0);
  }
}

// Issue 25: the cap is the device's, whichever context holds the memory. Two pools of one device
// (two contexts) share one admission; memory that names the device but no context charges it too.
TEST_CASE("pool: pools of one device share its cap through one admission", "[pool][account]") {
  SimUpstream up(4 * GiB);
  const Config cfg = with_limit(growth_config(32 * MiB, 32 * MiB), 96 * MiB);
  DeviceAdmission account(cfg, 0, 4 * GiB);
  ContextPool a(cfg, 0, up, nullptr, &account);
  ContextPool b(cfg, 0, up, nullptr, &account);
  REQUIRE(a.allocate(32 * MiB).ptr != 0);
  CHECK(account.charged() == 32 * MiB);
  REQUIRE(b.allocate(32 * MiB).ptr != 0);
  CHECK(account.charged() == 64 * MiB);
  CHECK(account.try_take(16 * MiB));  // a context-less cuMemCreate
  AllocResult refused = b.allocate(32 * MiB);
  CHECK(refused.ptr == 0);
  CHECK(refused.oom == OomClass::limit);
  CHECK(account.admit_outside(32 * MiB, nullptr) == OomClass::limit);
  std::size_t free = 0, total = 0;
  a.mem_info(&free, &total);
  CHECK(total == 96 * MiB);
  CHECK(free == 16 * MiB);  // 96 less the 80 held on the device (a's chunk is wholly in use)
  account.add(-static_cast<std::int64_t>(16 * MiB));
  CHECK(account.admit_outside(16 * MiB, nullptr) == OomClass::none);
  account.release_outside(16 * MiB);
  // A pool that goes gives its part of the account back.
  {
    ContextPool c(cfg, 0, up, nullptr, &account);
    REQUIRE(c.allocate(16 * MiB).ptr != 0);
    CHECK(account.charged() == 96 * MiB);
  }
  CHECK(account.charged() == 64 * MiB);
  // Many threads over two pools never pass the cap together.
  std::atomic<bool> passed{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      ContextPool& p = t % 2 ? a : b;
      for (int i = 0; i < 200; ++i) {
        AllocResult r = p.allocate(MiB * (1 + (i + t) % 8));
        if (account.charged() > 96 * MiB) passed = true;
        if (r.ptr) p.deallocate(r.ptr);
      }
    });
  for (auto& th : threads) th.join();
  CHECK_FALSE(passed);
}
