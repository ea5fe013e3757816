// CUDA IPC of pool blocks between two processes. The parent allocates two blocks (under a pool
// the second lies inside the first's chunk), fills them, and hands their handles to a child it
// starts (under the same LD_PRELOAD, so under cupool too). The child must see each block, not the
// chunk's start: it checks the contents and the range the driver reports, writes into the second
// block, and opens one handle twice. The parent then checks that the write landed in the second
// block and nowhere else. A child without cupool must be refused the inner block's handle (the
// driver would open the chunk's start) and still open the first block's; under the vmm policy
// (cupool's own handles, shim/ipc_vmm.h) it must be refused both.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "prog_common.hpp"
#include "child_process.hpp"

namespace {

constexpr size_t kBytes = 1 << 20;

std::string to_hex(const cudaIpcMemHandle_t& h) { return prog::to_hex(&h, sizeof h); }

cudaIpcMemHandle_t from_hex(const char* hex) {
    cudaIpcMemHandle_t h{};
    prog::from_hex(hex, &h, sizeof h);
    return h;
}

bool all_bytes(const void* dev, size_t n, unsigned char value) {
    std::vector<unsigned char> host(n);
    if (cudaMemcpy(host.data(), dev, n, cudaMemcpyDeviceToHost) != cudaSuccess) return false;
    for (unsigned char c : host)
        if (c != value) return false;
    return true;
}

// The importing process, under cupool: prints nothing but errors; exit status says.
int importer(const char* hex_a, const char* hex_b) {
    void *a = nullptr, *b = nullptr, *b_again = nullptr;
    RT(cudaIpcOpenMemHandle(&b, from_hex(hex_b), cudaIpcMemLazyEnablePeerAccess));
    RT(cudaIpcOpenMemHandle(&a, from_hex(hex_a), cudaIpcMemLazyEnablePeerAccess));
    EXPECT(a != nullptr && b != nullptr && a != b);
    EXPECT(all_bytes(a, kBytes, 0x11));
    EXPECT(all_bytes(b, kBytes, 0x22));
    // The block's own range, as for an allocation of that size.
    CUdeviceptr base = 0;
    size_t size = 0;
    DRV(cuMemGetAddressRange(&base, &size, reinterpret_cast<CUdeviceptr>(b) + 4096));
    EXPECT(base == reinterpret_cast<CUdeviceptr>(b));
    EXPECT(size >= kBytes);
    RT(cudaMemset(b, 0x33, 4096));
    RT(cudaDeviceSynchronize());
    // The same handle again: the same block; each open is closed once.
    RT(cudaIpcOpenMemHandle(&b_again, from_hex(hex_b), cudaIpcMemLazyEnablePeerAccess));
    EXPECT(b_again == b);
    RT(cudaIpcCloseMemHandle(b_again));
    EXPECT(all_bytes(b, 4096, 0x33));  // still open
    RT(cudaIpcCloseMemHandle(b));
    RT(cudaIpcCloseMemHandle(a));
    return prog::failures() == 0 ? 0 : 1;
}

// Without cupool: the first block starts its chunk and opens; the inner one must be refused.
int plain_importer(const char* hex_a, const char* hex_b, bool expect_refusal, bool refuse_both) {
    void *a = nullptr, *b = nullptr;
    if (refuse_both) {
        EXPECT(cudaIpcOpenMemHandle(&a, from_hex(hex_a), cudaIpcMemLazyEnablePeerAccess) != cudaSuccess);
        EXPECT(cudaIpcOpenMemHandle(&b, from_hex(hex_b), cudaIpcMemLazyEnablePeerAccess) != cudaSuccess);
        return prog::failures() == 0 ? 0 : 1;
    }
    RT(cudaIpcOpenMemHandle(&a, from_hex(hex_a), cudaIpcMemLazyEnablePeerAccess));
    EXPECT(all_bytes(a, kBytes, 0x11));
    const cudaError_t rb = cudaIpcOpenMemHandle(&b, from_hex(hex_b), cudaIpcMemLazyEnablePeerAccess);
    if (expect_refusal) {
        EXPECT(rb != cudaSuccess);
        cudaGetLastError();
    } else {
        // The first 4 KiB hold the other child's write.
        EXPECT(rb == cudaSuccess && all_bytes(static_cast<char*>(b) + 4096, kBytes - 4096, 0x22));
        if (rb == cudaSuccess) RT(cudaIpcCloseMemHandle(b));
    }
    RT(cudaIpcCloseMemHandle(a));
    return prog::failures() == 0 ? 0 : 1;
}

int run_child(const std::vector<std::string>& args, bool without_cupool) {
    return prog::run_self(args, [&] {
        if (without_cupool) unsetenv("LD_PRELOAD");
    });
}

}  // namespace

