// The shared budget (policy/shared_budget): the admission protocol model-checked over every
// interleaving, the real segment in one process, many processes at once (some killed), a forked
// child, and a member that waits for room. docs/design.md, "Sharing a device".
//
// Children made with fork() never run Catch2 assertions: they report through shared memory or
// their exit status and leave with _exit().
#include <catch2/catch.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <iterator>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>
#include <new>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "config.h"
#include "shared_budget.h"

using cupool::LimitSpec;
using cupool::SharedBudget;
using cupool::SizeSpec;

// ---- 1. The admission protocol, model-checked ----------------------------------------------------
//
// try_admit, step by step: (A) held[me] += b; (S0..Sn-1) read held[0], held[1], ... one slot at a
// time into a local sum, other threads running between the reads; (D) decide: sum <= budget admits;
// otherwise (U) held[me] -= b and refuse. An admitted claim is later released: (R) held[me] -= b.
// Every step touches one shared word once, so it is atomic. The implementation uses seq_cst for
// the claim, the reads and the take-back, so the memory model is sequential consistency: every run
// is an interleaving of these steps, and enumerating every interleaving covers every run. (It is
// Dekker's pattern, write mine then read theirs: with acquire/release alone two claimers could
// each miss the other's claim, a run no interleaving gives, and this model would not apply.)
// Slots are read in a fixed order, as the implementation's loop does; a slot not in use reads 0.
//
// Threads of one process share its slot. A process may crash before any step: all its threads stop
// forever and its slot keeps what it held, until reclaim_dead empties it (one atomic exchange).
// Memory in use: the claims admitted and not released; a crashed process's count until its slot
// is reclaimed (after which the driver has its memory back). Checked at every reachable state:
//   - memory in use <= budget;
//   - every slot holds exactly its admitted claims plus the claims being decided (no byte lost).
// Depth-first over global states, each state visited once.
namespace model {

constexpr int kMaxProcesses = 4;
constexpr int kMaxThreads = 6;

enum Step : std::uint8_t { kAdd, kRead, kDecide, kTakeBack, kRelease, kDone };

struct Thread {
  int process = 0;
  std::vector<std::uint32_t> claims;  // the admissions it makes, in order
  bool release = true;                // an admitted claim is released before its next admission
};

struct Protocol {
  std::uint32_t budget = 1000;
  int processes = 3;
  std::vector<Thread> threads;
  std::uint32_t may_crash = 0;    // bit p: process p may stop forever before any of its steps
  bool reclaim = false;           // a crashed process's slot may then be emptied (reclaim_dead)
  bool check_then_claim = false;  // the racy protocol (read the sum, then claim): must be caught
  // Partial-order reductions (each is checked against the full search below): a thread decides
  // as soon as it may (deciding writes nothing shared, so it commutes with every other step, and
  // deciding early only adds an admitted claim sooner); reads stop once the sum decides; a
  // reclaimed process's threads are forgotten (nothing of theirs is counted any more).
  bool reduce = true;
};

struct ThreadState {
  std::uint8_t claim = 0, step = kAdd, next_read = 0;
  std::uint8_t admitted = 0;  // bit per claim: admitted and not released
  std::uint8_t refused = 0;   // bit per claim
  std::uint32_t sum = 0;      // of the reads so far, capped at budget + 1 (only "<= budget" matters)
};

struct State {
  std::array<std::uint32_t, kMaxProcesses> held{};
  std::uint32_t dead = 0, reclaimed = 0;
  std::array<ThreadState, kMaxThreads> threads{};
};

struct Outcome {
  std::size_t states = 0, terminals = 0;
  std::string violation;  // empty, or what failed and the steps that led there
  std::uint32_t max_in_use = 0;
  std::set<std::uint32_t> together;        // sets of claims in use at once (bit per claim, every thread)
  std::set<std::uint32_t> refused_at_end;  // in final states without a crash: the claims refused
  std::uint32_t ever_admitted = 0, ever_refused = 0;
};

class Checker {
 public:
  explicit Checker(Protocol p) : p_(std::move(p)) {
    if (p_.processes > kMaxProcesses || p_.threads.size() > static_cast<std::size_t>(kMaxThreads))
      throw std::logic_error("model too large");
    int bit = 0;
    std::uint64_t total = 0;
    for (const Thread& t : p_.threads) {
      if (t.claims.size() > 4 || t.process >= p_.processes) throw std::logic_error("bad thread");
      for (const std::uint32_t c : t.claims) total += c;
      first_bit_.push_back(bit);
      bit += static_cast<int>(t.claims.size());
    }
    if (bit > 32) throw std::logic_error("too many claims");
    if (total >= 4095 || p_.budget >= 4095) throw std::logic_error("sizes do not fit the state's key");
  }

  // Bit of claim `c` of thread `t` in Outcome's sets.
  std::uint32_t bit(int t, int c) const { return 1u << (first_bit_[t] + c); }
  std::uint32_t claims_of_size(std::uint32_t size) const {
    std::uint32_t out = 0;
    for (std::size_t t = 0; t < p_.threads.size(); ++t)
      for (std::size_t c = 0; c < p_.threads[t].claims.size(); ++c)
        if (p_.threads[t].claims[c] == size) out |= bit(static_cast<int>(t), static_cast<int>(c));
    return out;
  }

  Outcome run() {
    seen_.reserve(1 << 16);
    State s;
    for (std::size_t i = 0; i < p_.threads.size(); ++i) s.threads[i].step = first_step();
    visit(s);
    return out_;
  }

 private:
  struct Move {
    char kind;  // 't' a thread's step, 'c' a crash, 'r' a reclaim
    std::uint8_t who, step, claim, read;
  };

  Step first_step() const { return p_.check_then_claim ? kRead : kAdd; }
  std::size_t thread_count() const { return p_.threads.size(); }

  void advance(ThreadState& t, const Thread& th) const {
    ++t.claim;
    t.sum = 0;
    t.next_read = 0;
    t.step = t.claim == th.claims.size() ? kDone : first_step();
  }

  // One step of thread i; false when it has none (done, or its process crashed).
  bool step(State& s, std::size_t i) const {
    ThreadState& t = s.threads[i];
    const Thread& th = p_.threads[i];
    if (t.step == kDone || (s.dead >> th.process & 1)) return false;
    const std::uint32_t b = th.claims[t.claim];
    const std::uint8_t bit = static_cast<std::uint8_t>(1u << t.claim);
    std::uint32_t& mine = s.held[th.process];
    switch (t.step) {
      case kAdd:
        mine += b;
        if (!p_.check_then_claim) {
          t.step = kRead;
        } else {
          t.admitted |= bit;  // the racy protocol admits by adding what it checked before
          if (th.release) t.step = kRelease; else advance(t, th);
        }
        break;
      case kRead:
        t.sum = std::min(t.sum + s.held[t.next_read], p_.budget + 1);
        ++t.next_read;
        // Reduction: once the sum decides the claim, the reads left cannot change the outcome and
        // write nothing, so the thread goes on to decide.
        if (t.next_read == p_.processes || (p_.reduce && t.sum + (p_.check_then_claim ? b : 0) > p_.budget))
          t.step = kDecide;
        break;
      case kDecide:
        if (p_.check_then_claim) {
          if (t.sum + b <= p_.budget) {
            t.step = kAdd;
          } else {
            t.refused |= bit;
            advance(t, th);
          }
        } else if (t.sum <= p_.budget) {
          t.admitted |= bit;
          if (th.release) t.step = kRelease; else advance(t, th);
        } else {
          t.refused |= bit;
          t.step = kTakeBack;
        }
        break;
      case kTakeBack:
      case kRelease:
        mine -= b;  // never below zero: the accounting check below would fail first
        if (t.step == kRelease) t.admitted &= static_cast<std::uint8_t>(~bit);
        advance(t, th);
        break;
      default:
        return false;
    }
    return true;
  }

  // The empty string, or what is wrong with state s.
  std::string check(const State& s) {
    std::uint32_t in_use = 0, together = 0, refused = 0;
    std::array<std::uint64_t, kMaxProcesses> expected{};
    for (std::size_t i = 0; i < thread_count(); ++i) {
      const ThreadState& t = s.threads[i];
      const Thread& th = p_.threads[i];
      for (std::size_t c = 0; c < th.claims.size(); ++c) {
        if (t.refused >> c & 1) refused |= bit(static_cast<int>(i), static_cast<int>(c));
        if (!(t.admitted >> c & 1) || (s.reclaimed >> th.process & 1)) continue;
        in_use += th.claims[c];
        together |= bit(static_cast<int>(i), static_cast<int>(c));
        expected[th.process] += th.claims[c];
      }
      // A claim added and not yet decided, or refused and not yet taken back, is in its slot too.
      if (!p_.check_then_claim && (t.step == kRead || t.step == kDecide || t.step == kTakeBack) &&
          !(s.reclaimed >> th.process & 1))
        expected[th.process] += th.claims[t.claim];
    }
    out_.max_in_use = std::max(out_.max_in_use, in_use);
    out_.together.insert(together);
    out_.ever_admitted |= together;
    out_.ever_refused |= refused;
    if (in_use > p_.budget)
      return "claims admitted at once pass the budget: " + std::to_string(in_use) + " > " + std::to_string(p_.budget);
    for (int p = 0; p < p_.processes; ++p)
      if (s.held[p] != expected[p])
        return "slot " + std::to_string(p) + " holds " + std::to_string(s.held[p]) + ", its claims add up to " +
               std::to_string(expected[p]);
    return {};
  }

  void terminal(const State& s) {
    ++out_.terminals;
    if (s.dead != 0) return;
    std::uint32_t refused = 0;
    for (std::size_t i = 0; i < thread_count(); ++i)
      for (std::size_t c = 0; c < p_.threads[i].claims.size(); ++c)
        if (s.threads[i].refused >> c & 1) refused |= bit(static_cast<int>(i), static_cast<int>(c));
    out_.refused_at_end.insert(refused);
  }

  // The state packed into 256 bits (held: 12 bits a slot; per thread: claim, step, read: 3 bits
  // each, admitted and refused: 4, sum: 12), the key of the visited set.
  struct Key {
    std::array<std::uint64_t, 4> w{};
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& k) const {
      std::uint64_t h = 0x9e3779b97f4a7c15ull;
      for (const std::uint64_t x : k.w) {
        h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
        h *= 0xbf58476d1ce4e5b9ull;
      }
      return static_cast<std::size_t>(h ^ (h >> 31));
    }
  };
  Key key_of(const State& s) const {
    Key k;
    int at = 0;
    auto put = [&k, &at](std::uint64_t v, int bits) {
      for (int i = 0; i < bits; ++i, ++at)
        if (v >> i & 1) k.w[at / 64] |= 1ull << (at % 64);
    };
    for (int p = 0; p < p_.processes; ++p) put(s.held[p], 12);
    put(s.dead, kMaxProcesses);
    put(s.reclaimed, kMaxProcesses);
    for (std::size_t i = 0; i < thread_count(); ++i) {
      const ThreadState& t = s.threads[i];
      put(t.claim, 3);
      put(t.step, 3);
      put(t.next_read, 3);
      put(t.admitted, 4);
      put(t.refused, 4);
      put(t.sum, 12);
    }
    return k;
  }

