// VmmCache: the bookkeeping that recycles whole virtual-memory mappings (docs/design.md,
// "Virtual-memory mappings"). A fake driver models what the real one holds (handles, reserved
// ranges, mappings) so every test can check that, after the cache has done its part, the
// driver's state is exactly what the program believes, or more (mappings kept for reuse).
#include <catch2/catch.hpp>

#include <chrono>
#include <condition_variable>
#include <future>
#include <cstdint>
#include <mutex>
#include <thread>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "sim_upstream.h"
#include "vmm_cache.h"

using namespace cupool;
using Verdict = VmmCache::Verdict;

namespace {

constexpr std::uint64_t MiB = 1ull << 20;

// What the driver holds for real; the program's own calls that the cache forwards go here too.
struct FakeDriver : VmmDriver {
  std::set<std::uint64_t> handles;
  std::map<std::uint64_t, std::uint64_t> reserved;  // va -> size
  std::map<std::uint64_t, std::uint64_t> mapped;    // va -> handle
  std::vector<std::string> calls;                   // calls made by the cache itself
  std::uint64_t next_handle = 100, next_va = 0x10000000;

  void unmap(std::uint64_t va, std::uint64_t) override {
    calls.push_back("unmap");
    REQUIRE(mapped.erase(va) == 1);
  }
  bool release(std::uint64_t handle) override {
    calls.push_back("release");
    REQUIRE(handles.erase(handle) == 1);
    return true;
  }
  void address_free(std::uint64_t va, std::uint64_t) override {
    calls.push_back("address_free");
    REQUIRE(mapped.count(va) == 0);
    REQUIRE(reserved.erase(va) == 1);
  }
  // Real calls, as the shim makes them when the cache says "forward" or misses.
  std::uint64_t real_create() { handles.insert(++next_handle); return next_handle; }
  std::uint64_t real_reserve(std::uint64_t size) {
    next_va += 64 * MiB;
    reserved[next_va] = size;
    return next_va;
  }
  bool real_map(std::uint64_t va, std::uint64_t h) {
    if (!handles.count(h) || !reserved.count(va) || mapped.count(va)) return false;
    mapped[va] = h;
    return true;
  }
  bool real_unmap(std::uint64_t va) { return mapped.erase(va) == 1; }
  bool real_release(std::uint64_t h) { return handles.erase(h) == 1; }
  bool real_address_free(std::uint64_t va) { return !mapped.count(va) && reserved.erase(va) == 1; }
};

VmmProps props(std::uint64_t device = 0) {
  VmmProps p;
  p.w[0] = 1;
  p.w[1] = device;
  return p;
}
VmmAccess rw(std::uint64_t device = 0) {
  VmmAccess a;
  a.w[0] = (device << 8) | 3;
  a.count = 1;
  return a;
}

// The program's side of XLA's sequence, through the cache as the shim drives it.
struct Program {
  VmmCache& cache;
  FakeDriver& drv;
  Upstream* owner;
  int driver_calls = 0;  // real calls made for the program's own calls

  struct Buffer {
    std::uint64_t h = 0, va = 0, size = 0;
  };

