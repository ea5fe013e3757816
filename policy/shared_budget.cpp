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

namespace cupool {
namespace {

std::uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

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

bool valid_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) return false;
  return true;
}

// Open-file-description locks on one byte (docs: fcntl(2), "Open file description locks"): held
// by the descriptor's open file, released when its last descriptor closes, whichever process or
// PID namespace looks. Never blocking.
bool ofd_lock(int fd, long long at, short type) {
  struct flock fl{};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = at;
  fl.l_len = 1;
  return fcntl(fd, F_OFD_SETLK, &fl) == 0;
}
// Does another open file description hold a lock on the byte? (Unknown counts as yes: a member is
// never taken for gone on a failed query.)
bool ofd_locked_by_other(int fd, long long at) {
  struct flock fl{};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = at;
  fl.l_len = 1;
  if (fcntl(fd, F_OFD_GETLK, &fl) != 0) return true;
  return fl.l_type != F_UNLCK;
}
constexpr long long kMembership = SharedBudget::kLockBase;
long long slot_byte(int i) { return SharedBudget::kLockBase + 1 + i; }

// Why this thread's last admission was refused (refusal()).
enum class Refusal : std::uint8_t { none, no_room, no_slot, device };
thread_local Refusal t_refusal = Refusal::none;

std::string file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device file";
  return "not a regular file";
}

}  // namespace

void SharedBudget::test_kill_point(const char* step) {
  static const char* const wanted = std::getenv("CUPOOLTEST_SHARE_KILL");
  if (wanted != nullptr && std::strcmp(wanted, step) == 0) raise(SIGKILL);
}

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

namespace {
constexpr char kPrivatePrefix[] = "cupool-new-";  // a budget's segment while its maker sets it up

// Removes the private files of makers that died before linking theirs (the named way only; an
// unnamed file goes with its maker). A maker holds the membership byte of its private file from
// the moment it exists, so a file whose byte this process can lock exclusively has no maker left.
// Only this user's regular files are touched; a maker that loses its byte to this sweep before it
// could lock it starts again under another name.
void sweep_abandoned_private_files() {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return;
  while (const dirent* e = readdir(dir)) {
    if (std::strncmp(e->d_name, kPrivatePrefix, sizeof kPrivatePrefix - 1) != 0) continue;
    const int fd = openat(dirfd(dir), e->d_name, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) continue;
    struct stat held{}, named{};
    if (fstat(fd, &held) == 0 && S_ISREG(held.st_mode) && held.st_uid == getuid() &&
        ofd_lock(fd, kMembership, F_WRLCK) && fstatat(dirfd(dir), e->d_name, &named, AT_SYMLINK_NOFOLLOW) == 0 &&
        named.st_ino == held.st_ino && named.st_dev == held.st_dev)
      unlinkat(dirfd(dir), e->d_name, 0);
    close(fd);
  }
  closedir(dir);
}

// A file at a private random name in /dev/shm (random: processes of other PID namespaces share
// it), with its membership byte held; -1 and errno on failure.
int open_private_file(unsigned mode, std::string* made) {
  for (int i = 0; i < 16; ++i) {
    std::uint64_t r = 0;
    if (getrandom(&r, sizeof r, 0) != static_cast<ssize_t>(sizeof r))
      r = now_ns() ^ (std::uint64_t{static_cast<unsigned>(getpid())} << 32) ^ static_cast<std::uint64_t>(i);
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(r));
    *made = "/" + std::string(kPrivatePrefix) + hex;
    const int fd = shm_open(made->c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
    if (fd < 0) {
      if (errno == EEXIST) continue;
      return -1;
    }
    if (ofd_lock(fd, kMembership, F_RDLCK)) return fd;
    close(fd);  // a sweep took it for abandoned between our open and our lock: it removes it
  }
  errno = EEXIST;
  return -1;
}
}  // namespace

