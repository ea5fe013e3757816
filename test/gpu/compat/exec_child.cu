// A CUDA program that starts other CUDA programs, as job launchers, torchrun and test drivers do:
// it allocates, then forks and execs itself as a child (which initialises CUDA on its own,
// allocates, checks and exits), and also starts one with posix_spawn, while its own buffer stays
// live. Under cupool the children inherit LD_PRELOAD and write traces of their own; every
// process's buffers must read back what it wrote, and every exit status must be the same.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <vector>

#include "common.h"

extern char** environ;

namespace {

bool round_trip(std::size_t bytes, unsigned char value) {
  void* p = nullptr;
  compat::check_rt(cudaMalloc(&p, bytes), "cudaMalloc", __FILE__, __LINE__);
  compat::check_rt(cudaMemset(p, value, bytes), "cudaMemset", __FILE__, __LINE__);
  std::vector<unsigned char> host(bytes);
  compat::check_rt(cudaMemcpy(host.data(), p, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy", __FILE__, __LINE__);
  compat::check_rt(cudaFree(p), "cudaFree", __FILE__, __LINE__);
  for (unsigned char c : host)
    if (c != value) return false;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) {  // a child: its own CUDA, its own buffers; the exit status says how it went
    const int value = std::atoi(argv[1]);
    return round_trip(32ull << 20, static_cast<unsigned char>(value)) ? 0 : 3;
  }
  compat::Verdict v("exec_child");
  void* mine = nullptr;
  const std::size_t bytes = 64ull << 20;
  compat::check_rt(cudaMalloc(&mine, bytes), "cudaMalloc", __FILE__, __LINE__);
  compat::check_rt(cudaMemset(mine, 0x5e, bytes), "cudaMemset", __FILE__, __LINE__);
  compat::check_rt(cudaDeviceSynchronize(), "cudaDeviceSynchronize", __FILE__, __LINE__);
  int children_ok = 0;
  for (int i = 0; i < 2; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {
      char arg[8];
      std::snprintf(arg, sizeof arg, "%d", 0x20 + i);
      execl("/proc/self/exe", argv[0], arg, static_cast<char*>(nullptr));
      _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    std::printf("exec child %d: exit %d\n", i, WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) ++children_ok;
  }
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) compat::die("readlink(/proc/self/exe)");
  self[n] = '\0';
  char arg[] = "64";
  char* child_argv[] = {self, arg, nullptr};
  pid_t pid = 0;
  if (posix_spawn(&pid, self, nullptr, nullptr, child_argv, environ) != 0) compat::die("posix_spawn");
  int status = 0;
  waitpid(pid, &status, 0);
  std::printf("spawned child: exit %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) ++children_ok;
  // The parent's buffer is intact, and it can still allocate.
  std::vector<unsigned char> host(bytes);
  compat::check_rt(cudaMemcpy(host.data(), mine, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy", __FILE__, __LINE__);
  bool ok = children_ok == 3 && round_trip(16ull << 20, 0x7a);
  for (unsigned char c : host)
    if (c != 0x5e) ok = false;
  compat::check_rt(cudaFree(mine), "cudaFree", __FILE__, __LINE__);
  v.add("children_ok", children_ok);
  return v.finish(ok);
}
