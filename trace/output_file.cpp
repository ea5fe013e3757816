// Creating the files cupool writes (output_file.h) without following a planted link or trusting
// another user's file.
#include "output_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace cupool {

int open_output_file(const std::string& path, bool exclusive, std::string* why) {
  // Not O_TRUNC: a file that turns out to be someone else's is left as it was.
  const int flags = O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | (exclusive ? O_EXCL : 0);
  int fd;
  do {
    fd = ::open(path.c_str(), flags, 0600);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int err = errno;
    struct stat st {};
    // O_NOFOLLOW fails with ELOOP on a link; say so rather than "Too many levels of symbolic links".
    if (err == ELOOP && ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode))
      *why = kRefusedLink;
    else if (err == EISDIR)
      *why = "it is a directory";
    else
      *why = std::strerror(err);
    errno = err;  // callers tell EEXIST (exclusive) from the rest
    return -1;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    *why = std::strerror(errno);
    ::close(fd);
    return -1;
  }
  if (S_ISREG(st.st_mode)) {
    if (st.st_uid != ::geteuid()) {
      *why = fmt::format("it belongs to another user (uid {})", st.st_uid);
      ::close(fd);
      return -1;
    }
    // fchmod, not the umask: the mode is 0600 however the file came to exist.
    if ((st.st_mode & 07777) != 0600 && ::fchmod(fd, 0600) != 0) {
      *why = fmt::format("cannot make it private (mode 0600): {}", std::strerror(errno));
      ::close(fd);
      return -1;
    }
    if (st.st_size != 0 && ::ftruncate(fd, 0) != 0) {
      *why = std::strerror(errno);
      ::close(fd);
      return -1;
    }
  }
  return fd;
}

bool output_file_possible(const std::string& path, std::string* why) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode)) *why = kRefusedLink;
    else if (S_ISDIR(st.st_mode)) *why = "it is a directory";
    else if (S_ISREG(st.st_mode) && st.st_uid != ::geteuid())
      *why = fmt::format("it belongs to another user (uid {})", st.st_uid);
    else if (::access(path.c_str(), W_OK) != 0) *why = std::strerror(errno);
    else return true;
    return false;
  }
  if (errno != ENOENT) {
    *why = std::strerror(errno);
    return false;
  }
  const std::size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  if (::stat(dir.c_str(), &st) != 0) {
    *why = std::strerror(errno);
    return false;
  }
  if (!S_ISDIR(st.st_mode)) {
    *why = std::strerror(ENOTDIR);
    return false;
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    *why = std::strerror(errno);
    return false;
  }
  return true;
}

}  // namespace cupool
