#include "event_clock.h"

#include <cpuid.h>
#include <time.h>
#include <x86intrin.h>

#include <atomic>
#include <fstream>
#include <mutex>
#include <string>

#include "spin_lock.h"

namespace cupool {

std::uint64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

namespace {

constexpr std::uint64_t kRefitNs = 20'000'000;  // how often the fit is corrected
constexpr std::uint64_t kLeadNs = 1'000'000;    // a new piece starts this far after its sample

// One linear piece: ns = ns0 + (tsc - tsc0) * mult / 2^32.
struct Piece {
  std::uint64_t tsc0, ns0, mult;
};

std::uint64_t apply(std::uint64_t tsc, const Piece& p) {
  if (tsc >= p.tsc0) return p.ns0 + static_cast<std::uint64_t>((static_cast<unsigned __int128>(tsc - p.tsc0) * p.mult) >> 32);
  const auto back = static_cast<std::uint64_t>((static_cast<unsigned __int128>(p.tsc0 - tsc) * p.mult) >> 32);
  return p.ns0 > back ? p.ns0 - back : 0;
}

// The fit: the current piece from its tsc0 on, the previous one before it. A new piece is
// published kLeadNs before it begins, and begins where the previous one is at that point, so
// every reader (also one that read the TSC just before a refit) computes the same continuous,
// increasing function. Published under a sequence lock, in atomics, so no fit is read torn.
struct Fit {
  std::atomic<std::uint32_t> seq{0};
  std::atomic<std::uint64_t> prev_tsc0{0}, prev_ns0{0}, prev_mult{0};
  std::atomic<std::uint64_t> tsc0{0}, ns0{0}, mult{0}, next_refit{~std::uint64_t{0}};
};
Fit g_fit;
SpinLock g_refit_lock;
std::uint64_t g_base_tsc = 0, g_base_ns = 0;  // the first calibration point: the long baseline
std::atomic<int> g_mode{-1};                  // -1 not decided, 0 clock_gettime, 1 TSC
std::once_flag g_once;

bool g_ignore_kernel_verdict = false;

bool invariant_tsc() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0x80000000u, nullptr) < 0x80000007u) return false;
  __cpuid(0x80000007u, a, b, c, d);
  if (!(d & (1u << 8))) return false;
  if (g_ignore_kernel_verdict) return true;
  // The kernel drops "tsc" from the available clock sources when it finds the TSC unsynchronized
  // across CPUs or unstable.
  std::ifstream f("/sys/devices/system/clocksource/clocksource0/available_clocksource");
  std::string word;
  while (f >> word)
    if (word == "tsc") return true;
  return false;
}

// A (tsc, ns) pair read as close together as the machine allows.
void sample(std::uint64_t* tsc, std::uint64_t* ns) {
  std::uint64_t best = ~std::uint64_t{0};
  for (int i = 0; i < 5; ++i) {
    const std::uint64_t a = __rdtsc();
    const std::uint64_t n = monotonic_ns();
    const std::uint64_t b = __rdtsc();
    if (b - a < best) {
      best = b - a;
      *tsc = a + (b - a) / 2;
      *ns = n;
    }
  }
}

std::uint64_t ticks_for(std::uint64_t ns, std::uint64_t mult) {
  return static_cast<std::uint64_t>((static_cast<unsigned __int128>(ns) << 32) / mult);
}

// A sequence lock without fences (the thread sanitizer does not model them): data stores are
// release and data loads acquire, so a reader that sees any new datum also sees the odd count.
void publish(const Piece& prev, const Piece& cur, std::uint64_t next_refit) {
  const std::uint32_t s = g_fit.seq.load(std::memory_order_relaxed);
  g_fit.seq.store(s + 1, std::memory_order_relaxed);
  constexpr auto rel = std::memory_order_release;
  g_fit.prev_tsc0.store(prev.tsc0, rel);
  g_fit.prev_ns0.store(prev.ns0, rel);
  g_fit.prev_mult.store(prev.mult, rel);
  g_fit.tsc0.store(cur.tsc0, rel);
  g_fit.ns0.store(cur.ns0, rel);
  g_fit.mult.store(cur.mult, rel);
  g_fit.next_refit.store(next_refit, rel);
  g_fit.seq.store(s + 2, rel);
}

