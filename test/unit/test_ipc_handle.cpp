// The IPC handle codec and the importer's bookkeeping (docs/design.md, "CUDA IPC of pool blocks"),
// and the vmm blocks' handle and reply checks ("IPC of vmm blocks").
#include <catch2/catch.hpp>

#include <array>
#include <cstring>

#include "ipc_handle.h"
#include "ipc_vmm_handle.h"

using namespace cupool::ipc;

namespace {
// A handle as the H200's driver (580) makes one: bytes 56..63 zero.
std::array<unsigned char, kHandleBytes> driver_handle() {
  std::array<unsigned char, kHandleBytes> h{};
  for (std::size_t i = 0; i < 56; ++i) h[i] = static_cast<unsigned char>(0x11 * (i % 13) + 1);
  return h;
}
}  // namespace

TEST_CASE("ipc: a block's place round-trips and the driver's handle comes back exactly", "[ipc]") {
  for (const BlockPlace place : {BlockPlace{0, 256}, BlockPlace{1 << 20, 4 << 20}, BlockPlace{(255ull << 30), 256ull << 20},
                                 BlockPlace{((1ull << 38) - 256), (1ull << 38) - 256}}) {
    const auto original = driver_handle();
    auto h = original;
    REQUIRE(encode(h.data(), place) == EncodeResult::written);
    CHECK(h != original);
    // Interior blocks: a byte the driver checks is changed, so a process without cupool cannot
    // open the handle at the chunk's start by mistake.
    CHECK((h[48] != original[48]) == (place.offset != 0));
    BlockPlace got;
    REQUIRE(decode(h.data(), &got));
    CHECK(got.offset == place.offset);
    CHECK(got.size == place.size);
    CHECK(h == original);
  }
}

TEST_CASE("ipc: handles without a place, and places that cannot be written", "[ipc]") {
  auto h = driver_handle();
  BlockPlace got;
  CHECK_FALSE(decode(h.data(), &got));  // a plain driver handle passes through untouched
  CHECK(h == driver_handle());
  CHECK(encode(h.data(), {1ull << 38, 256}) == EncodeResult::does_not_fit);  // offset past 256 GiB
  CHECK(encode(h.data(), {0, 1ull << 38}) == EncodeResult::does_not_fit);    // size past 256 GiB
  CHECK(encode(h.data(), {100, 256}) == EncodeResult::does_not_fit);         // not a 256-byte multiple
  CHECK(encode(h.data(), {0, 0}) == EncodeResult::does_not_fit);
  CHECK(h == driver_handle());
  h[60] = 1;  // the driver uses those bytes (the H200, for a 42 GB allocation): never overwritten
  CHECK(encode(h.data(), {0, 256}) == EncodeResult::driver_uses_bytes);
  CHECK(h[60] == 1);
}

TEST_CASE("ipc: imported blocks answer range queries and close their chunk once per open", "[ipc]") {
  ImportedBlocks blocks;
  CHECK(blocks.empty());
  blocks.opened(0x10000 + 4096, 0x10000, 8192);
  blocks.opened(0x10000 + 4096, 0x10000, 8192);  // the same handle opened twice
  blocks.opened(0x10000, 0x10000, 4096);
  CHECK_FALSE(blocks.empty());
  std::uint64_t start = 0, size = 0;
  REQUIRE(blocks.range(0x10000 + 4096 + 8191, &start, &size));
  CHECK(start == 0x10000 + 4096);
  CHECK(size == 8192);
  CHECK_FALSE(blocks.range(0x10000 + 4096 + 8192, &start, &size));
  CHECK_FALSE(blocks.range(0xffff, &start, &size));
  std::uint64_t base = 0;
  CHECK_FALSE(blocks.chunk_of(0x10000 + 8, &base));  // not a pointer this process opened
  REQUIRE(blocks.chunk_of(0x10000 + 4096, &base));
  CHECK(base == 0x10000);
  blocks.closed(0x10000 + 4096);
  REQUIRE(blocks.chunk_of(0x10000 + 4096, &base));  // opened twice: still open once
  blocks.closed(0x10000 + 4096);
  CHECK_FALSE(blocks.chunk_of(0x10000 + 4096, &base));
  blocks.closed(0x10000);
  CHECK(blocks.empty());
}

