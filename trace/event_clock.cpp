// The trace events' clock (event_clock.h): the TSC fit, the choice between the TSC and
// clock_gettime, and the ordered TSC read the hot paths stamp with.
#include "event_clock.h"

#include <cpuid.h>
#include <time.h>
#include <x86intrin.h>

#include <fstream>
#include <mutex>
#include <string>

namespace cupool {

// ---- TscFit ------------------------------------------------------------------------------------

std::uint64_t TscFit::apply(std::uint64_t tick, const Piece& p) {
  auto scale = [](std::uint64_t ticks, std::uint64_t mult) {
    return static_cast<std::uint64_t>((static_cast<unsigned __int128>(ticks) * mult) >> 32);
  };
  if (tick >= p.tick0) {
    if (tick <= p.end) return p.ns0 + scale(tick - p.tick0, p.mult);
    return p.ns0 + scale(p.end - p.tick0, p.mult) + scale(tick - p.end, p.rate);
  }
  const std::uint64_t back = scale(p.tick0 - tick, p.mult);
  return p.ns0 > back ? p.ns0 - back : 0;
}

std::uint64_t TscFit::ticks_for(std::uint64_t ns, std::uint64_t mult) const {
  return static_cast<std::uint64_t>((static_cast<unsigned __int128>(ns) << 32) / mult);
}

// A (tick, ns) pair read as close together as the machine allows.
void TscFit::sample(std::uint64_t* tick, std::uint64_t* ns) const {
  std::uint64_t best = ~std::uint64_t{0};
  for (int i = 0; i < 5; ++i) {
    const std::uint64_t a = ticks_();
    const std::uint64_t n = ns_();
    const std::uint64_t b = ticks_();
    if (b - a < best) {
      best = b - a;
      *tick = a + (b - a) / 2;
      *ns = n;
    }
  }
}

// Data stores are release and data loads acquire, so a reader that sees any new datum also sees
// the odd count. Gives up (false) if the counter has reached `not_after` once the count is odd:
// a refit delayed that long (the thread descheduled) would change the function for ticks that
// readers may already have converted with the current piece.
bool TscFit::publish(const Piece& prev, const Piece& cur, std::uint64_t next_refit, std::uint64_t not_after) {
  const std::uint32_t s = seq_.load(std::memory_order_relaxed);
  seq_.store(s + 1, std::memory_order_seq_cst);
  if (ticks_() >= not_after) {
    seq_.store(s, std::memory_order_release);
    return false;
  }
  constexpr auto rel = std::memory_order_release;
  prev_tick0_.store(prev.tick0, rel);
  prev_ns0_.store(prev.ns0, rel);
  prev_mult_.store(prev.mult, rel);
  prev_end_.store(prev.end, rel);
  prev_rate_.store(prev.rate, rel);
  tick0_.store(cur.tick0, rel);
  ns0_.store(cur.ns0, rel);
  mult_.store(cur.mult, rel);
  end_.store(cur.end, rel);
  rate_.store(cur.rate, rel);
  next_refit_.store(next_refit, rel);
  seq_.store(s + 2, rel);
  if (history_count_ == 0 || history_[(history_count_ - 1) % kHistory].tick0 != cur.tick0)
    history_[history_count_++ % kHistory] = cur;
  return true;
}

bool TscFit::calibrate() {
  sample(&base_tick_, &base_ns_);
  std::uint64_t tick = 0, ns = 0;
  do sample(&tick, &ns);
  while (ns - base_ns_ < kCalibrateNs);
  if (tick <= base_tick_) return false;
  const std::uint64_t mult =
      static_cast<std::uint64_t>((static_cast<unsigned __int128>(ns - base_ns_) << 32) / (tick - base_tick_));
  if (mult == 0) return false;
  const std::uint64_t end = tick + ticks_for(kRefitNs, mult);
  const Piece first{tick, ns, mult, end, mult};
  std::lock_guard g(refit_lock_);
  return publish(first, first, end, ~std::uint64_t{0});
}

// Run by the reader that first finds the fit due. The next piece begins kLeadNs from now, where
// the current one will be then (so no reading runs backwards, and readers that still use the
// current piece agree with it), and aims to meet the nanosecond clock kRefitNs later, at a slope
// within 1/2..3/2 of the long-run rate.
void TscFit::refit(const Piece& cur) {
  std::uint64_t tick = 0, ns = 0;
  sample(&tick, &ns);
  const std::uint64_t rate =
      static_cast<std::uint64_t>((static_cast<unsigned __int128>(ns - base_ns_) << 32) / (tick - base_tick_));
  const std::uint64_t begin = tick + ticks_for(kLeadNs, rate);
  const std::uint64_t ticks = ticks_for(kRefitNs, rate);
  const std::uint64_t start = apply(begin, cur);
  const std::uint64_t target = ns + kLeadNs + kRefitNs;  // the nanosecond clock at begin + ticks
  std::uint64_t mult =
      target > start ? static_cast<std::uint64_t>((static_cast<unsigned __int128>(target - start) << 32) / ticks) : 0;
  if (mult < rate / 2) mult = rate / 2;
  if (mult > rate + rate / 2) mult = rate + rate / 2;
  publish(cur, Piece{begin, start, mult, begin + ticks, rate}, begin + ticks, begin);
}

std::uint64_t TscFit::now() {
  constexpr auto acq = std::memory_order_acquire;
  for (;;) {
    const std::uint32_t s = seq_.load(acq);
    // Read after the sequence: a tick read before a refit the reader then missed could lie
    // before the previous piece.
    const std::uint64_t tick = ticks_();
    const Piece prev{prev_tick0_.load(acq), prev_ns0_.load(acq), prev_mult_.load(acq), prev_end_.load(acq),
                     prev_rate_.load(acq)};
    const Piece cur{tick0_.load(acq), ns0_.load(acq), mult_.load(acq), end_.load(acq), rate_.load(acq)};
    const std::uint64_t next = next_refit_.load(acq);
    if ((s & 1) || seq_.load(acq) != s) {
      __builtin_ia32_pause();
      continue;
    }
    if (tick >= next && refit_lock_.try_lock()) [[unlikely]] {
      if (seq_.load(acq) == s) refit(cur);
      refit_lock_.unlock();
      continue;
    }
    return tick >= cur.tick0 ? apply(tick, cur) : apply(tick, prev);
  }
}

std::uint64_t TscFit::to_ns(std::uint64_t tick) {
  std::lock_guard g(refit_lock_);
  const std::size_t kept = history_count_ < kHistory ? history_count_ : kHistory;
  for (std::size_t i = 1; i <= kept; ++i) {  // newest first: recent ticks are the common case
    const Piece& p = history_[(history_count_ - i) % kHistory];
    if (tick >= p.tick0) return apply(tick, p);
    if (i == kept) {  // older than every piece kept: back from the oldest, at the long-run rate
      Piece q = p;
      q.mult = q.rate;
      return apply(tick, q);
    }
  }
  return 0;  // not calibrated
}

// A thread of the parent may have held the refit lock or been inside publish() at the fork.
void TscFit::reset_after_fork() {
  refit_lock_.reset_after_fork();
  const std::uint32_t s = seq_.load(std::memory_order_relaxed);
  if (s & 1) seq_.store(s + 1, std::memory_order_release);
}

// ---- EventClock --------------------------------------------------------------------------------

namespace {

// rdtsc alone is not ordered with the loads before it: the CPU may read the counter before a load
// that precedes it in program order has completed. A thread that has seen another thread's event
// (through memory) could then stamp its own earlier: 0.1-0.5% of readings on the 2-core dev VM
// (test_event_clock.cpp). The lfence keeps the read after every earlier load, as the kernel's own
// rdtsc_ordered() and the vDSO's clock_gettime do.
inline std::uint64_t read_tsc() {
  _mm_lfence();
  return __rdtsc();
}

// Constant-initialized: the shim reads the clock from its load-time constructor, which may run
// before this file's dynamic initializers.
constinit TscFit g_tsc_fit(&read_tsc, &monotonic_ns);
std::atomic<int> g_mode{-1};  // -1 not decided, 0 clock_gettime, 1 TSC
std::once_flag g_once;

bool tsc_trusted() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0x80000000u, nullptr) < 0x80000007u) return false;
  __cpuid(0x80000007u, a, b, c, d);
  if (!(d & (1u << 8))) return false;  // not invariant
  std::ifstream f("/sys/devices/system/clocksource/clocksource0/available_clocksource");
  std::string word;
  while (f >> word)
    if (word == "tsc") return true;
  return false;
}

}  // namespace

void EventClock::init() {
  std::call_once(g_once, [] { g_mode.store(tsc_trusted() && g_tsc_fit.calibrate() ? 1 : 0, std::memory_order_release); });
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
  return mode == 1 ? g_tsc_fit.now() : monotonic_ns();
}

void EventClock::after_fork_in_child() { g_tsc_fit.reset_after_fork(); }

std::uint64_t EventClock::stamp() {
  int mode = g_mode.load(std::memory_order_acquire);
  if (mode < 0) [[unlikely]] {
    init();
    mode = g_mode.load(std::memory_order_acquire);
  }
  return mode == 1 ? read_tsc() : monotonic_ns();
}

std::uint64_t EventClock::stamp_to_ns(std::uint64_t stamp) { return uses_tsc() ? g_tsc_fit.to_ns(stamp) : stamp; }

}  // namespace cupool