  std::string describe_path() const {
    static const char* const kStepNames[] = {"claims", "reads slot", "decides", "takes back", "releases", "done"};
    std::string out;
    for (const Move& m : path_) {
      if (!out.empty()) out += "; ";
      if (m.kind == 'c') {
        out += "p" + std::to_string(m.who) + " crashes";
      } else if (m.kind == 'r') {
        out += "p" + std::to_string(m.who) + "'s slot reclaimed";
      } else {
        const Thread& th = p_.threads[m.who];
        out += "t" + std::to_string(m.who) + "(p" + std::to_string(th.process) + ", " +
               std::to_string(th.claims[m.claim]) + ") " + kStepNames[m.step];
        if (m.step == kRead) out += " " + std::to_string(m.read);
      }
    }
    return out;
  }

  void go(const State& next, Move m) {
    path_.push_back(m);
    visit(next);
    path_.pop_back();
  }

  void visit(const State& s) {
    if (!out_.violation.empty()) return;
    if (!seen_.insert(key_of(s)).second) return;
    ++out_.states;
    if (std::string why = check(s); !why.empty()) {
      out_.violation = why + ", after: " + describe_path();
      return;
    }
    if (p_.reduce) {
      for (std::size_t i = 0; i < thread_count(); ++i) {
        const ThreadState& t = s.threads[i];
        if (t.step != kDecide || (s.dead >> p_.threads[i].process & 1)) continue;
        State next = s;
        step(next, i);
        go(next, {'t', static_cast<std::uint8_t>(i), t.step, t.claim, t.next_read});
        return;
      }
    }
    bool moved = false;
    for (std::size_t i = 0; i < thread_count(); ++i) {
      State next = s;
      const ThreadState& t = s.threads[i];
      if (!step(next, i)) continue;
      moved = true;
      go(next, {'t', static_cast<std::uint8_t>(i), t.step, t.claim, t.next_read});
    }
    for (int p = 0; p < p_.processes; ++p) {
      const std::uint32_t pb = 1u << p;
      if ((p_.may_crash & pb) && !(s.dead & pb)) {
        bool running = s.held[p] != 0;
        for (std::size_t i = 0; i < thread_count(); ++i)
          running = running || (p_.threads[i].process == p && s.threads[i].step != kDone);
        if (running) {
          State next = s;
          next.dead |= pb;
          moved = true;
          go(next, {'c', static_cast<std::uint8_t>(p), 0, 0, 0});
        }
      }
      if (p_.reclaim && (s.dead & pb) && !(s.reclaimed & pb)) {
        State next = s;
        next.held[p] = 0;  // reclaim_dead: held[d].exchange(0)
        next.reclaimed |= pb;
        if (p_.reduce)
          for (std::size_t i = 0; i < thread_count(); ++i)
            if (p_.threads[i].process == p) next.threads[i] = ThreadState{0, kDone, 0, 0, 0, 0};
        moved = true;
        go(next, {'r', static_cast<std::uint8_t>(p), 0, 0, 0});
      }
    }
    if (!moved) terminal(s);
  }

  Protocol p_;
  std::vector<int> first_bit_;
  std::unordered_set<Key, KeyHash> seen_;
  std::vector<Move> path_;
  Outcome out_;
};

Thread thread(int process, std::vector<std::uint32_t> claims, bool release = true) {
  return Thread{process, std::move(claims), release};
}

}  // namespace model

using model::Checker;
using model::Protocol;

TEST_CASE("share: model check, three processes: 600 + 600 + 400 in a budget of 1000 (HAMi-core #273)", "[share][model]") {
  Protocol p;
  p.budget = 1000;
  p.processes = 3;
  p.threads = {model::thread(0, {600}), model::thread(1, {600}), model::thread(2, {400})};
  Checker c(p);
  const model::Outcome o = c.run();
  INFO(o.states << " states, " << o.terminals << " final");
  REQUIRE(o.violation.empty());
  CHECK(o.max_in_use == 1000);
  const std::uint32_t a = c.bit(0, 0), b = c.bit(1, 0), small = c.bit(2, 0);
  // Not vacuous: every claim is admitted in some run, 600 + 400 fill the budget exactly...
  CHECK(o.ever_admitted == (a | b | small));
  CHECK(o.together.count(a | small) == 1);
  CHECK(o.together.count(b | small) == 1);
  // ...and both 600s are never in use at once, in any run.
  for (const std::uint32_t set : o.together) CHECK((set & (a | b)) != (a | b));
  // The protocol is conservative: a claim being decided counts against the others, so the two
  // 600s can refuse each other (admit() then reclaims, or waits and retries). Every split occurs.
  CHECK(o.refused_at_end.count(a) == 1);      // one 600 refused, the other and the 400 admitted
  CHECK(o.refused_at_end.count(b) == 1);
  CHECK(o.refused_at_end.count(small) == 1);  // the 400 refused, the 600s admitted in turn
  CHECK(o.refused_at_end.count(a | b) == 1);  // both 600s refused: each saw the other's claim
  CHECK(o.refused_at_end.count(0) == 1);      // one after the other: a 600 released before the next
}

TEST_CASE("share: model check, the racy check-then-claim protocol is caught", "[share][model]") {
  // The checker has teeth: the order HAMi-core #273 describes (read the sum, then add the claim)
  // lets both 600s in, and the search finds the interleaving.
  Protocol p;
  p.budget = 1000;
  p.processes = 3;
  p.threads = {model::thread(0, {600}), model::thread(1, {600}), model::thread(2, {400})};
  p.check_then_claim = true;
  const model::Outcome o = Checker(p).run();
  INFO(o.violation);
  CHECK_FALSE(o.violation.empty());
  CHECK(o.violation.find("pass the budget") != std::string::npos);
  CHECK(o.max_in_use > 1000);
}

TEST_CASE("share: model check, claims that all fit are never refused", "[share][model]") {
  Protocol p;
  p.budget = 1000;
  p.processes = 3;
  p.threads = {model::thread(0, {300}), model::thread(1, {300}), model::thread(2, {400})};
  const model::Outcome o = Checker(p).run();
  REQUIRE(o.violation.empty());
  CHECK(o.ever_refused == 0);
  CHECK(o.refused_at_end == std::set<std::uint32_t>{0});
  CHECK(o.max_in_use == 1000);
}

TEST_CASE("share: model check, two admissions each, any process may crash, dead slots reclaimed", "[share][model]") {
  Protocol p;
  p.budget = 1000;
  p.processes = 3;
  SECTION("claims released between admissions") {
    p.threads = {model::thread(0, {600, 400}), model::thread(1, {600, 300}), model::thread(2, {400, 600})};
  }
  SECTION("claims kept: what each admits adds up") {
    p.threads = {model::thread(0, {300, 400}, false), model::thread(1, {600, 300}, false),
                 model::thread(2, {400, 300}, false)};
  }
  p.may_crash = 0b111;
  p.reclaim = true;
  Checker c(p);
  const model::Outcome o = c.run();
  INFO(o.states << " states, " << o.terminals << " final");
  REQUIRE(o.violation.empty());
  CHECK(o.max_in_use == 1000);
  std::uint32_t all = 0;
  for (int t = 0; t < 3; ++t)
    for (int k = 0; k < 2; ++k) all |= c.bit(t, k);
  CHECK(o.ever_admitted == all);
  CHECK(o.ever_refused == all);
  // Two 600s are never in use together.
  const std::uint32_t sixes = c.claims_of_size(600);
  for (const std::uint32_t set : o.together) CHECK(std::popcount(set & sixes) <= 1);
}

TEST_CASE("share: model check, threads of one process share its slot, and the process may crash", "[share][model]") {
  Protocol p;
  p.budget = 1000;
  p.processes = 3;
  // Process 0 runs two threads; process 2 makes two admissions.
  p.threads = {model::thread(0, {600}), model::thread(0, {400}), model::thread(1, {600}), model::thread(2, {400, 300})};
  p.may_crash = 0b101;
  p.reclaim = true;
  Checker c(p);
  const model::Outcome o = c.run();
  INFO(o.states << " states, " << o.terminals << " final");
  REQUIRE(o.violation.empty());
  CHECK(o.max_in_use == 1000);
  CHECK(o.together.count(c.bit(0, 0) | c.bit(1, 0)) == 1);  // one process's two threads fill it
  for (const std::uint32_t set : o.together) CHECK((set & (c.bit(0, 0) | c.bit(2, 0))) != (c.bit(0, 0) | c.bit(2, 0)));
}

TEST_CASE("share: model check, four processes", "[share][model]") {
  Protocol p;
  p.budget = 1000;
  p.processes = 4;
  SECTION("one admission each, any may crash") {
    p.threads = {model::thread(0, {600}), model::thread(1, {600}), model::thread(2, {400}), model::thread(3, {300})};
    p.may_crash = 0b1111;
    p.reclaim = true;
  }
  SECTION("one process admits twice") {
    p.threads = {model::thread(0, {600, 400}), model::thread(1, {600}), model::thread(2, {400}), model::thread(3, {300})};
  }
  Checker c(p);
  const model::Outcome o = c.run();
  INFO(o.states << " states, " << o.terminals << " final");
  REQUIRE(o.violation.empty());
  CHECK(o.max_in_use == 1000);
  std::uint32_t all = 0;
  for (int t = 0; t < 4; ++t)
    for (std::size_t k = 0; k < p.threads[t].claims.size(); ++k) all |= c.bit(t, static_cast<int>(k));
  CHECK(o.ever_admitted == all);
  CHECK(o.together.count(c.bit(0, 0) | c.bit(2, 0)) == 1);
  for (const std::uint32_t set : o.together) CHECK((set & (c.bit(0, 0) | c.bit(1, 0))) != (c.bit(0, 0) | c.bit(1, 0)));
}

TEST_CASE("share: model check, the reductions lose nothing", "[share][model]") {
  // On models small enough to search in full, the reduced search reaches the same verdict, the
  // same sets of claims in use at once, and the same outcomes.
  auto base = [] {
    Protocol p;
    p.budget = 1000;
    p.processes = 3;
    p.threads = {model::thread(0, {600}), model::thread(1, {600}), model::thread(2, {400})};
    return p;
  };
  std::vector<Protocol> models;
  models.push_back(base());
  models.push_back(base());
  models.back().check_then_claim = true;
  models.push_back(base());
  models.back().may_crash = 0b111;
  models.back().reclaim = true;
  models.push_back(base());
  models.back().threads = {model::thread(0, {600}), model::thread(0, {400}), model::thread(1, {600}),
                           model::thread(2, {400})};
  models.back().may_crash = 0b001;
  models.back().reclaim = true;
  models.push_back(base());
  models.back().threads = {model::thread(0, {600, 400}), model::thread(1, {300, 600}), model::thread(2, {400}, false)};
  for (std::size_t i = 0; i < models.size(); ++i) {
    Protocol full = models[i];
    full.reduce = false;
    const model::Outcome r = Checker(models[i]).run(), f = Checker(full).run();
    INFO("model " << i << ": " << r.states << " states reduced, " << f.states << " in full");
    CHECK(r.violation.empty() == f.violation.empty());
    if (!f.violation.empty()) continue;  // a search stops at its first violation: nothing more to compare
    CHECK(r.max_in_use == f.max_in_use);
    CHECK(r.ever_admitted == f.ever_admitted);
    CHECK(r.ever_refused == f.ever_refused);
    CHECK(r.together == f.together);
    CHECK(r.refused_at_end == f.refused_at_end);
    CHECK(r.states < f.states);
  }
}

