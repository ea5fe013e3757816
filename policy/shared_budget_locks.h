// The open-file-description locks of a shared budget's segment (shared_budget.h): one byte for
// membership, one per slot. Shared by the segment's life (shared_budget_segment.cpp) and the
// admission protocol (shared_budget.cpp); nothing else includes it.
#pragma once

#include <fcntl.h>

#include "shared_budget.h"

namespace cupool::budget_locks {

// Open-file-description locks on one byte (docs: fcntl(2), "Open file description locks"): held
// by the descriptor's open file, released when its last descriptor closes, whichever process or
// PID namespace looks. Never blocking.
inline bool ofd_lock(int fd, long long at, short type) {
  struct flock fl{};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = at;
  fl.l_len = 1;
  return fcntl(fd, F_OFD_SETLK, &fl) == 0;
}
// Does another open file description hold a lock on the byte? (Unknown counts as yes: a member is
// never taken for gone on a failed query.)
inline bool ofd_locked_by_other(int fd, long long at) {
  struct flock fl{};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = at;
  fl.l_len = 1;
  if (fcntl(fd, F_OFD_GETLK, &fl) != 0) return true;
  return fl.l_type != F_UNLCK;
}
inline constexpr long long kMembership = SharedBudget::kLockBase;
inline long long slot_byte(int i) { return SharedBudget::kLockBase + 1 + i; }


}  // namespace cupool::budget_locks
