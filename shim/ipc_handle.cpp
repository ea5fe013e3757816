// CUDA IPC handles of pool blocks (ipc_handle.h): writing and reading a block's place in its
// chunk in the handle's last bytes.
#include "ipc_handle.h"

#include <cstring>

namespace cupool::ipc {

namespace {
constexpr std::size_t kPlaceAt = 56;     // 8 bytes the driver leaves zero
constexpr std::size_t kCheckedByte = 48;  // a byte the driver validates (probed on the H200)
constexpr unsigned char kScramble = 0xA5;
constexpr std::uint64_t kMagic = 0xC;     // top nibble of the place word
constexpr unsigned kUnitShift = 8;         // offsets and sizes in 256-byte units
constexpr unsigned kFieldBits = 30;        // per field: up to 256 GiB
constexpr std::uint64_t kFieldMask = (std::uint64_t{1} << kFieldBits) - 1;
}  // namespace

EncodeResult encode(unsigned char* handle, const BlockPlace& place) {
  std::uint64_t word = 0;
  std::memcpy(&word, handle + kPlaceAt, sizeof word);
  if (word != 0) return EncodeResult::driver_uses_bytes;
  const std::uint64_t unit = std::uint64_t{1} << kUnitShift;
  const std::uint64_t off = place.offset >> kUnitShift, size = place.size >> kUnitShift;
  if (place.size == 0 || place.offset % unit != 0 || place.size % unit != 0 || off > kFieldMask || size > kFieldMask)
    return EncodeResult::does_not_fit;
  word = kMagic << 60 | off << kFieldBits | size;
  std::memcpy(handle + kPlaceAt, &word, sizeof word);
  if (place.offset != 0) handle[kCheckedByte] ^= kScramble;
  return EncodeResult::written;
}

bool decode(unsigned char* handle, BlockPlace* place) {
  std::uint64_t word = 0;
  std::memcpy(&word, handle + kPlaceAt, sizeof word);
  if (word >> 60 != kMagic) return false;
  place->offset = ((word >> kFieldBits) & kFieldMask) << kUnitShift;
  place->size = (word & kFieldMask) << kUnitShift;
  std::memset(handle + kPlaceAt, 0, sizeof word);
  if (place->offset != 0) handle[kCheckedByte] ^= kScramble;
  return true;
}

void ImportedBlocks::opened(std::uint64_t block, std::uint64_t chunk_base, std::uint64_t size) {
  std::lock_guard g(mu_);
  auto [it, added] = blocks_.try_emplace(block, Entry{chunk_base, size, 0});
  ++it->second.opens;
  count_.store(blocks_.size(), std::memory_order_release);
}

bool ImportedBlocks::chunk_of(std::uint64_t block, std::uint64_t* chunk_base) const {
  std::lock_guard g(mu_);
  auto it = blocks_.find(block);
  if (it == blocks_.end()) return false;
  *chunk_base = it->second.chunk_base;
  return true;
}

void ImportedBlocks::closed(std::uint64_t block) {
  std::lock_guard g(mu_);
  auto it = blocks_.find(block);
  if (it == blocks_.end()) return;
  if (--it->second.opens == 0) blocks_.erase(it);
  count_.store(blocks_.size(), std::memory_order_release);
}

bool ImportedBlocks::range(std::uint64_t ptr, std::uint64_t* start, std::uint64_t* size) const {
  std::lock_guard g(mu_);
  auto it = blocks_.upper_bound(ptr);
  if (it == blocks_.begin()) return false;
  --it;
  if (ptr - it->first >= it->second.size) return false;
  *start = it->first;
  *size = it->second.size;
  return true;
}

}  // namespace cupool::ipc
