// SharedBudget (shared_budget.h): the node's shared budget in its shared-memory segment: joining,
// admitting, giving back, waiting, and reclaiming the bytes of members that are gone.
#include "shared_budget.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <sched.h>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "options.h"
#include "units.h"
#include "clock.h"
#include "shared_budget_locks.h"

namespace cupool {
using namespace budget_locks;
namespace {

// Cross-process futex calls (not FUTEX_PRIVATE: the word is in shared memory).
// True when it returned because the time ran out (not a wake, nor a word already changed).
bool futex_wait(std::atomic<std::uint32_t>* word, std::uint32_t expected, std::uint64_t timeout_ns) {
  timespec ts{static_cast<time_t>(timeout_ns / 1'000'000'000ull), static_cast<long>(timeout_ns % 1'000'000'000ull)};
  return syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0) != 0 &&
         errno == ETIMEDOUT;
}
void futex_wake_all(std::atomic<std::uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

std::string own_command() {
  std::ifstream f("/proc/self/comm");
  std::string c;
  std::getline(f, c);
  return c;
}

// Why this thread's last admission was refused (refusal()).
enum class Refusal : std::uint8_t { none, no_room, no_slot, device };
thread_local Refusal t_refusal = Refusal::none;

}  // namespace

std::optional<std::uint64_t> SharedBudget::budget(int device, std::uint64_t device_total) const {
  const auto spec = limit_.for_device(device);
  if (!spec) return std::nullopt;
  return spec->resolve(device_total);
}

SharedBudget::Slot* SharedBudget::my_slot() {
  if (Slot* s = mine_.load(std::memory_order_acquire)) return s;
  std::lock_guard guard(claim_mu_);  // one descriptor holds every lock of this member: one claimer
  if (Slot* s = mine_.load(std::memory_order_acquire)) return s;
  const std::uint64_t me = static_cast<std::uint64_t>(my_pid_) << 8;
  for (int i = 0; i < kMaxMembers; ++i) {
    Slot& s = seg_->slots[i];
    // A private budget (replay) has no file: its members are threads of one process.
    if (fd_ >= 0) {
      if (!ofd_lock(fd_, slot_byte(i), F_WRLCK)) continue;  // a live member's
    } else {
      std::uint64_t expected = 0;
      if (!s.owner.compare_exchange_strong(expected, me | kClaiming, std::memory_order_seq_cst)) continue;
    }
    // Ours. What a member that died in it left goes first (its memory went with it).
    s.owner.store(me | kClaiming, std::memory_order_seq_cst);
    test_kill_point("slot-claim");
    std::uint64_t freed = 0;
    for (int d = 0; d < kMaxDevices; ++d) {
      freed += s.held[d].exchange(0);
      s.in_use[d].store(0);
      s.reserved[d].store(0);
      s.waiting[d].store(0);
    }
    s.ooms.store(0);
    s.start_ticks.store(start_ticks_of(my_pid_), std::memory_order_relaxed);
    std::snprintf(s.command, sizeof s.command, "%s", own_command().c_str());
    s.owner.store(me | kLive, std::memory_order_seq_cst);
    if (freed) {
      seg_->released_seq.fetch_add(1);
      futex_wake_all(&seg_->released_seq);
    }
    mine_.store(&s, std::memory_order_release);
    start_give_back();  // a fork child's own (the parent's thread did not come along)
    return &s;
  }
  if (fd_ >= 0) return nullptr;
  reclaim_dead();
  return nullptr;
}

bool SharedBudget::slot_held_by_other(int i) const {
  if (&seg_->slots[i] == mine_.load(std::memory_order_acquire)) return false;
  if (fd_ < 0) return (seg_->slots[i].owner.load() & 0xff) == kLive;  // a private budget's threads
  return ofd_locked_by_other(fd_, slot_byte(i));
}

std::uint64_t SharedBudget::reclaim_dead() {
  if (read_only_ || fd_ < 0) return 0;  // a private budget's members never die apart
  reclaim_scans_.fetch_add(1, std::memory_order_relaxed);
  std::uint64_t bytes = 0;
  const Slot* const mine = mine_.load(std::memory_order_acquire);
  for (int i = 0; i < kMaxMembers; ++i) {
    Slot& s = seg_->slots[i];
    if (&s == mine) continue;  // our own lock: taking it again would succeed
    bool used = s.owner.load(std::memory_order_seq_cst) != 0;
    for (int d = 0; d < kMaxDevices && !used; ++d) used = s.held[d].load() != 0 || s.waiting[d].load() != 0;
    if (!used) continue;
    // Lockable: no live member holds it. Emptied under the lock, so that no one claims it meanwhile.
    if (!ofd_lock(fd_, slot_byte(i), F_WRLCK)) continue;
    for (int d = 0; d < kMaxDevices; ++d) {
      bytes += s.held[d].exchange(0);
      s.in_use[d].store(0);
      s.reserved[d].store(0);
      s.waiting[d].store(0);
    }
    s.owner.store(0, std::memory_order_seq_cst);
    ofd_lock(fd_, slot_byte(i), F_UNLCK);
  }
  if (bytes) {
    seg_->released_seq.fetch_add(1);
    futex_wake_all(&seg_->released_seq);
  }
  return bytes;
}

bool SharedBudget::try_admit(int device, std::uint64_t budget, std::uint64_t bytes) {
  return claim(device, budget, bytes, true);
}

bool SharedBudget::claim(int device, std::uint64_t budget, std::uint64_t bytes, bool notify) {
  if (device < 0 || device >= kMaxDevices) {
    t_refusal = Refusal::device;
    return false;
  }
  Slot* mine = my_slot();
  if (mine == nullptr) {
    t_refusal = Refusal::no_slot;
    return false;
  }
  // 1. Claim. 2. Sum every claim, this one included. 3. Over the budget: take it back.
  mine->held[device].fetch_add(bytes, std::memory_order_seq_cst);
  std::uint64_t sum = 0;
  for (const Slot& s : seg_->slots) sum = saturating_add(sum, s.held[device].load(std::memory_order_seq_cst));
  if (sum <= budget) return true;
  mine->held[device].fetch_sub(bytes, std::memory_order_seq_cst);
  t_refusal = Refusal::no_room;
  // Someone waiting for room may fit now that this claim is gone (a waiter's own retries do not
  // say so: waiters would wake each other for ever).
  if (notify) {
    seg_->released_seq.fetch_add(1);
    if (someone_else_waits(device)) futex_wake_all(&seg_->released_seq);
  }
  return false;
}

bool SharedBudget::someone_else_waits(int device) const {
  for (int i = 0; i < kMaxMembers; ++i) {
    const Slot& s = seg_->slots[i];
    bool waits = false;
    if (device >= 0) waits = s.waiting[device].load() != 0;
    else
      for (int d = 0; d < kMaxDevices && !waits; ++d) waits = s.waiting[d].load() != 0;
    // A member that died waiting leaves its count until its slot is emptied: not a waiter.
    if (waits && slot_held_by_other(i)) return true;
  }
  return false;
}

std::string SharedBudget::refusal() const {
  switch (t_refusal) {
    case Refusal::no_slot:
      return "no slot is free: the budget's " + std::to_string(kMaxMembers) + " member slots are all held by live processes";
    case Refusal::device:
      return "a shared budget counts devices 0 to " + std::to_string(kMaxDevices - 1) + " only";
    default:
      return "the shared budget has no room";
  }
}

bool SharedBudget::gives_up_in_deadlock(int device) const {
  const Slot* mine = mine_.load(std::memory_order_acquire);
  if (mine == nullptr) return false;
  const Slot* least = nullptr;
  for (const Slot& s : seg_->slots) {
    const std::uint64_t owner = s.owner.load();
    if (owner == 0 || (owner & 0xff) != kLive || s.held[device].load() == 0) continue;
    bool waiting = false;
    for (int d = 0; d < kMaxDevices && !waiting; ++d) waiting = s.waiting[d].load() != 0;
    if (!waiting) return false;  // a member still runs: it may free memory
    // The least held; ties go to the larger pid (the younger process, most likely).
    if (least == nullptr || s.held[device].load() < least->held[device].load() ||
        (s.held[device].load() == least->held[device].load() && owner > least->owner.load()))
      least = &s;
  }
  return least == mine;
}

bool SharedBudget::admit(int device, std::uint64_t device_total, std::uint64_t bytes, std::uint64_t wait_ns) {
  const auto b = budget(device, device_total);
  t_refusal = Refusal::none;
  if (!b) return true;  // no budget on this device
  if (bytes > *b) {
    t_refusal = Refusal::no_room;
    return false;
  }
  // A claim refused beside another claim decided at the same moment may fit once that one has
  // taken itself back: tried again while the sum without it leaves room (each claim that fails
  // takes itself back, so this ends).
  auto try_hard = [&](bool notify) {
    for (int tries = 0; tries < 64; ++tries) {
      if (claim(device, *b, bytes, notify)) return true;
      if (test_after_refusal) test_after_refusal();
      if (t_refusal != Refusal::no_room || saturating_add(held_total(device), bytes) > *b) return false;
      sched_yield();
    }
    return false;
  };
  if (try_hard(true)) return true;
  if (t_refusal != Refusal::no_room) return false;
  if (reclaim_dead() > 0 && try_hard(true)) return true;
  if (wait_ns == 0 || t_refusal != Refusal::no_room) return false;
  if (wait_by_) {
    wait_by_();
    return claim(device, *b, bytes, false);
  }
  // Wait for room: say so in our slot (the others' give-back threads wake), then retry at every
  // release. A member killed while it waits leaves its count in its slot, which dies with it.
  Slot* mine = my_slot();
  if (mine == nullptr) return false;
  mine->waiting[device].fetch_add(bytes);
  seg_->wanted_seq.fetch_add(1);
  futex_wake_all(&seg_->wanted_seq);
  test_kill_point("wait");
  const std::uint64_t started = monotonic_ns(), deadline = saturating_add(started, wait_ns);
  bool ok = false;
  std::uint32_t last_release = seg_->released_seq.load();
  std::uint64_t quiet_since = started;  // no release seen since
  // Dead members are looked for at most every kScanEvery_ns (each look tries every slot's lock):
  // a wake by a release needs none, however many releases come (issue 26: 65 members' releases
  // made each waiter rescan at every one, and a 300 ms wait ran to 0.85 s).
  constexpr std::uint64_t kScanEvery_ns = 50'000'000;
  std::uint64_t last_scan = started;
  for (;;) {
    const std::uint32_t seen = seg_->released_seq.load();
    // Claimed only when the sum leaves room: a claim is counted in `held` while it is decided,
    // and a waiter that kept claiming in vain showed, to another waiter deciding who gives up,
    // more than it held (the share-budget test failed so a few runs in a hundred on a loaded
    // 2-core VM: the member holding more gave up, and the one holding less then waited for ever).
    if (saturating_add(held_total(device), bytes) <= *b && claim(device, *b, bytes, false)) {
      ok = true;
      break;
    }
    const std::uint64_t t = monotonic_ns();
    if (t >= deadline) break;
    if (seen != last_release) last_release = seen, quiet_since = t;
    // Every member that holds memory here waits too, and nothing was released for a while: no
    // one can give anything back, and all would wait out their time. One gives up now, the one
    // that holds the least (its program's out-of-memory frees what it held for the others).
    if (t - quiet_since >= kDeadlockQuiet_ns && gives_up_in_deadlock(device)) break;
    // At most 50 ms asleep: a member that died holding room is reclaimed without anyone's release.
    const bool timed_out = futex_wait(&seg_->released_seq, seen, std::min<std::uint64_t>(deadline - t, kScanEvery_ns));
    if (timed_out || monotonic_ns() - last_scan >= kScanEvery_ns) {
      reclaim_dead();
      last_scan = monotonic_ns();
    }
  }
  mine->waiting[device].fetch_sub(bytes);
  waits_.fetch_add(1, std::memory_order_relaxed);
  waited_ns_.fetch_add(monotonic_ns() - started, std::memory_order_relaxed);
  if (!ok) t_refusal = Refusal::no_room;
  return ok;
}

void SharedBudget::add(int device, std::uint64_t bytes) {
  Slot* mine = my_slot();
  if (mine == nullptr || device < 0 || device >= kMaxDevices || bytes == 0) return;
  mine->held[device].fetch_add(bytes, std::memory_order_seq_cst);
}

void SharedBudget::release(int device, std::uint64_t bytes) {
  Slot* mine = mine_.load(std::memory_order_acquire);
  if (mine == nullptr || device < 0 || device >= kMaxDevices || bytes == 0) return;
  std::uint64_t held = mine->held[device].load();
  // Never below zero (a release of bytes a fork child inherited but never claimed).
  while (!mine->held[device].compare_exchange_weak(held, held > bytes ? held - bytes : 0)) {
  }
  seg_->released_seq.fetch_add(1);
  if (someone_else_waits(device)) futex_wake_all(&seg_->released_seq);
}

std::optional<std::uint64_t> SharedBudget::room(int device, std::uint64_t device_total) const {
  const auto b = budget(device, device_total);
  if (!b) return std::nullopt;
  const std::uint64_t held = held_total(device);
  return held >= *b ? 0 : *b - held;
}

std::uint64_t SharedBudget::held_total(int device) const {
  if (device < 0 || device >= kMaxDevices) return 0;
  std::uint64_t sum = 0;
  for (const Slot& s : seg_->slots) sum = saturating_add(sum, s.held[device].load());
  return sum;
}

std::uint64_t SharedBudget::held_mine(int device) const {
  Slot* mine = mine_.load(std::memory_order_acquire);
  return mine && device >= 0 && device < kMaxDevices ? mine->held[device].load() : 0;
}

std::string SharedBudget::holders(int device) const {
  if (device < 0 || device >= kMaxDevices) return "nobody";
  std::vector<Member> held;
  for (Member& m : members())
    if (m.held[device] != 0) held.push_back(std::move(m));
  if (held.empty()) return "nobody";
  std::sort(held.begin(), held.end(), [&](const Member& a, const Member& b) { return a.held[device] > b.held[device]; });
  constexpr std::size_t kShown = 4;  // one line of bounded length, with up to 256 members
  std::string out;
  for (std::size_t i = 0; i < held.size() && i < kShown; ++i) {
    const Member& m = held[i];
    if (!out.empty()) out += ", ";
    out += "pid " + std::to_string(m.pid) + " (" + m.command + ") " + human_bytes(m.held[device]);
    if (!m.alive) out += " (gone)";
  }
  if (held.size() > kShown) out += " and " + std::to_string(held.size() - kShown) + " more";
  return out;
}

void SharedBudget::publish(int device, std::uint64_t in_use, std::uint64_t reserved) {
  Slot* mine = mine_.load(std::memory_order_acquire);
  if (mine == nullptr || device < 0 || device >= kMaxDevices) return;
  mine->in_use[device].store(in_use, std::memory_order_relaxed);
  mine->reserved[device].store(reserved, std::memory_order_relaxed);
}

void SharedBudget::note_oom() {
  if (Slot* mine = my_slot()) mine->ooms.fetch_add(1, std::memory_order_relaxed);
}

std::vector<SharedBudget::Member> SharedBudget::members() const {
  std::vector<Member> out;
  for (const Slot& s : seg_->slots) {
    const std::uint64_t owner = s.owner.load();
    if (owner == 0 || (owner & 0xff) != kLive) continue;
    Member m;
    m.pid = static_cast<int>(owner >> 8);
    m.start_ticks = s.start_ticks.load();
    m.command = std::string(s.command, strnlen(s.command, sizeof s.command));
    m.alive = &s == mine_.load(std::memory_order_acquire) || slot_held_by_other(static_cast<int>(&s - seg_->slots));
    for (int d = 0; d < kMaxDevices; ++d) {
      m.held[d] = s.held[d].load();
      m.in_use[d] = s.in_use[d].load();
      m.reserved[d] = s.reserved[d].load();
      m.waiting[d] = s.waiting[d].load();
    }
    m.ooms = s.ooms.load();
    out.push_back(std::move(m));
  }
  return out;
}

void SharedBudget::serve_give_back(std::function<void()> give_back, std::function<void()> publish) {
  if (read_only_ || give_back_ != nullptr) return;
  give_back_fn_ = std::move(give_back);
  publish_fn_ = std::move(publish);
  start_give_back();
}

void SharedBudget::start_give_back() {
  if (read_only_ || give_back_ != nullptr || !give_back_fn_) return;
  give_back_ = new std::thread([this, fn = give_back_fn_, publish = publish_fn_] {
    std::uint32_t seen = seg_->wanted_seq.load();
    while (!stopping_.load()) {
      futex_wait(&seg_->wanted_seq, seen, 100'000'000);
      const std::uint32_t now = seg_->wanted_seq.load();
      if (stopping_.load()) break;
      if (publish && mine_.load() != nullptr) publish();  // top's figures, at most 100 ms old
      const bool waits = someone_else_waits(-1);
      if (now == seen && !waits) continue;
      seen = now;
      // Someone waits for room: what this process holds idle goes back (unless it is the one waiting).
      if (Slot* mine = mine_.load(); mine != nullptr && waits) {
        bool self_waiting = false;
        for (int d = 0; d < kMaxDevices; ++d) self_waiting = self_waiting || mine->waiting[d].load() != 0;
        if (!self_waiting) fn();
      }
    }
  });
}

void SharedBudget::stop_give_back() {
  if (give_back_ == nullptr) return;
  stopping_.store(true);
  seg_->wanted_seq.fetch_add(1);
  futex_wake_all(&seg_->wanted_seq);
  give_back_->join();
  delete give_back_;
  give_back_ = nullptr;
}

void SharedBudget::after_fork_in_child() {
  mine_.store(nullptr, std::memory_order_release);
  my_pid_ = getpid();
  // The inherited descriptor is the parent's open file, locks and all: keeping it would keep
  // the parent's slot alive after the parent's death. The child opens the segment anew, and
  // joins as a member (the same file, or none if it is gone).
  if (fd_ >= 0) {
    close(fd_);
    fd_ = open(path_.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd_ >= 0 && !ofd_lock(fd_, kMembership, F_RDLCK)) {
      close(fd_);
      fd_ = -1;
    }
  }
  give_back_ = nullptr;  // the parent's thread: not this process's to join (leaked); a new one
                         // starts at the child's first claim
}

}  // namespace cupool