// ---- Helpers for the real segment ---------------------------------------------------------------

namespace {

constexpr std::uint64_t kMiB = 1ull << 20;

std::uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

// A budget name no other test (or run) uses.
std::string unique_name(const std::string& what) {
  static std::atomic<unsigned> counter{0};
  std::random_device rd;
  return "cupool-test-" + what + "-" + std::to_string(getpid()) + "-" + std::to_string(rd() % 1'000'000) + "-" +
         std::to_string(counter.fetch_add(1));
}

// Removes the budget's segment from /dev/shm when the test ends, however it ends.
struct Unlink {
  std::string name;
  ~Unlink() { shm_unlink(SharedBudget::segment_name(name, false).c_str()); }
};

std::string segment_path(const std::string& name) { return "/dev/shm" + SharedBudget::segment_name(name, false); }

SizeSpec bytes(std::uint64_t b) { return SizeSpec{b, 0}; }
SizeSpec percent(double p) { return SizeSpec{0, p}; }
LimitSpec limit_of(std::optional<SizeSpec> all, std::vector<std::pair<int, SizeSpec>> per_device = {}) {
  LimitSpec l;
  l.all = all;
  l.per_device = std::move(per_device);
  return l;
}

std::unique_ptr<SharedBudget> must_join(const std::string& name, const LimitSpec& limit) {
  std::string error;
  auto b = SharedBudget::join(name, limit, false, &error);
  INFO(error);
  REQUIRE(b != nullptr);
  return b;
}

const SharedBudget::Member* member_of(const std::vector<SharedBudget::Member>& members, int pid) {
  for (const SharedBudget::Member& m : members)
    if (m.pid == pid) return &m;
  return nullptr;
}

// Memory shared with forked children (MAP_SHARED | MAP_ANONYMOUS), made before the fork.
template <class T>
class Shared {
 public:
  Shared() {
    void* p = mmap(nullptr, sizeof(T), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap");
    p_ = new (p) T();
  }
  ~Shared() {
    p_->~T();
    munmap(p_, sizeof(T));
  }
  Shared(const Shared&) = delete;
  Shared& operator=(const Shared&) = delete;
  T* operator->() const { return p_; }
  T& operator*() const { return *p_; }

 private:
  T* p_ = nullptr;
};

// A forked child running `body`; it leaves with _exit(what body returns): no Catch2, no atexit.
// Killed and reaped by the destructor if the test ends first.
class Child {
 public:
  template <class F>
  explicit Child(F body) {
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork");
    if (pid_ == 0) {
      int rc = 100;
      try {
        rc = body();
      } catch (...) {
        rc = 101;
      }
      _exit(rc);
    }
  }
  ~Child() {
    if (!reaped_) {
      ::kill(pid_, SIGKILL);
      wait();
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  pid_t pid() const { return pid_; }
  // False once it has exited (then reaped: status() says how).
  bool running() {
    if (reaped_) return false;
    int st = 0;
    const pid_t r = wait4(pid_, &st, WNOHANG, &usage_);
    if (r == pid_) record(st);
    return !reaped_;
  }
  // Its exit status, or 128 + the signal that ended it.
  int wait() {
    while (!reaped_) {
      int st = 0;
      const pid_t r = wait4(pid_, &st, 0, &usage_);
      if (r == pid_) record(st);
      else if (r < 0 && errno != EINTR) reaped_ = true, status_ = -1;
    }
    return status_;
  }
  void kill9() { ::kill(pid_, SIGKILL); }
  double cpu_seconds() const {
    return static_cast<double>(usage_.ru_utime.tv_sec + usage_.ru_stime.tv_sec) +
           static_cast<double>(usage_.ru_utime.tv_usec + usage_.ru_stime.tv_usec) / 1e6;
  }

 private:
  void record(int st) {
    reaped_ = true;
    status_ = WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : -1;
  }
  pid_t pid_ = -1;
  bool reaped_ = false;
  int status_ = -1;
  rusage usage_{};
};

// Polls `done` every millisecond while `child` runs. False if the child exits first, or after two
// minutes (a guard against a hang, not a measure of speed).
template <class F>
bool wait_until(Child& child, F done) {
  const std::uint64_t give_up = now_ns() + 120'000'000'000ull;
  for (;;) {
    if (done()) return true;
    if (!child.running() || now_ns() > give_up) return false;
    usleep(1000);
  }
}

}  // namespace

// ---- 1b. Liveness and slot claiming, model-checked (issue 26) ----------------------------------------
//
// Who owns a slot, as the kernel's locks decide it (policy/shared_budget.cpp: my_slot, reclaim_dead).
// A process claims a slot by locking it (a try: it fails while another holds it), marks it
// claiming, empties what a dead member left, marks it live, then holds one unit in it. It may die
// at any step, its own slot's lock dropping with it (exec is the same for the slot). A reclaimer
// (another member about to be refused) may at any moment lock any slot that holds something,
// empty it and unlock it. Checked at every reachable state:
//   - no two processes own one slot;
//   - no live process's unit is ever emptied by anyone else;
//   - at the end, every slot is a live member's or can be locked (so emptied, or claimed): no
//     slot is stuck, whatever died where.
// `pid_rules` is the rule of 51ba0d9 (a slot is claimed by CAS of its owner from 0; a dead
// member is found by its pid, and only a slot marked live is reclaimed): the check must catch
// its stuck slot (a member killed while claiming, 12 of 400 kills in the issue).
namespace slot_model {

constexpr int kProcs = 3, kSlots = 2;
enum Pc : std::uint8_t { kTry, kMarkClaiming, kEmpty, kMarkLive, kHold, kHolding, kNoSlot };
enum Owner : std::uint8_t { kFree, kClaiming, kLive };

struct State {
  std::array<std::int8_t, kSlots> lock{-1, -1};      // holder: a process, kProcs (the reclaimer), or -1
  std::array<Owner, kSlots> owner{};
  std::array<std::int8_t, kSlots> owner_pid{-1, -1};
  std::array<std::uint8_t, kSlots> held{};
  std::array<Pc, kProcs> pc{};
  std::array<std::int8_t, kProcs> slot{-1, -1, -1};  // the slot the process tries or owns
  std::array<bool, kProcs> dead{};
  std::int8_t reclaiming = -1;  // the slot the reclaimer has locked, emptying it
  bool operator==(const State&) const = default;
};
struct StateHash {
  std::size_t operator()(const State& s) const {
    std::string bytes(reinterpret_cast<const char*>(&s), sizeof s);
    return std::hash<std::string>{}(bytes);
  }
};

class Checker {
 public:
  explicit Checker(bool pid_rules) : pid_rules_(pid_rules) {}
  std::string run() {
    State s;
    for (int p = 0; p < kProcs; ++p) s.slot[p] = 0;
    visit(s);
    return violation_;
  }
  std::size_t states() const { return seen_.size(); }

 private:
  bool lockable(const State& s, int i) const { return s.lock[i] < 0; }

  std::string check(const State& s) const {
    for (int a = 0; a < kProcs; ++a)
      for (int b = a + 1; b < kProcs; ++b)
        if (!s.dead[a] && !s.dead[b] && s.pc[a] >= kMarkClaiming && s.pc[a] <= kHolding &&
            s.pc[b] >= kMarkClaiming && s.pc[b] <= kHolding && s.slot[a] == s.slot[b])
          return "two live processes own slot " + std::to_string(s.slot[a]);
    for (int p = 0; p < kProcs; ++p)
      if (!s.dead[p] && s.pc[p] == kHolding && s.held[s.slot[p]] == 0)
        return "a live process's unit was emptied by another";
    return {};
  }

  // Every slot a live holder's, or one that someone could still take (lock it, or, under the
  // pid rules, find it free or reclaimable).
  std::string stuck(const State& s) const {
    for (int i = 0; i < kSlots; ++i) {
      const int o = s.owner_pid[i];
      const bool owner_alive = o >= 0 && !s.dead[o] && s.slot[o] == i && s.pc[o] >= kMarkClaiming;
      if (owner_alive) continue;
      const bool takeable = pid_rules_ ? s.owner[i] == kFree || s.owner[i] == kLive : lockable(s, i);
      if (!takeable) return "slot " + std::to_string(i) + " is stuck: its owner is gone and no one can take it";
    }
    return {};
  }

  std::vector<State> next(const State& s) const {
    std::vector<State> out;
    for (int p = 0; p < kProcs; ++p) {
      if (s.dead[p]) continue;
      // Death at any step: the kernel drops its lock (pid rules: nothing is dropped).
      {
        State t = s;
        t.dead[p] = true;
        if (!pid_rules_ && t.slot[p] >= 0 && t.lock[t.slot[p]] == p) t.lock[t.slot[p]] = -1;
        out.push_back(t);
      }
      State t = s;
      const int i = t.slot[p];
      switch (t.pc[p]) {
        case kTry:
          if (pid_rules_ ? t.owner[i] == kFree : lockable(t, i)) {
            if (pid_rules_) t.owner[i] = kClaiming, t.owner_pid[i] = static_cast<std::int8_t>(p);
            else t.lock[i] = static_cast<std::int8_t>(p);
            t.pc[p] = pid_rules_ ? kEmpty : kMarkClaiming;
          } else if (i + 1 < kSlots) {
            t.slot[p] = static_cast<std::int8_t>(i + 1);
          } else {
            t.pc[p] = kNoSlot;
            t.slot[p] = -1;
          }
          break;
        case kMarkClaiming:
          t.owner[i] = kClaiming;
          t.owner_pid[i] = static_cast<std::int8_t>(p);
          t.pc[p] = kEmpty;
          break;
        case kEmpty:
          t.held[i] = 0;
          t.pc[p] = kMarkLive;
          break;
        case kMarkLive:
          t.owner[i] = kLive;
          t.pc[p] = kHold;
          break;
        case kHold:
          t.held[i] = 1;
          t.pc[p] = kHolding;
          break;
        default:
          continue;
      }
      out.push_back(t);
    }
    // The reclaimer.
    if (s.reclaiming >= 0) {
      State t = s;
      const int i = t.reclaiming;
      t.held[i] = 0;
      t.owner[i] = kFree;
      t.owner_pid[i] = -1;
      if (!pid_rules_) t.lock[i] = -1;
      t.reclaiming = -1;
      out.push_back(t);
    } else {
      for (int i = 0; i < kSlots; ++i) {
        if (s.owner[i] == kFree && s.held[i] == 0) continue;
        State t = s;
        if (pid_rules_) {
          const int o = s.owner_pid[i];  // a live-marked slot whose pid is gone
          if (s.owner[i] != kLive || o < 0 || !s.dead[o]) continue;
        } else {
          if (!lockable(s, i)) continue;
          t.lock[i] = static_cast<std::int8_t>(kProcs);
        }
        t.reclaiming = static_cast<std::int8_t>(i);
        out.push_back(t);
      }
    }
    return out;
  }