  Buffer allocate(std::uint64_t size, const VmmProps& p = props(), std::uint64_t align = 0) {
    Buffer b;
    b.size = size;
    b.h = cache.take(owner, size, p);
    if (b.h == 0) {
      b.h = drv.real_create();
      ++driver_calls;
      cache.created(owner, b.h, size, p);
    }
    b.va = cache.reserve(size, align);
    if (b.va == 0) {
      b.va = drv.real_reserve(size);
      ++driver_calls;
      cache.reserved(b.va, size);
    }
    if (cache.map(b.va, size, 0, b.h) == Verdict::forward) {
      REQUIRE(drv.real_map(b.va, b.h));
      ++driver_calls;
      cache.map_done(b.va, size, 0, b.h);
    }
    if (cache.set_access(b.va, size, rw()) == Verdict::forward) {
      ++driver_calls;
      cache.set_access_done(b.va, size, rw());
    }
    return b;
  }
  void unmap(const Buffer& b) {
    if (cache.unmap(b.va, b.size) == Verdict::forward) {
      REQUIRE(drv.real_unmap(b.va));
      ++driver_calls;
    }
  }
  void release(const Buffer& b) {
    std::uint64_t size = 0;
    if (cache.release(b.h, &size) == Verdict::forward) {
      REQUIRE(drv.real_release(b.h));
      ++driver_calls;
    } else {
      CHECK(size == b.size);
    }
  }
  void address_free(const Buffer& b) {
    if (cache.address_free(b.va, b.size) == Verdict::forward) {
      REQUIRE(drv.real_address_free(b.va));
      ++driver_calls;
    }
  }
  void free(const Buffer& b) {
    unmap(b);
    release(b);
    address_free(b);
  }
};

// One context's mappings as the tests drive them: the driver's side, the cache and the program.
// `fences`: the program has streams of its own (deferred frees need fences); `busy`: device work
// is in flight, so fences retire only at complete_all().
struct Context {
  SimUpstream up{16ull << 30};
  FakeDriver drv;
  VmmCache cache;
  Program prog{cache, drv, &up};
  Context(FreeMode mode, bool fences, bool busy) : cache(drv, mode) {
    up.set_needs_fences(fences);
    up.set_pending_work(busy);
  }
};

}  // namespace

TEST_CASE("vmm cache: a repeated size costs no driver call", "[vmm]") {
  Context ctx(FreeMode::deferred, false, false);
  auto& [up, drv, cache, prog] = ctx;

  auto a = prog.allocate(2 * MiB);
  CHECK(prog.driver_calls == 4);  // create, reserve, map, set access
  prog.free(a);
  CHECK(prog.driver_calls == 4);  // kept: nothing given back
  CHECK(drv.mapped.size() == 1);
  CHECK(cache.free_bytes(&up) == 2 * MiB);

  auto b = prog.allocate(2 * MiB);
  CHECK(prog.driver_calls == 4);
  CHECK(b.h == a.h);
  CHECK(b.va == a.va);
  CHECK(cache.free_bytes(&up) == 0);
  CHECK(cache.stats().hits == 1);

  // Another size, or other props, is a miss.
  auto c = prog.allocate(4 * MiB);
  CHECK(prog.driver_calls == 8);
  prog.free(c);
  auto d = prog.allocate(4 * MiB, props(1));
  CHECK(prog.driver_calls == 12);
  CHECK(d.h != c.h);
  CHECK(drv.calls.empty());
}

TEST_CASE("vmm cache: frees in any order", "[vmm]") {
  Context ctx(FreeMode::deferred, false, false);
  auto& [up, drv, cache, prog] = ctx;
  auto a = prog.allocate(2 * MiB);
  const int base = prog.driver_calls;

  SECTION("release, unmap, address free") {
    prog.release(a);
    prog.unmap(a);
    prog.address_free(a);
  }
  SECTION("release, then address free while mapped is refused by the driver") {
    prog.release(a);
    CHECK(cache.address_free(a.va, a.size) == Verdict::forward);
    CHECK_FALSE(drv.real_address_free(a.va));  // still mapped, as the driver would say
    // the entry is gone, the handle was released for real (the program released it)
    CHECK(drv.handles.count(a.h) == 0);
    prog.unmap(a);
    prog.address_free(a);
    CHECK(drv.mapped.empty());
    CHECK(drv.reserved.empty());
    return;
  }
  CHECK(prog.driver_calls == base);
  CHECK(cache.free_bytes(&up) == 2 * MiB);
  auto b = prog.allocate(2 * MiB);
  CHECK(prog.driver_calls == base);
  CHECK(b.va == a.va);
}

TEST_CASE("vmm cache: set access with other descriptors goes to the driver", "[vmm]") {
  Context ctx(FreeMode::deferred, false, false);
  auto& [up, drv, cache, prog] = ctx;
  auto a = prog.allocate(2 * MiB);
  CHECK(cache.set_access(a.va, a.size, rw()) == Verdict::served);
  CHECK(cache.set_access(a.va, a.size, rw(1)) == Verdict::forward);
  cache.set_access_done(a.va, a.size, rw(1));
  CHECK(cache.set_access(a.va, a.size, rw(1)) == Verdict::served);
  VmmAccess many;
  many.count = 9;
  CHECK(cache.set_access(a.va, a.size, many) == Verdict::forward);
  cache.set_access_done(a.va, a.size, many);
  CHECK(cache.set_access(a.va, a.size, many) == Verdict::forward);
}

