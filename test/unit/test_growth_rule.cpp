// Unit tests of the growth policy's rule (policy/growth_rule.h): the step, and the next chunk from
// step, need and headroom; and how an upstream serves the ask (reserve_at_least, upstream.h).
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <vector>

#include "context_pool.h"
#include "growth_rule.h"
#include "suballocator.h"
#include "upstream.h"

using namespace cupool;
using growth::Ask;
using growth::next_chunk;

namespace {
constexpr std::uint64_t MiB = 1ull << 20;
constexpr std::uint64_t GiB = 1ull << 30;
}  // namespace

TEST_CASE("growth rule: its units are the pool's", "[growth]") {
  STATIC_REQUIRE(growth::kBlockAlignment == Suballocator::kAlignment);
  STATIC_REQUIRE(growth::kChunkGranularity == ContextPool::kChunkGranularity);
  STATIC_REQUIRE(growth::kChunkGranularity == 2 * MiB);
}

TEST_CASE("growth rule: the step starts at CUPOOL_GROWTH_CHUNK in whole granules and doubles to the max",
          "[growth]") {
  STATIC_REQUIRE(growth::first_step(0) == 2 * MiB);
  CHECK(growth::first_step(1) == 2 * MiB);
  CHECK(growth::first_step(2 * MiB) == 2 * MiB);
  CHECK(growth::first_step(3 * MiB) == 4 * MiB);
  CHECK(growth::first_step(32 * MiB) == 32 * MiB);

  std::uint64_t step = growth::first_step(32 * MiB);
  std::vector<std::uint64_t> steps;
  for (int i = 0; i < 6; ++i) {
    steps.push_back(step);
    step = growth::next_step(step, 512 * MiB);
  }
  CHECK(steps == std::vector<std::uint64_t>{32 * MiB, 64 * MiB, 128 * MiB, 256 * MiB, 512 * MiB, 512 * MiB});
  // A max below the step: the step stays (it never shrinks).
  CHECK(growth::next_step(32 * MiB, 8 * MiB) == 32 * MiB);
  // A max that is no power of two times the step: the step stops at it.
  CHECK(growth::next_step(64 * MiB, 100 * MiB) == 100 * MiB);
}

TEST_CASE("growth rule: a chunk of the step, or what is needed, whichever is larger", "[growth]") {
  // A small allocation: the step, and at least its size in granules.
  STATIC_REQUIRE(next_chunk(32 * MiB, 512, 8 * GiB) == Ask{32 * MiB, 2 * MiB});
  CHECK(next_chunk(32 * MiB, 1 * MiB, 8 * GiB) == Ask{32 * MiB, 2 * MiB});
  CHECK(next_chunk(32 * MiB, 3 * MiB + 512, 8 * GiB) == Ask{32 * MiB, 4 * MiB});
  // Larger than the step: just what is needed.
  CHECK(next_chunk(32 * MiB, 100 * MiB, 8 * GiB) == Ask{100 * MiB, 100 * MiB});
  CHECK(next_chunk(32 * MiB, 32 * MiB, 8 * GiB) == Ask{32 * MiB, 32 * MiB});
  CHECK(next_chunk(2 * MiB, 2 * MiB + 512, 8 * GiB) == Ask{4 * MiB, 4 * MiB});
}

TEST_CASE("growth rule: never more than the headroom", "[growth]") {
  // The step does not fit: the headroom in whole granules, and at least what is needed.
  CHECK(next_chunk(32 * MiB, 1 * MiB, 20 * MiB) == Ask{20 * MiB, 2 * MiB});
  CHECK(next_chunk(32 * MiB, 1 * MiB, 21 * MiB + 512) == Ask{20 * MiB, 2 * MiB});
  CHECK(next_chunk(32 * MiB, 4 * MiB, 4 * MiB) == Ask{4 * MiB, 4 * MiB});
  // A cap that is not a multiple of 2 MiB: its last bytes, to the block alignment, when they hold
  // the allocation.
  CHECK(next_chunk(32 * MiB, 1 * MiB, 1 * MiB + 700) == Ask{1 * MiB + 512, 1 * MiB + 512});
  CHECK(next_chunk(32 * MiB, 3 * MiB, 5 * MiB + 100) == Ask{4 * MiB, 4 * MiB});
  CHECK(next_chunk(32 * MiB, 5 * MiB, 5 * MiB + 100) == Ask{5 * MiB, 5 * MiB});
  // Past the cap: nothing.
  CHECK(next_chunk(32 * MiB, 1 * MiB + 512, 1 * MiB) == Ask{});
  CHECK(next_chunk(32 * MiB, 512, 0) == Ask{});
  CHECK(next_chunk(32 * MiB, 512, 511) == Ask{});
  CHECK(next_chunk(32 * MiB, 8 * GiB + 512, 8 * GiB) == Ask{});
}

