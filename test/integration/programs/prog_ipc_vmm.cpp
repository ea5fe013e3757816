// CUDA IPC of the vmm policy's blocks between processes that both run cupool (docs/design.md,
// "IPC of vmm blocks"). Run under CUPOOL_POLICY=vmm. The parent exports a block that is not the
// first in its pool's range to an importer child (fork + exec, under cupool too) that it drives
// line by line over pipes, and checks: data both ways, a second open of one handle (the same
// pointer, counted), the exporter freeing the block while the importer maps it (the importer's
// data intact, the exporter's next allocation elsewhere), a double close (invalid value), an
// exporter child that exits before the open (a clean error, at once even when a child it forked
// lives on) and one that exits after it (the memory stays valid), a process without cupool (a
// clean error), and hostile servers under the parent's own pid (silent, garbage, a reply without
// descriptors, a reply of a billion granules): errors within the timeout. The importer runs
// under a cap below one granule: what it imports is not charged to it. Under
// CUPOOL_SIM_NO_FD_HANDLES (no exportable memory) it checks the refusal instead.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "child_process.hpp"
#include "prog_common.hpp"

namespace {

constexpr size_t kBytes = 1 << 20;

std::string to_hex(const cudaIpcMemHandle_t& h) { return prog::to_hex(&h, sizeof h); }
cudaIpcMemHandle_t from_hex(const std::string& hex) {
    cudaIpcMemHandle_t h{};
    if (hex.size() == 2 * sizeof h) prog::from_hex(hex.c_str(), &h, sizeof h);
    return h;
}

bool all_bytes(const void* dev, size_t n, unsigned char value) {
    std::vector<unsigned char> host(n);
    if (cudaMemcpy(host.data(), dev, n, cudaMemcpyDeviceToHost) != cudaSuccess) return false;
    for (unsigned char c : host)
        if (c != value) return false;
    return true;
}

// A child of this program, driven by lines on its stdin; it answers one line per command.
struct Child {
    pid_t pid = -1;
    FILE* to = nullptr;
    FILE* from = nullptr;
    std::string ask(const std::string& text) {
        std::fprintf(to, "%s\n", text.c_str());
        std::fflush(to);
        return line();
    }
    std::string line() {
        char buf[512] = {};
        if (!std::fgets(buf, sizeof buf, from)) return "eof";
        std::string s(buf);
        while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
        return s;
    }
    int wait() {
        if (to) std::fclose(to);
        to = nullptr;
        int status = 0;
        waitpid(pid, &status, 0);
        if (from) std::fclose(from);
        from = nullptr;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    }
};

Child spawn(const std::vector<std::string>& args, const char* limit = nullptr) {
    int in[2], out[2];
    if (pipe(in) != 0 || pipe(out) != 0) std::abort();
    Child c;
    c.pid = fork();
    if (c.pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[0]), close(in[1]), close(out[0]), close(out[1]);
        if (limit) setenv("CUPOOL_LIMIT", limit, 1);
        std::vector<char*> argv;
        for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
        argv.push_back(nullptr);
        execv("/proc/self/exe", argv.data());
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    c.to = fdopen(in[1], "w");
    c.from = fdopen(out[0], "r");
    return c;
}

// ---- the importer child: open HEX | check I BYTE OFF LEN | write I BYTE OFF LEN | close I |
// range I | exit. Answers "ok ...", or "err CODE MS" for a failed open (MS: how long it took).
int importer() {
    std::vector<void*> opened;
    char line[512];
    while (std::fgets(line, sizeof line, stdin)) {
        char cmd[16] = {}, arg[200] = {};
        unsigned idx = 0, byte = 0;
        unsigned long off = 0, len = 0;
        std::string reply = "bad";
        if (std::sscanf(line, "open %199s", arg) == 1) {
            const auto t0 = std::chrono::steady_clock::now();
            void* p = nullptr;
            const cudaError_t r = cudaIpcOpenMemHandle(&p, from_hex(arg), cudaIpcMemLazyEnablePeerAccess);
            const long ms = static_cast<long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                  std::chrono::steady_clock::now() - t0).count());
            const cudaError_t sticky = cudaGetLastError();
            if (r == cudaSuccess) {
                opened.push_back(p);
                reply = "ok " + std::to_string(opened.size() - 1) + " " + std::to_string(reinterpret_cast<uintptr_t>(p));
            } else {
                // As the runtime's own failed open: cudaGetLastError says so too.
                reply = std::string(sticky != cudaSuccess ? "err " : "no-last-error ") + std::to_string(r) + " " +
                        std::to_string(ms);
            }
        } else if (std::sscanf(line, "%15s %u %u %lu %lu", cmd, &idx, &byte, &off, &len) == 5 && idx < opened.size()) {
            char* p = static_cast<char*>(opened[idx]) + off;
            if (std::strcmp(cmd, "check") == 0) {
                reply = all_bytes(p, len, static_cast<unsigned char>(byte)) ? "ok" : "differs";
            } else if (std::strcmp(cmd, "write") == 0) {
                reply = cudaMemset(p, static_cast<int>(byte), len) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess
                            ? "ok" : "failed";
            }
        } else if (std::sscanf(line, "close %u", &idx) == 1 && idx < opened.size()) {
            const cudaError_t r = cudaIpcCloseMemHandle(opened[idx]);
            cudaGetLastError();
            reply = "rc " + std::to_string(r);
        } else if (std::sscanf(line, "range %u", &idx) == 1 && idx < opened.size()) {
            CUdeviceptr base = 0;
            size_t size = 0;
            const CUresult r = cuMemGetAddressRange(&base, &size, reinterpret_cast<CUdeviceptr>(opened[idx]) + 4096);
            reply = r == CUDA_SUCCESS && base == reinterpret_cast<CUdeviceptr>(opened[idx]) && size >= kBytes ? "ok" : "wrong";
        } else if (std::strncmp(line, "info", 4) == 0) {
            size_t free = 0, total = 0;
            reply = cudaMemGetInfo(&free, &total) == cudaSuccess ? "ok " + std::to_string(free) : "failed";
        } else if (std::strncmp(line, "exit", 4) == 0) {
            return 0;
        }
        std::printf("%s\n", reply.c_str());
        std::fflush(stdout);
    }
    return 0;
}

