// CUDA IPC between processes in the pattern of NVIDIA's simpleIPC sample (our own code), and the
// lifetimes a shared block goes through, on real hardware. Run as `simple_ipc [N]` under cupool
// (LD_PRELOAD) or without it; the parent starts every other role itself (fork + exec of this
// program, command pipes, a line of results back from each), and prints one JSON line per case
// and a last JSON line with every fact. It asserts nothing: test/gpu/run_all.py (group vmmipc)
// judges the facts against the policy it ran under, so that one run records what the driver does
// without cupool as the reference.
//   simple    the parent cudaMalloc's a buffer after another allocation (so that under a pool it
//             is not the first block), fills it, and hands its cudaIpcMemHandle to N children at
//             once; each opens it (even children by the runtime API, odd ones by the driver
//             API's cuIpcOpenMemHandle), checks that it sees the parent's fill, runs a kernel
//             writing its own part, closes; the parent checks every word. The driver API's
//             cuIpcGetMemHandle of the same buffer is asked for too.
//   double    a child opens the handle, closes it, closes it again: the second close's error.
//   freed     the parent frees a shared block while a child maps it; the child then writes it;
//             the parent's next allocation of that size must not see the child's words, and the
//             child's mapping must keep them after the parent fills its new block.
//   orphan    a separate exporter process shares a block and exits while an importer maps it:
//             the importer reads (and writes) it after the exporter is gone.
//   plain     a child without cupool (LD_PRELOAD removed) opens the simple case's handle: under
//             cupool's vmm policy a clean CUDA error is expected (never a crash, never the wrong
//             memory); its code is recorded.
// Built by nvcc (test/gpu/prepare.sh); also builds as plain C++ against the simulated CUDA
// (test/sim), where the kernels are replaced by copies from the host:
//   c++ -x c++ -std=c++17 -I/usr/local/cuda/include test/gpu/simple_ipc.cu -Lbuild/test/sim -lcudart -lcuda
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

using u32 = std::uint32_t;
constexpr int kTimeoutMs = 30'000;  // a child that does not answer within this is killed
constexpr size_t kPerChild = 1u << 20;     // words each child of the simple case writes (4 MiB)
constexpr size_t kLifeWords = 2u << 20;    // words of the lifetime cases' blocks (8 MiB)
constexpr size_t kFirstBytes = 1u << 20;   // the allocation made first, so that the shared one is not

// The word each pattern has at index j (child i of the simple case; B: the importer's write in
// freed; D: the orphan exporter's fill; E: what the orphan importer adds to it).
__host__ __device__ inline u32 simple_word(u32 i, u32 j) { return ((i + 1u) << 28) | (j & 0x0fffffffu); }
__host__ __device__ inline u32 b_word(u32 j) { return 0xb0000000u | (j * 2654435761u >> 4); }
__host__ __device__ inline u32 d_word(u32 j) { return 0xd0000000u | (j & 0x0fffffffu); }

#ifdef __CUDACC__
__global__ void k_simple(u32* p, u32 child, size_t begin, size_t n) {
  for (size_t k = blockIdx.x * size_t(blockDim.x) + threadIdx.x; k < n; k += size_t(gridDim.x) * blockDim.x)
    p[begin + k] = simple_word(child, u32(begin + k));
}
__global__ void k_fill(u32* p, size_t n, int which) {
  for (size_t j = blockIdx.x * size_t(blockDim.x) + threadIdx.x; j < n; j += size_t(gridDim.x) * blockDim.x)
    p[j] = which == 'B' ? b_word(u32(j)) : which == 'D' ? d_word(u32(j)) : p[j] + 1u;
}
#endif

// Runs the kernel (or, on the simulated CUDA, the same words copied from the host); returns the
// error of the launch or of the synchronize after it.
cudaError_t write_simple(u32* p, u32 child, size_t begin, size_t n) {
#ifdef __CUDACC__
  k_simple<<<264, 256>>>(p, child, begin, n);
  cudaError_t rc = cudaGetLastError();
  return rc != cudaSuccess ? rc : cudaDeviceSynchronize();
#else
  std::vector<u32> h(n);
  for (size_t k = 0; k < n; ++k) h[k] = simple_word(child, u32(begin + k));
  cudaError_t rc = cudaMemcpy(p + begin, h.data(), n * 4, cudaMemcpyHostToDevice);
  return rc != cudaSuccess ? rc : cudaDeviceSynchronize();
#endif
}

