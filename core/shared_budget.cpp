#include "shared_budget.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <thread>

#include "options.h"
#include "units.h"

namespace cupool {
namespace {

std::uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

// Cross-process futex calls (not FUTEX_PRIVATE: the word is in shared memory).
void futex_wait(std::atomic<std::uint32_t>* word, std::uint32_t expected, std::uint64_t timeout_ns) {
  timespec ts{static_cast<time_t>(timeout_ns / 1'000'000'000ull), static_cast<long>(timeout_ns % 1'000'000'000ull)};
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
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

bool valid_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) return false;
  return true;
}

}  // namespace

std::string SharedBudget::segment_name(const std::string& name, bool group) {
  return "/cupool-share-" + (group ? "g" + std::to_string(getgid()) : std::to_string(getuid())) + "-" + name;
}

namespace {
// The state (field 3) and start time (field 22) of `pid` from /proc/<pid>/stat; false if unreadable.
bool proc_stat(int pid, char* state, std::uint64_t* start_ticks) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(f, stat)) return false;
  // The command (field 2) is in parentheses and may hold spaces and parentheses: fields after
  // its last ')'.
  const std::size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return false;
  std::istringstream rest(stat.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i) {
    if (i == 3) *state = field.empty() ? '?' : field[0];
    if (i == 22) {
      *start_ticks = std::strtoull(field.c_str(), nullptr, 10);
      return true;
    }
  }
  return false;
}
}  // namespace

std::uint64_t SharedBudget::start_ticks_of(int pid) {
  char state = '?';
  std::uint64_t start = 0;
  return proc_stat(pid, &state, &start) ? start : 0;
}

bool SharedBudget::alive(int pid, std::uint64_t start_ticks) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  char state = '?';
  std::uint64_t start = 0;
  if (!proc_stat(pid, &state, &start)) return true;  // unreadable /proc (another user's): trust kill()
  if (state == 'Z' || state == 'X') return false;    // exited, not yet reaped: holds nothing any more
  return start == start_ticks;                        // else a new process that got the pid
}