// ---- an exporter child: two blocks (the second not the first in the range), the second filled
// with `byte` and shared; its handle on stdout; then it waits for a line and exits (`free` first
// frees the blocks). Its counts come back in its last line.
int exporter(unsigned byte, bool fork_first) {
    void *a = nullptr, *b = nullptr;
    RT(cudaMalloc(&a, kBytes));
    RT(cudaMalloc(&b, kBytes));
    RT(cudaMemset(b, static_cast<int>(byte), kBytes));
    RT(cudaDeviceSynchronize());
    cudaIpcMemHandle_t h{};
    RT(cudaIpcGetMemHandle(&h, b));
    // A forked child that outlives this process must not keep its socket's name alive: an open
    // after this process exited is then refused at once instead of waiting out the timeout.
    if (fork_first && fork() == 0) {
        close(0), close(1), close(2);  // holds none of the test's pipes
        sleep(2);
        _exit(0);
    }
    std::printf("%s\n", to_hex(h).c_str());
    std::fflush(stdout);
    char line[64] = {};
    const bool got = std::fgets(line, sizeof line, stdin) != nullptr;
    int frees = 0;
    if (got && std::strncmp(line, "free", 4) == 0) {
        RT(cudaFree(a));
        RT(cudaFree(b));
        frees = 2;
    }
    std::printf("counts %d %d %d\n", 2, frees, prog::failures());
    std::fflush(stdout);
    return prog::failures() == 0 ? 0 : 1;
}

// ---- a process without cupool: the handle must fail to open, cleanly.
int plain(const char* hex) {
    void* p = nullptr;
    const cudaError_t r = cudaIpcOpenMemHandle(&p, from_hex(hex), cudaIpcMemLazyEnablePeerAccess);
    return r != cudaSuccess ? 0 : 1;
}

// ---- hostile servers, bound under this process's pid and a nonce of our choosing, so that the
// importer's peer check passes and what the server sends is all that is wrong.
std::uint32_t fnv(const unsigned char* h) {
    std::uint32_t x = 2166136261u;
    for (size_t i = 0; i < 52; ++i) x = (x ^ h[i]) * 16777619u;
    return x;
}