cudaError_t fill(u32* p, size_t n, int which) {
#ifdef __CUDACC__
  k_fill<<<264, 256>>>(p, n, which);
  cudaError_t rc = cudaGetLastError();
  return rc != cudaSuccess ? rc : cudaDeviceSynchronize();
#else
  std::vector<u32> h(n);
  if (which == '+') {
    cudaError_t rc = cudaMemcpy(h.data(), p, n * 4, cudaMemcpyDeviceToHost);
    if (rc != cudaSuccess) return rc;
  }
  for (size_t j = 0; j < n; ++j) h[j] = which == 'B' ? b_word(u32(j)) : which == 'D' ? d_word(u32(j)) : h[j] + 1u;
  cudaError_t rc = cudaMemcpy(p, h.data(), n * 4, cudaMemcpyHostToDevice);
  return rc != cudaSuccess ? rc : cudaDeviceSynchronize();
#endif
}

std::string hex(const void* data, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    unsigned c = static_cast<const unsigned char*>(data)[i];
    s += digits[c >> 4];
    s += digits[c & 15];
  }
  return s;
}

bool unhex(const std::string& s, cudaIpcMemHandle_t* h) {
  if (s.size() != 2 * sizeof *h) return false;
  auto* out = reinterpret_cast<unsigned char*>(h);
  for (size_t i = 0; i < sizeof *h; ++i) out[i] = static_cast<unsigned char>(std::stoul(s.substr(2 * i, 2), nullptr, 16));
  return true;
}

std::string ptr_str(const void* p) {
  char b[32];
  std::snprintf(b, sizeof b, "\"0x%llx\"", static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(p)));
  return b;
}

std::string err_str(cudaError_t rc) {
  return "{\"rc\": " + std::to_string(int(rc)) + ", \"name\": \"" + cudaGetErrorName(rc) + "\"}";
}

// What the driver itself says of the memory at p (cupool passes these attributes through): an
// allocation cudaIpcGetMemHandle can share (1: cuMemAlloc; 0: cuMemCreate'd memory, the vmm
// policy's granules), and the shareable handle types it was created with (0 for cuMemAlloc).
std::string driver_view(const void* p) {
  int legacy = 0;  // the driver writes a bool: the other bytes stay 0
  unsigned long long types = 0;
  const CUresult r1 = cuPointerGetAttribute(&legacy, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                                            reinterpret_cast<CUdeviceptr>(p));
  const CUresult r2 = cuPointerGetAttribute(&types, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES,
                                            reinterpret_cast<CUdeviceptr>(p));
  std::string s = "{\"legacy_ipc_capable\": " + (r1 == CUDA_SUCCESS ? std::to_string(legacy) : "null") +
                  ", \"allowed_handle_types\": " + (r2 == CUDA_SUCCESS ? std::to_string(types) : "null");
  if (r1 != CUDA_SUCCESS || r2 != CUDA_SUCCESS) s += ", \"attribute_rc\": [" + std::to_string(int(r1)) + ", " + std::to_string(int(r2)) + "]";
  return s + "}";
}

// Words of dev[0..n) that differ from want(j), read back to the host; -1 if the copy failed.
template <typename Want>
long long count_bad(const u32* dev, size_t n, Want want, cudaError_t* copy_rc = nullptr) {
  std::vector<u32> h(n);
  const cudaError_t rc = cudaMemcpy(h.data(), dev, n * 4, cudaMemcpyDeviceToHost);
  if (copy_rc) *copy_rc = rc;
  if (rc != cudaSuccess) return -1;
  long long bad = 0;
  for (size_t j = 0; j < n; ++j) bad += h[j] != want(u32(j));
  return bad;
}

// ---- Processes ---------------------------------------------------------------------------------
struct Child {
  pid_t pid = -1;
  int to = -1;    // commands to the child, a line each
  int from = -1;  // its result lines
  std::string buf;
  std::string status;  // how it ended: "exit 0", "signal 11", "killed after timeout"
};

