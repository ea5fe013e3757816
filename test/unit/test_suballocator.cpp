#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "suballocator.h"

using cupool::Suballocator;
using FS = Suballocator::FreeStatus;

namespace {
constexpr std::uint64_t kBase = 0x7f0000000000ull;
constexpr std::uint64_t MiB = 1ull << 20;
}  // namespace

TEST_CASE("suballocator: blocks are aligned, rounded and accounted", "[suballocator]") {
  Suballocator s;
  REQUIRE(s.add_chunk(kBase, 4 * MiB) != Suballocator::kNoChunk);
  CHECK(s.reserved() == 4 * MiB);
  CHECK(s.free_blocks() == 1);
  CHECK(s.largest_free() == 4 * MiB);

  std::uint64_t a = s.allocate(1);
  std::uint64_t b = s.allocate(513);
  std::uint64_t c = s.allocate(0);
  REQUIRE(a != 0);
  REQUIRE(b != 0);
  REQUIRE(c != 0);
  CHECK(a % 512 == 0);
  CHECK(b % 512 == 0);
  CHECK(s.block_size(a) == 512);
  CHECK(s.block_size(b) == 1024);
  CHECK(s.block_size(c) == 512);
  CHECK(s.in_use() == 2048);
  CHECK(s.in_use() + s.free_bytes() == s.reserved());
  CHECK(s.check_invariants());

  CHECK(s.free(b) == FS::freed);
  CHECK(s.free(a) == FS::freed);
  CHECK(s.free(c) == FS::freed);
  CHECK(s.in_use() == 0);
  CHECK(s.free_blocks() == 1);
  CHECK(s.largest_free() == 4 * MiB);
  CHECK(s.check_invariants());
}

TEST_CASE("suballocator: best fit takes the smallest free block that holds the request", "[suballocator]") {
  Suballocator s;
  REQUIRE(s.add_chunk(kBase, 64 * MiB) != Suballocator::kNoChunk);
  // Free holes (their neighbours live) of 3 MiB at 0, 2 MiB at 4, 2.5 MiB at 8 MiB; the tail from 12 MiB.
  const std::uint64_t h0 = s.allocate(3 * MiB), l0 = s.allocate(1 * MiB);
  const std::uint64_t h1 = s.allocate(2 * MiB), l1 = s.allocate(2 * MiB);
  const std::uint64_t h2 = s.allocate(2 * MiB + MiB / 2), l2 = s.allocate(MiB + MiB / 2);
  REQUIRE((l0 && l1 && l2));
  REQUIRE(s.free(h0) == FS::freed);
  REQUIRE(s.free(h1) == FS::freed);
  REQUIRE(s.free(h2) == FS::freed);
  // 2 MiB + 512: the 2 MiB hole is too small; TLSF's allocate() would skip the 2.5 MiB hole's
  // size class (its first block might not fit) and cut the 3 MiB one or the tail.
  CHECK(s.allocate_best_fit(2 * MiB + 512, 64) == h2);
  CHECK(s.allocate_best_fit(2 * MiB, 64) == h1);
  CHECK(s.allocate_best_fit(1, 64) == h2 + 2 * MiB + 512);  // the smallest free block: what h2's hole kept
  CHECK(s.allocate_best_fit(1ull << 40, 64) == 0);
  CHECK(s.check_invariants());
  // Equal sizes: the lower address.
  Suballocator t;
  REQUIRE(t.add_chunk(kBase, 64 * MiB) != Suballocator::kNoChunk);
  std::vector<std::uint64_t> b;
  for (int i = 0; i < 8; ++i) b.push_back(t.allocate(1 * MiB));
  for (int i : {6, 2, 4}) REQUIRE(t.free(b[i]) == FS::freed);
  CHECK(t.allocate_best_fit(1 * MiB, 64) == b[2]);
  CHECK(t.check_invariants());
}