// The real handle with another nonce (bytes 16..23) and its checksum (bytes 52..55) redone.
cudaIpcMemHandle_t with_nonce(cudaIpcMemHandle_t h, std::uint64_t nonce) {
    auto* b = reinterpret_cast<unsigned char*>(h.reserved);
    std::memcpy(b + 16, &nonce, sizeof nonce);
    const std::uint32_t sum = fnv(b);
    std::memcpy(b + 52, &sum, sizeof sum);
    return h;
}

struct FakeServer {
    int fd = -1;
    std::thread t;
    std::atomic<bool> stop{false};
    // mode: 0 silent (accepts, never answers), 1 garbage, 2 a sane reply and then a batch without
    // descriptors, 3 a reply claiming a billion granules.
    FakeServer(std::uint64_t nonce, int mode, std::uint64_t offset, std::uint64_t size) {
        char name[80];
        std::snprintf(name, sizeof name, "cupool-ipc-%d-%016llx", static_cast<int>(getpid()),
                      static_cast<unsigned long long>(nonce));
        sockaddr_un addr{};
        addr.sun_family = AF_UNIX;
        std::memcpy(addr.sun_path + 1, name, std::strlen(name));
        fd = socket(AF_UNIX, SOCK_STREAM, 0);
        const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + std::strlen(name));
        EXPECT(bind(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0 && listen(fd, 4) == 0);
        t = std::thread([this, mode, offset, size] {
            const int c = accept(fd, nullptr, nullptr);
            if (c < 0) return;
            unsigned char req[24];
            if (mode != 0) (void)!recv(c, req, sizeof req, MSG_WAITALL);
            struct {
                std::uint32_t magic, status;
                std::uint64_t granule, count, offset, size;
            } reply{0x43505649, 0, 2u << 20, 1, offset, size};
            if (mode == 1) {
                unsigned char junk[40];
                std::memset(junk, 0xff, sizeof junk);
                (void)!send(c, junk, sizeof junk, MSG_NOSIGNAL);
            } else if (mode == 2) {
                (void)!send(c, &reply, sizeof reply, MSG_NOSIGNAL);
                const std::uint32_t batch[4] = {0x43505649, 0, 1, 0};  // one descriptor announced, none sent
                (void)!send(c, batch, sizeof batch, MSG_NOSIGNAL);
            } else if (mode == 3) {
                reply.count = 1000000000;
                (void)!send(c, &reply, sizeof reply, MSG_NOSIGNAL);
            }
            while (!stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
            close(c);
        });
    }
    ~FakeServer() {
        stop = true;
        shutdown(fd, SHUT_RDWR);
        close(fd);
        t.join();
    }
};

bool starts(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// "err CODE MS": a failed open, within `max_ms`.
bool clean_error(const std::string& reply, long max_ms) {
    int code = 0;
    long ms = 0;
    return std::sscanf(reply.c_str(), "err %d %ld", &code, &ms) == 2 && code != 0 && ms <= max_ms;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc == 2 && std::strcmp(argv[1], "--import") == 0) return importer();
    if (argc == 3 && std::strcmp(argv[1], "--export") == 0) return exporter(static_cast<unsigned>(std::atoi(argv[2])), false);
    if (argc == 3 && std::strcmp(argv[1], "--export-fork") == 0)
        return exporter(static_cast<unsigned>(std::atoi(argv[2])), true);
    if (argc == 3 && std::strcmp(argv[1], "--plain") == 0) return plain(argv[2]);

    signal(SIGPIPE, SIG_IGN);  // a child that died answers "eof", not a killed parent
    long long allocs = 0, frees = 0, bytes = 0;
    void *a = nullptr, *b = nullptr;
    RT(cudaMalloc(&a, kBytes));
    RT(cudaMalloc(&b, kBytes));
    allocs += 2;
    bytes += 2 * kBytes;
    RT(cudaMemset(a, 0x11, kBytes));
    RT(cudaMemset(b, 0x22, kBytes));
    RT(cudaDeviceSynchronize());

    if (std::getenv("CUPOOL_SIM_NO_FD_HANDLES")) {
        // No exportable memory (the device says so, or cuMemCreate refuses the handle type):
        // the blocks still work, and sharing them is refused (invalid value, the handle cleared)
        // in both APIs, as before vmm blocks could be shared.
        cudaIpcMemHandle_t h;
        std::memset(&h, 0x5a, sizeof h);
        const cudaError_t r = cudaIpcGetMemHandle(&h, b);
        EXPECT(r == cudaErrorInvalidValue);
        cudaGetLastError();
        const cudaIpcMemHandle_t zero{};
        EXPECT(std::memcmp(&h, &zero, sizeof h) == 0);
        CUipcMemHandle hd;
        EXPECT(cuIpcGetMemHandle(&hd, reinterpret_cast<CUdeviceptr>(a)) == CUDA_ERROR_INVALID_VALUE);
        EXPECT(all_bytes(a, kBytes, 0x11) && all_bytes(b, kBytes, 0x22));
        RT(cudaFree(a));
        RT(cudaFree(b));
        return prog::finish(prog::Json().num("allocs", 2).num("frees", 2).num("bytes", 2 * kBytes)
                                .boolean("refused_without_fd_handles", r == cudaErrorInvalidValue));
    }

    // b is not the first block of the range. Its handle, by both APIs, from inside it, and from a
    // thread with no current context (torch.multiprocessing's feeder thread): the same bytes.
    cudaIpcMemHandle_t hb{}, hb_inside{}, hb_thread{};
    RT(cudaIpcGetMemHandle(&hb, b));
    RT(cudaIpcGetMemHandle(&hb_inside, static_cast<char*>(b) + 4096));
    EXPECT(std::memcmp(&hb, &hb_inside, sizeof hb) == 0);
    CUipcMemHandle hd{};
    DRV(cuIpcGetMemHandle(&hd, reinterpret_cast<CUdeviceptr>(b)));
    EXPECT(std::memcmp(&hb, &hd, sizeof hb) == 0);
    std::thread([&] { RT(cudaIpcGetMemHandle(&hb_thread, b)); }).join();
    EXPECT(std::memcmp(&hb, &hb_thread, sizeof hb) == 0);

    // The importer runs under a cap smaller than one granule: imported memory is the exporter's,
    // not charged to the importer (its memory info does not move either).
    Child imp = spawn({"prog_ipc_vmm", "--import"}, "1MiB");
    const std::string info_before = imp.ask("info");
    // Exporter to importer, then importer to exporter; the block's own range; a second open.
    const std::string opened = imp.ask("open " + to_hex(hb));
    EXPECT(starts(opened, "ok 0 "));
    EXPECT(starts(info_before, "ok ") && imp.ask("info") == info_before);
    EXPECT(imp.ask("check 0 34 0 1048576") == "ok");
    EXPECT(imp.ask("range 0") == "ok");
    EXPECT(imp.ask("write 0 51 0 4096") == "ok");
    const std::string again = imp.ask("open " + to_hex(hb));
    EXPECT(starts(again, "ok 1 ") && again.substr(5) == opened.substr(5));  // the same pointer
    EXPECT(imp.ask("close 1") == "rc 0");
    EXPECT(imp.ask("check 0 51 0 4096") == "ok");  // still open: one open remains
    EXPECT(all_bytes(b, 4096, 0x33));
    EXPECT(all_bytes(static_cast<char*>(b) + 4096, kBytes - 4096, 0x22));
    EXPECT(all_bytes(a, kBytes, 0x11));  // the write landed in b, not at the range's start

    // The exporter frees b while the importer maps it: the importer's data stays, and the
    // exporter's next allocation does not get b's bytes.
    RT(cudaFree(b));
    ++frees;
    void* c = nullptr;
    RT(cudaMalloc(&c, kBytes));
    ++allocs;
    bytes += kBytes;
    const auto cb = reinterpret_cast<uintptr_t>(c), bb = reinterpret_cast<uintptr_t>(b);
    EXPECT(cb + kBytes <= bb || bb + kBytes <= cb);
    RT(cudaMemset(c, 0x44, kBytes));
    RT(cudaDeviceSynchronize());
    EXPECT(imp.ask("check 0 51 0 4096") == "ok");
    EXPECT(imp.ask("check 0 34 4096 1044480") == "ok");
    EXPECT(imp.ask("write 0 85 0 1048576") == "ok");
    EXPECT(all_bytes(c, kBytes, 0x44));
    EXPECT(all_bytes(a, kBytes, 0x11));
    // A second free of b while it is held is a double free, as for any block.
    EXPECT(cudaFree(b) == cudaErrorInvalidValue);
    cudaGetLastError();
    // Close, then close again: the driver's invalid value.
    EXPECT(imp.ask("close 0") == "rc 0");
    EXPECT(imp.ask("close 0") == "rc " + std::to_string(cudaErrorInvalidValue));
    // Freed and no longer mapped anywhere: the handle no longer opens.
    EXPECT(clean_error(imp.ask("open " + to_hex(hb)), 5000));

    // An exporter that exits before the open: a clean error, soon; also where a child it forked
    // after exporting lives on (it must have closed the exporter's socket: refused, no timeout).
    for (const char* mode : {"--export", "--export-fork"}) {
        Child ex = spawn({"prog_ipc_vmm", mode, "102"});
        const std::string hex = ex.ask("");  // its handle line; the empty line lets it exit
        int n_alloc = 0, n_free = 0, fails = 1;
        EXPECT(std::sscanf(ex.line().c_str(), "counts %d %d %d", &n_alloc, &n_free, &fails) == 3);
        EXPECT(ex.wait() == 0 && fails == 0);
        allocs += n_alloc;
        bytes += n_alloc * static_cast<long long>(kBytes);
        EXPECT(clean_error(imp.ask("open " + hex), 1000));
    }
    // An exporter that exits after the open: the importer's memory stays valid.
    {
        Child ex = spawn({"prog_ipc_vmm", "--export", "119"});
        char hex[200] = {};
        EXPECT(std::fgets(hex, sizeof hex, ex.from) != nullptr);
        hex[std::strcspn(hex, "\n")] = 0;
        const std::string r = imp.ask(std::string("open ") + hex);
        EXPECT(starts(r, "ok 2 "));
        int n_alloc = 0, n_free = 0, fails = 1;
        EXPECT(std::sscanf(ex.ask("free").c_str(), "counts %d %d %d", &n_alloc, &n_free, &fails) == 3);
        EXPECT(ex.wait() == 0 && fails == 0);
        allocs += n_alloc;
        frees += n_free;
        bytes += n_alloc * static_cast<long long>(kBytes);
        EXPECT(imp.ask("check 2 119 0 1048576") == "ok");
        EXPECT(imp.ask("write 2 7 0 1048576") == "ok");
        EXPECT(imp.ask("check 2 7 0 1048576") == "ok");
        EXPECT(imp.ask("close 2") == "rc 0");
    }

    // A process without cupool: a clean error, not the wrong memory and not a crash.
    void* d = nullptr;
    RT(cudaMalloc(&d, kBytes));
    ++allocs;
    bytes += kBytes;
    cudaIpcMemHandle_t hd2{};
    RT(cudaIpcGetMemHandle(&hd2, d));
    EXPECT(prog::run_self({"prog_ipc_vmm", "--plain", to_hex(hd2)}, [] { unsetenv("LD_PRELOAD"); }) == 0);

    // Hostile servers: each open fails within the importer's timeout (2 s) and some slack.
    const auto* raw = reinterpret_cast<const unsigned char*>(hd2.reserved);
    std::uint64_t offset = 0, size = 0;
    std::memcpy(&offset, raw + 32, sizeof offset);
    std::memcpy(&size, raw + 40, sizeof size);
    for (int mode = 0; mode < 4; ++mode) {
        const std::uint64_t nonce = 0x5eed0000ull + static_cast<std::uint64_t>(mode);
        FakeServer fake(nonce, mode, offset, size);
        const std::string r = imp.ask("open " + to_hex(with_nonce(hd2, nonce)));
        if (!clean_error(r, 4500)) std::fprintf(stderr, "hostile server %d: %s\n", mode, r.c_str());
        EXPECT(clean_error(r, 4500));
    }
    // The real server still serves after all that.
    EXPECT(starts(imp.ask("open " + to_hex(hd2)), "ok 3 "));
    EXPECT(imp.ask("close 3") == "rc 0");

    imp.ask("exit");
    EXPECT(imp.wait() == 0);
    RT(cudaFree(a));
    RT(cudaFree(c));
    RT(cudaFree(d));
    frees += 3;
    return prog::finish(prog::Json().num("allocs", allocs).num("frees", frees).num("bytes", bytes)
                            .boolean("ipc_vmm_ok", prog::failures() == 0));
}