std::unique_ptr<SharedBudget> SharedBudget::join(const std::string& name, const LimitSpec& limit, bool group,
                                                 std::string* error) {
  auto fail = [&](const std::string& why) -> std::unique_ptr<SharedBudget> {
    *error = "cupool: CUPOOL_SHARE=" + name + ": " + why;
    return nullptr;
  };
  if (!valid_name(name)) return fail("a budget name is 1 to 64 letters, digits, '-', '_' or '.'");
  const std::string seg_name = segment_name(name, group);
  const mode_t mode = group ? 0660 : 0600;
  bool created = false;
  const mode_t old_umask = umask(0);  // the mode asked for, whatever the umask
  int fd = shm_open(seg_name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
  if (fd >= 0) {
    created = true;
  } else if (errno == EEXIST) {
    fd = shm_open(seg_name.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0);
  }
  umask(old_umask);
  if (fd < 0) return fail("cannot open /dev/shm" + seg_name + ": " + std::strerror(errno));
  struct stat st{};
  if (fstat(fd, &st) != 0 || (!created && st.st_uid != getuid() && !group)) {
    close(fd);
    return fail("/dev/shm" + seg_name + " belongs to another user");
  }
  if (created && ftruncate(fd, sizeof(Segment)) != 0) {
    const int e = errno;
    close(fd);
    shm_unlink(seg_name.c_str());
    return fail(std::string("cannot size the shared segment: ") + std::strerror(e));
  }
  // Another member may still be sizing it: wait (briefly) until it has the segment's size.
  for (int i = 0; i < 1000 && !created; ++i) {
    if (fstat(fd, &st) == 0 && static_cast<std::size_t>(st.st_size) >= sizeof(Segment)) break;
    usleep(1000);
  }
  if (fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) < sizeof(Segment)) {
    close(fd);
    return fail("/dev/shm" + seg_name + " was never set up (too small); remove it if no member is running");
  }
  void* p = mmap(nullptr, sizeof(Segment), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return fail(std::string("cannot map the shared segment: ") + std::strerror(errno));
  std::unique_ptr<SharedBudget> b(new SharedBudget);
  b->name_ = name;
  b->limit_ = limit;
  b->seg_ = static_cast<Segment*>(p);
  b->my_pid_ = getpid();
  Segment& s = *b->seg_;
  const std::string text = format_limit_spec(limit);
  if (created) {
    s.magic = kMagic;
    s.layout = kLayoutVersion;
    s.max_members = kMaxMembers;
    s.max_devices = kMaxDevices;
    std::snprintf(s.limit, sizeof s.limit, "%s", text.c_str());
    timespec ts{};
    clock_gettime(CLOCK_REALTIME, &ts);
    s.created_unix_ns = static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
    s.ready.store(1, std::memory_order_release);
  } else {
    for (int i = 0; i < 1000 && s.ready.load(std::memory_order_acquire) == 0; ++i) usleep(1000);
    if (s.ready.load(std::memory_order_acquire) == 0) return fail("the shared segment was never set up");
    if (s.magic != kMagic || s.layout != kLayoutVersion || s.max_members != kMaxMembers ||
        s.max_devices != kMaxDevices)
      return fail("/dev/shm" + seg_name + " is not a budget of this cupool version");
    if (text != s.limit)
      return fail("CUPOOL_SHARE_LIMIT=" + (text.empty() ? std::string("(unset)") : text) +
                  " differs from the budget's own, " + (s.limit[0] ? std::string(s.limit) : std::string("(unset)")) +
                  "; every member of a budget gives the same limit");
  }
  return b;
}

std::unique_ptr<SharedBudget> SharedBudget::observe(const std::string& segment_path, std::string* error) {
  const int fd = open(segment_path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    *error = segment_path + ": " + std::strerror(errno);
    return nullptr;
  }
  struct stat st{};
  if (fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) < sizeof(Segment)) {
    close(fd);
    *error = segment_path + ": not a cupool budget (too small)";
    return nullptr;
  }
  void* p = mmap(nullptr, sizeof(Segment), PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    *error = segment_path + ": " + std::strerror(errno);
    return nullptr;
  }
  std::unique_ptr<SharedBudget> b(new SharedBudget);
  b->seg_ = static_cast<Segment*>(p);
  b->read_only_ = true;
  if (b->seg_->magic != kMagic || b->seg_->layout != kLayoutVersion) {
    *error = segment_path + ": not a budget of this cupool version";
    return nullptr;
  }
  const std::string base = segment_path.substr(segment_path.rfind('/') + 1);
  const std::size_t dash = base.find('-', std::string("cupool-share-").size());
  b->name_ = dash == std::string::npos ? base : base.substr(dash + 1);
  return b;
}

std::unique_ptr<SharedBudget> SharedBudget::create_private(const LimitSpec& limit, std::string* error) {
  void* p = mmap(nullptr, sizeof(Segment), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    *error = std::string("cupool: cannot map a private budget: ") + std::strerror(errno);
    return nullptr;
  }
  std::unique_ptr<SharedBudget> b(new SharedBudget);
  b->name_ = "private";
  b->limit_ = limit;
  b->private_segment_.reset(static_cast<Segment*>(p), [](Segment* s) { munmap(s, sizeof(Segment)); });
  b->seg_ = b->private_segment_.get();
  b->my_pid_ = getpid();
  // Anonymous memory is zeroed: every slot is free, every counter 0.
  Segment& s = *b->seg_;
  s.magic = kMagic;
  s.layout = kLayoutVersion;
  s.max_members = kMaxMembers;
  s.max_devices = kMaxDevices;
  std::snprintf(s.limit, sizeof s.limit, "%s", format_limit_spec(limit).c_str());
  s.ready.store(1, std::memory_order_release);
  return b;
}

