// CUDA IPC of vmm blocks (docs/design.md, "IPC of vmm blocks"): the 64-byte handle cupool writes
// for a block of the vmm policy, and the pure rules the exporter's socket server and the importer
// share (its name, the messages' checks). The driver has no handle for such memory, so the handle
// names the exporting process (pid and a random nonce: a recycled pid does not match), an export
// id, and the block's place; the importer asks the exporter for the granules' file descriptors.
// No CUDA and no sockets here: shim/ipc_vmm.cpp does the calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace cupool::ipc {

struct VmmHandle {
  std::uint32_t pid = 0;        // the exporter
  std::uint64_t nonce = 0;      // random per exporting process (per fork too)
  std::uint64_t export_id = 0;  // the exporter's name for the shared block
  std::uint64_t offset = 0;     // block start - its first granule's start
  std::uint64_t size = 0;       // the block's bytes
  std::int32_t device = 0;      // the exporter's device ordinal
};

// Writes all 64 bytes. Byte 48 holds a value the H200's driver refuses there (a flipped byte 48
// of a valid handle is CUDA_ERROR_INVALID_HANDLE: docs/design.md, "CUDA IPC of pool blocks"), and
// bytes 0..3 are not the simulator's marker, so a process without cupool gets an error. Bytes
// 56..63 stay zero: decode() of a growth block's place (ipc_handle.h) does not take it for one.
void encode_vmm(unsigned char* handle, const VmmHandle& h);
// True if the 64 bytes are such a handle (its magic, version and checksum hold, the place is sane).
bool decode_vmm(const unsigned char* handle, VmmHandle* h);

// The exporter's abstract Unix socket name, without the leading NUL (so no file to plant or
// clean up, and gone with the process).
std::string vmm_socket_name(std::uint32_t pid, std::uint64_t nonce);

// What a reply may say about the granules behind a block, checked before anything is mapped: the
// granule a power of two from 4 KiB to 1 GiB, the block inside its first granule's offset and
// `count` granules, count = what covers offset + size, and the whole below 1 TiB.
bool vmm_layout_sane(std::uint64_t granule, std::uint64_t count, std::uint64_t offset, std::uint64_t size);

// The wire: the importer's request, the exporter's reply, then batches of descriptors, each a
// BatchHeader with SCM_RIGHTS. Fixed sizes, little-endian hosts on both ends (one machine).
constexpr std::uint32_t kWireMagic = 0x43505649;  // "IVPC"
constexpr std::uint32_t kWireVersion = 1;
constexpr std::uint32_t kMaxFdsPerBatch = 64;      // below SCM_MAX_FD (253), and few open at once
struct WireRequest {
  std::uint32_t magic = kWireMagic;
  std::uint32_t version = kWireVersion;
  std::uint64_t nonce = 0;
  std::uint64_t export_id = 0;
};
enum class WireStatus : std::uint32_t { ok = 0, unknown_export = 1, failed = 2 };
struct WireReply {
  std::uint32_t magic = kWireMagic;
  WireStatus status = WireStatus::failed;
  std::uint64_t granule = 0;
  std::uint64_t count = 0;
  std::uint64_t offset = 0;
  std::uint64_t size = 0;
};
struct BatchHeader {
  std::uint32_t magic = kWireMagic;
  std::uint32_t first = 0;  // index of the batch's first granule
  std::uint32_t n = 0;      // descriptors in this batch
  std::uint32_t pad = 0;
};

}  // namespace cupool::ipc
