// cudaMalloc in the parent, then fork. Real CUDA forbids using the parent's CUDA state in a forked
// child, so one child only allocates host memory and exits, and a second one re-execs this program
// with "--child" to do fresh CUDA work. The parent waits for both, checks its buffer and frees it.
// The parent's JSON line is printed last (after the children exited).
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "prog_common.hpp"

static int child_cuda() {
    long long allocs = 0, frees = 0, bytes = 0;
    void* p = nullptr;
    RT(cudaMalloc(&p, 1 << 20));
    if (p) {
        ++allocs;
        bytes += 1 << 20;
        RT(cudaMemset(p, 0x33, 1 << 20));
        unsigned char b = 0;
        RT(cudaMemcpy(&b, p, 1, cudaMemcpyDeviceToHost));
        EXPECT(b == 0x33);
        RT(cudaFree(p));
        ++frees;
    }
    return prog::finish(prog::Json().num("allocs", allocs).num("frees", frees).num("bytes", bytes).boolean("child", true));
}

static bool wait_ok(pid_t pid) {
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return false;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

int main(int argc, char** argv) {
    if (argc > 1 && std::strcmp(argv[1], "--child") == 0) return child_cuda();
    long long allocs = 0, frees = 0, bytes = 0;
    constexpr size_t kBytes = 2 << 20;
    void* p = nullptr;
    RT(cudaMalloc(&p, kBytes));
    if (!p) return prog::finish(prog::Json());
    ++allocs;
    bytes += kBytes;
    RT(cudaMemset(p, 0x7e, kBytes));
    std::fflush(stdout);

    pid_t c1 = fork();
    if (c1 == 0) {  // no CUDA here
        std::vector<char> host(1 << 20, 1);
        _exit(host[12345] == 1 ? 0 : 1);
    }
    pid_t c2 = fork();
    if (c2 == 0) {
        char self[] = "/proc/self/exe";
        char arg[] = "--child";
        char* args[] = {argv[0], arg, nullptr};
        execv(self, args);
        _exit(127);
    }
    bool ok1 = c1 > 0 && wait_ok(c1);
    bool ok2 = c2 > 0 && wait_ok(c2);
    EXPECT(ok1);
    EXPECT(ok2);
    unsigned char b = 0;
    RT(cudaMemcpy(&b, static_cast<char*>(p) + kBytes - 1, 1, cudaMemcpyDeviceToHost));
    EXPECT(b == 0x7e);
    RT(cudaFree(p));
    ++frees;
    return prog::finish(prog::Json()
                            .num("allocs", allocs)
                            .num("frees", frees)
                            .num("bytes", bytes)
                            .num("children_ok", (ok1 ? 1 : 0) + (ok2 ? 1 : 0)));
}
