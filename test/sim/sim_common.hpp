// Shared bits of the simulated CUDA driver (libcuda.so.1) used by the CI tests.
#pragma once

#include <cctype>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

namespace cupool_sim {

// Parses "123", "4KiB", "16GiB", "512M", "2g" ... into bytes (binary units). Returns fallback on error.
inline uint64_t parse_bytes(const char* s, uint64_t fallback) {
    if (s == nullptr || *s == '\0') return fallback;
    char* end = nullptr;
    errno = 0;
    unsigned long long v = std::strtoull(s, &end, 10);
    if (end == s || errno != 0) return fallback;
    std::string suf(end);
    while (!suf.empty() && suf.front() == ' ') suf.erase(suf.begin());
    for (auto& c : suf) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    uint64_t mul = 1;
    if (suf.empty() || suf == "b") mul = 1;
    else if (suf == "k" || suf == "kb" || suf == "kib") mul = 1ull << 10;
    else if (suf == "m" || suf == "mb" || suf == "mib") mul = 1ull << 20;
    else if (suf == "g" || suf == "gb" || suf == "gib") mul = 1ull << 30;
    else if (suf == "t" || suf == "tb" || suf == "tib") mul = 1ull << 40;
    else return fallback;
    return static_cast<uint64_t>(v) * mul;
}

inline long env_long(const char* name, long fallback) {
    const char* s = std::getenv(name);
    if (s == nullptr || *s == '\0') return fallback;
    char* end = nullptr;
    long v = std::strtol(s, &end, 10);
    return end == s ? fallback : v;
}

constexpr size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

// The UUID of simulated device `ordinal`: what cuDeviceGetUuid(_v2) gives and what the simulated
// NVML spells out ("GPU-" and 8-4-4-4-12 hex digits), so that both name a device alike.
inline void device_uuid(int ordinal, unsigned char out[16]) {
    static const unsigned char base[16] = {0x5c, 0x00, 0x01, 0xc0, 0x51, 0xd0, 0x4e, 0x7a,
                                           0x9b, 0x3e, 0x60, 0x11, 0xa2, 0x00, 0x00, 0x00};
    std::memcpy(out, base, 16);
    out[15] = static_cast<unsigned char>(ordinal);
}

// Layout of the 64-byte CUipcMemHandle produced by the simulated driver.
struct IpcHandle {
    uint32_t magic;     // kIpcMagic
    int32_t pid;        // exporting process
    int32_t fd;         // memfd in the exporting process (open /proc/<pid>/fd/<fd>)
    int32_t device;     // device ordinal of the allocation
    uint64_t offset;    // always 0: a handle names the whole allocation, as the driver's does
    uint64_t size;      // size of the whole allocation (its mapping)
    uint64_t base;      // allocation base in the exporter (identification only)
    uint64_t buffer_id; // unique id of the allocation in the exporter
};
static_assert(sizeof(IpcHandle) <= 64);
constexpr uint32_t kIpcMagic = 0x4d535043; // "CPSM"

} // namespace cupool_sim