std::unique_ptr<SharedBudget> SharedBudget::another_member() const {
  if (!private_segment_) return nullptr;
  std::unique_ptr<SharedBudget> b(new SharedBudget);
  b->name_ = name_;
  b->limit_ = limit_;
  b->private_segment_ = private_segment_;
  b->seg_ = seg_;
  b->my_pid_ = my_pid_;
  return b;
}

SharedBudget::~SharedBudget() {
  stop_give_back();
  // The slot stays ours until exit: the process still holds its memory. At exit, the next
  // member that needs room finds us gone and reclaims the slot. (A private budget's mapping goes
  // with its last member.)
  if (seg_ && !private_segment_) munmap(seg_, sizeof(Segment));
}

std::string SharedBudget::limit_text() const { return seg_ ? std::string(seg_->limit) : std::string(); }

std::optional<std::uint64_t> SharedBudget::budget(int device, std::uint64_t device_total) const {
  const auto spec = limit_.for_device(device);
  if (!spec) return std::nullopt;
  return spec->resolve(device_total);
}

SharedBudget::Slot* SharedBudget::my_slot() {
  if (Slot* s = mine_.load(std::memory_order_acquire)) return s;
  const std::uint64_t me = static_cast<std::uint64_t>(my_pid_) << 8;
  for (int pass = 0; pass < 2; ++pass) {
    for (Slot& s : seg_->slots) {
      std::uint64_t expected = 0;
      if (!s.owner.compare_exchange_strong(expected, me | kClaiming, std::memory_order_seq_cst)) continue;
      s.start_ticks.store(start_ticks_of(my_pid_), std::memory_order_relaxed);
      for (int d = 0; d < kMaxDevices; ++d) {
        s.held[d].store(0);
        s.in_use[d].store(0);
        s.reserved[d].store(0);
        s.waiting[d].store(0);
      }
      s.ooms.store(0);
      std::snprintf(s.command, sizeof s.command, "%s", own_command().c_str());
      s.owner.store(me | kLive, std::memory_order_seq_cst);
      // Threads of this process may claim at once: one slot wins, the others are given back.
      Slot* winner = nullptr;
      if (mine_.compare_exchange_strong(winner, &s, std::memory_order_acq_rel)) {
        start_give_back();  // a fork child's own (the parent's thread did not come along)
        return &s;
      }
      s.owner.store(0, std::memory_order_seq_cst);
      return winner;
    }
    reclaim_dead();  // full: slots of members that are gone are free again
  }
  return nullptr;
}