void decide() {
  if (!invariant_tsc()) {
    g_mode.store(0, std::memory_order_release);
    return;
  }
  sample(&g_base_tsc, &g_base_ns);
  std::uint64_t tsc = 0, ns = 0;
  do sample(&tsc, &ns);
  while (ns - g_base_ns < 2'000'000);
  const std::uint64_t mult = static_cast<std::uint64_t>(
      (static_cast<unsigned __int128>(ns - g_base_ns) << 32) / (tsc - g_base_tsc));
  if (mult == 0) {
    g_mode.store(0, std::memory_order_release);
    return;
  }
  const Piece first{tsc, ns, mult};
  publish(first, first, tsc + ticks_for(kRefitNs, mult));
  g_mode.store(1, std::memory_order_release);
}

// Run by the reader that first finds the fit due. The next piece begins kLeadNs from now where
// the current one will be then, and aims to meet CLOCK_MONOTONIC kRefitNs later, at a slope
// within 1/2..3/2 of the long-run rate.
void refit(const Piece& cur) {
  std::uint64_t tsc = 0, ns = 0;
  sample(&tsc, &ns);
  const std::uint64_t rate = static_cast<std::uint64_t>(
      (static_cast<unsigned __int128>(ns - g_base_ns) << 32) / (tsc - g_base_tsc));
  const std::uint64_t begin = tsc + ticks_for(kLeadNs, rate);
  const std::uint64_t ticks = ticks_for(kRefitNs, rate);
  const std::uint64_t start = apply(begin, cur);
  const std::uint64_t target = ns + kLeadNs + kRefitNs;  // CLOCK_MONOTONIC at begin + ticks
  std::uint64_t mult = target > start
                           ? static_cast<std::uint64_t>((static_cast<unsigned __int128>(target - start) << 32) / ticks)
                           : 0;
  if (mult < rate / 2) mult = rate / 2;
  if (mult > rate + rate / 2) mult = rate + rate / 2;
  publish(cur, Piece{begin, start, mult}, begin + ticks);
}

}  // namespace

void EventClock::init() {
  std::call_once(g_once, decide);
}

void EventClock::init_trusting_cpu() {
  std::call_once(g_once, [] {
    g_ignore_kernel_verdict = true;
    decide();
  });
}

bool EventClock::uses_tsc() {
  init();
  return g_mode.load(std::memory_order_acquire) == 1;
}

std::uint64_t EventClock::now() {
  int mode = g_mode.load(std::memory_order_acquire);
  if (mode < 0) [[unlikely]] {
    init();
    mode = g_mode.load(std::memory_order_acquire);
  }
  if (mode == 0) return monotonic_ns();
  const std::uint64_t tsc = __rdtsc();
  for (;;) {
    constexpr auto acq = std::memory_order_acquire;
    const std::uint32_t s = g_fit.seq.load(acq);
    const Piece prev{g_fit.prev_tsc0.load(acq), g_fit.prev_ns0.load(acq), g_fit.prev_mult.load(acq)};
    const Piece cur{g_fit.tsc0.load(acq), g_fit.ns0.load(acq), g_fit.mult.load(acq)};
    const std::uint64_t next = g_fit.next_refit.load(acq);
    if ((s & 1) || g_fit.seq.load(acq) != s) continue;
    if (tsc >= next && g_refit_lock.try_lock()) [[unlikely]] {
      if (g_fit.seq.load(std::memory_order_acquire) == s) refit(cur);
      g_refit_lock.unlock();
      continue;
    }
    return tsc >= cur.tsc0 ? apply(tsc, cur) : apply(tsc, prev);
  }
}

}  // namespace cupool
