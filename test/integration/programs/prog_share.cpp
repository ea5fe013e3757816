// A member of a shared budget (CUPOOL_SHARE) on the simulated CUDA, driven by
// test/integration/check_share_budget.py through its standard input, one command a line:
//   alloc MIB   cudaMalloc that many MiB; prints "alloc <rc>"
//   free        cudaFree everything allocated; prints "free 0"
//   info        prints "info <free bytes> <total bytes>" (cudaMemGetInfo)
//   graph MIB   captures a graph with a memory node of that many MiB, instantiates and launches
//               it (the driver reserves graph memory until a trim); prints "graph <rc>"
//   trim        destroys the graph and trims the device's graph memory; prints "trim <rc>"
//   detach      the commands are served by a new thread from now on, and the main thread calls
//               pthread_exit (the process lives on); prints "detach 0" from the new thread
//   exec        execs the program again (the same pid, a new image without memory); prints
//               "ready" again
//   device N    cudaSetDevice(N); prints "device <rc>"
//   quit        exits 0
#include <cuda_runtime_api.h>

#include <pthread.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
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

std::vector<void*> held;

void serve();

void* serve_thread(void*) {
    std::printf("detach 0\n");
    std::fflush(stdout);
    serve();
    std::exit(0);
}

void serve() {
    char line[256];
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
        } else if (cmd.rfind("detach", 0) == 0) {
            pthread_t t;
            pthread_create(&t, nullptr, serve_thread, nullptr);
            pthread_exit(nullptr);
        } else if (cmd.rfind("exec", 0) == 0) {
            std::fflush(stdout);
            char self[] = "/proc/self/exe";
            char* argv[] = {self, nullptr};
            execv(self, argv);
            std::printf("exec %d\n", errno);
        } else if (cmd.rfind("device ", 0) == 0) {
            std::printf("device %d\n", static_cast<int>(cudaSetDevice(std::atoi(cmd.c_str() + 7))));
        } else if (cmd.rfind("quit", 0) == 0) {
            break;
        }
        std::fflush(stdout);
    }
}

int main() {
    cudaFree(nullptr);
    std::printf("ready\n");
    std::fflush(stdout);
    serve();
    return 0;
}
