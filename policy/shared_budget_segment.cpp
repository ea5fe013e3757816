// SharedBudget's segment (shared_budget.h): its name, making it apart and linking it in place,
// joining, observing, private budgets, and leaving. The admission protocol is shared_budget.cpp.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "clock.h"
#include "options.h"
#include "shared_budget.h"
#include "shared_budget_locks.h"
#include "units.h"

namespace cupool {
using namespace budget_locks;

namespace {

bool valid_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) return false;
  return true;
}

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
      r = monotonic_ns() ^ (std::uint64_t{static_cast<unsigned>(getpid())} << 32) ^ static_cast<std::uint64_t>(i);
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
  const std::uint64_t wait_until = monotonic_ns() + kJoinWaitNs;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    auto a_moment = [&] {
      if (monotonic_ns() >= wait_until) return false;
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

}  // namespace cupool