TEST_CASE("suballocator: allocate_best places the block where the cost is lowest, inside a free block", "[suballocator]") {
  Suballocator s;
  REQUIRE(s.add_chunk(kBase, 64 * MiB) != Suballocator::kNoChunk);
  const std::uint64_t a = s.allocate(8 * MiB), live = s.allocate(1 * MiB);
  REQUIRE(live != 0);
  REQUIRE(s.free(a) == FS::freed);  // free: [0, 8) MiB and the tail [9, 64) MiB
  // The cost: how far the block starts from 20 MiB; the place inside each free block nearest it.
  auto cost = [&](std::uint64_t addr, std::uint64_t size, std::uint64_t bytes, std::uint64_t* offset) -> std::uint64_t {
    const std::uint64_t want = kBase + 20 * MiB;
    const std::uint64_t at = std::clamp(want, addr, addr + size - bytes);
    *offset = at - addr;
    return at > want ? at - want : want - at;
  };
  const std::uint64_t p = s.allocate_best(2 * MiB, cost);
  CHECK(p == kBase + 20 * MiB);
  CHECK(s.block_size(p) == 2 * MiB);
  CHECK(s.check_invariants());
  // What is left on both sides stays free, and coalesces when the block goes.
  CHECK(s.free_bytes() == 63 * MiB - 2 * MiB);
  CHECK(s.largest_free() == 42 * MiB);  // [22, 64)
  REQUIRE(s.free(p) == FS::freed);
  CHECK(s.largest_free() == 55 * MiB);
  CHECK(s.check_invariants());
  // Equal costs: the smaller free block.
  CHECK(s.allocate_best(1 * MiB, [](std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t*) -> std::uint64_t {
    return 0;
  }) == kBase);
  CHECK(s.allocate_best(1ull << 40, cost) == 0);
  CHECK(s.check_invariants());
}

TEST_CASE("suballocator: free classifies double free and foreign pointers", "[suballocator]") {
  Suballocator s;
  s.add_chunk(kBase, 1 * MiB);
  std::uint64_t a = s.allocate(4096);
  std::uint64_t b = s.allocate(4096);
  CHECK(s.free(a) == FS::freed);
  CHECK(s.free(a) == FS::double_free);       // freed block start
  CHECK(s.free(a + 512) == FS::double_free); // inside free memory
  CHECK(s.free(b + 512) == FS::not_owned);   // interior of a live block
  CHECK(s.free(kBase + 2 * MiB) == FS::not_owned);
  CHECK(s.free(0) == FS::not_owned);
  CHECK(s.block_size(b) == 4096);            // b survived all of that
  CHECK(s.free(b) == FS::freed);
  CHECK(s.check_invariants());
}

TEST_CASE("suballocator: block_range maps interior pointers to their block", "[suballocator]") {
  Suballocator s;
  s.add_chunk(kBase, 1 * MiB);
  std::uint64_t a = s.allocate(1000);
  std::uint64_t b = s.allocate(10000);
  std::uint64_t base = 0;
  std::size_t size = 0;
  REQUIRE(s.block_range(b + 9999, &base, &size));
  CHECK(base == b);
  CHECK(size == 10240);
  REQUIRE(s.block_range(a, &base, &size));
  CHECK(base == a);
  CHECK(size == 1024);
  CHECK_FALSE(s.block_range(b + 10240, &base, &size));  // free remainder
  CHECK_FALSE(s.block_range(kBase - 1, &base, &size));
  s.free(a);
  CHECK_FALSE(s.block_range(a + 10, &base, &size));
}

TEST_CASE("suballocator: chunks never coalesce with each other", "[suballocator]") {
  Suballocator s;
  // Two adjacent chunks: a block must not straddle them.
  s.add_chunk(kBase, 1 * MiB);
  s.add_chunk(kBase + 1 * MiB, 1 * MiB);
  CHECK(s.free_blocks() == 2);
  CHECK(s.largest_free() == 1 * MiB);
  CHECK(s.allocate(1 * MiB + 512) == 0);
  std::uint64_t a = s.allocate(1 * MiB);
  std::uint64_t b = s.allocate(1 * MiB);
  CHECK(a != 0);
  CHECK(b != 0);
  CHECK(s.allocate(512) == 0);
  s.free(a);
  s.free(b);
  CHECK(s.free_blocks() == 2);
  CHECK(s.check_invariants());
}