TEST_CASE("growth rule: what it asks holds the allocation and fits the headroom", "[growth]") {
  std::mt19937_64 rng(28);
  const std::uint64_t steps[] = {2 * MiB, 32 * MiB, 512 * MiB};
  for (int i = 0; i < 20000; ++i) {
    const std::uint64_t step = steps[rng() % 3];
    const std::uint64_t bytes = (rng() % (64 * MiB / 512) + 1) * 512;
    const std::uint64_t headroom = rng() % 4 == 0 ? rng() % (8 * GiB) : rng() % (80 * MiB);
    const Ask a = next_chunk(step, bytes, headroom);
    INFO("step " << step << " bytes " << bytes << " headroom " << headroom);
    if (a.need == 0) {
      // Refused only where the allocation in whole blocks does not fit.
      CHECK(bytes > headroom / 512 * 512);
      CHECK(a.chunk == 0);
      continue;
    }
    CHECK(a.need >= bytes);
    CHECK(a.need - bytes < 2 * MiB);
    CHECK(a.chunk >= a.need);
    CHECK(a.chunk <= headroom);
    CHECK((a.chunk % (2 * MiB) == 0 || a.chunk == a.need));
    if (step <= headroom && a.need <= step) CHECK(a.chunk == step);
  }
}

TEST_CASE("growth's ask of the upstream: the chunk, then the minimum where there was no room", "[growth]") {
  struct Asked {
    std::size_t bytes;
    bool last;
  };
  auto serve = [](std::size_t bytes, std::size_t min, UpstreamStatus first, std::vector<Asked>* asks,
                  std::size_t* got) {
    return reserve_at_least(bytes, min, got, [&](std::size_t n, bool last) {
      asks->push_back({n, last});
      return asks->size() == 1 ? first : UpstreamStatus::ok;
    });
  };
  std::vector<Asked> asks;
  std::size_t got = 0;
  SECTION("room: one ask, a smaller one would follow") {
    CHECK(serve(32 * MiB, 2 * MiB, UpstreamStatus::ok, &asks, &got) == UpstreamStatus::ok);
    REQUIRE(asks.size() == 1);
    CHECK((asks[0].bytes == 32 * MiB && !asks[0].last));
    CHECK(got == 32 * MiB);
  }
  SECTION("no room on the device, or in a budget: the minimum, last") {
    for (UpstreamStatus no_room : {UpstreamStatus::out_of_memory, UpstreamStatus::share_exhausted}) {
      asks.clear();
      CHECK(serve(32 * MiB, 2 * MiB, no_room, &asks, &got) == UpstreamStatus::ok);
      REQUIRE(asks.size() == 2);
      CHECK((asks[0].bytes == 32 * MiB && !asks[0].last));
      CHECK((asks[1].bytes == 2 * MiB && asks[1].last));
      CHECK(got == 2 * MiB);
    }
  }
  SECTION("another error: no second ask") {
    CHECK(serve(32 * MiB, 2 * MiB, UpstreamStatus::error, &asks, &got) == UpstreamStatus::error);
    CHECK(asks.size() == 1);
  }
  SECTION("no smaller size allowed: one ask, last") {
    CHECK(serve(4 * MiB, 4 * MiB, UpstreamStatus::out_of_memory, &asks, &got) == UpstreamStatus::out_of_memory);
    REQUIRE(asks.size() == 1);
    CHECK(asks[0].last);
  }
}
