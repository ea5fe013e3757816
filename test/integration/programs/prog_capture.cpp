// Stream capture as PyTorch and CUDA-graph programs use it, which a preloaded pool must leave
// exactly as it is: each case prints nothing of its own, and the program exits 0 only if every
// call returned what the driver returns without cupool (measured on the H200:
// docs/gpu-runs/2026-12-01-capture-probe.txt).
//  - In each capture mode, on a non-blocking and a blocking stream: a "kernel" (host function)
//    captured, then, with the thread switched to relaxed mode as PyTorch does, cudaMalloc of a
//    size no free block has (the pool misses) and cudaFree of a buffer from before the capture,
//    then a second kernel that writes the new buffer; the graph must instantiate, launch three
//    times and write the buffer each time.
//  - A cudaMalloc the mode forbids (global mode, on the capturing thread): refused with
//    cudaErrorStreamCaptureUnsupported, the capture invalidated.
//  - Captures on four threads at once, allocating and freeing during them.
//  - A cudaMallocAsync/cudaFreeAsync pair captured into the graph (a memory node).
// Frees of blocks while other streams have work (a non-blocking stream made first) put the pool
// in quarantine mode, so deferred frees have fences to place.
#include <cuda_runtime_api.h>

#include <atomic>
#include <barrier>
#include <cstring>
#include <thread>
#include <vector>

#include "prog_common.hpp"