TEST_CASE("vmm cache: what is not one handle over one reservation of its size is never cached", "[vmm]") {
  Context ctx(FreeMode::deferred, false, false);
  auto& [up, drv, cache, prog] = ctx;

  SECTION("a reservation larger than the handle (expandable segments)") {
    const std::uint64_t h1 = drv.real_create(), h2 = drv.real_create();
    cache.created(&up, h1, 2 * MiB, props());
    cache.created(&up, h2, 2 * MiB, props());
    const std::uint64_t va = drv.real_reserve(8 * MiB);
    cache.reserved(va, 8 * MiB);
    CHECK(cache.map(va, 2 * MiB, 0, h1) == Verdict::forward);
    cache.map_done(va, 2 * MiB, 0, h1);
    CHECK(cache.map(va + 2 * MiB, 2 * MiB, 0, h2) == Verdict::forward);
    cache.map_done(va + 2 * MiB, 2 * MiB, 0, h2);
    CHECK(cache.stats().entries == 0);
    CHECK(cache.unmap(va, 2 * MiB) == Verdict::forward);
    CHECK(cache.release(h1, nullptr) == Verdict::forward);
  }
  SECTION("a map at an offset into the handle") {
    const std::uint64_t h = drv.real_create();
    cache.created(&up, h, 4 * MiB, props());
    const std::uint64_t va = drv.real_reserve(2 * MiB);
    cache.reserved(va, 2 * MiB);
    CHECK(cache.map(va, 2 * MiB, 2 * MiB, h) == Verdict::forward);
    cache.map_done(va, 2 * MiB, 2 * MiB, h);
    CHECK(cache.stats().entries == 0);
  }
  SECTION("an exported handle") {
    const std::uint64_t h = drv.real_create();
    cache.created(&up, h, 2 * MiB, props());
    cache.pin_handle(h);
    const std::uint64_t va = drv.real_reserve(2 * MiB);
    cache.reserved(va, 2 * MiB);
    CHECK(cache.map(va, 2 * MiB, 0, h) == Verdict::forward);
    cache.map_done(va, 2 * MiB, 0, h);
    CHECK(cache.stats().entries == 0);
  }
  SECTION("a created handle without a context") {
    const std::uint64_t h = drv.real_create();
    cache.created(nullptr, h, 2 * MiB, props());
    const std::uint64_t va = drv.real_reserve(2 * MiB);
    cache.reserved(va, 2 * MiB);
    cache.map_done(va, 2 * MiB, 0, h);
    CHECK(cache.stats().entries == 0);
  }
}