TEST_CASE("suballocator: add/remove chunk rules", "[suballocator]") {
  Suballocator s;
  CHECK(s.add_chunk(kBase + 100, 1 * MiB) == Suballocator::kNoChunk);  // misaligned
  CHECK(s.add_chunk(0, 1 * MiB) == Suballocator::kNoChunk);
  REQUIRE(s.add_chunk(kBase, 2 * MiB) != Suballocator::kNoChunk);
  CHECK(s.add_chunk(kBase + 1 * MiB, 2 * MiB) == Suballocator::kNoChunk);  // overlap
  CHECK(s.add_chunk(kBase - 1 * MiB, 2 * MiB) == Suballocator::kNoChunk);  // overlap
  REQUIRE(s.add_chunk(kBase + 4 * MiB, 2 * MiB) != Suballocator::kNoChunk);

  std::uint64_t a = s.allocate(3 * 512);
  REQUIRE(a != 0);
  std::vector<std::uint64_t> free_bases;
  s.for_each_free_chunk([&](std::uint32_t, std::uint64_t base, std::size_t) { free_bases.push_back(base); });
  REQUIRE(free_bases.size() == 1);
  CHECK_FALSE(s.remove_chunk(a));  // chunk of a is in use
  CHECK(s.remove_chunk(free_bases[0]));
  CHECK(s.chunk_count() == 1);
  CHECK(s.reserved() == 2 * MiB);
  s.free(a);
  CHECK(s.remove_chunk(a));
  CHECK(s.reserved() == 0);
  CHECK(s.free_blocks() == 0);
  CHECK(s.allocate(512) == 0);
  CHECK(s.check_invariants());
}

TEST_CASE("suballocator: allocate succeeds whenever one free block is large enough", "[suballocator]") {
  // TLSF rounds the search up to the next size class; a block in the request's own class that is
  // large enough must still be found (otherwise the pool would report false fragmentation).
  Suballocator s;
  std::uint64_t chunk = 33 * 512 * 64;  // a size in the middle of a class
  s.add_chunk(kBase, chunk);
  CHECK(s.largest_free() == chunk);
  std::uint64_t a = s.allocate(chunk - 512);
  CHECK(a != 0);
  s.free(a);
  CHECK(s.allocate(chunk) == kBase);
}

TEST_CASE("suballocator: hold and release_held (quarantine)", "[suballocator]") {
  Suballocator s;
  s.add_chunk(kBase, 1 * MiB);
  std::uint64_t a = s.allocate(4096);
  std::size_t sz = 0;
  CHECK(s.hold(a, &sz) == FS::freed);
  CHECK(sz == 4096);
  CHECK(s.held() == 4096);
  CHECK(s.in_use() == 0);
  CHECK(s.block_size(a) == 0);
  CHECK(s.hold(a) == FS::double_free);
  CHECK(s.free(a) == FS::double_free);
  CHECK(s.allocate(1 * MiB) == 0);  // held memory is not reusable
  Suballocator::FreeInfo info;
  CHECK(s.release_held(a, &info));
  CHECK(info.size == 4096);
  CHECK(info.chunk_now_free);
  CHECK_FALSE(s.release_held(a));
  CHECK(s.held() == 0);
  CHECK(s.free_blocks() == 1);
  CHECK(s.check_invariants());
}

