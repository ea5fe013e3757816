// The vmm block's IPC handle and the socket rules (ipc_vmm_handle.h).
#include "ipc_vmm_handle.h"

#include <fmt/format.h>

#include <cstring>

namespace cupool::ipc {

namespace {
constexpr std::uint32_t kMagic = 0x564D4350;    // "PCMV" at byte 0
constexpr std::uint32_t kVersion = 1;
constexpr std::size_t kRefusedByte = 48;
constexpr unsigned char kRefusedValue = 0x4E;   // 0xEB (the H200's value) ^ 0xA5: refused there
// Layout: 0 magic, 4 version, 8 pid, 12 device, 16 nonce, 24 export id, 32 offset, 40 size,
// 48 the refused byte, 49..51 zero, 52 checksum, 56..63 zero.
constexpr std::size_t kChecksumAt = 52;

std::uint32_t checksum(const unsigned char* h) {  // FNV-1a over bytes 0..51
  std::uint32_t x = 2166136261u;
  for (std::size_t i = 0; i < kChecksumAt; ++i) x = (x ^ h[i]) * 16777619u;
  return x;
}
template <typename T>
void put(unsigned char* h, std::size_t at, T v) {
  std::memcpy(h + at, &v, sizeof v);
}
template <typename T>
T get(const unsigned char* h, std::size_t at) {
  T v;
  std::memcpy(&v, h + at, sizeof v);
  return v;
}
}  // namespace

void encode_vmm(unsigned char* h, const VmmHandle& v) {
  std::memset(h, 0, 64);
  put(h, 0, kMagic);
  put(h, 4, kVersion);
  put(h, 8, v.pid);
  put(h, 12, v.device);
  put(h, 16, v.nonce);
  put(h, 24, v.export_id);
  put(h, 32, v.offset);
  put(h, 40, v.size);
  h[kRefusedByte] = kRefusedValue;
  put(h, kChecksumAt, checksum(h));
}

bool decode_vmm(const unsigned char* h, VmmHandle* v) {
  if (get<std::uint32_t>(h, 0) != kMagic || get<std::uint32_t>(h, 4) != kVersion) return false;
  if (h[kRefusedByte] != kRefusedValue || get<std::uint32_t>(h, kChecksumAt) != checksum(h)) return false;
  for (std::size_t i = 56; i < 64; ++i)
    if (h[i] != 0) return false;
  VmmHandle out;
  out.pid = get<std::uint32_t>(h, 8);
  out.device = get<std::int32_t>(h, 12);
  out.nonce = get<std::uint64_t>(h, 16);
  out.export_id = get<std::uint64_t>(h, 24);
  out.offset = get<std::uint64_t>(h, 32);
  out.size = get<std::uint64_t>(h, 40);
  if (out.pid == 0 || out.size == 0 || out.device < 0) return false;
  *v = out;
  return true;
}

std::string vmm_socket_name(std::uint32_t pid, std::uint64_t nonce) {
  return fmt::format("cupool-ipc-{}-{:016x}", pid, nonce);
}

bool vmm_layout_sane(std::uint64_t granule, std::uint64_t count, std::uint64_t offset, std::uint64_t size) {
  if (granule < 4096 || granule > (1ull << 30) || (granule & (granule - 1)) != 0) return false;
  if (size == 0 || offset >= granule || size > (1ull << 40)) return false;
  const std::uint64_t need = (offset + size + granule - 1) / granule;
  return count == need;
}

}  // namespace cupool::ipc
