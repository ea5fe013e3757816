// Device memory that no cudaMalloc takes: arrays (runtime and driver) and graph memory. Both
// must be counted against the cap and traced. Without PROG_EXPECT_CAP every allocation must
// succeed (as it does without cupool on the simulated 16 GiB device); with
// PROG_EXPECT_CAP=<bytes> (and CUPOOL_LIMIT set to the same), arrays past the cap must be refused
// with cudaErrorMemoryAllocation, last error included, and a graph whose memory node cannot fit
// must fail to launch with cudaErrorMemoryAllocation.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <vector>

#include "prog_common.hpp"

namespace {
void CUDART_CB nothing_fn(void*) {}
}  // namespace

int main() {
    const char* cap_env = std::getenv("PROG_EXPECT_CAP");
    const unsigned long long cap = cap_env ? std::strtoull(cap_env, nullptr, 10) : 0;
    long long made = 0, refused = 0;
    // Twelve 8192 x 8192 float arrays, 256 MiB each.
    const cudaChannelFormatDesc desc{32, 0, 0, 0, cudaChannelFormatKindFloat};
    const unsigned long long each = 8192ull * 8192ull * 4;
    std::vector<cudaArray_t> arrays;
    for (int i = 0; i < 12; ++i) {
        cudaArray_t a = nullptr;
        const cudaError_t rc = cudaMalloc3DArray(&a, &desc, cudaExtent{8192, 8192, 0}, 0);
        if (rc == cudaSuccess) {
            arrays.push_back(a);
            ++made;
        } else {
            ++refused;
            EXPECT(rc == cudaErrorMemoryAllocation);
            EXPECT(cudaGetLastError() == cudaErrorMemoryAllocation);
        }
    }
    if (cap) EXPECT(static_cast<unsigned long long>(made) == cap / each);
    else EXPECT(made == 12);
    // A driver-API array too.
    CUDA_ARRAY_DESCRIPTOR d{};
    d.Width = 1024;
    d.Height = 1024;
    d.Format = CU_AD_FORMAT_FLOAT;
    d.NumChannels = 4;
    CUarray da = nullptr;
    const CUresult drc = cuArrayCreate(&da, &d);
    if (cap) EXPECT(drc == CUDA_ERROR_OUT_OF_MEMORY || made * each + 16ull * 1024 * 1024 <= cap);
    else EXPECT(drc == CUDA_SUCCESS);
    const long long driver_made = drc == CUDA_SUCCESS;
    if (drc == CUDA_SUCCESS) DRV(cuArrayDestroy(da));
    for (cudaArray_t a : arrays) RT(cudaFreeArray(a));

    // Graph memory: a 512 MiB memory node.
    cudaStream_t s = nullptr;
    RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    RT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    void* p = nullptr;
    RT(cudaMallocAsync(&p, 512ull << 20, s));
    RT(cudaLaunchHostFunc(s, nothing_fn, nullptr));
    RT(cudaFreeAsync(p, s));
    cudaGraph_t graph = nullptr;
    RT(cudaStreamEndCapture(s, &graph));
    cudaGraphExec_t exec = nullptr;
    cudaError_t irc = cudaGraphInstantiate(&exec, graph, 0);
    cudaError_t lrc = irc;
    if (irc == cudaSuccess) {
        lrc = cudaGraphLaunch(exec, s);
        if (lrc == cudaSuccess) RT(cudaStreamSynchronize(s));
    }
    const bool graph_ran = irc == cudaSuccess && lrc == cudaSuccess;
    if (cap && cap < (512ull << 20)) {
        EXPECT(!graph_ran);
        EXPECT((irc != cudaSuccess ? irc : lrc) == cudaErrorMemoryAllocation);
    } else {
        EXPECT(graph_ran);
    }
    cudaGetLastError();
    if (exec) RT(cudaGraphExecDestroy(exec));
    RT(cudaGraphDestroy(graph));
    RT(cudaDeviceGraphMemTrim(0));
    RT(cudaStreamDestroy(s));
    // One ordinary allocation, so that the run's trace checks have something of the program's.
    void* q = nullptr;
    RT(cudaMalloc(&q, 1 << 20));
    RT(cudaFree(q));
    // Arrays are allocations too, in the program's counts as in the trace.
    return prog::finish(prog::Json()
                            .num("allocs", 1 + made + driver_made)
                            .num("frees", 1 + made + driver_made)
                            .num("bytes", (1 << 20) + made * static_cast<long long>(each) + driver_made * (16 << 20))
                            .num("arrays_made", made)
                            .num("arrays_refused", refused)
                            .boolean("graph_ran", graph_ran));
}
