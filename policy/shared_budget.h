// SharedBudget: a memory budget per device that the processes on one node naming it share
// (CUPOOL_SHARE, CUPOOL_SHARE_LIMIT). Its state lives in a POSIX shared-memory segment
// (/dev/shm/cupool-share-<uid or g<gid>>-<name>), mode 0600 (0660 with CUPOOL_SHARE_ACCESS=group),
// holding one slot per member process. docs/design.md ("Sharing a device", "Deploying on a shared
// node") explains the rules:
// - Admission cannot be raced and needs no lock: a member adds its claim to its own slot, then
//   sums every slot; if the sum passes the budget it takes its claim back and is refused (or
//   waits). With sequentially consistent atomics, of any set of claims that all pass, the last
//   to be added saw all the others, so what passed never exceeds the budget (test/unit:
//   exhaustive check of every interleaving of the protocol, and a many-process stress test).
// - Liveness comes from the kernel, not from pids: a member holds an open-file-description lock
//   (fcntl F_OFD_SETLK) on one byte per slot of the segment file, which the kernel releases when
//   the last descriptor of it closes: when the process dies however it dies, or execs (the
//   descriptor is close-on-exec), and never while any of its threads runs (a main thread's
//   pthread_exit included). Locks are seen across PID namespaces (containers sharing /dev/shm
//   with --ipc=host), where a pid and its start time are not. A slot whose lock nobody holds is
//   free, or a dead member's, and whoever locks it next empties it.
// - Every member also holds a shared lock on one more byte: whoever can turn it exclusive is
//   alone, and may set the segment up afresh (a leftover with no member) or, leaving last,
//   remove it.
// - A forked child is a member of its own: it opens the segment again (the inherited descriptor
//   is its parent's lock) and claims a slot of its own at its first admission.
// - A member may wait for room (CUPOOL_SHARE_WAIT): it says how much it waits for in its slot,
//   the others' give-back threads return their wholly free chunks, and each release wakes the
//   waiters. When every member holding memory waits and nothing is released for a second, the
//   one holding the least gives up at once rather than at the end of its wait.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "config.h"

namespace cupool {

class SharedBudget {
 public:
  static constexpr int kMaxMembers = 256;
  // CUDA device ordinals a budget counts (CUPOOL_SHARE_LIMIT refuses a larger one).
  static constexpr int kMaxDevices = 64;
  static constexpr std::uint64_t kMagic = 0x31'6572'6168'5350'43ull;  // "CPShare1"
  static constexpr std::uint32_t kLayoutVersion = 2;
  // The locks lie past the segment's bytes (a lock needs no byte of the file): the membership
  // byte, then one byte per slot.
  static constexpr long long kLockBase = 1ll << 40;

  // The shared segment, as every member maps it. Plain atomics only: address-free, lock-free.
  struct Slot {
    // 0: free. Otherwise pid << 8 | state (kClaiming, kLive, kReclaiming).
    std::atomic<std::uint64_t> owner;
    std::atomic<std::uint64_t> start_ticks;  // the pid's start time (clock ticks after boot)
    std::atomic<std::uint64_t> held[kMaxDevices];     // claims: admitted bytes, and claims being decided
    std::atomic<std::uint64_t> in_use[kMaxDevices];   // published by the member (for top)
    std::atomic<std::uint64_t> reserved[kMaxDevices];
    std::atomic<std::uint64_t> waiting[kMaxDevices];  // bytes it waits for room for, now
    std::atomic<std::uint64_t> ooms;                  // refusals for want of room in the budget
    char command[48];                                 // the member's command name
  };
  struct Segment {
    std::uint64_t magic;
    std::uint32_t layout;
    std::uint32_t max_members, max_devices;
    std::atomic<std::uint32_t> ready;   // 1 once the creator has filled in what follows
    char limit[256];                    // CUPOOL_SHARE_LIMIT as the creator gave it (normalized)
    std::uint64_t created_unix_ns;
    std::atomic<std::uint32_t> released_seq;  // futex word: bumped at every release (waiters wake)
    std::atomic<std::uint32_t> wanted_seq;    // futex word: bumped when a member starts waiting
    Slot slots[kMaxMembers];
  };
  // A slot's state: being set up by the member that locked it, or in use. Either way it is a
  // live member's only while that member holds the slot's lock.
  static constexpr std::uint64_t kClaiming = 1, kLive = 2;

