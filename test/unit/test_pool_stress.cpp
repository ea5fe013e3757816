// Many threads allocating and freeing through one pool at once. Built twice: into unit_tests, and
// with -fsanitize=thread as pool_stress_tsan.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "context_pool.h"
#include "sim_upstream.h"

using namespace cupool;

namespace {

constexpr std::uint64_t MiB = 1ull << 20;
constexpr std::uint64_t GiB = 1ull << 30;

// The live blocks of every thread, to prove that no two overlap.
class LiveSet {
 public:
  bool insert(std::uint64_t p, std::uint64_t size) {
    std::lock_guard lock(mu_);
    auto it = live_.lower_bound(p);
    if (it != live_.end() && it->first < p + size) return false;
    if (it != live_.begin() && std::prev(it)->first + std::prev(it)->second > p) return false;
    live_.emplace(p, size);
    return true;
  }
  void erase(std::uint64_t p) {
    std::lock_guard lock(mu_);
    live_.erase(p);
  }

 private:
  std::mutex mu_;
  std::map<std::uint64_t, std::uint64_t> live_;
};

struct StressResult {
  std::uint64_t overlaps = 0, bad_frees = 0, bad_sizes = 0, allocations = 0, ooms = 0;
};

StressResult run_stress(ContextPool& pool, SimUpstream& up, int threads, int ops, bool toggle_fences) {
  LiveSet live;
  std::atomic<std::uint64_t> overlaps{0}, bad_frees{0}, bad_sizes{0}, allocations{0}, ooms{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937_64 rng(1234 + t);
      std::vector<std::pair<std::uint64_t, std::uint64_t>> mine;
      for (int i = 0; i < ops; ++i) {
        if (mine.empty() || rng() % 100 < 52) {
          std::size_t size = rng() % 8 == 0 ? rng() % (8 * MiB) : rng() % 65536 + 1;
          AllocResult r = pool.allocate(size);
          if (r.ptr == 0) {
            ++ooms;
            continue;
          }
          ++allocations;
          std::uint64_t got = pool.block_size(r.ptr);
          if (got < size || r.ptr % 512 != 0) ++bad_sizes;
          if (!live.insert(r.ptr, size)) ++overlaps;
          mine.emplace_back(r.ptr, size);
        } else {
          std::size_t k = rng() % mine.size();
          auto [p, size] = mine[k];
          mine[k] = mine.back();
          mine.pop_back();
          std::uint64_t base = 0;
          std::size_t bsize = 0;
          if (!pool.block_range(p + size - 1, &base, &bsize) || base != p) ++bad_sizes;
          live.erase(p);
          if (pool.deallocate(p) != FreeResult::freed) ++bad_frees;
        }
        if (t == 0 && i % 5000 == 0) pool.trim();
        if (t == 1 && i % 997 == 0) {
          std::size_t f = 0, tot = 0;
          pool.mem_info(&f, &tot);
          (void)pool.state();
        }
        if (t == 2 && i % 1500 == 0) {
          if (pool.admission().admit_outside(64 * MiB, nullptr) == OomClass::none)
            pool.admission().release_outside(64 * MiB);
        }
      }
      for (auto [p, size] : mine) {
        live.erase(p);
        if (pool.deallocate(p) != FreeResult::freed) ++bad_frees;
      }
    });
  }
  std::thread device;
  if (toggle_fences) {
    // The "device": sometimes busy, sometimes done.
    device = std::thread([&] {
      std::mt19937 rng(7);
      while (!stop.load()) {
        up.set_pending_work(rng() % 2 == 0);
        if (rng() % 3 == 0) up.complete_all();
        std::this_thread::yield();
      }
    });
  }
  for (auto& w : workers) w.join();
  stop = true;
  if (device.joinable()) device.join();
  return {overlaps.load(), bad_frees.load(), bad_sizes.load(), allocations.load(), ooms.load()};
}

}  // namespace

TEST_CASE("pool stress: 8 threads, growth, sync free", "[pool][stress]") {
  SimUpstream up(64 * GiB);
  Config cfg;
  cfg.growth_chunk = 8 * MiB;
  cfg.growth_chunk_max = 64 * MiB;
  cfg.release_idle_ns = 200'000;  // real clock: some chunks go back while others are taken
  ContextPool pool(cfg, 0, up, nullptr);
  StressResult r = run_stress(pool, up, 8, 20000, false);
  CHECK(r.overlaps == 0);
  CHECK(r.bad_frees == 0);
  CHECK(r.bad_sizes == 0);
  CHECK(r.ooms == 0);
  CHECK(r.allocations > 50000);
  CHECK(pool.state().in_use == 0);
  pool.trim();
  CHECK(pool.state().reserved == 0);
  CHECK(up.counters().reserved_bytes == 0);
}

TEST_CASE("pool stress: 8 threads, deferred free with fences, under a tight cap", "[pool][stress]") {
  SimUpstream up(64 * GiB);
  Config cfg;
  cfg.free_mode = FreeMode::deferred;
  cfg.growth_chunk = 8 * MiB;
  cfg.growth_chunk_max = 32 * MiB;
  cfg.limit.all = SizeSpec{96 * MiB, 0};
  up.set_pending_work(true);
  ContextPool pool(cfg, 0, up, nullptr);
  StressResult r = run_stress(pool, up, 8, 20000, true);
  CHECK(r.overlaps == 0);
  CHECK(r.bad_frees == 0);
  CHECK(r.bad_sizes == 0);
  CHECK(r.allocations > 50000);
  CHECK(pool.state().in_use == 0);
  CHECK(pool.state().reserved <= 96 * MiB);
  auto c = up.counters();
  UNSCOPED_INFO("ooms " << r.ooms << " fence waits " << c.fence_waits << " fences " << c.fences_placed
                        << " reserves " << c.reserve_calls << " releases " << c.release_calls);
  CHECK(c.peak_reserved_bytes <= 96 * MiB);
  up.set_pending_work(false);
  up.complete_all();
  pool.trim();
  CHECK(pool.state().quarantined == 0);
  CHECK(pool.state().reserved == 0);
}

TEST_CASE("pool stress: 8 threads race the first use of a preallocating pool", "[pool][stress]") {
  SimUpstream up(64 * GiB);
  Config cfg;
  cfg.policy = PolicyKind::preallocate;
  cfg.preallocate = SizeSpec{256 * MiB, 0};
  cfg.preallocate_grow = true;
  cfg.growth_chunk = 16 * MiB;
  ContextPool pool(cfg, 0, up, nullptr);
  StressResult r = run_stress(pool, up, 8, 5000, false);
  CHECK(r.overlaps == 0);
  CHECK(r.bad_frees == 0);
  CHECK(r.bad_sizes == 0);
  CHECK(r.ooms == 0);
  CHECK(pool.state().in_use == 0);
  CHECK(up.counters().total_reserved_bytes >= 256 * MiB);
}