TEST_CASE("vmm cache: mismatches make the driver's state the program's before the call", "[vmm]") {
  Context ctx(FreeMode::deferred, false, false);
  auto& [up, drv, cache, prog] = ctx;
  auto a = prog.allocate(2 * MiB);

  SECTION("a handed-out handle mapped at another reservation") {
    prog.free(a);
    const std::uint64_t h = cache.take(&up, 2 * MiB, props());
    REQUIRE(h == a.h);
    const std::uint64_t va = drv.real_reserve(2 * MiB);  // the program reserved with a hint, say
    cache.reserved(va, 2 * MiB);
    CHECK(cache.map(va, 2 * MiB, 0, h) == Verdict::forward);
    // the cached mapping is unmapped and its reservation freed for real; the handle is the program's
    CHECK(drv.calls == std::vector<std::string>{"unmap", "address_free"});
    CHECK(drv.reserved.count(a.va) == 0);
    REQUIRE(drv.real_map(va, h));
    cache.map_done(va, 2 * MiB, 0, h);
    CHECK(cache.stats().entries == 1);  // the new pair forms a mapping of its own
    Program::Buffer b{h, va, 2 * MiB};
    prog.free(b);
    CHECK(cache.free_bytes(&up) == 2 * MiB);
  }
  SECTION("another handle mapped onto the cached reservation") {
    prog.unmap(a);  // program still holds handle and reservation
    const std::uint64_t other = drv.real_create();
    cache.created(&up, other, 2 * MiB, props());
    CHECK(cache.map(a.va, 2 * MiB, 0, other) == Verdict::forward);
    CHECK(drv.calls == std::vector<std::string>{"unmap"});
    REQUIRE(drv.real_map(a.va, other));
    cache.map_done(a.va, 2 * MiB, 0, other);
    CHECK(cache.stats().entries == 1);
    // the first handle is the program's, plain
    CHECK(cache.release(a.h, nullptr) == Verdict::forward);
    CHECK(drv.real_release(a.h));
  }
  SECTION("a handle released twice: the driver says so") {
    prog.release(a);
    CHECK(cache.release(a.h, nullptr) == Verdict::forward);
    CHECK(drv.calls == std::vector<std::string>{"release"});
    CHECK_FALSE(drv.real_release(a.h));
    CHECK(drv.mapped.count(a.va) == 1);  // the program never unmapped it
  }
  SECTION("unmap of a range already unmapped: the driver says so") {
    prog.unmap(a);
    CHECK(cache.unmap(a.va, a.size) == Verdict::forward);
    CHECK_FALSE(drv.real_unmap(a.va));
  }
  SECTION("a range covering the mapping and more is unmapped for real") {
    CHECK(cache.unmap(a.va, 4 * MiB) == Verdict::forward);
    CHECK(drv.calls.empty());  // the mapping was the program's as it is: forgotten
    CHECK(cache.stats().entries == 0);
  }
  SECTION("a reservation at a hint over a given-up address") {
    prog.free(a);
    cache.before_reserve_at(a.va, 2 * MiB);
    CHECK(drv.calls == std::vector<std::string>{"unmap", "release", "address_free"});
    CHECK(drv.reserved.empty());
    CHECK(cache.free_bytes(&up) == 0);
  }
  SECTION("retained at its address") {
    cache.pin_address(a.va + 4096);
    CHECK(cache.stats().entries == 0);
    CHECK(drv.calls.empty());
    prog.free(a);  // all for real now
    CHECK(drv.handles.empty());
  }
  SECTION("set access on a range the program unmapped") {
    prog.unmap(a);
    CHECK(cache.set_access(a.va, a.size, rw()) == Verdict::forward);
    CHECK(drv.calls == std::vector<std::string>{"unmap"});
  }
  SECTION("a handed-out mapping whose reserve does not fit") {
    prog.free(a);
    REQUIRE(cache.take(&up, 2 * MiB, props()) == a.h);
    CHECK(cache.reserve(2 * MiB, 128 * MiB) == 0);  // cached address not aligned that much
  }
}

TEST_CASE("vmm cache: sync mode reuses only after a synchronize", "[vmm]") {
  Context ctx(FreeMode::sync, true, false);
  auto& [up, drv, cache, prog] = ctx;
  auto a = prog.allocate(2 * MiB);
  auto b = prog.allocate(2 * MiB);
  prog.free(a);
  prog.free(b);
  CHECK(up.counters().synchronizes == 0);
  auto c = prog.allocate(2 * MiB);
  CHECK(up.counters().synchronizes == 1);
  auto d = prog.allocate(2 * MiB);
  CHECK(up.counters().synchronizes == 1);  // one synchronize made both reusable
  CHECK(prog.driver_calls == 8);
  CHECK(((c.h == a.h && d.h == b.h) || (c.h == b.h && d.h == a.h)));
}

