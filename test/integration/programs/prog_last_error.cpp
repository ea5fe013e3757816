// A refused allocation leaves the runtime's last error as the driver's refusal does: each call
// asks for more than the device has (so the answer is the same with and without cupool, whoever
// refuses), and cudaPeekAtLastError / cudaGetLastError must then say cudaErrorMemoryAllocation,
// once, and cudaSuccess after it has been read.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "prog_common.hpp"

namespace {
long long checked = 0;

void expect_refused(cudaError_t rc, const char* what) {
    if (rc != cudaErrorMemoryAllocation) prog::fail(__FILE__, __LINE__, what, rc);
    const cudaError_t peek = cudaPeekAtLastError();
    const cudaError_t last = cudaGetLastError();
    const cudaError_t after = cudaGetLastError();
    if (peek != cudaErrorMemoryAllocation) prog::fail(__FILE__, __LINE__, "cudaPeekAtLastError after a refusal", peek);
    if (last != cudaErrorMemoryAllocation) prog::fail(__FILE__, __LINE__, "cudaGetLastError after a refusal", last);
    if (after != cudaSuccess) prog::fail(__FILE__, __LINE__, "cudaGetLastError read twice", after);
    ++checked;
}
}  // namespace

int main() {
    RT(cudaFree(nullptr));
    size_t free = 0, total = 0;
    RT(cudaMemGetInfo(&free, &total));
    const size_t huge = total + (size_t{1} << 30);
    void* p = nullptr;
    size_t pitch = 0;
    expect_refused(cudaMalloc(&p, huge), "cudaMalloc");
    expect_refused(cudaMallocManaged(&p, huge), "cudaMallocManaged");
    expect_refused(cudaMallocAsync(&p, huge, 0), "cudaMallocAsync");
    expect_refused(cudaMallocPitch(&p, &pitch, huge / 1024, 1024), "cudaMallocPitch");
    // After refusals, a successful call leaves no error behind.
    RT(cudaMalloc(&p, 1 << 20));
    EXPECT(cudaGetLastError() == cudaSuccess);
    RT(cudaFree(p));
    return prog::finish(prog::Json().num("allocs", 1).num("frees", 1).num("bytes", 1 << 20).num("refusals_checked", checked));
}
