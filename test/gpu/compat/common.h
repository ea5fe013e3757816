// Shared helpers of the compatibility programs (test/gpu/compat/README.md).
//
// Output rules every program follows, so that run_compat.py can compare a run without cupool
// with runs under it:
//   - stdout holds only deterministic lines: no addresses, timings or memory-info numbers;
//   - a line starting with '#' is informational and is not compared (reuse details, timings);
//   - the last line is the verdict: {"program": "...", "verdict": "ok"|"fail", ...counts};
//     a program whose checks all pass exits 0, otherwise 1; a CUDA call that fails where it must
//     not prints the call and its error, a "fail" verdict, and exits 2.
#pragma once

#include <cuda_runtime.h>

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace compat {

inline const char*& program_name() {
  static const char* name = "unknown";
  return name;
}

// Keys and values of the verdict line, in the order they were added.
class Verdict {
 public:
  explicit Verdict(const char* program) { program_name() = program; }
  void add(const char* key, long long v) { items_.emplace_back(key, std::to_string(v)); }
  void add_str(const char* key, const std::string& v) { items_.emplace_back(key, quote(v)); }
  // Prints the verdict line and returns the exit status: 0 when ok.
  int finish(bool ok) const {
    std::string line = std::string("{\"program\": ") + quote(program_name()) + ", \"verdict\": " + (ok ? "\"ok\"" : "\"fail\"");
    for (const auto& kv : items_) line += ", " + quote(kv.first) + ": " + kv.second;
    line += "}";
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    return ok ? 0 : 1;
  }
  static std::string quote(const std::string& s) {
    std::string r = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') r += '\\';
      if (static_cast<unsigned char>(c) < 0x20) c = ' ';
      r += c;
    }
    return r + "\"";
  }

 private:
  std::vector<std::pair<std::string, std::string>> items_;
};

// A check that cannot go on: say what and where, print a failing verdict, exit 2.
[[noreturn]] inline void die(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::fflush(stdout);
  std::fprintf(stderr, "%s: FATAL: %s\n", program_name(), buf);
  std::printf("FATAL: %s\n", buf);
  std::printf("{\"program\": %s, \"verdict\": \"fail\", \"fatal\": %s}\n", Verdict::quote(program_name()).c_str(),
              Verdict::quote(buf).c_str());
  std::fflush(stdout);
  std::exit(2);
}

inline void check_rt(cudaError_t e, const char* what, const char* file, int line) {
  if (e != cudaSuccess) die("%s returned %s (%s:%d)", what, cudaGetErrorName(e), file, line);
}

}  // namespace compat

// A runtime call that must succeed.
#define CK(x) ::compat::check_rt((x), #x, __FILE__, __LINE__)
// The kernel just launched must have been accepted.
#define CK_LAUNCH() ::compat::check_rt(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

// Device time since an arbitrary origin, in nanoseconds (wall clock of the GPU).
__device__ __forceinline__ unsigned long long compat_globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Every block's thread 0 waits `spin_ns` of wall-clock time, then the block reads its share of
// p[0..n) and counts the words that are not `expect` into *bad. Launched with few blocks, so that
// work on other streams (a memset overwriting p) can run while it waits.
__global__ void compat_slow_check(const unsigned* p, size_t n, unsigned expect, unsigned long long spin_ns,
                                  unsigned long long* bad) {
  if (threadIdx.x == 0) {
    unsigned long long t0 = compat_globaltimer();
    while (compat_globaltimer() - t0 < spin_ns) {
    }
  }
  __syncthreads();
  unsigned long long mine = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    unsigned v = __ldcv(p + i);  // straight from memory, never a stale cached line
    mine += (v != expect);
  }
  if (mine) atomicAdd(bad, mine);
}

__global__ void compat_fill_u32(unsigned* p, size_t n, unsigned v) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    p[i] = v;
}