TEST_CASE("vmm cache: deferred mode reuses behind fences", "[vmm]") {
  Context ctx(FreeMode::deferred, true, true);
  auto& [up, drv, cache, prog] = ctx;
  auto a = prog.allocate(2 * MiB);
  prog.free(a);
  CHECK(up.counters().fences_placed == 1);  // at the free
  // Not retired: create another mapping rather than hold the host until the device gets there.
  auto b = prog.allocate(2 * MiB);
  CHECK(b.h != a.h);
  CHECK(up.counters().fence_waits == 0);
  prog.free(b);
  up.complete_all();
  auto c = prog.allocate(2 * MiB);  // retired: reused
  CHECK((c.h == a.h || c.h == b.h));
  auto d = prog.allocate(2 * MiB);
  CHECK((d.h == a.h || d.h == b.h));
  CHECK(d.h != c.h);
  CHECK(up.counters().fence_waits == 0);
  CHECK(up.counters().synchronizes == 0);
  CHECK(prog.driver_calls == 8);
}

TEST_CASE("vmm cache: deferred mode waits once a size has enough mappings", "[vmm]") {
  Context ctx(FreeMode::deferred, true, true);
  auto& [up, drv, cache, prog] = ctx;
  std::vector<std::uint64_t> handles;
  for (std::size_t i = 0; i < VmmCache::kMaxPerKey; ++i) {
    auto m = prog.allocate(2 * MiB);
    handles.push_back(m.h);
    prog.free(m);
  }
  CHECK(up.counters().fence_waits == 0);
  CHECK(prog.driver_calls == 4 * VmmCache::kMaxPerKey);
  auto next = prog.allocate(2 * MiB);  // the oldest fence is waited for instead
  CHECK(up.counters().fence_waits == 1);
  CHECK(next.h == handles.front());
  CHECK(prog.driver_calls == 4 * VmmCache::kMaxPerKey);
}

namespace {
// A SimUpstream whose synchronize and fence waits block until the test opens the gate: the
// device still busy, for as long as the test likes.
struct GatedUpstream : Upstream {
  SimUpstream sim{16ull << 30};
  std::mutex m;
  std::condition_variable cv;
  bool open = false, blocked = false;

  void gate() {
    std::unique_lock l(m);
    blocked = true;
    cv.notify_all();
    cv.wait(l, [&] { return open; });
  }
  void wait_until_blocked() {
    std::unique_lock l(m);
    cv.wait(l, [&] { return blocked; });
  }
  void open_gate() {
    std::lock_guard l(m);
    open = true;
    cv.notify_all();
  }
  UpstreamStatus reserve(std::size_t bytes, std::size_t min_bytes, std::uint64_t* base, std::size_t* got,
                         int* code) override {
    return sim.reserve(bytes, min_bytes, base, got, code);
  }
  void release(std::uint64_t base, std::size_t bytes) override { sim.release(base, bytes); }
  void device_memory(std::size_t* total, std::size_t* free) override { sim.device_memory(total, free); }
  void synchronize() override {
    gate();
    sim.synchronize();
  }
  bool needs_fences() override { return sim.needs_fences(); }
  FenceId place_fence() override { return sim.place_fence(); }
  bool fence_retired(FenceId f) override { return sim.fence_retired(f); }
  void wait_fence(FenceId f) override {
    gate();
    sim.wait_fence(f);
  }
};
}  // namespace

TEST_CASE("vmm cache: a wait for the device does not hold up other threads' calls", "[vmm]") {
  for (const FreeMode mode : {FreeMode::deferred, FreeMode::sync}) {
    INFO((mode == FreeMode::sync ? "sync" : "deferred"));
    GatedUpstream up;
    up.sim.set_needs_fences(true);
    up.sim.set_pending_work(true);
    FakeDriver drv;
    VmmCache cache(drv, mode);
    Program prog{cache, drv, &up};
    std::vector<Program::Buffer> freed;
    const std::size_t n = mode == FreeMode::deferred ? VmmCache::kMaxPerKey : 1;
    for (std::size_t i = 0; i < n; ++i) freed.push_back(prog.allocate(2 * MiB));
    for (const auto& b : freed) prog.free(b);
    // The next 2 MiB buffer must wait for the device (a fence, or a synchronize).
    std::uint64_t got = 0;
    std::thread waiter([&] { got = cache.take(&up, 2 * MiB, props()); });
    up.wait_until_blocked();
    // Meanwhile another thread's calls go through: a size the cache has not seen, the stats.
    // The gate opens only once they have: were they held up behind the wait, the test would hang
    // (and its timeout fail it), whatever the machine's speed.
    auto other = std::async(std::launch::async, [&] {
      return cache.take(&up, 4 * MiB, props()) == 0 && cache.stats().entries == n;
    });
    other.wait();
    up.open_gate();
    CHECK(other.get());
    waiter.join();
    CHECK(got == freed.front().h);
  }
}

