// The trace's clock never runs backwards (also across threads and refits) and stays close to
// CLOCK_MONOTONIC: the clock the shim uses on this machine, and the TSC fit driven by a counter
// of known rate and drift (so that the fit is exercised also where the kernel does not trust the
// TSC). Nothing here depends on how fast or busy the machine is: every check is a property of
// each reading, whatever the number of readings.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "event_clock.h"

using cupool::EventClock;
using cupool::monotonic_ns;
using cupool::TscFit;

namespace {

struct Result {
  int backwards = 0;         // a thread's reading below its previous one
  int behind_published = 0;  // a reading below one another thread had published before it
  std::uint64_t worst_offset = 0;
  std::uint64_t readings = 0;
};

// Threads read `clock` for `ms`; every 1024 readings one is bracketed by CLOCK_MONOTONIC.
template <typename Clock>
Result hammer(Clock clock, int threads, int ms) {
  std::atomic<std::uint64_t> latest{0}, worst{0}, readings{0};
  std::atomic<bool> stop{false};
  std::atomic<int> backwards{0}, behind{0};
  auto reader = [&] {
    std::uint64_t last = 0, n = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      const std::uint64_t seen = latest.load(std::memory_order_acquire);
      const std::uint64_t t = clock();
      if (t < last) backwards.fetch_add(1);
      if (t < seen) behind.fetch_add(1);
      last = t;
      std::uint64_t cur = latest.load(std::memory_order_relaxed);
      while (cur < t && !latest.compare_exchange_weak(cur, t, std::memory_order_release)) {
      }
      if (++n % 1024 == 0) {
        const std::uint64_t a = monotonic_ns();
        const std::uint64_t e = clock();
        const std::uint64_t b = monotonic_ns();
        const std::uint64_t off = e < a ? a - e : (e > b ? e - b : 0);
        std::uint64_t w = worst.load();
        while (off > w && !worst.compare_exchange_weak(w, off)) {
        }
      }
    }
    readings.fetch_add(n);
  };
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) pool.emplace_back(reader);
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  stop = true;
  for (auto& t : pool) t.join();
  return {backwards.load(), behind.load(), worst.load(), readings.load()};
}

// A counter synchronized across CPUs by construction: 2.1 GHz, 200 ppm fast, a large offset.
std::uint64_t fake_ticks() {
  return 1'000'000'000'000ull +
         static_cast<std::uint64_t>(static_cast<unsigned __int128>(monotonic_ns()) * 2'100'420 / 1'000'000);
}

}  // namespace

// The bracketing reads can only widen on a loaded machine (a preemption between them makes the
// interval longer), so the offset bound holds however busy the machine is.
TEST_CASE("EventClock follows CLOCK_MONOTONIC and never runs backwards", "[clock]") {
  EventClock::init();
  INFO("uses the TSC: " << EventClock::uses_tsc());
  const Result r = hammer([] { return EventClock::now(); }, 3, 100);
  CHECK(r.backwards == 0);
  CHECK(r.behind_published == 0);
  CHECK(r.worst_offset < 50'000);
}

// What the hot paths record: a stamp, converted later. A stamp taken after another thread's
// (seen through memory) must not convert to an earlier time: the trace orders a free before the
// allocation that reuses its address by these values. With a bare rdtsc (no lfence) this failed
// on the 2-core dev VM in every run.
TEST_CASE("EventClock stamps keep the order in which threads see each other", "[clock]") {
  EventClock::init();
  INFO("uses the TSC: " << EventClock::uses_tsc());
  const Result r = hammer([] { return EventClock::stamp(); }, 3, 100);
  CHECK(r.backwards == 0);
  CHECK(r.behind_published == 0);
}

TEST_CASE("TscFit maps a drifting counter onto CLOCK_MONOTONIC across refits", "[clock]") {
  TscFit fit(&fake_ticks, &monotonic_ns);
  REQUIRE(fit.calibrate());
  // 150 ms: seven refits.
  const Result r = hammer([&] { return fit.now(); }, 3, 150);
  INFO(r.readings << " readings");
  CHECK(r.backwards == 0);
  CHECK(r.behind_published == 0);
  CHECK(r.worst_offset < 50'000);
}

TEST_CASE("TscFit refuses a counter that does not advance", "[clock]") {
  TscFit fit([] { return std::uint64_t{42}; }, &monotonic_ns);
  CHECK_FALSE(fit.calibrate());
}

namespace {
thread_local std::uint64_t t_last_tick = 0;
std::uint64_t remembered_ticks() { return t_last_tick = fake_ticks(); }
}  // namespace

TEST_CASE("TscFit::to_ns maps a tick read earlier exactly as now() did, across refits", "[clock]") {
  TscFit fit(&remembered_ticks, &monotonic_ns);
  REQUIRE(fit.calibrate());
  std::vector<std::pair<std::uint64_t, std::uint64_t>> seen;  // (tick, what now() returned)
  const std::uint64_t until = monotonic_ns() + 120'000'000;       // six refits
  while (monotonic_ns() < until) {
    const std::uint64_t ns = fit.now();
    seen.emplace_back(t_last_tick, ns);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  REQUIRE(!seen.empty());
  int differ = 0;
  for (const auto& [tick, ns] : seen) differ += fit.to_ns(tick) != ns;
  CHECK(differ == 0);
}

TEST_CASE("EventClock stamps convert to the clock now() reads", "[clock]") {
  const std::uint64_t before = EventClock::now();
  const std::uint64_t stamp = EventClock::stamp();
  const std::uint64_t after = EventClock::now();
  const std::uint64_t ns = EventClock::stamp_to_ns(stamp);
  CHECK(ns >= before);
  CHECK(ns <= after);
}
