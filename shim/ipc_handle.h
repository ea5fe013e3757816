// CUDA IPC of pool blocks. The driver shares whole allocations: on the H200 (driver 580) a handle
// taken at any address inside an allocation is that allocation's handle, and it opens at the
// allocation's base. A pool block is a piece of a chunk, so the exporting cupool writes the
// block's place in its chunk into bytes 56..63 of the 64-byte handle (the driver leaves them zero
// and does not read them), and the importing cupool opens the chunk and returns the block.
// For a block that does not start its chunk it also scrambles byte 48, which the driver does
// check, so that a process without cupool gets an invalid-handle error instead of the chunk's
// start: the wrong memory.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

namespace cupool::ipc {

constexpr std::size_t kHandleBytes = 64;  // CUipcMemHandle and cudaIpcMemHandle_t

struct BlockPlace {
  std::uint64_t offset = 0;  // block start - chunk start
  std::uint64_t size = 0;    // the block's bytes
};

// Writes the place into a handle the driver made; otherwise leaves the handle untouched and
// says why: the driver's bytes there are not zero (seen on the H200 for a 42 GB allocation), or
// the place does not fit (offset and size multiples of 256, each below 256 GiB).
enum class EncodeResult { written, driver_uses_bytes, does_not_fit };
EncodeResult encode(unsigned char* handle, const BlockPlace& place);
// True if the handle carries a place: then it is restored, in place, to the driver's handle.
bool decode(unsigned char* handle, BlockPlace* place);

// The importer's side: blocks opened from such handles, so that closing one closes its chunk's
// mapping and range queries inside it answer with the block. The driver counts opens of one
// handle in a process (both get the same base), so every open and close is passed on.
class ImportedBlocks {
 public:
  void opened(std::uint64_t block, std::uint64_t chunk_base, std::uint64_t size);
  // The chunk base to close for a block pointer this process opened; false if it is not one.
  bool chunk_of(std::uint64_t block, std::uint64_t* chunk_base) const;
  void closed(std::uint64_t block);  // after the driver closed one open of it
  // The imported block holding `ptr`, if any.
  bool range(std::uint64_t ptr, std::uint64_t* start, std::uint64_t* size) const;
  bool empty() const { return count_.load(std::memory_order_acquire) == 0; }  // no lock: range queries ask first

 private:
  struct Entry {
    std::uint64_t chunk_base, size, opens;
  };
  mutable std::mutex mu_;
  std::map<std::uint64_t, Entry> blocks_;  // by block start
  std::atomic<std::size_t> count_{0};      // blocks_.size()
};

}  // namespace cupool::ipc