  // Joins budget `name` (created if it does not exist, or set up afresh with `limit` if no member
  // is left in it) with `limit` per device; the limit must be the one its members gave. Null and
  // *error (one line "cupool: ...") on failure: a file at the name that is not a budget of this
  // user (or group) is never used.
  static std::unique_ptr<SharedBudget> join(const std::string& name, const LimitSpec& limit, bool group,
                                            std::string* error);
  // A read-only view of an existing segment (cupool top): no slot is claimed. The file is opened
  // without blocking and must be a regular file of the size of a segment; its bytes are copied
  // (no mapping another user could truncate under the reader), strings bounded.
  static std::unique_ptr<SharedBudget> observe(const std::string& segment_path, std::string* error);
  // The segment's owner, as the file says (observe only).
  unsigned owner_uid() const { return owner_uid_; }
  unsigned owner_gid() const { return owner_gid_; }
  // A budget that no other process can join (`cupool replay`: the recorded processes are members
  // in one process): its segment is anonymous memory. Every SharedBudget of it is one member
  // with a slot of its own; another_member() adds one. Null and *error on failure.
  static std::unique_ptr<SharedBudget> create_private(const LimitSpec& limit, std::string* error);
  std::unique_ptr<SharedBudget> another_member() const;  // private budgets only (else null)
  // Private budgets only: an admission that would wait calls `give_back_others` instead (the
  // other members return their wholly free memory at once) and tries once more; no time passes.
  void wait_by(std::function<void()> give_back_others) { wait_by_ = std::move(give_back_others); }
  ~SharedBudget();
  SharedBudget(const SharedBudget&) = delete;
  SharedBudget& operator=(const SharedBudget&) = delete;

  // The segment's name in /dev/shm for budget `name` of this user (or group).
  static std::string segment_name(const std::string& name, bool group);
  const std::string& name() const { return name_; }
  const LimitSpec& limit() const { return limit_; }

  // The budget on `device` (whose memory is `device_total`), or nothing if it has none.
  std::optional<std::uint64_t> budget(int device, std::uint64_t device_total) const;
  // Takes `bytes` on `device`. With no room, reclaims dead members' bytes, then waits up to
  // wait_ns for others to give memory back. False: refused (refusal() says why).
  bool admit(int device, std::uint64_t device_total, std::uint64_t bytes, std::uint64_t wait_ns);
  // Why this thread's last admission was refused, in words: no room, no free slot (every one of
  // kMaxMembers held by a live member), or a device past kMaxDevices.
  std::string refusal() const;
  // One attempt, no reclaim, no wait (the protocol's step; the tests drive it).
  bool try_admit(int device, std::uint64_t budget, std::uint64_t bytes);
  void release(int device, std::uint64_t bytes);
  // Counts `bytes` the driver already handed out where no admission could come first (graph
  // memory the driver grew on its own): held, even past the budget, so that others see it.
  void add(int device, std::uint64_t bytes);
  // What the budget still allows on `device`; nothing when it has no budget there.
  std::optional<std::uint64_t> room(int device, std::uint64_t device_total) const;
  std::uint64_t held_total(int device) const;  // every member's claims
  std::uint64_t held_mine(int device) const;
  // Slots of members that are gone (their lock is free) are emptied; their bytes are free again.
  // Returns the bytes reclaimed.
  std::uint64_t reclaim_dead();
  // Who holds what on `device`, for an out-of-memory message: "pid 12 (python) 40.0 GiB, ...",
  // the largest few, and how many more (a line of bounded length).
  std::string holders(int device) const;
  // The member's own figures, for `cupool top`.
  void publish(int device, std::uint64_t in_use, std::uint64_t reserved);
  void note_oom();
  // This process's waits for room (those that ended admitted or refused) and their total time:
  // what its trace's footer reports.
  std::uint64_t waits() const { return waits_.load(std::memory_order_relaxed); }
  // How often this member looked at every slot's lock for dead members (a test's measure: a
  // waiter woken by releases must not rescan at every wake, issue 26).
  std::uint64_t reclaim_scans() const { return reclaim_scans_.load(std::memory_order_relaxed); }
  std::uint64_t waited_ns() const { return waited_ns_.load(std::memory_order_relaxed); }