SharedBudget::MakeResult SharedBudget::make_linked(const std::string& seg_name, unsigned mode,
                                                   const std::function<void(Segment&)>& set_up, void** mapping,
                                                   int* fd_out, std::string* why) {
  const std::string path = "/dev/shm" + seg_name;
  // An unnamed file (O_TMPFILE) where /dev/shm offers one: a maker that dies before linking it
  // leaves nothing behind. Else a private name, swept once its maker is gone.
  std::string made;
  int fd = open("/dev/shm", O_TMPFILE | O_RDWR | O_CLOEXEC, mode);
  if (fd >= 0) {
    if (!ofd_lock(fd, kMembership, F_RDLCK)) {  // nobody else can see the file: never, but say so
      const int e = errno;
      close(fd);
      *why = "cannot lock a new budget's segment: " + std::string(std::strerror(e));
      return MakeResult::failed;
    }
  } else {
    sweep_abandoned_private_files();
    fd = open_private_file(mode, &made);
    if (fd < 0) {
      *why = "cannot make a budget in /dev/shm: " + std::string(std::strerror(errno));
      return MakeResult::failed;
    }
  }
  auto drop = [&] {
    close(fd);
    if (!made.empty()) shm_unlink(made.c_str());
  };
  auto give_up = [&](const std::string& what, int e) {
    drop();
    *why = what + ": " + std::strerror(e);
    return MakeResult::failed;
  };
  // fchmod, not the umask: the umask is the whole process's, and another thread may be creating
  // a file of its own with it meanwhile.
  if (fchmod(fd, mode) != 0) return give_up("cannot set the mode of a new budget's segment", errno);
  if (ftruncate(fd, sizeof(Segment)) != 0) return give_up("cannot size " + path, errno);
  void* p = mmap(nullptr, sizeof(Segment), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return give_up("cannot map the shared segment", errno);
  set_up(*static_cast<Segment*>(p));
  const int linked = made.empty() ? linkat(AT_FDCWD, ("/proc/self/fd/" + std::to_string(fd)).c_str(), AT_FDCWD,
                                           path.c_str(), AT_SYMLINK_FOLLOW)
                                  : link(("/dev/shm" + made).c_str(), path.c_str());
  if (linked != 0) {
    const int e = errno;
    munmap(p, sizeof(Segment));
    drop();
    // EEXIST: another maker linked its own first; join that one. Anything else: this /dev/shm
    // (or a sandbox's filter) allows no link, or no /proc is mounted; make it in place.
    return e == EEXIST ? MakeResult::lost : MakeResult::no_link;
  }
  if (!made.empty()) shm_unlink(made.c_str());
  *mapping = p;
  *fd_out = fd;
  return MakeResult::made;
}

std::unique_ptr<SharedBudget> SharedBudget::join(const std::string& name, const LimitSpec& limit, bool group,
                                                 std::string* error) {
  auto fail = [&](const std::string& why) -> std::unique_ptr<SharedBudget> {
    *error = "cupool: CUPOOL_SHARE=" + name + ": " + why;
    return nullptr;
  };
  if (!valid_name(name)) return fail("a budget name is 1 to 64 letters, digits, '-', '_' or '.'");
  for (const auto& [device, spec] : limit.per_device)
    if (device >= kMaxDevices)
      return fail("CUPOOL_SHARE_LIMIT names device " + std::to_string(device) + "; a shared budget counts devices 0 to " +
                  std::to_string(kMaxDevices - 1));
  const std::string seg_name = segment_name(name, group);
  const std::string path = "/dev/shm" + seg_name;
  const mode_t mode = group ? 0660 : 0600;
  const std::string what_to_do =
      "; cupool uses no file it did not make for you, and in the sticky /dev/shm only its owner or root can remove "
      "it: choose another CUPOOL_SHARE name (every member of the budget gives the same one), or have it removed";
  const std::string text = format_limit_spec(limit);
  auto set_up = [&](Segment& s) {
    std::memset(static_cast<void*>(&s), 0, sizeof(Segment));
    s.magic = kMagic;
    s.layout = kLayoutVersion;
    s.max_members = kMaxMembers;
    s.max_devices = kMaxDevices;
    std::snprintf(s.limit, sizeof s.limit, "%s", text.c_str());
    timespec ts{};
    clock_gettime(CLOCK_REALTIME, &ts);
    s.created_unix_ns =
        static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
    s.ready.store(1, std::memory_order_release);
  };
  auto member = [&](int fd, void* p) {
    std::unique_ptr<SharedBudget> b(new SharedBudget);
    b->name_ = name;
    b->path_ = path;
    b->limit_ = limit;
    b->seg_ = static_cast<Segment*>(p);
    b->fd_ = fd;
    b->group_ = group;
    b->my_pid_ = getpid();
    return b;
  };
  bool in_place = false;  // this /dev/shm allows no link: new segments are made at their name
  // A member that leaves last may remove the segment between our open and our lock: then the
  // file we hold is unlinked (no link left), and we start again with a fresh one.
  constexpr int kAttempts = 100;
  // A member making the segment in place, or leaving last, holds the membership byte alone for a
  // moment: those moments are waited out (they are not attempts), up to kJoinWaitNs in all. On a
  // loaded machine a maker can be off the CPU for a good part of a second.
  constexpr std::uint64_t kJoinWaitNs = 10'000'000'000ull;
  const std::uint64_t wait_until = now_ns() + kJoinWaitNs;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    auto a_moment = [&] {
      if (now_ns() >= wait_until) return false;
      usleep(1000);
      --attempt;
      return true;
    };
    // O_NONBLOCK: a FIFO planted at the name must not hang the open.
    int fd = shm_open(seg_name.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0);
    const bool missing = fd < 0 && errno == ENOENT;
    if (missing && !in_place) {
      // No budget of that name: make one, apart, and link it at the name when it is ready. (Made
      // at its name, a member starting at the same moment opened it before it was sized and set
      // up, and refused it as "not a budget".)
      void* p = nullptr;
      std::string why;
      switch (make_linked(seg_name, mode, set_up, &p, &fd, &why)) {
        case MakeResult::made: return member(fd, p);
        case MakeResult::lost: continue;  // another member linked its own first: join that one
        case MakeResult::failed: return fail(why);
        case MakeResult::no_link: in_place = true; break;
      }
    }
    if (missing) {  // and in place
      // Made at its name, with the membership byte held exclusive until it is set up: a member
      // that opens it meanwhile cannot take the byte and tries again. One that took the byte
      // shared before us is alone in it then, and sets it up itself: we join it.
      fd = shm_open(seg_name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
      if (fd < 0 && errno == EEXIST) continue;
      if (fd < 0) return fail("cannot make " + path + ": " + std::strerror(errno));
      if (!ofd_lock(fd, kMembership, F_WRLCK)) {
        close(fd);
        continue;
      }
      void* p = MAP_FAILED;
      if (fchmod(fd, mode) != 0 || ftruncate(fd, sizeof(Segment)) != 0 ||
          (p = mmap(nullptr, sizeof(Segment), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
        const int e = errno;
        shm_unlink(seg_name.c_str());
        close(fd);
        return fail("cannot set up " + path + ": " + std::strerror(e));
      }
      set_up(*static_cast<Segment*>(p));
      if (!ofd_lock(fd, kMembership, F_RDLCK)) {  // our own byte, from exclusive to shared
        const int e = errno;
        munmap(p, sizeof(Segment));
        shm_unlink(seg_name.c_str());
        close(fd);
        return fail("cannot share the membership byte of " + path + ": " + std::strerror(e));
      }
      return member(fd, p);
    }
    if (fd < 0) {
      if (errno == ENOENT) continue;  // removed between the two opens
      const int e = errno;
      struct stat ls{};
      if (lstat(path.c_str(), &ls) == 0 && (ls.st_uid != getuid() || !S_ISREG(ls.st_mode)))
        return fail(path + " is " + (S_ISREG(ls.st_mode) ? "a file" : file_kind(ls.st_mode)) + " of uid " +
                    std::to_string(ls.st_uid) + ", not a budget of yours" + what_to_do);
      return fail("cannot open " + path + ": " + std::strerror(e));
    }
    struct stat st{};
    if (fstat(fd, &st) != 0) {
      const int e = errno;
      close(fd);
      return fail("cannot inspect " + path + ": " + std::strerror(e));
    }
    // Trusted only if it is a regular file this user (or, group access, a member of the group,
    // with the group's mode) made: anyone may plant a file at the name first.
    const bool ours = S_ISREG(st.st_mode) &&
                      (group ? st.st_gid == getgid() && (st.st_mode & 07777) == 0660 : st.st_uid == getuid() &&
                                                                                            (st.st_mode & 0077) == 0);
    if (!ours) {
      close(fd);
      if (!S_ISREG(st.st_mode)) return fail(path + " is " + file_kind(st.st_mode) + ", not a budget" + what_to_do);
      return fail(path + " belongs to uid " + std::to_string(st.st_uid) + " gid " + std::to_string(st.st_gid) +
                  " with mode " + [&] {
                    char m[8];
                    std::snprintf(m, sizeof m, "%04o", static_cast<unsigned>(st.st_mode & 07777));
                    return std::string(m);
                  }() + ", not to " + (group ? "your group with mode 0660" : "you with mode 0600") + what_to_do);
    }
    if (!ofd_lock(fd, kMembership, F_RDLCK)) {  // its maker sets it up, or a last member removes it
      close(fd);
      if (a_moment()) continue;
      return fail(path + " was held by one process alone for " + std::to_string(kJoinWaitNs / 1'000'000'000ull) +
                  " s while joining (a member setting it up or removing it takes a moment); try again");
    }
    if (fstat(fd, &st) != 0 || st.st_nlink == 0) {  // removed before our lock: start again
      close(fd);
      continue;
    }
    // Alone in it (every member holds the membership byte shared): a leftover whose members are
    // all gone (its maker may have died before it was set up). Set it up afresh, with our limit.
    const bool alone = ofd_lock(fd, kMembership, F_WRLCK);
    if (alone && static_cast<std::size_t>(st.st_size) != sizeof(Segment) && ftruncate(fd, sizeof(Segment)) != 0) {
      const int e = errno;
      close(fd);
      return fail("cannot size " + path + ": " + std::strerror(e));
    }
    if (!alone && static_cast<std::size_t>(st.st_size) != sizeof(Segment)) {
      // Other members hold it and it is not a segment yet: made in place and being set up by one
      // of them (a moment), or not a budget at all (refused, once the moment is up).
      close(fd);
      if (a_moment()) continue;
      return fail(path + " is not a budget of this cupool version (" + std::to_string(st.st_size) + " bytes)");
    }
    void* p = mmap(nullptr, sizeof(Segment), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      close(fd);
      return fail(std::string("cannot map the shared segment: ") + std::strerror(e));
    }
    std::unique_ptr<SharedBudget> b = member(fd, p);
    Segment& s = *b->seg_;
    // Alone, but a process still holds a slot: a member that has left (leave() gives the
    // membership byte up first) and is exiting; its threads may still count in its slot. The
    // budget is kept as it is and joined, never set up afresh under it.
    bool slot_held = false;
    if (alone && s.ready.load(std::memory_order_acquire) != 0 && s.magic == kMagic && s.layout == kLayoutVersion)
      for (int i = 0; i < kMaxMembers && !slot_held; ++i) slot_held = ofd_locked_by_other(fd, slot_byte(i));
    if (alone && !slot_held) {
      set_up(s);
      if (!ofd_lock(fd, kMembership, F_RDLCK))  // our own byte, back to shared: others may join now
        return fail("cannot share the membership byte of " + path + ": " + std::strerror(errno));
      return b;
    }
    if (alone && !ofd_lock(fd, kMembership, F_RDLCK))  // our own byte, back to shared
      return fail("cannot share the membership byte of " + path + ": " + std::strerror(errno));
    // Another member set it up before it let us take the membership byte.
    if (s.ready.load(std::memory_order_acquire) == 0 || s.magic != kMagic || s.layout != kLayoutVersion ||
        s.max_members != kMaxMembers || s.max_devices != kMaxDevices)
      return fail(path + " is not a budget of this cupool version");
    const std::string theirs(s.limit, strnlen(s.limit, sizeof s.limit));
    if (text != theirs)
      return fail("CUPOOL_SHARE_LIMIT=" + (text.empty() ? std::string("(unset)") : text) +
                  " differs from the budget's own, " + (theirs.empty() ? std::string("(unset)") : theirs) +
                  ", given by its members running now; every member of a budget gives the same limit");
    return b;
  }
  return fail(path + " was removed and made again " + std::to_string(kAttempts) + " times while joining; try again");
}

std::unique_ptr<SharedBudget> SharedBudget::observe(const std::string& segment_path, std::string* error) {
  // O_NONBLOCK: a FIFO planted in /dev/shm must not hang top or the metrics server.
  const int fd = open(segment_path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    *error = segment_path + ": " + std::strerror(errno);
    return nullptr;
  }
  struct stat st{};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<std::size_t>(st.st_size) != sizeof(Segment)) {
    const bool regular = S_ISREG(st.st_mode);
    close(fd);
    *error = segment_path + ": not a cupool budget (" + (regular ? "wrong size" : file_kind(st.st_mode)) + ")";
    return nullptr;
  }
  // A copy, not a mapping: the file's owner may truncate it while it is read (a mapping would
  // then fault with SIGBUS in the reader).
  auto copy = std::make_unique<Segment>();
  char* dst = reinterpret_cast<char*>(copy.get());
  std::size_t got = 0;
  while (got < sizeof(Segment)) {
    const ssize_t n = pread(fd, dst + got, sizeof(Segment) - got, static_cast<off_t>(got));
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  if (got != sizeof(Segment)) {
    close(fd);
    *error = segment_path + ": not a cupool budget (shorter than a segment)";
    return nullptr;
  }
  std::unique_ptr<SharedBudget> b(new SharedBudget);
  b->copy_ = std::move(copy);
  b->seg_ = b->copy_.get();
  b->fd_ = fd;  // for the liveness of its members' locks
  b->read_only_ = true;
  b->owner_uid_ = st.st_uid;
  b->owner_gid_ = st.st_gid;
  b->path_ = segment_path;
  if (b->seg_->magic != kMagic || b->seg_->layout != kLayoutVersion) {
    *error = segment_path + ": not a budget of this cupool version";
    return nullptr;
  }
  b->seg_->limit[sizeof b->seg_->limit - 1] = '\0';  // bounded, whatever the file held
  for (Slot& slot : b->seg_->slots) slot.command[sizeof slot.command - 1] = '\0';
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
  // The slot's lock goes with the descriptor: the next member that needs room finds the slot
  // free and empties it. (A private budget's mapping goes with its last member; a copy is ours.)
  if (seg_ && !private_segment_ && !copy_) munmap(seg_, sizeof(Segment));
  if (fd_ >= 0) close(fd_);
}

void SharedBudget::leave() {
  if (read_only_ || fd_ < 0 || private_segment_) return;
  // The last member out removes the segment's name: alone once the membership byte turns
  // exclusive, and only the file it holds (a new one at the name is another budget's). Threads
  // of this process may still allocate: the slot stays, in the file they map, until the process
  // ends and the kernel lets go of its locks. A joiner that opened the old file finds it gone
  // (no link left, or the byte held) and makes a new one.
  // Our own membership goes first: two members leaving at the same moment each found the other's
  // byte held and neither removed the segment (the stress loop left one behind in about one run
  // of examples/share/two_jobs.sh in ten). A joiner that finds only leaving members' slots held
  // joins the budget as it is (join()).
  ofd_lock(fd_, kMembership, F_UNLCK);
  if (!ofd_lock(fd_, kMembership, F_WRLCK)) return;
  struct stat held{}, named{};
  if (fstat(fd_, &held) == 0 && stat(path_.c_str(), &named) == 0 && held.st_ino == named.st_ino &&
      held.st_dev == named.st_dev)
    shm_unlink(path_.c_str() + std::strlen("/dev/shm"));
}

std::string SharedBudget::limit_text() const { return seg_ ? std::string(seg_->limit) : std::string(); }

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
  const std::uint64_t started = now_ns(), deadline = saturating_add(started, wait_ns);
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
    const std::uint64_t t = now_ns();
    if (t >= deadline) break;
    if (seen != last_release) last_release = seen, quiet_since = t;
    // Every member that holds memory here waits too, and nothing was released for a while: no
    // one can give anything back, and all would wait out their time. One gives up now, the one
    // that holds the least (its program's out-of-memory frees what it held for the others).
    if (t - quiet_since >= kDeadlockQuiet_ns && gives_up_in_deadlock(device)) break;
    // At most 50 ms asleep: a member that died holding room is reclaimed without anyone's release.
    const bool timed_out = futex_wait(&seg_->released_seq, seen, std::min<std::uint64_t>(deadline - t, kScanEvery_ns));
    if (timed_out || now_ns() - last_scan >= kScanEvery_ns) {
      reclaim_dead();
      last_scan = now_ns();
    }
  }
  mine->waiting[device].fetch_sub(bytes);
  waits_.fetch_add(1, std::memory_order_relaxed);
  waited_ns_.fetch_add(now_ns() - started, std::memory_order_relaxed);
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