// ---- vmm blocks' handles (shim/ipc_vmm_handle.h) ------------------------------------------------

TEST_CASE("ipc vmm: a handle round-trips, and nothing else reads as one", "[ipc]") {
  VmmHandle v;
  v.pid = 4242;
  v.nonce = 0x0123456789abcdefull;
  v.export_id = 7;
  v.offset = 1 << 20;
  v.size = 3ull << 30;
  v.device = 3;
  std::array<unsigned char, kHandleBytes> h;
  h.fill(0x77);
  encode_vmm(h.data(), v);
  // A process without cupool must be refused: byte 48 holds the value the H200's driver refuses,
  // and bytes 56..63 stay zero so the growth policy's place decoder does not take it for one.
  CHECK(h[48] == 0x4E);
  for (std::size_t i = 56; i < 64; ++i) CHECK(h[i] == 0);
  BlockPlace place;
  auto copy = h;
  CHECK_FALSE(decode(copy.data(), &place));
  VmmHandle got;
  REQUIRE(decode_vmm(h.data(), &got));
  CHECK(got.pid == v.pid);
  CHECK(got.nonce == v.nonce);
  CHECK(got.export_id == v.export_id);
  CHECK(got.offset == v.offset);
  CHECK(got.size == v.size);
  CHECK(got.device == v.device);
  // Any changed byte is refused (the checksum, the magic, the version, the marker, the tail).
  for (std::size_t i = 0; i < kHandleBytes; ++i) {
    auto bad = h;
    bad[i] ^= 0x01;
    CHECK_FALSE(decode_vmm(bad.data(), &got));
  }
  // A driver's handle and a growth block's handle are not vmm handles.
  CHECK_FALSE(decode_vmm(driver_handle().data(), &got));
  auto growth = driver_handle();
  REQUIRE(encode(growth.data(), BlockPlace{1 << 20, 1 << 20}) == EncodeResult::written);
  CHECK_FALSE(decode_vmm(growth.data(), &got));
  std::array<unsigned char, kHandleBytes> zero{};
  CHECK_FALSE(decode_vmm(zero.data(), &got));
}

TEST_CASE("ipc vmm: the socket's name and the checks on what an exporter sends", "[ipc]") {
  CHECK(vmm_socket_name(12, 0xabcull) == "cupool-ipc-12-0000000000000abc");
  CHECK(vmm_socket_name(12, 1) != vmm_socket_name(12, 2));  // a recycled pid has another nonce
  const std::uint64_t g = 2 << 20;
  CHECK(vmm_layout_sane(g, 1, 0, g));
  CHECK(vmm_layout_sane(g, 2, g / 2, g));
  CHECK(vmm_layout_sane(g, 1, g - 512, 512));
  CHECK_FALSE(vmm_layout_sane(g, 1, g / 2, g));        // too few granules
  CHECK_FALSE(vmm_layout_sane(g, 3, g / 2, g));        // too many
  CHECK_FALSE(vmm_layout_sane(g, 1, g, 512));          // the offset past the first granule
  CHECK_FALSE(vmm_layout_sane(g, 0, 0, 0));            // nothing
  CHECK_FALSE(vmm_layout_sane(3 << 20, 1, 0, 4096));   // not a power of two
  CHECK_FALSE(vmm_layout_sane(1024, 1, 0, 512));       // below 4 KiB
  CHECK_FALSE(vmm_layout_sane(g, 1000000000, 0, 1000000000 * g));  // past 1 TiB
  CHECK_FALSE(vmm_layout_sane(g, ~0ull, 0, ~0ull));    // sizes that would overflow
}