namespace {

struct Counts {
    std::atomic<long long> allocs{0}, frees{0}, bytes{0};
};
Counts counts;

void note_alloc(size_t n) {
    ++counts.allocs;
    counts.bytes += static_cast<long long>(n);
}

struct Fill {
    unsigned char* p = nullptr;
    size_t n = 0;
    unsigned char value = 0;
    std::atomic<int> runs{0};
};
void CUDART_CB fill_fn(void* u) {
    auto* f = static_cast<Fill*>(u);
    if (f->p) std::memset(f->p, f->value, f->n);
    ++f->runs;
}
void CUDART_CB nothing_fn(void*) {}

#define EXPECT_RC(call, want)                                                            \
    do {                                                                                 \
        cudaError_t e_ = (call);                                                         \
        if (e_ != (want)) prog::fail(__FILE__, __LINE__, #call " != " #want, e_);        \
    } while (0)

// One capture in `mode` on a new stream, with a relaxed cudaMalloc (that misses the pool) and a
// cudaFree during it. Returns true if the graph ran and wrote the buffer three times.
bool relaxed_allocation_case(cudaStreamCaptureMode mode, bool blocking) {
    cudaStream_t s = nullptr;
    RT(cudaStreamCreateWithFlags(&s, blocking ? cudaStreamDefault : cudaStreamNonBlocking));
    void* before = nullptr;
    RT(cudaMalloc(&before, 1 << 20));
    note_alloc(1 << 20);
    RT(cudaDeviceSynchronize());
    RT(cudaStreamBeginCapture(s, mode));
    RT(cudaLaunchHostFunc(s, nothing_fn, nullptr));
    cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
    RT(cudaThreadExchangeStreamCaptureMode(&m));
    const size_t n = 96 << 20;  // more than any free block: the pool must grow
    void* q = nullptr;
    RT(cudaMalloc(&q, n));
    if (q) note_alloc(n);
    RT(cudaFree(before));
    ++counts.frees;
    RT(cudaThreadExchangeStreamCaptureMode(&m));
    Fill fill;
    fill.p = static_cast<unsigned char*>(q);
    fill.n = n;
    fill.value = 0x3c;
    RT(cudaLaunchHostFunc(s, fill_fn, &fill));
    cudaGraph_t graph = nullptr;
    RT(cudaStreamEndCapture(s, &graph));
    bool ok = false;
    if (graph) {
        cudaGraphExec_t exec = nullptr;
        RT(cudaGraphInstantiate(&exec, graph, 0));
        if (exec) {
            for (int i = 0; i < 3; ++i) RT(cudaGraphLaunch(exec, s));
            RT(cudaStreamSynchronize(s));
            RT(cudaGraphExecDestroy(exec));
        }
        RT(cudaGraphDestroy(graph));
        ok = fill.runs == 3 && q && static_cast<unsigned char*>(q)[n - 1] == 0x3c;
    }
    if (q) {
        RT(cudaFree(q));
        ++counts.frees;
    }
    RT(cudaStreamDestroy(s));
    return ok;
}

// A cudaMalloc the capture mode forbids: the driver refuses it and invalidates the capture.
bool forbidden_allocation_case() {
    cudaStream_t s = nullptr;
    RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    RT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    RT(cudaLaunchHostFunc(s, nothing_fn, nullptr));
    void* q = nullptr;
    const cudaError_t rc = cudaMalloc(&q, 1 << 20);
    EXPECT_RC(rc, cudaErrorStreamCaptureUnsupported);
    EXPECT_RC(cudaGetLastError(), cudaErrorStreamCaptureUnsupported);
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    RT(cudaStreamIsCapturing(s, &st));
    EXPECT(st == cudaStreamCaptureStatusInvalidated);
    cudaGraph_t graph = nullptr;
    EXPECT_RC(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
    EXPECT(graph == nullptr);
    cudaGetLastError();
    if (rc == cudaSuccess && q) {  // not expected; keep the counts honest
        note_alloc(1 << 20);
        RT(cudaFree(q));
        ++counts.frees;
    }
    RT(cudaStreamDestroy(s));
    return rc == cudaErrorStreamCaptureUnsupported;
}

// Four threads capture at once (each its own stream), allocating and freeing during the captures.
// A thread in global mode may not synchronize while another's global capture is in progress (the
// driver would refuse it and invalidate that capture), so all end their captures before any runs
// its graph.
bool threads_case(cudaStreamCaptureMode mode) {
    std::atomic<int> good{0};
    std::barrier ended(4);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([&, t] {
            cudaStream_t s = nullptr;
            RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
            RT(cudaStreamBeginCapture(s, mode));
            cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
            RT(cudaThreadExchangeStreamCaptureMode(&m));
            std::vector<void*> blocks;
            for (int i = 0; i < 8; ++i) {
                void* p = nullptr;
                const size_t n = size_t(1 + t + i) << 20;
                RT(cudaMalloc(&p, n));
                if (p) {
                    note_alloc(n);
                    blocks.push_back(p);
                }
                if (i % 3 == 2 && !blocks.empty()) {
                    RT(cudaFree(blocks.back()));
                    ++counts.frees;
                    blocks.pop_back();
                }
            }
            RT(cudaThreadExchangeStreamCaptureMode(&m));
            Fill fill;
            fill.p = blocks.empty() ? nullptr : static_cast<unsigned char*>(blocks.front());
            fill.n = 1 << 20;
            fill.value = static_cast<unsigned char>(0x10 + t);
            RT(cudaLaunchHostFunc(s, fill_fn, &fill));
            cudaGraph_t graph = nullptr;
            RT(cudaStreamEndCapture(s, &graph));
            ended.arrive_and_wait();
            if (graph) {
                cudaGraphExec_t exec = nullptr;
                RT(cudaGraphInstantiate(&exec, graph, 0));
                if (exec) {
                    RT(cudaGraphLaunch(exec, s));
                    RT(cudaStreamSynchronize(s));
                    RT(cudaGraphExecDestroy(exec));
                }
                RT(cudaGraphDestroy(graph));
            }
            if (fill.runs == 1 && fill.p && fill.p[0] == 0x10 + t) ++good;
            for (void* p : blocks) {
                RT(cudaFree(p));
                ++counts.frees;
            }
            RT(cudaStreamDestroy(s));
        });
    for (auto& th : threads) th.join();
    return good == 4;
}

// A stream-ordered allocation captured into the graph: a memory node, run three times.
bool memory_node_case() {
    cudaStream_t s = nullptr;
    RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    RT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    void* p = nullptr;
    RT(cudaMallocAsync(&p, 8 << 20, s));
    Fill fill;
    fill.p = static_cast<unsigned char*>(p);
    fill.n = 8 << 20;
    fill.value = 0x77;
    RT(cudaLaunchHostFunc(s, fill_fn, &fill));
    RT(cudaFreeAsync(p, s));
    cudaGraph_t graph = nullptr;
    RT(cudaStreamEndCapture(s, &graph));
    bool ok = false;
    if (graph) {
        cudaGraphExec_t exec = nullptr;
        RT(cudaGraphInstantiate(&exec, graph, 0));
        if (exec) {
            for (int i = 0; i < 3; ++i) RT(cudaGraphLaunch(exec, s));
            RT(cudaStreamSynchronize(s));
            RT(cudaGraphExecDestroy(exec));
        }
        RT(cudaGraphDestroy(graph));
        ok = fill.runs == 3;
    }
    RT(cudaDeviceGraphMemTrim(0));
    RT(cudaStreamDestroy(s));
    return ok;
}

}  // namespace

int main() {
    // Streams that can overlap, and frees behind them: the pool's deferred frees need fences.
    cudaStream_t side = nullptr;
    RT(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    std::vector<void*> warm;
    for (int i = 0; i < 16; ++i) {
        void* p = nullptr;
        RT(cudaMalloc(&p, 1 << 20));
        if (p) {
            note_alloc(1 << 20);
            warm.push_back(p);
        }
    }
    RT(cudaLaunchHostFunc(side, nothing_fn, nullptr));
    for (void* p : warm) {
        RT(cudaFree(p));
        ++counts.frees;
    }
    long long cases = 0, passed = 0;
    for (cudaStreamCaptureMode mode :
         {cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal, cudaStreamCaptureModeRelaxed})
        for (bool blocking : {false, true}) {
            ++cases;
            const bool ok = relaxed_allocation_case(mode, blocking);
            passed += ok;
            if (!ok) prog::fail(__FILE__, __LINE__, "relaxed allocation during a capture", mode * 2 + blocking);
        }
    ++cases;
    passed += forbidden_allocation_case();
    for (cudaStreamCaptureMode mode : {cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal}) {
        ++cases;
        const bool ok = threads_case(mode);
        passed += ok;
        if (!ok) prog::fail(__FILE__, __LINE__, "captures on four threads", mode);
    }
    ++cases;
    const bool node = memory_node_case();
    passed += node;
    if (!node) prog::fail(__FILE__, __LINE__, "memory node", 0);
    RT(cudaStreamDestroy(side));
    return prog::finish(prog::Json()
                            .num("allocs", counts.allocs)
                            .num("frees", counts.frees)
                            .num("bytes", counts.bytes)
                            .num("cases", cases)
                            .num("cases_as_without_cupool", passed));
}
