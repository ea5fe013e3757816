// The growth policy's rule, as pure functions: how large the pool's next chunk is, from the step
// (which doubles from CUPOOL_GROWTH_CHUNK up to CUPOOL_GROWTH_CHUNK_MAX), the bytes an allocation
// needs and the headroom the cap leaves. ContextPool::grow applies it; docs/design.md ("The pool")
// explains it.
#pragma once

#include <algorithm>
#include <cstdint>

namespace cupool::growth {

// Chunks are whole multiples of this (a cap that is not is the one exception: see next_chunk).
inline constexpr std::uint64_t kChunkGranularity = 2ull << 20;
// Blocks are multiples of this (Suballocator::kAlignment; a unit test checks they agree).
inline constexpr std::uint64_t kBlockAlignment = 512;

// What to ask the upstream for: `chunk` bytes, or at least `need` (the upstream may give anything
// between the two). need == 0: the allocation does not fit under the cap at all.
struct Ask {
  std::uint64_t chunk = 0;
  std::uint64_t need = 0;
  friend constexpr bool operator==(const Ask&, const Ask&) = default;
};

// The first step: CUPOOL_GROWTH_CHUNK rounded up to the granularity (at least one granule).
constexpr std::uint64_t first_step(std::uint64_t growth_chunk) {
  const std::uint64_t g = kChunkGranularity;
  return std::max<std::uint64_t>((std::max<std::uint64_t>(growth_chunk, 1) + g - 1) / g * g, g);
}

// The step after a chunk was taken: doubled, up to CUPOOL_GROWTH_CHUNK_MAX (never below the step).
constexpr std::uint64_t next_step(std::uint64_t step, std::uint64_t growth_chunk_max) {
  return std::min<std::uint64_t>(step * 2, std::max<std::uint64_t>(growth_chunk_max, step));
}

// The chunk for an allocation of `bytes` (a multiple of kBlockAlignment): max(round_up(bytes,
// 2 MiB), step), never more than `headroom`; and if the upstream cannot give a chunk larger than
// needed, just what is needed. Where the cap is not a multiple of 2 MiB, what is needed is the
// headroom's last bytes (rounded down to the block alignment) when they hold the allocation.
constexpr Ask next_chunk(std::uint64_t step, std::uint64_t bytes, std::uint64_t headroom) {
  const std::uint64_t g = kChunkGranularity;
  std::uint64_t need = (bytes + g - 1) / g * g;
  const std::uint64_t aligned_left = headroom / kBlockAlignment * kBlockAlignment;
  if (need > headroom && bytes <= aligned_left) need = aligned_left;
  if (need > headroom || need < bytes) return {};  // past the cap (or `bytes` so large it wraps)
  std::uint64_t chunk = std::max(need, step);
  if (chunk > headroom) chunk = std::max(need, headroom / g * g);
  return {chunk, need};
}

}  // namespace cupool::growth