int main(int argc, char** argv) {
    if (argc == 4 && std::strcmp(argv[1], "--import") == 0) return importer(argv[2], argv[3]);
    if (argc == 5 && std::strcmp(argv[1], "--import-plain") == 0)
        return plain_importer(argv[2], argv[3], std::strncmp(argv[4], "refused", 7) == 0,
                              std::strcmp(argv[4], "refused-both") == 0);

    const char* policy = std::getenv("CUPOOL_POLICY");
    const bool preloaded = std::getenv("LD_PRELOAD") && std::strstr(std::getenv("LD_PRELOAD"), "cupool");
    const bool pooled = preloaded && !(policy && std::strcmp(policy, "passthrough") == 0);
    long long allocs = 0, frees = 0, bytes = 0;
    void *a = nullptr, *b = nullptr;
    RT(cudaMalloc(&a, kBytes));
    RT(cudaMalloc(&b, kBytes));
    allocs += 2;
    bytes += 2 * kBytes;
    RT(cudaMemset(a, 0x11, kBytes));
    RT(cudaMemset(b, 0x22, kBytes));
    RT(cudaDeviceSynchronize());
    if (std::getenv("CUPOOL_SIM_IPC_HANDLE_TAIL") && pooled) {
        // No room in the driver's handle for the block's place: refused, and the handle cleared
        // so that nothing that opens at the chunk's start can leave this process.
        cudaIpcMemHandle_t h;
        std::memset(&h, 0x5a, sizeof h);
        const cudaError_t r = cudaIpcGetMemHandle(&h, b);
        EXPECT(r == cudaErrorNotSupported);
        cudaGetLastError();
        const cudaIpcMemHandle_t zero{};
        EXPECT(std::memcmp(&h, &zero, sizeof h) == 0);
        RT(cudaFree(a));
        RT(cudaFree(b));
        return prog::finish(prog::Json().num("allocs", 2).num("frees", 2).num("bytes", 2 * kBytes)
                                .boolean("refused_without_room", r == cudaErrorNotSupported));
    }
    cudaIpcMemHandle_t ha, hb, hb_inside;
    RT(cudaIpcGetMemHandle(&ha, a));
    RT(cudaIpcGetMemHandle(&hb, b));
    // Inside a block, as inside an allocation: the block's handle.
    RT(cudaIpcGetMemHandle(&hb_inside, static_cast<char*>(b) + 4096));
    EXPECT(std::memcmp(&hb, &hb_inside, sizeof hb) == 0);
    // From a thread with no current context yet (torch.multiprocessing shares from its queue's
    // feeder thread): the same handle.
    cudaIpcMemHandle_t hb_thread{};
    std::thread([&] { RT(cudaIpcGetMemHandle(&hb_thread, b)); }).join();
    EXPECT(std::memcmp(&hb, &hb_thread, sizeof hb) == 0);

    const int child = run_child({"prog_ipc", "--import", to_hex(ha), to_hex(hb)}, false);
    EXPECT(child == 0);
    EXPECT(all_bytes(b, 4096, 0x33));               // the child's write, in the right block
    EXPECT(all_bytes(static_cast<char*>(b) + 4096, kBytes - 4096, 0x22));
    EXPECT(all_bytes(a, kBytes, 0x11));             // and not at the chunk's start
    // Under a pool, b lies inside a's chunk.
    // Under vmm, every block's handle is cupool's own: a process without cupool opens neither.
    const bool vmm = pooled && policy && std::strcmp(policy, "vmm") == 0;
    const int plain = run_child({"prog_ipc", "--import-plain", to_hex(ha), to_hex(hb),
                                 vmm ? "refused-both" : pooled ? "refused" : "opened"}, true);
    EXPECT(plain == 0);

    RT(cudaFree(a));
    RT(cudaFree(b));
    frees += 2;
    return prog::finish(prog::Json().num("allocs", allocs).num("frees", frees).num("bytes", bytes)
                            .boolean("child_saw_blocks", child == 0).boolean("plain_child_ok", plain == 0));
}
