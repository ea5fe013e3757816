// The clock of trace events: CLOCK_MONOTONIC nanoseconds. Every traced call reads it twice, and
// on the H200's VM clock_gettime costs 28-39 ns, so where the TSC is invariant and the kernel
// trusts it (it lists "tsc" among its clock sources only when the CPUs' counters agree), it is
// read instead and mapped onto CLOCK_MONOTONIC by a TscFit. Elsewhere clock_gettime is used.
//
// Hot paths take a stamp() (an ordered rdtsc: lfence + rdtsc; a bare rdtsc was 18 ns there,
// against 35 ns for a fitted now()) and the trace writer converts it later with stamp_to_ns(),
// which gives what now() would have.
//
// What it guarantees across threads: a reading (now() or a stamp, once converted) taken by a
// thread after it has seen, through memory with acquire order, another thread's reading or
// anything that thread wrote after its reading, is never smaller. So an event that another
// event caused through memory (a free, then the allocation that reuses the address) is never
// stamped before it. This rests on two things: the read is ordered after earlier loads (the
// lfence), and the CPUs' counters agree, which the kernel checked before it listed "tsc" as a
// clock source (else CLOCK_MONOTONIC, which gives the same guarantee, is used).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "clock.h"  // monotonic_ns()
#include "spin_lock.h"

namespace cupool {

// Maps a tick counter onto a nanosecond clock by a continuous, increasing piecewise-linear
// function, re-fitted every kRefitNs (past a piece's window, at the long-run rate): readings stay
// within microseconds of the nanosecond clock
// and never run backwards, also across threads and refits. The sources are injectable so that
// tests can drive the fit with a counter of known rate and drift.
class TscFit {
 public:
  using Source = std::uint64_t (*)();
  static constexpr std::uint64_t kRefitNs = 20'000'000;  // how often the fit is corrected
  static constexpr std::uint64_t kLeadNs = 1'000'000;    // a new piece starts this far after its sample
  static constexpr std::uint64_t kCalibrateNs = 2'000'000;

  constexpr TscFit(Source ticks, Source ns) : ticks_(ticks), ns_(ns) {}
  bool calibrate();  // ~kCalibrateNs of sampling; false if the counter does not advance
  std::uint64_t now();
  // A tick read earlier, mapped as now() mapped it then: by the piece that was in force. Pieces
  // older than the last kHistory are gone; ticks before them use the oldest one kept.
  std::uint64_t to_ns(std::uint64_t tick);
  void reset_after_fork();  // in a forked child, before anything reads the clock
  static constexpr std::size_t kHistory = 256;  // >= 5 s of pieces

 private:
  // ns = ns0 + (tick - tick0) * mult / 2^32 up to `end`, then at the long-run `rate`: a
  // corrective slope must not run on through an idle gap in which nobody refits.
  struct Piece {
    std::uint64_t tick0 = 0, ns0 = 0, mult = 0, end = 0, rate = 0;
  };
  static std::uint64_t apply(std::uint64_t tick, const Piece& p);
  std::uint64_t ticks_for(std::uint64_t ns, std::uint64_t mult) const;
  void sample(std::uint64_t* tick, std::uint64_t* ns) const;
  bool publish(const Piece& prev, const Piece& cur, std::uint64_t next_refit, std::uint64_t not_after);
  void refit(const Piece& cur);

  Source ticks_, ns_;
  std::uint64_t base_tick_ = 0, base_ns_ = 0;  // the first sample: the long baseline of the rate
  // The fit: the current piece from its tick0 on, the previous one before it; a sequence lock
  // in atomics (no fences: the thread sanitizer does not model them).
  std::atomic<std::uint32_t> seq_{0};
  std::atomic<std::uint64_t> prev_tick0_{0}, prev_ns0_{0}, prev_mult_{0}, prev_end_{0}, prev_rate_{0};
  std::atomic<std::uint64_t> tick0_{0}, ns0_{0}, mult_{0}, end_{0}, rate_{0}, next_refit_{~std::uint64_t{0}};
  SpinLock refit_lock_;  // refits, and the history below
  Piece history_[kHistory]{};  // every published piece, a ring: for to_ns()
  std::size_t history_count_ = 0;
};

class EventClock {
 public:
  // Decides TSC or not (and calibrates: ~2 ms) on first use; call early to keep that off hot paths.
  static void init();
  static std::uint64_t now();
  static bool uses_tsc();
  // A reading for hot paths: TSC ticks where uses_tsc(), else CLOCK_MONOTONIC ns (then
  // stamp_to_ns is the identity).
  static std::uint64_t stamp();
  static std::uint64_t stamp_to_ns(std::uint64_t stamp);
  static void after_fork_in_child();
};

}  // namespace cupool