// Starts this program again in `role` with `args`; with_cupool false: without LD_PRELOAD.
Child spawn(const std::vector<std::string>& args, bool with_cupool) {
  int down[2], up[2];
  if (pipe(down) != 0 || pipe(up) != 0) {
    std::perror("pipe");
    std::exit(3);
  }
  fcntl(down[1], F_SETFD, FD_CLOEXEC);
  fcntl(up[0], F_SETFD, FD_CLOEXEC);
  std::vector<std::string> all = {"simple_ipc"};
  all.insert(all.end(), args.begin(), args.end());
  all.push_back(std::to_string(down[0]));
  all.push_back(std::to_string(up[1]));
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (char** e = environ; *e; ++e)
    if (with_cupool || std::strncmp(*e, "LD_PRELOAD=", 11) != 0) envp.push_back(*e);
  envp.push_back(nullptr);
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    execve("/proc/self/exe", argv.data(), envp.data());
    _exit(127);
  }
  close(down[0]);
  close(up[1]);
  Child c;
  c.pid = pid;
  c.to = down[1];
  c.from = up[0];
  return c;
}

void send(Child& c, const std::string& line) {
  const std::string s = line + "\n";
  if (c.to >= 0 && write(c.to, s.data(), s.size()) != ssize_t(s.size())) std::fprintf(stderr, "simple_ipc: a child went away\n");
}

// The child's next line; "" if it ended or did not answer within the timeout.
std::string read_line(Child& c, int timeout_ms = kTimeoutMs) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    const size_t nl = c.buf.find('\n');
    if (nl != std::string::npos) {
      std::string line = c.buf.substr(0, nl);
      c.buf.erase(0, nl + 1);
      return line;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0 || c.from < 0) return "";
    pollfd p{c.from, POLLIN, 0};
    if (poll(&p, 1, int(left)) <= 0) continue;
    char b[4096];
    const ssize_t n = read(c.from, b, sizeof b);
    if (n <= 0) {
      close(c.from);
      c.from = -1;
      return "";
    }
    c.buf.append(b, size_t(n));
  }
}

// Waits for the child to end (killing it after the timeout); its status as text.
std::string finish(Child& c, int timeout_ms = kTimeoutMs) {
  if (c.to >= 0) close(c.to), c.to = -1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  int st = 0;
  for (;;) {
    const pid_t r = waitpid(c.pid, &st, WNOHANG);
    if (r == c.pid) break;
    if (r < 0) return c.status = "waitpid failed";
    if (std::chrono::steady_clock::now() > deadline) {
      kill(c.pid, SIGKILL);
      waitpid(c.pid, &st, 0);
      c.status = "killed after timeout";
      if (c.from >= 0) close(c.from), c.from = -1;
      return c.status;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (c.from >= 0) close(c.from), c.from = -1;
  return c.status = WIFEXITED(st) ? "exit " + std::to_string(WEXITSTATUS(st))
                                  : WIFSIGNALED(st) ? "signal " + std::to_string(WTERMSIG(st)) : "ended";
}

std::string quoted(const std::string& s) {
  std::string q = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') q += '\\';
    if (static_cast<unsigned char>(ch) >= 0x20) q += ch;
  }
  return q + "\"";
}

// A child's JSON result line, or a JSON string saying that none came.
std::string result_or(const std::string& line, const char* what) {
  return !line.empty() && line[0] == '{' ? line : quoted(std::string("no answer: ") + what);
}

// ---- Child roles (each gets its command and result pipes as the last two arguments) -----------
struct Pipes {
  int in, out;
  void say(const std::string& s) const {
    const std::string l = s + "\n";
    if (write(out, l.data(), l.size()) < 0) _exit(4);
  }
  std::string wait_for() const {  // the parent's next command line
    std::string line;
    char ch;
    while (read(in, &ch, 1) == 1 && ch != '\n') line += ch;
    return line;
  }
};

void* open_handle(const std::string& hex_handle, cudaError_t* rc) {
  cudaIpcMemHandle_t h{};
  void* p = nullptr;
  *rc = unhex(hex_handle, &h) ? cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess) : cudaErrorInvalidValue;
  return *rc == cudaSuccess ? p : nullptr;
}