std::uint64_t SharedBudget::reclaim_dead() {
  if (read_only_) return 0;
  std::uint64_t bytes = 0;
  for (Slot& s : seg_->slots) {
    std::uint64_t owner = s.owner.load(std::memory_order_seq_cst);
    if (owner == 0 || (owner & 0xff) != kLive) continue;
    const int pid = static_cast<int>(owner >> 8);
    if (alive(pid, s.start_ticks.load(std::memory_order_relaxed))) continue;
    // One reclaimer: whoever moves the slot from live to reclaiming.
    if (!s.owner.compare_exchange_strong(owner, (owner & ~std::uint64_t{0xff}) | kReclaiming)) continue;
    for (int d = 0; d < kMaxDevices; ++d) {
      bytes += s.held[d].exchange(0);
      s.in_use[d].store(0);
      s.reserved[d].store(0);
      s.waiting[d].store(0);
    }
    s.owner.store(0, std::memory_order_seq_cst);
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
  Slot* mine = my_slot();
  if (mine == nullptr || device < 0 || device >= kMaxDevices) return false;
  // 1. Claim. 2. Sum every claim, this one included. 3. Over the budget: take it back.
  mine->held[device].fetch_add(bytes, std::memory_order_seq_cst);
  std::uint64_t sum = 0;
  for (const Slot& s : seg_->slots) sum = saturating_add(sum, s.held[device].load(std::memory_order_seq_cst));
  if (sum <= budget) return true;
  mine->held[device].fetch_sub(bytes, std::memory_order_seq_cst);
  // Someone waiting for room may fit now that this claim is gone (a waiter's own retries do not
  // say so: waiters would wake each other for ever).
  if (notify) {
    seg_->released_seq.fetch_add(1);
    if (seg_->waiters.load() > 0) futex_wake_all(&seg_->released_seq);
  }
  return false;
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
  if (!b) return true;  // no budget on this device
  if (bytes > *b) return false;
  if (try_admit(device, *b, bytes)) return true;
  if (reclaim_dead() > 0 && try_admit(device, *b, bytes)) return true;
  if (wait_ns == 0) return false;
  if (wait_by_) {
    wait_by_();
    return claim(device, *b, bytes, false);
  }
  // Wait for room: say so (the others' give-back threads wake), then retry at every release.
  Slot* mine = my_slot();
  if (mine == nullptr) return false;
  mine->waiting[device].fetch_add(bytes);
  seg_->waiters.fetch_add(1);
  seg_->wanted_seq.fetch_add(1);
  futex_wake_all(&seg_->wanted_seq);
  const std::uint64_t started = now_ns(), deadline = started + wait_ns;
  bool ok = false;
  std::uint32_t last_release = seg_->released_seq.load();
  std::uint64_t quiet_since = started;  // no release seen since
  for (;;) {
    const std::uint32_t seen = seg_->released_seq.load();
    if (claim(device, *b, bytes, false)) {
      ok = true;
      break;
    }
    const std::uint64_t t = now_ns();
    if (t >= deadline) break;
    if (seen != last_release) last_release = seen, quiet_since = t;
    // Every member that holds memory here waits too, and nothing was released for a while: no
    // one can give anything back, and all would wait out their time. One gives up now, the one
    // that holds the least (its program's out-of-memory frees what it held for the others).
    if (t - quiet_since >= kDeadlockQuiet_ns && gives_up_in_deadlock(device)) break;
    // At most 50 ms asleep: a member that died holding room is reclaimed without anyone's release.
    futex_wait(&seg_->released_seq, seen, std::min<std::uint64_t>(deadline - t, 50'000'000));
    reclaim_dead();
  }
  seg_->waiters.fetch_sub(1);
  mine->waiting[device].fetch_sub(bytes);
  waits_.fetch_add(1, std::memory_order_relaxed);
  waited_ns_.fetch_add(now_ns() - started, std::memory_order_relaxed);
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
  if (seg_->waiters.load() > 0) futex_wake_all(&seg_->released_seq);
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
  std::string out;
  for (const Member& m : members()) {
    if (device < 0 || device >= kMaxDevices || m.held[device] == 0) continue;
    if (!out.empty()) out += ", ";
    out += "pid " + std::to_string(m.pid) + " (" + m.command + ") " + human_bytes(m.held[device]);
    if (!m.alive) out += " (gone)";
  }
  return out.empty() ? std::string("nobody") : out;
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
    m.alive = alive(m.pid, m.start_ticks);
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

void SharedBudget::serve_give_back(std::function<void()> give_back) {
  if (read_only_ || give_back_ != nullptr) return;
  give_back_fn_ = std::move(give_back);
  start_give_back();
}

void SharedBudget::start_give_back() {
  if (read_only_ || give_back_ != nullptr || !give_back_fn_) return;
  give_back_ = new std::thread([this, fn = give_back_fn_] {
    std::uint32_t seen = seg_->wanted_seq.load();
    while (!stopping_.load()) {
      futex_wait(&seg_->wanted_seq, seen, 100'000'000);
      const std::uint32_t now = seg_->wanted_seq.load();
      if (stopping_.load()) break;
      if (now == seen && seg_->waiters.load() == 0) continue;
      seen = now;
      // Someone waits for room: what this process holds idle goes back (unless it is the one waiting).
      if (Slot* mine = mine_.load(); mine != nullptr && seg_->waiters.load() > 0) {
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
  give_back_ = nullptr;  // the parent's thread: not this process's to join (leaked); a new one
                         // starts at the child's first claim
}

}  // namespace cupool