TEST_CASE("suballocator: randomized against a reference model", "[suballocator]") {
  std::mt19937_64 rng(GENERATE(1u, 2u, 3u, 42u));
  Suballocator s;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> chunks = {
      {kBase, 8 * MiB}, {kBase + 8 * MiB, 3 * MiB}, {kBase + 64 * MiB, 16 * MiB + 512 * 7}};
  for (auto [b, sz] : chunks) REQUIRE(s.add_chunk(b, sz) != Suballocator::kNoChunk);
  std::uint64_t total = s.reserved();

  std::map<std::uint64_t, std::uint64_t> live;  // base -> rounded size (the reference model)
  std::vector<std::uint64_t> order;
  std::uint64_t model_in_use = 0;
  int successes = 0;
  auto size_dist = [&]() -> std::size_t {
    switch (rng() % 4) {
      case 0: return rng() % 600;
      case 1: return rng() % 20000;
      case 2: return rng() % (512 * 1024);
      default: return rng() % (4 * MiB);
    }
  };
  for (int step = 0; step < 20000; ++step) {
    bool do_alloc = order.empty() || rng() % 100 < 55;
    if (do_alloc) {
      std::size_t want = size_dist();
      std::uint64_t rounded = want == 0 ? 512 : (want + 511) / 512 * 512;
      std::uint64_t largest = s.largest_free();
      std::uint64_t p = s.allocate(want);
      if (p == 0) {
        CHECK(largest < rounded);  // it fails only if nothing fits
        continue;
      }
      REQUIRE(p % 512 == 0);
      REQUIRE(s.block_size(p) == rounded);
      // No overlap with any live block; inside one chunk.
      auto it = live.lower_bound(p);
      if (it != live.end()) REQUIRE(p + rounded <= it->first);
      if (it != live.begin()) {
        auto prev = std::prev(it);
        REQUIRE(prev->first + prev->second <= p);
      }
      bool inside = false;
      for (auto [b, sz] : chunks) inside |= p >= b && p + rounded <= b + sz;
      REQUIRE(inside);
      live[p] = rounded;
      order.push_back(p);
      ++successes;
      model_in_use += rounded;
    } else {
      std::size_t i = rng() % order.size();
      std::uint64_t p = order[i];
      order[i] = order.back();
      order.pop_back();
      if (rng() % 8 == 0) {  // interior lookups map to the block
        std::uint64_t base = 0;
        std::size_t sz = 0;
        REQUIRE(s.block_range(p + live[p] - 1, &base, &sz));
        REQUIRE(base == p);
        REQUIRE(sz == live[p]);
      }
      REQUIRE(s.free(p) == FS::freed);
      model_in_use -= live[p];
      live.erase(p);
      if (rng() % 16 == 0) REQUIRE(s.free(p) == FS::double_free);
    }
    REQUIRE(s.in_use() == model_in_use);
    REQUIRE(s.in_use() + s.free_bytes() == s.reserved());
    REQUIRE(s.reserved() == total);
    if (step % 1000 == 0) REQUIRE(s.check_invariants());
  }
  CHECK(successes > 5000);
  for (std::uint64_t p : order) REQUIRE(s.free(p) == FS::freed);
  CHECK(s.in_use() == 0);
  CHECK(s.free_blocks() == chunks.size());  // coalescing restored one free block per chunk
  CHECK(s.largest_free() == 16 * MiB + 512 * 7);
  CHECK(s.live_blocks() == 0);
  CHECK(s.check_invariants());
  std::size_t wholly_free = 0;
  s.for_each_free_chunk([&](std::uint32_t, std::uint64_t, std::size_t) { ++wholly_free; });
  CHECK(wholly_free == chunks.size());
}

TEST_CASE("suballocator: many small blocks exercise slab and hash growth", "[suballocator]") {
  Suballocator s;
  s.add_chunk(kBase, 64 * MiB);
  std::vector<std::uint64_t> ps;
  for (int i = 0; i < 100000; ++i) {
    std::uint64_t p = s.allocate(512);
    REQUIRE(p != 0);
    ps.push_back(p);
  }
  CHECK(s.free_blocks() == 1);
  for (std::size_t i = 0; i < ps.size(); i += 2) REQUIRE(s.free(ps[i]) == FS::freed);
  CHECK(s.free_blocks() == 50001);  // plus the tail of the chunk
  CHECK(s.check_invariants());
  for (std::size_t i = 1; i < ps.size(); i += 2) REQUIRE(s.free(ps[i]) == FS::freed);
  CHECK(s.free_blocks() == 1);
  CHECK(s.largest_free() == 64 * MiB);
  CHECK(s.check_invariants());
}