// The driver API's open and close (cuIpcOpenMemHandle / cuIpcCloseMemHandle), their results as
// the runtime's: cudaError_t and CUresult share these codes' meaning but not always their number,
// so the name printed is the driver's.
std::string drv_str(CUresult rc) {
  const char* name = nullptr;
  cuGetErrorName(rc, &name);
  return "{\"rc\": " + std::to_string(int(rc)) + ", \"name\": \"" + (name ? name : "?") + "\", \"api\": \"driver\"}";
}

// simple: child i sees the parent's fill over its part, writes its part by a kernel, closes.
// Odd children open and close through the driver API, even ones through the runtime's.
int role_simple(const Pipes& io, const std::string& h, u32 i) {
  cudaError_t open_rc = cudaSuccess;
  u32* p = nullptr;
  std::string open_s;
  const bool driver = i % 2 == 1;
  if (driver) {
    cudaIpcMemHandle_t rh{};
    CUipcMemHandle dh{};
    CUdeviceptr d = 0;
    CUresult r = unhex(h, &rh) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    std::memcpy(&dh, &rh, sizeof dh);
    if (r == CUDA_SUCCESS) r = cuIpcOpenMemHandle(&d, dh, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    open_s = drv_str(r);
    p = r == CUDA_SUCCESS ? reinterpret_cast<u32*>(d) : nullptr;
  } else {
    p = static_cast<u32*>(open_handle(h, &open_rc));
    open_s = err_str(open_rc);
  }
  std::string out = "{\"child\": " + std::to_string(i) + ", \"pid\": " + std::to_string(getpid()) + ", \"open\": " + open_s;
  if (p) {
    const size_t begin = i * kPerChild;
    out += ", \"ptr\": " + ptr_str(p) + ", \"driver\": " + driver_view(p);
    out += ", \"fill_bad\": " + std::to_string(count_bad(p + begin, kPerChild, [](u32) { return 0xffffffffu; }));
    out += ", \"kernel\": " + err_str(write_simple(p, i, begin, kPerChild));
    out += ", \"close\": " + (driver ? drv_str(cuIpcCloseMemHandle(reinterpret_cast<CUdeviceptr>(p)))
                                   : err_str(cudaIpcCloseMemHandle(p)));
  }
  io.say(out + "}");
  return 0;
}

// double: open, close, close again.
int role_double(const Pipes& io, const std::string& h) {
  cudaError_t open_rc;
  void* p = open_handle(h, &open_rc);
  std::string out = "{\"open\": " + err_str(open_rc);
  if (p) {
    out += ", \"close1\": " + err_str(cudaIpcCloseMemHandle(p));
    out += ", \"close2\": " + err_str(cudaIpcCloseMemHandle(p));
    cudaGetLastError();
    out += ", \"sync_after\": " + err_str(cudaDeviceSynchronize());
  }
  io.say(out + "}");
  return 0;
}

// freed (importer): opens, waits while the parent frees, writes B, waits while the parent
// allocates and fills anew, checks B is still there, closes.
int role_freed(const Pipes& io, const std::string& h) {
  cudaError_t open_rc;
  auto* p = static_cast<u32*>(open_handle(h, &open_rc));
  std::string out = "{\"open\": " + err_str(open_rc) + ", \"pid\": " + std::to_string(getpid());
  if (!p) {
    io.say(out + "}");
    return 0;
  }
  out += ", \"ptr\": " + ptr_str(p) + ", \"driver\": " + driver_view(p);
  out += ", \"fill_bad\": " + std::to_string(count_bad(p, kLifeWords, [](u32) { return 0xa1a1a1a1u; }));
  io.say(out + "}");
  std::string cmd = io.wait_for();  // "freed"
  out = "{\"after_free_bad\": " + std::to_string(count_bad(p, kLifeWords, [](u32) { return 0xa1a1a1a1u; }));
  out += ", \"write\": " + err_str(fill(p, kLifeWords, 'B'));
  out += ", \"written_bad\": " + std::to_string(count_bad(p, kLifeWords, b_word)) + "}";
  io.say(out);
  cmd = io.wait_for();  // "overwritten"
  out = "{\"kept_bad\": " + std::to_string(count_bad(p, kLifeWords, b_word));
  out += ", \"close\": " + err_str(cudaIpcCloseMemHandle(p)) + "}";
  io.say(out);
  return 0;
}

// orphan exporter: allocates one block and then the shared one, fills it with D, hands out its
// handle, and exits on the parent's word without freeing it.
int role_exporter(const Pipes& io) {
  void *first = nullptr, *p = nullptr;
  const cudaError_t a1 = cudaMalloc(&first, kFirstBytes), a2 = cudaMalloc(&p, kLifeWords * 4);
  std::string out = "{\"pid\": " + std::to_string(getpid()) + ", \"alloc\": [" + err_str(a1) + ", " + err_str(a2) + "]";
  cudaIpcMemHandle_t h{};
  cudaError_t get = cudaErrorInvalidValue;
  if (a1 == cudaSuccess && a2 == cudaSuccess) {
    out += ", \"first_ptr\": " + ptr_str(first) + ", \"ptr\": " + ptr_str(p) + ", \"driver\": " + driver_view(p);
    out += ", \"fill\": " + err_str(fill(static_cast<u32*>(p), kLifeWords, 'D'));
    get = cudaIpcGetMemHandle(&h, p);
  }
  out += ", \"get\": " + err_str(get) + ", \"handle\": \"" + (get == cudaSuccess ? hex(&h, sizeof h) : "") + "\"}";
  io.say(out);
  io.wait_for();  // "exit"
  std::fflush(stdout);
  return 0;       // exits with the block still allocated and shared
}

// orphan importer: opens the exporter's block; after the exporter has exited, reads it and adds
// 1 to every word by a kernel.
int role_orphan(const Pipes& io, const std::string& h) {
  cudaError_t open_rc;
  auto* p = static_cast<u32*>(open_handle(h, &open_rc));
  std::string out = "{\"open\": " + err_str(open_rc) + ", \"pid\": " + std::to_string(getpid());
  if (p) {
    out += ", \"ptr\": " + ptr_str(p) + ", \"driver\": " + driver_view(p);
    out += ", \"fill_bad\": " + std::to_string(count_bad(p, kLifeWords, d_word));
  }
  io.say(out + "}");
  if (!p) return 0;
  io.wait_for();  // "check": the exporter has exited
  cudaError_t copy_rc = cudaSuccess;
  out = "{\"after_exit_bad\": " + std::to_string(count_bad(p, kLifeWords, d_word, &copy_rc));
  out += ", \"after_exit_copy\": " + err_str(copy_rc);
  out += ", \"write\": " + err_str(fill(p, kLifeWords, '+'));
  out += ", \"written_bad\": " + std::to_string(count_bad(p, kLifeWords, [](u32 j) { return d_word(j) + 1u; }));
  out += ", \"close\": " + err_str(cudaIpcCloseMemHandle(p)) + "}";
  io.say(out);
  return 0;
}

// plain (no cupool): opens the handle; if it opens, whether it shows child 0's words.
int role_plain(const Pipes& io, const std::string& h) {
  const char* pre = std::getenv("LD_PRELOAD");
  cudaError_t open_rc;
  auto* p = static_cast<u32*>(open_handle(h, &open_rc));
  std::string out = "{\"ld_preload\": " + quoted(pre ? pre : "") + ", \"open\": " + err_str(open_rc);
  if (p) {
    const long long bad = count_bad(p, 4096, [](u32 j) { return simple_word(0, j); });
    out += ", \"ptr\": " + ptr_str(p) + ", \"first_words_bad\": " + std::to_string(bad);
    out += ", \"close\": " + err_str(cudaIpcCloseMemHandle(p));
  }
  cudaGetLastError();
  out += ", \"sync_after\": " + err_str(cudaDeviceSynchronize()) + "}";
  io.say(out);
  return 0;
}

// ---- The parent ------------------------------------------------------------------------------
void print_case(const char* name, const std::string& body) {
  std::printf("{\"case\": \"%s\", %s}\n", name, body.c_str());
  std::fflush(stdout);
}

int parent(int n_children) {
  std::string facts = "\"check\": \"simple_ipc\", \"pid\": " + std::to_string(getpid());
  const char* pre = std::getenv("LD_PRELOAD");
  facts += ", \"ld_preload\": " + quoted(pre ? pre : "") + ", \"children\": " + std::to_string(n_children);
  if (cudaSetDevice(0) != cudaSuccess) {
    std::printf("{%s, \"error\": \"cudaSetDevice failed\"}\n", facts.c_str());
    return 1;
  }
  void *first = nullptr, *shared = nullptr;
  const size_t words = kPerChild * size_t(n_children);
  if (cudaMalloc(&first, kFirstBytes) != cudaSuccess || cudaMalloc(&shared, words * 4) != cudaSuccess ||
      cudaMemset(first, 0x11, kFirstBytes) != cudaSuccess || cudaMemset(shared, 0xff, words * 4) != cudaSuccess ||
      cudaDeviceSynchronize() != cudaSuccess) {
    std::printf("{%s, \"error\": \"allocation or fill failed\"}\n", facts.c_str());
    return 1;
  }
  facts += ", \"first_ptr\": " + ptr_str(first) + ", \"shared_ptr\": " + ptr_str(shared) +
           ", \"shared_bytes\": " + std::to_string(words * 4) + ", \"exporter_driver\": " + driver_view(shared);
  cudaIpcMemHandle_t h{};
  const cudaError_t get = cudaIpcGetMemHandle(&h, shared);
  facts += ", \"get\": " + err_str(get);
  const std::string hh = hex(&h, sizeof h);
  // The driver API's handle of the same block (the odd children open the runtime's through the
  // driver API): whether it is the same 64 bytes is recorded, not required.
  CUipcMemHandle dh{};
  const CUresult dget = cuIpcGetMemHandle(&dh, reinterpret_cast<CUdeviceptr>(shared));
  facts += ", \"driver_get\": " + drv_str(dget) +
           ", \"driver_handle_same\": " + (dget == CUDA_SUCCESS && !std::memcmp(&dh, &h, sizeof dh) ? "true" : "false");

  if (get == cudaSuccess) {
    // simple: N children at once.
    std::vector<Child> kids;
    for (int i = 0; i < n_children; ++i) kids.push_back(spawn({"simple", hh, std::to_string(i)}, true));
    std::string res = "\"results\": [";
    for (int i = 0; i < n_children; ++i) {
      const std::string line = read_line(kids[i]);
      res += (i ? ", " : "") + result_or(line, "simple child");
    }
    res += "], \"exits\": [";
    for (int i = 0; i < n_children; ++i) res += (i ? ", \"" : "\"") + finish(kids[i]) + "\"";
    long long bad = -2;
    {
      std::vector<u32> host(words);
      if (cudaMemcpy(host.data(), shared, words * 4, cudaMemcpyDeviceToHost) == cudaSuccess) {
        bad = 0;
        for (size_t j = 0; j < words; ++j) bad += host[j] != simple_word(u32(j / kPerChild), u32(j));
      }
    }
    res += "], \"bad_words\": " + std::to_string(bad);
    print_case("simple", res);
    facts += ", \"simple\": {" + res + "}";

    // double close.
    Child d = spawn({"double", hh}, true);
    const std::string dl = read_line(d);
    const std::string ds = finish(d);
    print_case("double", "\"result\": " + result_or(dl, "double") + ", \"exit\": \"" + ds + "\"");
    facts += ", \"double\": {\"result\": " + result_or(dl, "double") + ", \"exit\": \"" + ds + "\"}";

    // plain importer, without cupool.
    Child pl = spawn({"plain", hh}, false);
    const std::string pll = read_line(pl);
    const std::string pls = finish(pl);
    print_case("plain", "\"result\": " + result_or(pll, "plain") + ", \"exit\": \"" + pls + "\"");
    facts += ", \"plain\": {\"result\": " + result_or(pll, "plain") + ", \"exit\": \"" + pls + "\"}";
  }

  // freed: the exporter frees while the importer maps.
  {
    void* blk = nullptr;
    std::string res;
    cudaIpcMemHandle_t fh{};
    cudaError_t fget = cudaErrorMemoryAllocation;
    if (cudaMalloc(&blk, kLifeWords * 4) == cudaSuccess && cudaMemset(blk, 0xa1, kLifeWords * 4) == cudaSuccess &&
        cudaDeviceSynchronize() == cudaSuccess)
      fget = cudaIpcGetMemHandle(&fh, blk);
    res = "\"ptr\": " + ptr_str(blk) + ", \"exporter_driver\": " + driver_view(blk) + ", \"get\": " + err_str(fget);
    if (fget == cudaSuccess) {
      Child c = spawn({"freed", hex(&fh, sizeof fh)}, true);
      const std::string opened = read_line(c);
      res += ", \"opened\": " + result_or(opened, "freed open");
      res += ", \"free\": " + err_str(cudaFree(blk));
      res += ", \"sync_after_free\": " + err_str(cudaDeviceSynchronize());
      send(c, "freed");
      const std::string written = read_line(c);
      res += ", \"written\": " + result_or(written, "freed write");
      void* next = nullptr;
      const cudaError_t na = cudaMalloc(&next, kLifeWords * 4);
      res += ", \"next_alloc\": " + err_str(na);
      if (na == cudaSuccess) {
        res += ", \"next_ptr\": " + ptr_str(next) + ", \"next_same_address\": " + (next == blk ? "true" : "false");
        // Words of the importer's write that the exporter's new block shows (never expected).
        const long long differ = count_bad(static_cast<u32*>(next), kLifeWords, b_word);
        res += ", \"next_sees_importer_words\": " + std::to_string(differ < 0 ? -1 : (long long)kLifeWords - differ);
        cudaMemset(next, 0xc3, kLifeWords * 4);
        cudaDeviceSynchronize();
      }
      send(c, "overwritten");
      const std::string kept = read_line(c);
      res += ", \"kept\": " + result_or(kept, "freed keep");
      res += ", \"exit\": \"" + finish(c) + "\"";
      if (na == cudaSuccess) {
        res += ", \"next_after_close_bad\": " +
               std::to_string(count_bad(static_cast<u32*>(next), kLifeWords, [](u32) { return 0xc3c3c3c3u; }));
        cudaFree(next);
      }
    } else if (blk) {
      cudaFree(blk);
    }
    print_case("freed", res);
    facts += ", \"freed\": {" + res + "}";
  }

  // orphan: the exporter (another process) exits while the importer maps.
  {
    Child e = spawn({"exporter"}, true);
    const std::string el = read_line(e);
    std::string res = "\"exporter\": " + result_or(el, "exporter");
    const size_t at = el.find("\"handle\": \"");
    const std::string eh = at == std::string::npos ? "" : el.substr(at + 11, 128);
    if (eh.size() == 128 && eh.find('"') == std::string::npos) {
      Child im = spawn({"orphan", eh}, true);
      const std::string opened = read_line(im);
      res += ", \"opened\": " + result_or(opened, "orphan open");
      send(e, "exit");
      res += ", \"exporter_exit\": \"" + finish(e) + "\"";
      send(im, "check");
      const std::string checked = read_line(im);
      res += ", \"checked\": " + result_or(checked, "orphan check") + ", \"importer_exit\": \"" + finish(im) + "\"";
    } else {
      res += ", \"exporter_exit\": \"" + finish(e) + "\"";
    }
    print_case("orphan", res);
    facts += ", \"orphan\": {" + res + "}";
  }

  // Nothing else of the parent's changed.
  facts += ", \"first_bad\": " + std::to_string(count_bad(static_cast<u32*>(first), kFirstBytes / 4, [](u32) { return 0x11111111u; }));
  cudaFree(shared);
  cudaFree(first);
  std::printf("{%s}\n", facts.c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string role = argc > 1 ? argv[1] : "";
  if (role.empty() || std::isdigit(static_cast<unsigned char>(role[0])))
    return parent(role.empty() ? 4 : std::max(1, std::atoi(role.c_str())));
  if (argc < 4) {
    std::fprintf(stderr, "usage: simple_ipc [N]   (the other roles are started by the parent)\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  const Pipes io{std::atoi(argv[argc - 2]), std::atoi(argv[argc - 1])};
  cudaSetDevice(0);
  cudaFree(nullptr);  // the primary context, current on this thread for the driver API's calls
  if (role == "simple" && argc == 6) return role_simple(io, argv[2], u32(std::atoi(argv[3])));
  if (role == "double" && argc == 5) return role_double(io, argv[2]);
  if (role == "freed" && argc == 5) return role_freed(io, argv[2]);
  if (role == "exporter" && argc == 4) return role_exporter(io);
  if (role == "orphan" && argc == 5) return role_orphan(io, argv[2]);
  if (role == "plain" && argc == 5) return role_plain(io, argv[2]);
  std::fprintf(stderr, "simple_ipc: unknown role %s\n", role.c_str());
  return 2;
}
