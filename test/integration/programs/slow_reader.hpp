// The "kernel" of the in-flight safety programs: a host function on a stream that reads a buffer
// ~100 ms after it starts, while the host frees the buffer, allocates the same size and fills it
// with another pattern. It records whether it still saw the original pattern.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <thread>

namespace prog {

constexpr size_t kSlowReadBytes = 4 << 20;
constexpr unsigned char kOriginalByte = 0xa5;

struct SlowRead {
    const unsigned char* p;
    std::atomic<int> saw_original{-1};  // -1 until it has read
};

// For cudaLaunchHostFunc(stream, slow_read, &args).
inline void CUDART_CB slow_read(void* u) {
    auto* a = static_cast<SlowRead*>(u);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    bool ok = true;
    for (size_t i = 0; i < kSlowReadBytes; i += 64) ok &= a->p[i] == kOriginalByte;
    ok &= a->p[kSlowReadBytes - 1] == kOriginalByte;
    a->saw_original = ok ? 1 : 0;
}

}  // namespace prog