  void visit(const State& s) {
    if (!violation_.empty() || !seen_.insert(s).second) return;
    if (std::string v = check(s); !v.empty()) {
      violation_ = v;
      return;
    }
    const std::vector<State> more = next(s);
    bool settled = s.reclaiming < 0;
    for (int p = 0; p < kProcs && settled; ++p)
      settled = s.dead[p] || s.pc[p] == kHolding || s.pc[p] == kNoSlot;
    if (settled)
      if (std::string v = stuck(s); !v.empty()) {
        violation_ = v;
        return;
      }
    for (const State& t : more) visit(t);
  }

  bool pid_rules_;
  std::unordered_set<State, StateHash> seen_;
  std::string violation_;
};

}  // namespace slot_model

TEST_CASE("share: model check, slots are claimed and freed by the kernel's locks, whoever dies where",
          "[share][model]") {
  slot_model::Checker locks(false);
  CHECK(locks.run().empty());
  CHECK(locks.states() > 1000);
  // 51ba0d9's rule: a member killed while claiming leaves its slot stuck for good.
  slot_model::Checker pids(true);
  CHECK(pids.run().find("is stuck") != std::string::npos);
}

// ---- 2. The real segment, in one process ---------------------------------------------------------

TEST_CASE("share: admit, release, room, and a budget per device", "[share]") {
  const std::string name = unique_name("basic");
  const Unlink cleanup{name};
  // 1000 bytes on every device; device 1: half its memory; device 2: a quarter.
  const LimitSpec limit = limit_of(bytes(1000), {{1, percent(50)}, {2, percent(25)}});
  auto b = must_join(name, limit);
  const std::uint64_t total = 4000;  // each device's memory
  CHECK(b->name() == name);
  CHECK(b->limit() == limit);
  CHECK(b->limit_text() == "1000,1:50%,2:25%");
  CHECK(b->budget(0, total) == std::uint64_t{1000});
  CHECK(b->budget(7, total) == std::uint64_t{1000});  // the default for any device
  CHECK(b->budget(1, total) == std::uint64_t{2000});
  CHECK(b->budget(1, 8000) == std::uint64_t{4000});  // a percent follows the device's memory
  CHECK(b->budget(2, 4002) == std::uint64_t{1000});  // 1000.5 rounds down
  struct stat st{};
  REQUIRE(stat(segment_path(name).c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);  // this user's only
  CHECK(static_cast<std::size_t>(st.st_size) == sizeof(SharedBudget::Segment));

  // No slot until the first admission.
  CHECK(b->members().empty());
  CHECK(b->held_mine(0) == 0);
  CHECK(b->room(0, total) == std::uint64_t{1000});
  CHECK(b->holders(0) == "nobody");

  REQUIRE(b->admit(0, total, 600, 0));
  CHECK(b->held_mine(0) == 600);
  CHECK(b->held_total(0) == 600);
  CHECK(b->room(0, total) == std::uint64_t{400});
  CHECK_FALSE(b->admit(0, total, 401, 0));  // one byte too many
  CHECK(b->held_mine(0) == 600);            // the refused claim was taken back
  CHECK(b->admit(0, total, 400, 0));        // exactly the budget
  CHECK(b->room(0, total) == std::uint64_t{0});
  CHECK_FALSE(b->admit(0, total, 1, 0));
  CHECK(b->held_total(0) == 1000);

  // Device 1 has a budget of its own: 2000 of its 4000 bytes.
  CHECK(b->held_total(1) == 0);
  CHECK(b->admit(1, total, 2000, 0));
  CHECK_FALSE(b->admit(1, total, 1, 0));
  CHECK(b->room(1, total) == std::uint64_t{0});
  CHECK(b->room(1, 8000) == std::uint64_t{2000});  // on a device twice as large, twice the budget
  CHECK(b->admit(1, 8000, 2000, 0));
  CHECK(b->held_total(1) == 4000);
  CHECK(b->held_total(0) == 1000);  // devices do not mix
  b->release(1, 4000);
  CHECK(b->held_total(1) == 0);

  b->release(0, 400);
  CHECK(b->held_mine(0) == 600);
  CHECK(b->room(0, total) == std::uint64_t{400});
  b->release(0, 5000);  // more than it holds: down to zero, never below
  CHECK(b->held_mine(0) == 0);
  CHECK(b->held_total(0) == 0);

  // A claim larger than the whole budget is refused at once, and leaves nothing behind.
  CHECK_FALSE(b->admit(0, total, 1001, 0));
  CHECK_FALSE(b->admit(2, total, 1001, 0));
  CHECK(b->admit(2, total, 1000, 0));
  b->release(2, 1000);
  CHECK(b->held_total(0) == 0);
  for (const SharedBudget::Member& m : b->members()) CHECK(m.waiting[0] == 0);

  // One attempt of the protocol, with the budget given.
  CHECK(b->try_admit(0, 500, 500));
  CHECK_FALSE(b->try_admit(0, 500, 1));
  CHECK(b->try_admit(0, 501, 1));
  CHECK(b->held_mine(0) == 501);
  b->release(0, 501);

  // Devices the segment has no room for: refused, never recorded.
  CHECK_FALSE(b->try_admit(SharedBudget::kMaxDevices, 1000, 1));
  CHECK_FALSE(b->try_admit(-1, 1000, 1));
  CHECK(b->held_total(SharedBudget::kMaxDevices) == 0);
  CHECK(b->held_total(-1) == 0);
  b->release(-1, 5);

  // The member as others see it.
  REQUIRE(b->admit(0, total, 300, 0));
  b->publish(0, 200, 250);
  b->note_oom();
  const auto members = b->members();
  REQUIRE(members.size() == 1);
  const SharedBudget::Member& me = members[0];
  CHECK(me.pid == getpid());
  CHECK(me.alive);
  CHECK(me.start_ticks == SharedBudget::start_ticks_of(getpid()));
  CHECK(me.start_ticks != 0);
  CHECK_FALSE(me.command.empty());
  CHECK(me.held[0] == 300);
  CHECK(me.held[1] == 0);
  CHECK(me.in_use[0] == 200);
  CHECK(me.reserved[0] == 250);
  CHECK(me.ooms == 1);
  CHECK(b->holders(0).rfind("pid " + std::to_string(getpid()) + " (", 0) == 0);
  CHECK(b->holders(0).find("gone") == std::string::npos);
  CHECK(b->holders(1) == "nobody");
  CHECK(b->reclaim_dead() == 0);  // nobody is gone
  CHECK(b->held_total(0) == 300);
}

TEST_CASE("share: a device without a budget is not counted", "[share]") {
  const std::string name = unique_name("nodev");
  const Unlink cleanup{name};
  auto b = must_join(name, limit_of(std::nullopt, {{0, bytes(1000)}}));
  CHECK(b->limit_text() == "0:1000");
  CHECK(b->budget(0, 4000) == std::uint64_t{1000});
  CHECK_FALSE(b->budget(3, 4000).has_value());
  CHECK_FALSE(b->room(3, 4000).has_value());
  CHECK(b->admit(3, 4000, 1ull << 40, 0));
  CHECK(b->held_total(3) == 0);
  CHECK(b->members().empty());  // nothing claimed
  CHECK_FALSE(b->admit(0, 4000, 1001, 0));
}

TEST_CASE("share: joining: one limit per budget, valid names, two members in one process", "[share]") {
  const std::string name = unique_name("join");
  const Unlink cleanup{name};
  const LimitSpec limit = limit_of(bytes(1000), {{1, percent(50)}});
  auto first = must_join(name, limit);
  std::string error;

  CHECK(SharedBudget::join(name, limit_of(bytes(1001), {{1, percent(50)}}), false, &error) == nullptr);
  CHECK(error == "cupool: CUPOOL_SHARE=" + name +
                     ": CUPOOL_SHARE_LIMIT=1001,1:50% differs from the budget's own, 1000,1:50%, given by its "
                     "members running now; every member of a budget gives the same limit");
  error.clear();
  CHECK(SharedBudget::join(name, limit_of(bytes(1000), {{1, percent(60)}}), false, &error) == nullptr);
  CHECK(error.find("CUPOOL_SHARE_LIMIT=1000,1:60% differs from the budget's own, 1000,1:50%") != std::string::npos);
  error.clear();
  CHECK(SharedBudget::join(name, LimitSpec{}, false, &error) == nullptr);
  CHECK(error.find("CUPOOL_SHARE_LIMIT=(unset) differs from the budget's own, 1000,1:50%") != std::string::npos);
  CHECK(first->limit_text() == "1000,1:50%");  // the budget is unchanged by those who could not join

  // A second member, in this same process: a slot of its own, one budget between them.
  auto second = must_join(name, limit);
  REQUIRE(first->admit(0, 4000, 600, 0));
  CHECK_FALSE(second->admit(0, 4000, 600, 0));
  CHECK(second->admit(0, 4000, 400, 0));
  CHECK(first->held_mine(0) == 600);
  CHECK(second->held_mine(0) == 400);
  CHECK(first->held_total(0) == 1000);
  CHECK(first->members().size() == 2);
  second->release(0, 400);
  CHECK(first->room(0, 4000) == std::uint64_t{400});

  // A read-only view (cupool top) sees the same, and never reclaims.
  auto view = SharedBudget::observe(segment_path(name), &error);
  INFO(error);
  REQUIRE(view != nullptr);
  CHECK(view->name() == name);
  CHECK(view->limit_text() == "1000,1:50%");
  CHECK(view->held_total(0) == 600);
  CHECK(view->members().size() == 2);
  CHECK(view->reclaim_dead() == 0);

  // Names: 1 to 64 letters, digits, '-', '_' or '.'.
  for (const std::string& bad : {std::string(), std::string("a/b"), std::string("../x"), std::string("has space"),
                                std::string("t\xc3\xa9st"), std::string("x\n"), std::string(65, 'x')}) {
    error.clear();
    CHECK(SharedBudget::join(bad, limit, false, &error) == nullptr);
    CHECK(error.find("a budget name is 1 to 64 letters, digits, '-', '_' or '.'") != std::string::npos);
  }
  const std::string longest = name + std::string(64 - name.size(), 'x');
  const Unlink cleanup_longest{longest};
  CHECK(must_join(longest, limit)->name() == longest);
}

TEST_CASE("share: a process's start time is read past a command name with spaces and parentheses", "[share][fork]") {
  struct Report {
    std::atomic<std::uint64_t> ticks{0};
    std::atomic<int> renamed{0};
  };
  Shared<Report> r;
  Child child([&] {
    r->ticks = SharedBudget::start_ticks_of(getpid());
    // The command is field 2 of /proc/<pid>/stat, in parentheses: one that looks like more fields.
    if (prctl(PR_SET_NAME, "a) 1 2 (b", 0, 0, 0) != 0) return 2;
    r->renamed = 1;
    for (;;) pause();
  });
  REQUIRE(wait_until(child, [&] { return r->renamed.load() == 1; }));
  CHECK(r->ticks.load() != 0);
  CHECK(SharedBudget::start_ticks_of(child.pid()) == r->ticks.load());
  // (Shown by top beside the pid; liveness is the slot's lock since issue 26, tested below.)
  child.kill9();
  CHECK(child.wait() == 128 + SIGKILL);
}

// Issue 26: a claim refused only because another claim was being decided at the same moment (and
// then took itself back) is tried again while the budget has room: at 51ba0d9 admit() refused it
// (2 to 3 refusals in 3000 asks with most of the budget free). The other claim is made to vanish
// exactly between the refusal and the decision to retry (SharedBudget::test_after_refusal).
namespace {
SharedBudget* g_in_flight = nullptr;
void in_flight_claim_goes() {
  if (g_in_flight && g_in_flight->held_mine(0) > 0) g_in_flight->release(0, g_in_flight->held_mine(0));
}
}  // namespace

TEST_CASE("share: a claim refused beside another claim being decided is tried again", "[share]") {
  const std::string name = unique_name("retry");
  const Unlink cleanup{name};
  auto a = must_join(name, limit_of(bytes(1000)));
  auto b = must_join(name, limit_of(bytes(1000)));
  b->add(0, 700);  // b's claim, added and not yet decided (it will be refused and taken back)
  g_in_flight = b.get();
  SharedBudget::test_after_refusal = in_flight_claim_goes;
  const bool admitted = a->admit(0, 4000, 400, 0);
  SharedBudget::test_after_refusal = nullptr;
  g_in_flight = nullptr;
  CHECK(admitted);
  CHECK(a->held_mine(0) == 400);
  // Without room even once the other claim is gone, the refusal stands.
  b->add(0, 700);
  CHECK_FALSE(a->admit(0, 4000, 400, 0));
  CHECK(a->held_mine(0) == 400);
}

// Issue 26: with 65 members a 300 ms wait ran to 0.85 s: every release woke every waiter, and each
// rescanned /proc for every member. A waiter now looks for dead members at most once per 50 ms of
// its wait, whatever the number of releases.
TEST_CASE("share: a waiter woken by many releases does not rescan the members at each", "[share][wait]") {
  const std::string name = unique_name("rescan");
  const Unlink cleanup{name};
  auto holder = must_join(name, limit_of(bytes(1000)));
  auto waiter = must_join(name, limit_of(bytes(1000)));
  REQUIRE(holder->admit(0, 4000, 1000, 0));
  std::atomic<bool> done{false};
  std::atomic<int> releases{0};
  std::thread churn([&] {
    // Releases that leave no room: each wakes the waiter, none admits it.
    while (!done.load()) {
      holder->release(0, 1);
      holder->add(0, 1);
      releases.fetch_add(1);
    }
  });
  while (releases.load() == 0) std::this_thread::yield();  // the churn runs before the wait begins
  const std::uint64_t wait_ns = 300'000'000;
  const bool admitted = waiter->admit(0, 4000, 500, wait_ns);
  done = true;
  churn.join();
  CHECK_FALSE(admitted);
  // How often it was woken depends on the machine: not asserted; the bound below holds for any.
  // One scan before the wait, then at most one per 50 ms of it (and the wait's last, shorter
  // slice): not one per wake.
  CHECK(waiter->reclaim_scans() <= 1 + wait_ns / 50'000'000 + 2);
}

// ---- 3. Many processes at once, each with many threads, two of them killed --------------------
//
// Sixteen children of eight threads each join one budget. Every thread (a "worker") loops: admit
// a random size on one of two devices (up to three claims outstanding), or release its oldest.
// Each worker counts what it has admitted and not yet released, in memory shared with the parent:
// it adds a claim after admit() said yes and takes it off before release(), so the counts are
// always within what the budget has admitted. Two checks:
//   - every worker also adds its claim to one word per device and checks the sum it gets back
//     (one atomic word: an exact snapshot of everything admitted at that instant);
//   - the parent sums the workers' counts, a consistent snapshot at a time (each worker's count
//     is under a sequence lock: the parent keeps a sum only if no count changed while it read).
// A child's threads share its slot: once they are done (or all holding), the slot holds exactly
// the sum of their counts. Two children are killed while every thread of theirs holds bytes:
//   - the first while every other worker is parked between steps: the parent then checks that the
//     slots hold exactly what the workers say they hold, reclaims the dead one's bytes (exactly
//     those) and lets the others go on;
//   - the second while the others run: their refusals reclaim it (reclaim_dead racing with
//     admissions and with each other), or the parent does once everyone is done.
namespace {
namespace stress {

constexpr int kChildren = 16, kThreads = 8, kWorkers = kChildren * kThreads, kIterations = 400, kDevices = 2;
constexpr std::size_t kMaxOutstanding = 3;
constexpr std::uint64_t kTotal = 4 * kMiB;                       // each device's memory
constexpr std::uint64_t kBudget[kDevices] = {1 * kMiB, 2 * kMiB};  // 1 MiB; 50% of 4 MiB
constexpr int kFirstVictim = 2, kSecondVictim = 11;
constexpr int kFirstStop = 120, kSecondStop = 240;  // the iteration at which each victim's threads stop, holding

enum : int { kRunning, kParked, kHolding, kFinished };

struct Board {
  std::atomic<int> go{0}, pause{0}, first_victim_done{0};
  std::atomic<int> state[kWorkers];
  std::atomic<int> child_holding[kChildren];                 // every thread of the child holds, checked
  std::atomic<std::uint64_t> version[kWorkers];              // odd while the worker changes its counts
  std::atomic<std::uint64_t> admitted[kWorkers][kDevices];   // admitted and not released
  std::atomic<std::uint64_t> total[kDevices];                // the same, every worker
  std::atomic<std::uint64_t> worst[kDevices];                // the largest total seen
  std::atomic<std::uint64_t> over_budget{0};                 // totals past the budget
  std::atomic<std::uint64_t> held_mismatch{0};               // held_mine() other than the child's own count
  std::atomic<std::uint64_t> admissions[kWorkers], refusals[kWorkers];
  std::atomic<int> join_failed{0};
};

void change_count(Board& board, int w, int device, std::uint64_t add, std::uint64_t sub) {
  board.version[w].fetch_add(1);
  if (add) board.admitted[w][device].fetch_add(add);
  if (sub) board.admitted[w][device].fetch_sub(sub);
  board.version[w].fetch_add(1);
}

std::uint64_t child_count(const Board& board, int child, int device) {
  std::uint64_t sum = 0;
  for (int t = 0; t < kThreads; ++t) sum += board.admitted[child * kThreads + t][device].load();
  return sum;
}

// One thread of child `child`: worker w.
void run_worker(int child, int w, SharedBudget& b, Board& board) {
  std::mt19937_64 rng(0x5eed'0000u + static_cast<unsigned>(w));
  struct Claim {
    int device;
    std::uint64_t bytes;
  };
  std::vector<Claim> out;
  const int stop = child == kFirstVictim ? kFirstStop : child == kSecondVictim ? kSecondStop : -1;

  auto park = [&] {
    if (board.pause.load() == 0) return;
    board.state[w].store(kParked);
    while (board.pause.load() != 0) usleep(100);
    board.state[w].store(kRunning);
  };
  auto admit = [&](int d, std::uint64_t bytes) {
    if (!b.admit(d, kTotal, bytes, 0)) {
      board.refusals[w].fetch_add(1);
      return;
    }
    board.admissions[w].fetch_add(1);
    const std::uint64_t now = board.total[d].fetch_add(bytes) + bytes;
    if (now > kBudget[d]) board.over_budget.fetch_add(1);
    std::uint64_t worst = board.worst[d].load();
    while (now > worst && !board.worst[d].compare_exchange_weak(worst, now)) {
    }
    change_count(board, w, d, bytes, 0);
    out.push_back({d, bytes});
  };
  auto release_oldest = [&] {
    const Claim c = out.front();
    out.erase(out.begin());
    change_count(board, w, c.device, 0, c.bytes);
    board.total[c.device].fetch_sub(c.bytes);
    b.release(c.device, c.bytes);
  };

  for (int i = 0; i < kIterations; ++i) {
    park();
    if (i == stop) {
      // A victim's thread: (the second victim's wait for the first to be dealt with) hold
      // something, say so, and wait to be killed.
      while (child == kSecondVictim && board.first_victim_done.load() == 0) {
        park();
        usleep(200);
      }
      while (out.empty()) {
        park();
        const int d = static_cast<int>(rng() % kDevices);
        admit(d, 1 + rng() % (kBudget[d] / 16));
        if (out.empty()) usleep(100);
      }
      board.state[w].store(kHolding);
      for (;;) pause();
    }
    if (!out.empty() && (out.size() == kMaxOutstanding || rng() % 3 == 0)) {
      release_oldest();
    } else {
      const int d = static_cast<int>(rng() % kDevices);
      admit(d, 1 + rng() % (kBudget[d] / 2));
    }
  }
  while (!out.empty()) release_oldest();
  board.state[w].store(kFinished);
}

int run_child(int child, const std::string& name, const LimitSpec& limit, Board& board) {
  std::string error;
  auto b = SharedBudget::join(name, limit, false, &error);
  if (!b) {
    board.join_failed.fetch_add(1);
    return 2;
  }
  while (board.go.load() == 0) usleep(100);
  auto check_mine = [&] {
    for (int d = 0; d < kDevices; ++d)
      if (b->held_mine(d) != child_count(board, child, d)) board.held_mismatch.fetch_add(1);
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] { run_worker(child, child * kThreads + t, *b, board); });
  if (child == kFirstVictim || child == kSecondVictim) {
    // Killed once every thread holds: the slot then holds exactly what they count.
    for (bool all = false; !all; usleep(200)) {
      all = true;
      for (int t = 0; t < kThreads; ++t) all = all && board.state[child * kThreads + t].load() == kHolding;
    }
    check_mine();
    board.child_holding[child].store(1);
    for (;;) pause();
  }
  for (std::thread& t : threads) t.join();
  check_mine();
  return 0;
}

// The workers' counts, summed at one instant; false if some count changed while they were read.
bool snapshot(const Board& board, std::uint64_t sums[kDevices]) {
  static std::uint64_t before[kWorkers], counts[kWorkers][kDevices];  // the parent's thread only
  for (int i = 0; i < kWorkers; ++i)
    if ((before[i] = board.version[i].load()) & 1) return false;
  for (int i = 0; i < kWorkers; ++i)
    for (int d = 0; d < kDevices; ++d) counts[i][d] = board.admitted[i][d].load();
  for (int i = 0; i < kWorkers; ++i)
    if (board.version[i].load() != before[i]) return false;
  for (int d = 0; d < kDevices; ++d) {
    sums[d] = 0;
    for (int i = 0; i < kWorkers; ++i) sums[d] += counts[i][d];
  }
  return true;
}

}  // namespace stress
}  // namespace

TEST_CASE("share: sixteen processes of eight threads admitting at once never pass the budget; killed ones are reclaimed",
          "[share][fork][stress]") {
  using namespace stress;
  const std::string name = unique_name("stress");
  const Unlink cleanup{name};
  const LimitSpec limit = limit_of(bytes(kBudget[0]), {{1, percent(50)}});
  auto parent = must_join(name, limit);  // made before the children: they open it
  REQUIRE(parent->budget(0, kTotal) == kBudget[0]);
  REQUIRE(parent->budget(1, kTotal) == kBudget[1]);
  Shared<Board> board;

  std::vector<std::unique_ptr<Child>> children;
  for (int i = 0; i < kChildren; ++i)
    children.push_back(std::make_unique<Child>([&, i] { return run_child(i, name, limit, *board); }));
  board->go.store(1);

  std::uint64_t snapshots = 0, snapshot_over = 0, snapshot_worst[kDevices] = {};
  std::uint64_t first_victim_bytes[kDevices] = {}, second_victim_bytes[kDevices] = {};
  bool first_killed = false, second_killed = false;
  auto take_snapshot = [&] {
    std::uint64_t sums[kDevices];
    if (!snapshot(*board, sums)) return;
    ++snapshots;
    for (int d = 0; d < kDevices; ++d) {
      snapshot_worst[d] = std::max(snapshot_worst[d], sums[d]);
      if (sums[d] > kBudget[d]) ++snapshot_over;
    }
  };
  auto still_running = [&](int w) {
    return board->state[w].load() == kRunning && children[w / kThreads]->running();
  };
  auto wait_for = [&](auto done) {
    const std::uint64_t give_up = now_ns() + 300'000'000'000ull;  // a guard against a hang
    while (!done()) {
      if (now_ns() > give_up) FAIL("the children never got there");
      usleep(200);
    }
  };
  auto counted = [&](int d) {
    std::uint64_t sum = 0;
    for (int w = 0; w < kWorkers; ++w) sum += board->admitted[w][d].load();
    return sum;
  };
  // A victim's counts leave the sums before it dies: from its death on, its bytes may be
  // reclaimed and admitted again.
  auto forget = [&](int v, std::uint64_t (&per_device)[kDevices]) {
    for (int d = 0; d < kDevices; ++d) {
      per_device[d] = 0;
      for (int t = 0; t < kThreads; ++t) {
        const int w = v * kThreads + t;
        const std::uint64_t held = board->admitted[w][d].load();
        per_device[d] += held;
        change_count(*board, w, d, 0, held);
        board->total[d].fetch_sub(held);
      }
    }
  };

  for (;;) {
    take_snapshot();
    if (!first_killed && board->child_holding[kFirstVictim].load() == 1) {
      // Every other worker parked between steps (or done): the slots hold exactly the counts.
      board->pause.store(1);
      wait_for([&] {
        for (int w = 0; w < kWorkers; ++w)
          if (still_running(w)) return false;
        return true;
      });
      for (int d = 0; d < kDevices; ++d) CHECK(parent->held_total(d) == counted(d));
      forget(kFirstVictim, first_victim_bytes);
      children[kFirstVictim]->kill9();
      CHECK(children[kFirstVictim]->wait() == 128 + SIGKILL);
      CHECK(first_victim_bytes[0] + first_victim_bytes[1] > 0);
      // The parent, a member that holds nothing, reclaims exactly the dead one's bytes.
      CHECK(parent->reclaim_dead() == first_victim_bytes[0] + first_victim_bytes[1]);
      CHECK(member_of(parent->members(), children[kFirstVictim]->pid()) == nullptr);
      for (int d = 0; d < kDevices; ++d) CHECK(parent->held_total(d) == counted(d));
      first_killed = true;
      board->first_victim_done.store(1);
      board->pause.store(0);
    }
    if (!second_killed && board->child_holding[kSecondVictim].load() == 1) {
      forget(kSecondVictim, second_victim_bytes);
      children[kSecondVictim]->kill9();
      CHECK(children[kSecondVictim]->wait() == 128 + SIGKILL);
      CHECK(second_victim_bytes[0] + second_victim_bytes[1] > 0);
      second_killed = true;
    }
    bool any = false;
    for (int i = 0; i < kChildren; ++i) any = any || children[i]->running();
    if (!any) break;
    usleep(200);
  }
  take_snapshot();

  CHECK(board->join_failed.load() == 0);
  std::uint64_t admissions = 0, refusals = 0;
  for (int i = 0; i < kChildren; ++i) {
    INFO("child " << i);
    CHECK(children[i]->wait() == (i == kFirstVictim || i == kSecondVictim ? 128 + SIGKILL : 0));
    std::uint64_t child_admissions = 0;
    for (int t = 0; t < kThreads; ++t) child_admissions += board->admissions[i * kThreads + t].load();
    CHECK(child_admissions > 0);
  }
  for (int w = 0; w < kWorkers; ++w) {
    admissions += board->admissions[w].load();
    refusals += board->refusals[w].load();
  }
  CHECK(first_killed);
  CHECK(second_killed);
  INFO(admissions << " admissions, " << refusals << " refusals, " << snapshots << " snapshots; worst "
                  << board->worst[0].load() << " / " << kBudget[0] << " and " << board->worst[1].load() << " / "
                  << kBudget[1]);
  CHECK(refusals > 0);  // the budget was contended
  CHECK(board->over_budget.load() == 0);
  CHECK(snapshot_over == 0);
  for (int d = 0; d < kDevices; ++d) {
    CHECK(board->worst[d].load() <= kBudget[d]);
    CHECK(snapshot_worst[d] <= kBudget[d]);
    CHECK(board->total[d].load() == 0);
  }
  CHECK(board->held_mismatch.load() == 0);

  // Everyone is gone. What the slots still hold is the second victim's, unless a refused child
  // reclaimed it already; the parent reclaims the rest, and the budget is empty.
  std::uint64_t left = 0;
  for (int d = 0; d < kDevices; ++d) {
    CHECK(parent->held_total(d) <= second_victim_bytes[d]);
    left += parent->held_total(d);
  }
  for (const SharedBudget::Member& m : parent->members()) CHECK_FALSE(m.alive);
  CHECK(parent->reclaim_dead() == left);
  for (int d = 0; d < kDevices; ++d) CHECK(parent->held_total(d) == 0);
  CHECK(parent->members().empty());
  CHECK(parent->room(0, kTotal) == kBudget[0]);
}

// ---- 4. A forked child ---------------------------------------------------------------------------

TEST_CASE("share: a forked child is a member of its own, and its bytes are reclaimed once it is gone", "[share][fork]") {
  const std::string name = unique_name("fork");
  const Unlink cleanup{name};
  const std::uint64_t total = 4000;
  auto b = must_join(name, limit_of(bytes(1000)));
  REQUIRE(b->admit(0, total, 300, 0));
  const int parent_pid = getpid();

  struct Report {
    std::atomic<std::uint64_t> mine_after_fork{~0ull}, total_after_stray_release{0}, mine_after_admit{0},
        total_after_admit{0};
    std::atomic<int> members{0}, sees_parent{0}, sees_self{0}, refused_past_budget{0};
  };
  Shared<Report> r;
  Child child([&] {
    b->after_fork_in_child();
    r->mine_after_fork = b->held_mine(0);  // the parent's slot is not the child's
    b->release(0, 300);                    // so releasing what the parent holds does nothing
    r->total_after_stray_release = b->held_total(0);
    if (!b->admit(0, total, 200, 0)) return 2;
    r->mine_after_admit = b->held_mine(0);
    r->total_after_admit = b->held_total(0);
    const auto members = b->members();
    r->members = static_cast<int>(members.size());
    for (const SharedBudget::Member& m : members) {
      if (m.pid == parent_pid && m.alive && m.held[0] == 300) r->sees_parent = 1;
      if (m.pid == getpid() && m.alive && m.held[0] == 200) r->sees_self = 1;
    }
    r->refused_past_budget = b->admit(0, total, 501, 0) ? 0 : 1;
    return 0;  // leaves holding its 200 bytes
  });
  REQUIRE(child.wait() == 0);
  CHECK(r->mine_after_fork.load() == 0);
  CHECK(r->total_after_stray_release.load() == 300);
  CHECK(r->mine_after_admit.load() == 200);
  CHECK(r->total_after_admit.load() == 500);
  CHECK(r->members.load() == 2);
  CHECK(r->sees_parent.load() == 1);
  CHECK(r->sees_self.load() == 1);
  CHECK(r->refused_past_budget.load() == 1);

  // Gone, its slot still holds its bytes: shown as gone, until someone reclaims them.
  CHECK(b->held_mine(0) == 300);
  CHECK(b->held_total(0) == 500);
  const auto members = b->members();
  REQUIRE(members.size() == 2);
  const SharedBudget::Member* gone = member_of(members, child.pid());
  REQUIRE(gone != nullptr);
  CHECK_FALSE(gone->alive);
  CHECK(gone->held[0] == 200);
  CHECK(b->holders(0).find("pid " + std::to_string(child.pid()) + " (") != std::string::npos);
  CHECK(b->holders(0).find("(gone)") != std::string::npos);
  CHECK(b->reclaim_dead() == 200);
  CHECK(b->reclaim_dead() == 0);
  CHECK(b->held_total(0) == 300);
  CHECK(b->members().size() == 1);

  // A refused admission reclaims by itself: a child takes the rest of the budget and leaves; the
  // parent's next admission finds it gone and gets the room.
  Child greedy([&] {
    b->after_fork_in_child();
    return b->admit(0, total, 700, 0) ? 0 : 1;
  });
  REQUIRE(greedy.wait() == 0);
  CHECK(b->held_total(0) == 1000);
  CHECK(b->admit(0, total, 600, 0));
  CHECK(b->held_mine(0) == 900);
  CHECK(b->held_total(0) == 900);
  CHECK(member_of(b->members(), greedy.pid()) == nullptr);
}

// ---- 5. Waiting for room -------------------------------------------------------------------------

TEST_CASE("share: a member waits for room, and is admitted once another gives it back", "[share][fork][wait]") {
  const std::string name = unique_name("wait");
  const Unlink cleanup{name};
  const std::uint64_t total = 4000;
  const std::uint64_t long_wait = 30'000'000'000ull;  // 30 s: far longer than the test needs
  std::atomic<int> give_backs{0};  // outlives b, whose give-back thread counts here
  auto b = must_join(name, limit_of(bytes(1000)));
  REQUIRE(b->admit(0, total, 900, 0));
  auto waiting_for = [&](const Child& c) -> std::uint64_t {
    const auto members = b->members();
    const SharedBudget::Member* m = member_of(members, c.pid());
    return m != nullptr ? m->waiting[0] : 0;
  };
  // A child that waits for 500 bytes: exit 0 if it got them.
  auto waiter = [&] {
    b->after_fork_in_child();
    return b->admit(0, total, 500, long_wait) && b->held_mine(0) == 500 ? 0 : 1;
  };

  SECTION("without waiting, refused at once") {
    auto other = must_join(name, limit_of(bytes(1000)));
    CHECK_FALSE(other->admit(0, total, 500, 0));
    CHECK(other->held_mine(0) == 0);
    Child child([&] {
      b->after_fork_in_child();
      return b->admit(0, total, 500, 0) ? 1 : 0;
    });
    CHECK(child.wait() == 0);
    for (const SharedBudget::Member& m : b->members()) CHECK(m.waiting[0] == 0);
    CHECK(b->reclaim_dead() == 0);  // the child left nothing
    CHECK(b->held_total(0) == 900);
  }

  SECTION("waiting, admitted when the holder releases") {
    Child child(waiter);
    // It says what it waits for in its slot; only then does the holder release.
    REQUIRE(wait_until(child, [&] { return waiting_for(child) == 500; }));
    b->release(0, 900);
    CHECK(child.wait() == 0);
    CHECK(b->reclaim_dead() == 500);  // it left holding them
    CHECK(b->held_total(0) == 0);
  }

  SECTION("waiting, admitted when the holder's give-back thread returns its memory") {
    Child child(waiter);  // forked before the give-back thread starts
    b->serve_give_back([&] {
      if (give_backs.fetch_add(1) == 0) b->release(0, 900);
    });
    CHECK(child.wait() == 0);
    CHECK(give_backs.load() >= 1);
    CHECK(b->held_mine(0) == 0);
    CHECK(b->reclaim_dead() == 500);
  }
}

// ---- Problems found and fixed (each test failed before its fix) -------------------------------------------

// A member that has exited but that its parent has not yet waited for is a zombie: kill(pid, 0)
// succeeds and /proc/<pid>/stat still shows its start time, so alive() calls it alive and its bytes
// stay held until it is reaped (forever, under a parent that never reaps, as PID 1 in a container
// without an init). alive() should read the state (field 3) too: 'Z' or 'X' is gone.
TEST_CASE("share: a member that has exited but is not yet reaped is gone", "[share][fork]") {
  const std::string name = unique_name("zombie");
  const Unlink cleanup{name};
  auto b = must_join(name, limit_of(bytes(1000)));
  Child child([&] {
    b->after_fork_in_child();
    return b->admit(0, 4000, 100, 0) ? 0 : 1;
  });
  siginfo_t info{};
  REQUIRE(waitid(P_PID, static_cast<id_t>(child.pid()), &info, WEXITED | WNOWAIT) == 0);  // exited, not reaped
  REQUIRE(info.si_status == 0);
  const auto members = b->members();
  const SharedBudget::Member* m = member_of(members, child.pid());
  REQUIRE(m != nullptr);
  CHECK_FALSE(m->alive);
  CHECK(b->reclaim_dead() == 100);
  CHECK(child.wait() == 0);
  b->reclaim_dead();
  CHECK(b->held_total(0) == 0);
}

// admit()'s wait loop reads released_seq, then tries; a refused try bumps released_seq itself, so
// the futex wait that follows finds the word changed and returns at once: the waiter spins (each
// round also reading /proc for every member and waking every other waiter) instead of sleeping up
// to 50 ms. Every refused try bumps released_seq once, so while nobody releases, its count is the
// number of tries: a waiter that sleeps makes at most one per 50 ms (plus the first). Load can
// only lower the count, never raise it.
TEST_CASE("share: a waiting member sleeps between tries", "[share][fork][wait]") {
  const std::string name = unique_name("sleep");
  const Unlink cleanup{name};
  auto b = must_join(name, limit_of(bytes(1000)));
  REQUIRE(b->admit(0, 4000, 900, 0));
  const int fd = open(segment_path(name).c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  void* p = mmap(nullptr, sizeof(SharedBudget::Segment), PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  REQUIRE(p != MAP_FAILED);
  const auto* seg = static_cast<const SharedBudget::Segment*>(p);
  Child child([&] {
    b->after_fork_in_child();
    return b->admit(0, 4000, 500, 30'000'000'000ull) ? 0 : 1;
  });
  REQUIRE(wait_until(child, [&] {
    const auto members = b->members();
    const SharedBudget::Member* m = member_of(members, child.pid());
    return m != nullptr && m->waiting[0] == 500;
  }));
  const std::uint32_t seq0 = seg->released_seq.load();
  const std::uint64_t t0 = now_ns();
  while (now_ns() - t0 < 300'000'000ull) usleep(10'000);
  const std::uint32_t tries = seg->released_seq.load() - seq0;
  const std::uint64_t elapsed = now_ns() - t0;
  b->release(0, 900);
  CHECK(child.wait() == 0);
  INFO(tries << " tries in " << elapsed / 1'000'000 << " ms; the waiter used " << child.cpu_seconds()
             << " s of CPU");
  CHECK(tries <= elapsed / 50'000'000ull + 2);
  munmap(p, sizeof(SharedBudget::Segment));
  b->reclaim_dead();
}

// my_slot() is not safe for two threads of one process using the budget for the first time at
// once: both find no slot, both claim one, and mine_ keeps the last. A claim added to the other
// slot is later released from this one (clamped at zero), so its bytes stay held, and the budget
// stays smaller, until the process exits. A process-local lock (or a compare-exchange of mine_
// that gives the losing slot back) around the first claim fixes it.
TEST_CASE("share: threads of one process using the budget for the first time at once get one slot", "[share]") {
  const std::string name = unique_name("threads");
  const Unlink cleanup{name};
  const LimitSpec limit = limit_of(bytes(1'000'000));
  constexpr int kRounds = 20, kThreads = 4;
  int extra_slots = 0;
  std::uint64_t leaked = 0;
  for (int round = 0; round < kRounds; ++round) {
    auto b = must_join(name, limit);  // a new member: no slot yet
    auto mine = [&] {
      int n = 0;
      for (const SharedBudget::Member& m : b->members()) n += m.pid == getpid();
      return n;
    };
    const int before = mine();
    const std::uint64_t held_before = b->held_total(0);
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&] {
        ready.fetch_add(1);
        while (!go.load()) {
        }
        if (b->try_admit(0, 1'000'000, 1)) b->release(0, 1);
      });
    while (ready.load() < kThreads) {
    }
    go.store(true);
    for (std::thread& t : threads) t.join();
    extra_slots += mine() - before - 1;
    leaked += b->held_total(0) - held_before;
  }
  CHECK(extra_slots == 0);
  CHECK(leaked == 0);
}

// ---- 6. Making a new budget --------------------------------------------------------------------

// What a sandbox (or a file system) may deny the maker of a new budget, by a seccomp filter in a
// forked child: the kernel itself refuses, as it would on such a machine.
enum class Deny { nothing, unnamed_files, links };

// Installs the filter in this (single-threaded, forked) process. False if the kernel refused it.
bool deny_in_this_process(Deny what) {
  if (what == Deny::nothing) return true;
#if defined(__x86_64__)
  constexpr std::uint32_t kArch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
  constexpr std::uint32_t kArch = AUDIT_ARCH_AARCH64;
#else
  return false;
#endif
  std::vector<sock_filter> f = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kArch, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
  };
  auto deny_call = [&](long nr, int err) {
    f.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<std::uint32_t>(nr), 0, 1));
    f.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | static_cast<std::uint32_t>(err)));
  };
  // openat(dirfd, path, flags): flags (the low word of args[2]) with O_TMPFILE's own bit.
  auto deny_tmpfile = [&](long nr, int flags_arg) {
    constexpr std::uint32_t kTmpBit = O_TMPFILE & ~O_DIRECTORY;
    f.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<std::uint32_t>(nr), 0, 4));
    f.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, static_cast<std::uint32_t>(offsetof(seccomp_data, args) + sizeof(std::uint64_t) * static_cast<std::size_t>(flags_arg))));
    f.push_back(BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, kTmpBit, 0, 1));
    f.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EOPNOTSUPP));
    f.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)));  // back for the next test
  };
  if (what == Deny::links) {
    deny_call(SYS_linkat, EPERM);
#ifdef SYS_link
    deny_call(SYS_link, EPERM);
#endif
  } else {
    deny_tmpfile(SYS_openat, 2);
#ifdef SYS_open
    deny_tmpfile(SYS_open, 1);
#endif
  }
  f.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
  sock_fprog prog{static_cast<unsigned short>(f.size()), f.data()};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

