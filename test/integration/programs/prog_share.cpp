// A member of a shared budget (CUPOOL_SHARE) on the simulated CUDA, driven by
// test/integration/check_share_budget.py through its standard input, one command a line:
//   alloc MIB   cudaMalloc that many MiB; prints "alloc <rc>"
//   free        cudaFree everything allocated; prints "free 0"
//   info        prints "info <free bytes> <total bytes>" (cudaMemGetInfo)
//   graph MIB   captures a graph with a memory node of that many MiB, instantiates and launches
//               it (the driver reserves graph memory until a trim); prints "graph <rc>"
//   trim        destroys the graph and trims the device's graph memory; prints "trim <rc>"
//   quit        exits 0
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {
void nothing(void*) {}

cudaGraphExec_t g_exec = nullptr;

cudaError_t launch_graph(size_t bytes) {
    cudaStream_t s = nullptr;
    cudaError_t rc = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (rc != cudaSuccess) return rc;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    void* p = nullptr;
    cudaMallocAsync(&p, bytes, s);
    cudaLaunchHostFunc(s, nothing, nullptr);
    cudaFreeAsync(p, s);
    cudaGraph_t graph = nullptr;
    rc = cudaStreamEndCapture(s, &graph);
    if (rc == cudaSuccess) rc = cudaGraphInstantiate(&g_exec, graph, 0);
    if (rc == cudaSuccess) rc = cudaGraphLaunch(g_exec, s);
    if (rc == cudaSuccess) rc = cudaStreamSynchronize(s);
    if (graph) cudaGraphDestroy(graph);
    cudaStreamDestroy(s);
    return rc;
}
}  // namespace

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
        } else if (cmd.rfind("graph ", 0) == 0) {
            const cudaError_t rc = launch_graph(std::strtoull(cmd.c_str() + 6, nullptr, 10) << 20);
            if (rc != cudaSuccess) (void)cudaGetLastError();
            std::printf("graph %d\n", static_cast<int>(rc));
        } else if (cmd.rfind("trim", 0) == 0) {
            if (g_exec) cudaGraphExecDestroy(g_exec);
            g_exec = nullptr;
            std::printf("trim %d\n", static_cast<int>(cudaDeviceGraphMemTrim(0)));
        } else if (cmd.rfind("quit", 0) == 0) {
            break;
        }
        std::fflush(stdout);
    }
    return 0;
}
