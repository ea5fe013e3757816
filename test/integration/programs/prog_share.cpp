// A member of a shared budget (CUPOOL_SHARE) on the simulated CUDA, driven by
// test/integration/check_share_budget.py through its standard input, one command a line:
//   alloc MIB   cudaMalloc that many MiB; prints "alloc <rc>"
//   free        cudaFree everything allocated; prints "free 0"
//   info        prints "info <free bytes> <total bytes>" (cudaMemGetInfo)
//   quit        exits 0
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

int main() {
    std::vector<void*> held;
    char line[256];
    cudaFree(nullptr);
    std::printf("ready\n");
    std::fflush(stdout);
    while (std::fgets(line, sizeof line, stdin)) {
        std::string cmd(line);
        if (cmd.rfind("alloc ", 0) == 0) {
            const size_t mib = std::strtoull(cmd.c_str() + 6, nullptr, 10);
            void* p = nullptr;
            const cudaError_t rc = cudaMalloc(&p, mib << 20);
            if (rc == cudaSuccess) held.push_back(p);
            else (void)cudaGetLastError();
            std::printf("alloc %d\n", static_cast<int>(rc));
        } else if (cmd.rfind("free", 0) == 0) {
            for (void* p : held) cudaFree(p);
            held.clear();
            std::printf("free 0\n");
        } else if (cmd.rfind("info", 0) == 0) {
            size_t f = 0, t = 0;
            const cudaError_t rc = cudaMemGetInfo(&f, &t);
            std::printf("info %zu %zu %d\n", f, t, static_cast<int>(rc));
        } else if (cmd.rfind("quit", 0) == 0) {
            break;
        }
        std::fflush(stdout);
    }
    return 0;
}