// Private files that makers of new budgets left behind in /dev/shm: files of a private name
// whose membership byte nobody holds (a live maker holds it), the same file in three looks 20 ms
// apart (a maker may be between creating its file and locking it). Other processes (tests run
// at once) make such files too, and the sweep test plants some ("-test" in their names): those
// of live makers are held, and the planted ones are left out.
int private_files_abandoned() {
  auto abandoned_now = [] {
    std::set<std::pair<dev_t, ino_t>> found;
    if (DIR* d = opendir("/dev/shm")) {
      while (const dirent* e = readdir(d)) {
        if (std::strncmp(e->d_name, "cupool-new-", 11) != 0 || std::strstr(e->d_name, "-test") != nullptr) continue;
        const int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        if (fd < 0) continue;
        struct flock fl{};
        fl.l_type = F_WRLCK;
        fl.l_whence = SEEK_SET;
        fl.l_start = SharedBudget::kLockBase;
        fl.l_len = 1;
        struct stat st{};
        if (fcntl(fd, F_OFD_GETLK, &fl) == 0 && fl.l_type == F_UNLCK && fstat(fd, &st) == 0)
          found.insert({st.st_dev, st.st_ino});
        close(fd);
      }
      closedir(d);
    }
    return found;
  };
  auto still = abandoned_now();
  for (int look = 0; look < 2 && !still.empty(); ++look) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::set<std::pair<dev_t, ino_t>> again, now = abandoned_now();
    std::set_intersection(still.begin(), still.end(), now.begin(), now.end(), std::inserter(again, again.end()));
    still = again;
  }
  return static_cast<int>(still.size());
}

