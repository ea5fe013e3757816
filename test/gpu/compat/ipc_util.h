// Helpers of the two IPC programs: a child started by fork + exec of this same binary (so it
// initialises CUDA afresh), and a Unix socket pair (SOCK_SEQPACKET: one message per send) over
// which a file descriptor travels with SCM_RIGHTS.
#pragma once

#include <fcntl.h>
#include <limits.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "common.h"

namespace compat {

// Sends `len` bytes, and `fd` with them unless it is -1.
inline void send_msg(int sock, const void* data, size_t len, int fd) {
  msghdr msg{};
  iovec iov{const_cast<void*>(data), len};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int))];
  if (fd >= 0) {
    std::memset(ctrl, 0, sizeof ctrl);
    msg.msg_control = ctrl;
    msg.msg_controllen = sizeof ctrl;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  ssize_t n;
  do n = sendmsg(sock, &msg, 0);
  while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(len)) die("sendmsg: %s", n < 0 ? std::strerror(errno) : "short write");
}

// Receives one message of exactly `len` bytes; *fd gets the descriptor sent with it (or -1).
// Returns false when the peer has gone away (end of file).
inline bool recv_msg(int sock, void* data, size_t len, int* fd) {
  msghdr msg{};
  iovec iov{data, len};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int))];
  msg.msg_control = ctrl;
  msg.msg_controllen = sizeof ctrl;
  ssize_t n;
  do n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  if (n == 0) return false;
  if (n != static_cast<ssize_t>(len)) die("recvmsg: %s", n < 0 ? std::strerror(errno) : "message of the wrong size");
  if (fd) {
    *fd = -1;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) std::memcpy(fd, CMSG_DATA(c), sizeof(int));
  }
  return true;
}

struct Child {
  pid_t pid = -1;
  int sock = -1;  // the parent's end
};

// fork + exec of /proc/self/exe with arguments `mode` and the child's socket number.
inline Child spawn_self(const char* mode) {
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) die("readlink /proc/self/exe: %s", std::strerror(errno));
  exe[n] = 0;
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) die("socketpair: %s", std::strerror(errno));
  char fdarg[16];
  std::snprintf(fdarg, sizeof fdarg, "%d", sv[1]);
  char* argv[] = {exe, const_cast<char*>(mode), fdarg, nullptr};
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) die("fork: %s", std::strerror(errno));
  if (pid == 0) {  // only async-signal-safe calls until exec
    fcntl(sv[1], F_SETFD, 0);
    execv(exe, argv);
    _exit(127);
  }
  close(sv[1]);
  return Child{pid, sv[0]};
}

// The child's exit status, or 128 + the signal that ended it.
inline int wait_child(const Child& c) {
  int st = 0;
  while (waitpid(c.pid, &st, 0) < 0)
    if (errno != EINTR) die("waitpid: %s", std::strerror(errno));
  close(c.sock);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// A short, fixed-size text field of a message.
template <size_t N>
inline void put(char (&dst)[N], const char* s) {
  std::snprintf(dst, N, "%s", s ? s : "");
}

}  // namespace compat
