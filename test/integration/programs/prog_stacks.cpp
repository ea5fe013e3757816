// CUPOOL_TRACE_STACKS (test/integration/check_stacks.py): allocations made from functions with
// names the check looks for in the trace's stacks, the report and the memory_viz export. Built
// with its symbols exported (-rdynamic), so that dladdr names them as it names a library's.
// Prints one JSON line: how many allocations of each kind it made.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

#include "prog_common.hpp"

// Visible (the project builds with -fvisibility=hidden) and exported, so that dladdr names them.
#define STACKS_EXPORT __attribute__((noinline, visibility("default")))

extern "C" {
// noinline and not a tail call (an empty asm after the call), so that each is a frame.
STACKS_EXPORT void* stacks_allocate_weights(std::size_t bytes) {
    void* p = nullptr;
    RT(cudaMalloc(&p, bytes));
    asm volatile("" ::: "memory");
    return p;
}

STACKS_EXPORT void* stacks_recurse(int depth, std::size_t bytes) {
    void* p = depth == 0 ? stacks_allocate_weights(bytes) : stacks_recurse(depth - 1, bytes);
    asm volatile("" ::: "memory");
    return p;
}

STACKS_EXPORT int stacks_allocate_too_much(std::size_t bytes) {
    void* p = nullptr;
    const cudaError_t rc = cudaMalloc(&p, bytes);
    asm volatile("" ::: "memory");
    return rc;
}
}

STACKS_EXPORT int main() {
    RT(cudaFree(nullptr));
    std::size_t free = 0, total = 0;
    RT(cudaMemGetInfo(&free, &total));
    std::vector<void*> held;
    long long small = 0;
    for (int i = 0; i < 400; ++i) {  // small ones, freed at once
        void* p = stacks_allocate_weights(std::size_t{1} << 20);
        RT(cudaFree(p));
        ++small;
    }
    held.push_back(stacks_recurse(8, std::size_t{64} << 20));  // the largest, 9 frames of recursion deep
    // Another thread's allocation: its stack starts in its own thread.
    std::thread([&] { held.push_back(stacks_allocate_weights(std::size_t{32} << 20)); }).join();
    const int refused = stacks_allocate_too_much(total + (std::size_t{1} << 30));
    if (refused != cudaErrorMemoryAllocation) prog::fail(__FILE__, __LINE__, "the refused allocation", refused);
    cudaGetLastError();
    for (void* p : held) RT(cudaFree(p));
    return prog::finish(prog::Json().num("small", small).num("held", static_cast<long long>(held.size())).num("refused", 1));
}