// Two jobs started together (examples/share/two_jobs.sh) both make a budget that does not exist
// yet. The one that made the file had to size it and set it up after opening it, and the other
// could open it in between: it found a file of 0 bytes, or could not take the membership byte
// alone to set it up, and refused "not a budget of this cupool version (0 bytes)" (the example,
// looped three at a time on the 2-core dev VM, failed so 10 times in a few minutes; this test
// refused 20 of its 600 joins). The segment now appears at its name already set up: an unnamed
// file linked there, or, where /dev/shm makes none, a file of a private name; where it allows no
// link, it is made in place, its maker holding the membership byte alone until it is set up.
// Threads stand in for processes: each join opens the file on its own, and the kernel's locks
// are per open file. Each way runs in a child with a seccomp filter denying the others.
TEST_CASE("share: members that make a new budget at the same moment all join it", "[share][fork]") {
  const Deny way = GENERATE(Deny::nothing, Deny::unnamed_files, Deny::links);
  INFO("denied: " << (way == Deny::nothing ? "nothing" : way == Deny::links ? "links" : "unnamed files"));
  constexpr int kRounds = 150, kThreads = 4;
  struct Report {
    std::atomic<int> refused{0}, rounds{0}, not_one_budget{0}, denied_as_asked{0};
    char first_error[512] = {};
  };
  Shared<Report> r;
  Child child([&] {
    if (!deny_in_this_process(way)) return 3;
    // The filter works: what it denies fails with its error.
    if (way == Deny::links) r->denied_as_asked = linkat(AT_FDCWD, "/nonexistent-a", AT_FDCWD, "/nonexistent-b", 0) != 0 && errno == EPERM;
    if (way == Deny::unnamed_files) {
      const int fd = open("/dev/shm", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
      r->denied_as_asked = fd < 0 && errno == EOPNOTSUPP;
      if (fd >= 0) close(fd);
    }
    const LimitSpec limit = limit_of(bytes(1'000'000));
    for (int round = 0; round < kRounds; ++round) {
      const std::string name = unique_name("together");
      const Unlink cleanup{name};
      std::atomic<int> ready{0};
      std::atomic<bool> go{false};
      std::vector<std::unique_ptr<SharedBudget>> members(kThreads);
      std::vector<std::string> errors(kThreads);
      std::vector<std::thread> threads;
      for (int t = 0; t < kThreads; ++t)
        threads.emplace_back([&, t] {
          ready.fetch_add(1);
          while (!go.load()) {
          }
          const auto i = static_cast<std::size_t>(t);
          members[i] = SharedBudget::join(name, limit, false, &errors[i]);
        });
      while (ready.load() < kThreads) {
      }
      go.store(true);
      for (std::thread& t : threads) t.join();
      for (int t = 0; t < kThreads; ++t)
        if (!members[static_cast<std::size_t>(t)]) {
          if (r->refused.fetch_add(1) == 0)
            std::snprintf(r->first_error, sizeof r->first_error, "%s", errors[static_cast<std::size_t>(t)].c_str());
        }
      // One budget between them: what one member holds, each other sees.
      if (members[0] && members[0]->admit(0, 4'000'000, 600, 0)) {
        for (int t = 1; t < kThreads; ++t)
          if (members[static_cast<std::size_t>(t)] && members[static_cast<std::size_t>(t)]->held_total(0) != 600)
            r->not_one_budget.fetch_add(1);
        members[0]->release(0, 600);
      }
      r->rounds.fetch_add(1);
    }
    return 0;
  });
  REQUIRE(child.wait() == 0);
  INFO(r->first_error);
  CHECK(r->rounds.load() == kRounds);
  CHECK(r->refused.load() == 0);
  CHECK(r->not_one_budget.load() == 0);
  if (way != Deny::nothing) CHECK(r->denied_as_asked.load() == 1);
  // No maker left a private file behind.
  CHECK(private_files_abandoned() == 0);
}

// A maker that dies between making its private file and linking it leaves the file behind (the
// named way, where /dev/shm makes no unnamed file). The next maker removes it, and only it: a
// private file whose maker is alive (it holds the membership byte) stays.
TEST_CASE("share: private files of makers that died are removed by the next maker", "[share][fork]") {
  auto plant = [](const std::string& shm_name) {
    const int fd = shm_open(shm_name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    REQUIRE(fd >= 0);
    return fd;
  };
  const std::string stem = "/cupool-new-test" + std::to_string(getpid());
  const std::string abandoned = stem + "a", live = stem + "l";
  const int abandoned_fd = plant(abandoned);
  close(abandoned_fd);  // its maker is gone: no lock on it
  const int live_fd = plant(live);
  struct flock fl{};
  fl.l_type = F_RDLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = SharedBudget::kLockBase;
  fl.l_len = 1;
  REQUIRE(fcntl(live_fd, F_OFD_SETLK, &fl) == 0);  // a maker setting its segment up
  const std::string name = unique_name("sweep");
  const Unlink cleanup{name};
  Child child([&] {
    if (!deny_in_this_process(Deny::unnamed_files)) return 3;
    std::string error;
    return SharedBudget::join(name, limit_of(bytes(1000)), false, &error) ? 0 : 1;
  });
  REQUIRE(child.wait() == 0);
  struct stat st{};
  CHECK(stat(("/dev/shm" + abandoned).c_str(), &st) != 0);
  CHECK(stat(("/dev/shm" + live).c_str(), &st) == 0);
  close(live_fd);
  shm_unlink(live.c_str());
  shm_unlink(abandoned.c_str());
}

// The mode of a new budget's segment is set on the file (fchmod), not by changing the process's
// umask around its creation: that is every thread's, and another thread creating a file meanwhile
// would have got the wrong mode. Whatever the umask, a budget is 0600, a group budget 0660.
TEST_CASE("share: a new budget's mode is exact whatever the umask, and the umask is left alone", "[share][fork]") {
  for (const Deny way : {Deny::nothing, Deny::unnamed_files, Deny::links})
    for (const bool group : {false, true})
      for (const mode_t mask : {mode_t{0}, mode_t{022}, mode_t{0777}}) {
        INFO("way " << static_cast<int>(way) << " group " << group << " umask " << mask);
        const std::string name = unique_name("mode");
        Child child([&] {
          if (!deny_in_this_process(way)) return 3;
          umask(mask);
          std::string error;
          auto b = SharedBudget::join(name, limit_of(bytes(1000)), group, &error);
          if (!b) return 1;
          struct stat st{};
          if (stat(("/dev/shm" + SharedBudget::segment_name(name, group)).c_str(), &st) != 0) return 2;
          if ((st.st_mode & 07777) != (group ? 0660u : 0600u)) return 4;
          if (umask(0) != mask) return 5;
          shm_unlink(SharedBudget::segment_name(name, group).c_str());
          return 0;
        });
        CHECK(child.wait() == 0);
      }
}

// The umask is the whole process's: a maker that cleared it around its own creation gave every
// file another thread created meanwhile the mode that thread asked for, unmasked (0666 for
// 0600-by-umask output). Here one thread makes budgets while another creates files under umask
// 077: each of those must come out 0600.
TEST_CASE("share: making a budget never changes the mode of files other threads create", "[share][fork]") {
  char dir_template[] = "/tmp/cupool-umask-XXXXXX";
  REQUIRE(mkdtemp(dir_template) != nullptr);
  const std::string dir = dir_template;
  struct Report {
    std::atomic<int> loose{0}, files{0}, budgets{0};
  };
  Shared<Report> r;
  Child child([&] {
    umask(077);
    std::atomic<bool> done{false};
    std::thread maker([&] {
      for (int i = 0; i < 400; ++i) {
        const std::string name = unique_name("umask");
        std::string error;
        if (SharedBudget::join(name, limit_of(bytes(1000)), false, &error)) r->budgets.fetch_add(1);
        shm_unlink(SharedBudget::segment_name(name, false).c_str());
      }
      done = true;
    });
    const std::string file = dir + "/f";
    while (!done.load()) {
      const int fd = open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
      if (fd < 0) continue;
      struct stat st{};
      if (fstat(fd, &st) == 0 && (st.st_mode & 077) != 0) r->loose.fetch_add(1);
      r->files.fetch_add(1);
      close(fd);
      unlink(file.c_str());
    }
    maker.join();
    return 0;
  });
  REQUIRE(child.wait() == 0);
  rmdir(dir.c_str());
  INFO(r->files.load() << " files created beside " << r->budgets.load() << " budgets");
  CHECK(r->budgets.load() == 400);
  CHECK(r->files.load() > 0);
  CHECK(r->loose.load() == 0);
}

// The last member out removes the segment (leave(), at exit). Two members leaving at the same
// moment each found the other's membership byte held, and neither removed it: looping
// examples/share/two_jobs.sh left a segment behind in about one run in ten. Here both leave
// while the other is still alive (as a process is between its leave() and its exit).
TEST_CASE("share: two members leaving at the same moment remove the segment", "[share][fork]") {
  const std::string name = unique_name("leave");
  const Unlink cleanup{name};
  struct Report {
    std::atomic<int> joined{0}, left{0};
  };
  Shared<Report> r;
  auto body = [&] {
    std::string error;
    auto b = SharedBudget::join(name, limit_of(bytes(1000)), false, &error);
    if (!b) return 1;
    if (!b->admit(0, 4000, 100, 0)) return 2;
    r->joined.fetch_add(1);
    while (r->joined.load() < 2) usleep(100);
    b->leave();
    r->left.fetch_add(1);
    while (r->left.load() < 2) usleep(100);  // alive, its descriptor open, until both have left
    usleep(20'000);
    return 0;
  };
  Child a(body), b(body);
  REQUIRE(a.wait() == 0);
  REQUIRE(b.wait() == 0);
  struct stat st{};
  CHECK(stat(segment_path(name).c_str(), &st) != 0);
}

// A joiner that finds no member but a slot still held (members that have left and are exiting)
// joins the budget as it is: setting it up afresh would zero what the exiting process's threads
// still count in its slot.
TEST_CASE("share: a budget whose members have left but not exited is joined as it is", "[share][fork]") {
  const std::string name = unique_name("exiting");
  const Unlink cleanup{name};
  const LimitSpec limit = limit_of(bytes(1000));
  auto present = must_join(name, limit);  // there when the other leaves: it does not remove the segment
  struct Report {
    std::atomic<int> left{0}, done{0};
  };
  Shared<Report> r;
  Child exiting([&] {
    present.reset();  // the parent's member, not the child's
    std::string error;
    auto b = SharedBudget::join(name, limit, false, &error);
    if (!b || !b->admit(0, 4000, 300, 0)) return 1;
    b->leave();
    r->left = 1;
    while (r->done.load() == 0) usleep(1000);  // exiting: its slot still held, its 300 bytes counted
    return 0;
  });
  while (r->left.load() == 0) usleep(1000);
  present.reset();  // gone without leaving (its descriptor closed): no member holds the byte now
  auto joiner = must_join(name, limit);
  CHECK(joiner->held_total(0) == 300);  // joined as it was, not set up afresh under the exiting one
  r->done = 1;
  REQUIRE(exiting.wait() == 0);
  CHECK(joiner->reclaim_dead() == 300);
  CHECK(joiner->held_total(0) == 0);
}

// A waiter tried a claim at every wake, and a claim is counted in `held` while it is decided: to
// another waiter deciding which of them gives up (the one holding the least), it looked as if it
// held more than it did, and the member holding more gave up (the share-budget test then waited
// for ever, a few runs in a hundred under load). A waiter now claims only when the sum leaves
// room, so while there is none, what it holds is what it was admitted.
TEST_CASE("share: a member waiting for room claims nothing while there is none", "[share][wait]") {
  const std::string name = unique_name("vain");
  const Unlink cleanup{name};
  const LimitSpec limit = limit_of(bytes(1000));
  auto waiter = must_join(name, limit);
  auto other = must_join(name, limit);
  REQUIRE(waiter->admit(0, 4000, 300, 0));
  REQUIRE(other->admit(0, 4000, 600, 0));  // 100 left: the waiter's 400 never fit
  std::atomic<bool> admitted{false};
  std::thread t([&] { admitted = waiter->admit(0, 4000, 400, 60'000'000'000ull); });
  auto waits = [&] {
    for (const SharedBudget::Member& m : other->members())
      if (m.waiting[0] == 400) return true;
    return false;
  };
  while (!waits()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // Every release wakes the waiter; taking the bytes back keeps the budget as full as it was.
  std::uint64_t seen_over = 0, refused = 0, samples = 0;
  const std::uint64_t until = now_ns() + 300'000'000;
  while (now_ns() < until) {
    other->release(0, 10);
    while (!other->admit(0, 4000, 10, 0)) ++refused;  // a claim of the waiter's in the way
    for (int i = 0; i < 64; ++i, ++samples) seen_over += waiter->held_mine(0) > 300;
  }
  INFO(samples << " samples");
  CHECK(seen_over == 0);
  CHECK(refused == 0);
  CHECK_FALSE(admitted.load());
  other->release(0, 600);  // now it fits
  t.join();
  CHECK(admitted.load());
  CHECK(waiter->held_mine(0) == 700);
}
