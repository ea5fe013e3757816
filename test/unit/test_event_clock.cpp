// The trace's clock: never runs backwards (also across threads and across refits) and stays
// close to CLOCK_MONOTONIC.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include "event_clock.h"

using cupool::EventClock;
using cupool::monotonic_ns;

TEST_CASE("EventClock follows CLOCK_MONOTONIC and never runs backwards", "[clock]") {
  EventClock::init_trusting_cpu();
  INFO("uses the TSC: " << EventClock::uses_tsc());
  // Threads read the clock for 150 ms (several refits). Each checks its own readings increase,
  // and that a reading is never below one another thread published before it read.
  std::atomic<std::uint64_t> latest{0};
  std::atomic<bool> stop{false};
  std::atomic<int> backwards{0}, behind_published{0};
  std::atomic<std::uint64_t> worst_offset{0};
  auto reader = [&] {
    std::uint64_t last = 0;
    std::uint64_t n = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      const std::uint64_t seen = latest.load(std::memory_order_acquire);
      const std::uint64_t t = EventClock::now();
      if (t < last) backwards.fetch_add(1);
      if (t < seen) behind_published.fetch_add(1);
      last = t;
      std::uint64_t cur = latest.load(std::memory_order_relaxed);
      while (cur < t && !latest.compare_exchange_weak(cur, t, std::memory_order_release)) {
      }
      if (++n % 1024 == 0) {
        const std::uint64_t a = monotonic_ns();
        const std::uint64_t e = EventClock::now();
        const std::uint64_t b = monotonic_ns();
        // e should lie in [a, b]; how far outside it does, at most.
        const std::uint64_t off = e < a ? a - e : (e > b ? e - b : 0);
        std::uint64_t w = worst_offset.load();
        while (off > w && !worst_offset.compare_exchange_weak(w, off)) {
        }
      }
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) threads.emplace_back(reader);
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  stop = true;
  for (auto& t : threads) t.join();
  CHECK(backwards.load() == 0);
  CHECK(behind_published.load() == 0);
  // Within 50 us of CLOCK_MONOTONIC (a loaded machine can preempt between the reads; the fit's
  // own error is a few microseconds at most).
  CHECK(worst_offset.load() < 50'000);
}