TEST_CASE("vmm cache: a retired younger fence makes the older ones reusable too", "[vmm]") {
  Context ctx(FreeMode::deferred, true, true);
  auto& [up, drv, cache, prog] = ctx;
  auto a = prog.allocate(2 * MiB);
  auto b = prog.allocate(4 * MiB);
  prog.free(a);  // fence 1
  prog.free(b);  // fence 2
  up.complete_all();
  auto c = prog.allocate(4 * MiB);
  CHECK(c.h == b.h);
  auto d = prog.allocate(2 * MiB);
  CHECK(d.h == a.h);
  CHECK(up.counters().fence_waits == 0);
}

TEST_CASE("vmm cache: memory pressure gives free mappings back", "[vmm]") {
  SimUpstream other(16ull << 30);
  other.set_needs_fences(false);
  Context ctx(FreeMode::deferred, false, false);
  auto& [up, drv, cache, prog] = ctx;
  Program prog2{cache, drv, &other};
  auto a = prog.allocate(2 * MiB);
  auto b = prog.allocate(4 * MiB);
  auto c = prog2.allocate(2 * MiB);
  auto live = prog.allocate(2 * MiB);
  prog.free(a);
  prog.free(b);
  prog2.free(c);
  CHECK(cache.free_bytes(&up) == 6 * MiB);
  CHECK(cache.free_bytes(nullptr) == 8 * MiB);
  CHECK(cache.evict_free(&up) == 6 * MiB);
  CHECK(cache.free_bytes(&up) == 0);
  CHECK(cache.free_bytes(&other) == 2 * MiB);
  CHECK(drv.handles.count(a.h) == 0);
  CHECK(drv.reserved.count(b.va) == 0);
  CHECK(drv.handles.count(live.h) == 1);
  CHECK(cache.stats().evicted == 2);
  CHECK(cache.evict_free(nullptr) == 2 * MiB);
  CHECK(drv.mapped.size() == 1);
}

TEST_CASE("vmm cache: a context that goes away is forgotten without driver calls", "[vmm]") {
  Context ctx(FreeMode::deferred, true, true);
  auto& [up, drv, cache, prog] = ctx;
  auto a = prog.allocate(2 * MiB);
  auto b = prog.allocate(2 * MiB);
  prog.free(a);
  cache.abandon(&up);
  CHECK(drv.calls.empty());
  CHECK(cache.stats().entries == 0);
  CHECK(cache.free_bytes(nullptr) == 0);
  CHECK(cache.take(&up, 2 * MiB, props()) == 0);
  // b's calls now go to the driver untouched.
  CHECK(cache.unmap(b.va, b.size) == Verdict::forward);
}

TEST_CASE("vmm cache: a steady loop of XLA's sequence settles into hits only", "[vmm]") {
  Context ctx(FreeMode::deferred, true, false);
  auto& [up, drv, cache, prog] = ctx;
  const std::uint64_t sizes[] = {2 * MiB, 4 * MiB, 2 * MiB, 8 * MiB, 2 * MiB};
  int calls_after_warmup = 0;
  for (int step = 0; step < 20; ++step) {
    if (step == 3) calls_after_warmup = prog.driver_calls;
    up.set_pending_work(true);
    std::vector<Program::Buffer> bufs;
    for (std::uint64_t s : sizes) bufs.push_back(prog.allocate(s));
    for (auto& b : bufs) prog.free(b);
    up.complete_all();  // the device catches up by the next step
  }
  CHECK(prog.driver_calls == calls_after_warmup);
  CHECK(cache.stats().entries <= 2 * std::size(sizes));
}