  // Give-back: `give_back` runs on a thread of this process whenever another member starts
  // waiting for room (it should return wholly free memory to the driver, which releases it).
  // `publish` runs on it at least every 100 ms once the process is a member: what top shows of
  // it (publish()), after frees too, at no cost to allocations.
  void serve_give_back(std::function<void()> give_back, std::function<void()> publish = nullptr);

  // In a forked child: the parent's slot is not the child's (a new one is claimed when needed),
  // nor its locks (the segment is opened again); the give-back thread did not survive the fork.
  void after_fork_in_child();
  // At exit: if no other member is left, the segment is removed.
  void leave();

  // For `cupool top` and the metrics: every member slot in use.
  struct Member {
    int pid = 0;
    std::uint64_t start_ticks = 0;
    std::string command;
    bool alive = false;
    std::uint64_t held[kMaxDevices] = {}, in_use[kMaxDevices] = {}, reserved[kMaxDevices] = {},
                  waiting[kMaxDevices] = {};
    std::uint64_t ooms = 0;
  };
  std::vector<Member> members() const;
  std::string limit_text() const;

  // The start time of `pid` (field 22 of /proc/<pid>/stat), or 0 if it is not running: shown by
  // top beside the pid (both as the member's own PID namespace sees them), never a liveness test.
  static std::uint64_t start_ticks_of(int pid);
  // Test hook (CUPOOLTEST_SHARE_KILL=slot-claim|wait, read by tests only): the process kills
  // itself with SIGKILL at that step, so that a test can land a kill exactly there.
  static void test_kill_point(const char* step);
  // Test hook (unit tests only; nullptr otherwise): called after a claim was refused and took
  // itself back, before admit() decides whether to try again, so that a test can make a claim
  // decided at the same moment go away exactly then.
  static inline void (*test_after_refusal)() = nullptr;

 private:
  SharedBudget() = default;
  // A new budget's segment, set up (`set_up`) apart and then linked at `seg_name`, so that whoever
  // opens that name finds a budget ready, or nothing. made: `*fd` (the membership byte held
  // shared) and `*mapping`. lost: a segment is at the name already (join that one). no_link: this
  // /dev/shm allows no link (make it in place). failed: `*why` says what failed.
  enum class MakeResult { made, lost, no_link, failed };
  static MakeResult make_linked(const std::string& seg_name, unsigned mode, const std::function<void(Segment&)>& set_up,
                                void** mapping, int* fd, std::string* why);
  Slot* my_slot();  // claimed at first use
  bool slot_held_by_other(int i) const;  // a live member other than this object holds slot i
  bool someone_else_waits(int device) const;  // device -1: on any device
  // The protocol's step; `notify`: a refusal wakes the waiters (not from a waiter's own retries).
  bool claim(int device, std::uint64_t budget, std::uint64_t bytes, bool notify);
  void stop_give_back();
  // While waiting: every member holding memory on `device` waits too, and this one holds the
  // least of them (it gives up, so that the others can go on).
  bool gives_up_in_deadlock(int device) const;
  static constexpr std::uint64_t kDeadlockQuiet_ns = 1'000'000'000;  // no release for this long first

  std::string name_;
  std::string path_;  // the segment's path in /dev/shm (joined budgets)
  LimitSpec limit_;
  Segment* seg_ = nullptr;
  int fd_ = -1;  // the segment, open for its locks (joined budgets); -1: none
  bool group_ = false;
  unsigned owner_uid_ = 0, owner_gid_ = 0;
  std::unique_ptr<Segment> copy_;  // observe(): the segment's bytes as read
  std::mutex claim_mu_;  // threads of this member claim its slot one at a time (one lock owner: the fd)
  std::shared_ptr<Segment> private_segment_;  // a private budget's mapping, unmapped with its last member
  std::function<void()> wait_by_;
  bool read_only_ = false;
  std::atomic<Slot*> mine_{nullptr};
  int my_pid_ = 0;
  std::thread* give_back_ = nullptr;  // never destroyed in a fork child, where it is not ours
  std::function<void()> publish_fn_;
  std::function<void()> give_back_fn_;  // kept across fork: a child starts its own thread at its first claim
  void start_give_back();
  std::atomic<bool> stopping_{false};
  std::atomic<std::uint64_t> waits_{0}, waited_ns_{0}, reclaim_scans_{0};
};

}  // namespace cupool
