// Which streams make deferred frees need fences. Phase 1: one blocking stream B besides the
// legacy default stream. A "kernel" on B reads p for ~100 ms while the host frees p, allocates the
// same size and fills it with cudaMemset on the legacy stream, which waits for B's earlier work:
// stream order alone keeps the kernel's data intact, so cupool may (and should) reuse p at once.
// Phase 2: a second blocking stream C, created after the free (while the kernel still runs and
// the freed memory already counts as reusable). Work on C does not wait for B, so the fill on C
// is safe only if cupool makes sure nothing freed before C existed is handed to C early.
// Phase 3: the same with C in place before the round (frees then wait behind fences).
// Exit 0 only if every kernel saw the original data.
#include <cuda_runtime_api.h>

#include "prog_common.hpp"
#include "slow_reader.hpp"

namespace {
constexpr size_t kBytes = prog::kSlowReadBytes;

long long allocs = 0, frees = 0, bytes = 0;

// Runs the pattern with the kernel on `reader` and the refill on `*writer` (the legacy stream if
// null; created after the free if `create_writer`); true if the kernel saw the original data.
bool round(cudaStream_t reader, cudaStream_t* writer, bool create_writer) {
    void* p = nullptr;
    RT(cudaMalloc(&p, kBytes));
    if (!p) return false;
    ++allocs;
    bytes += kBytes;
    RT(cudaMemset(p, prog::kOriginalByte, kBytes));
    prog::SlowRead args;
    args.p = static_cast<const unsigned char*>(p);
    RT(cudaLaunchHostFunc(reader, prog::slow_read, &args));
    RT(cudaFree(p));
    ++frees;
    if (create_writer) RT(cudaStreamCreate(writer));
    void* q = nullptr;
    RT(cudaMalloc(&q, kBytes));
    if (q) {
        ++allocs;
        bytes += kBytes;
        if (writer == nullptr) RT(cudaMemset(q, 0x5a, kBytes));
        else RT(cudaMemsetAsync(q, 0x5a, kBytes, *writer));
    }
    RT(cudaDeviceSynchronize());
    if (q) {
        RT(cudaFree(q));
        ++frees;
    }
    return args.saw_original == 1;
}
}  // namespace

int main() {
    cudaStream_t b = nullptr, c = nullptr;
    RT(cudaStreamCreate(&b));
    const bool one_order = round(b, nullptr, false);
    EXPECT(one_order);
    const bool second_stream_late = round(b, &c, true);
    EXPECT(second_stream_late);
    const bool two_orders = round(b, &c, false);
    EXPECT(two_orders);
    RT(cudaStreamDestroy(c));
    RT(cudaStreamDestroy(b));
    return prog::finish(prog::Json()
                            .num("allocs", allocs)
                            .num("frees", frees)
                            .num("bytes", bytes)
                            .boolean("one_blocking_stream_ok", one_order)
                            .boolean("second_stream_created_after_free_ok", second_stream_late)
                            .boolean("two_blocking_streams_ok", two_orders));
}
