// Granules (granules.h): the vmm policy's bookkeeping of which granules are mapped and which
// no block touches any more.
#include "granules.h"

#include <algorithm>
#include <bit>

namespace cupool {

void Granules::reset(std::uint64_t base, std::uint64_t size, std::uint64_t granule) {
  base_ = base;
  granule_ = granule ? granule : 1;
  const std::size_t n = static_cast<std::size_t>(size / granule_);
  users_.assign(n, 0);
  state_.assign(n, State::unmapped);
  seq_.assign(n, 0);
  since_.assign(n, 0);
  stamp_ = 0;
  idle_bits_.assign((n + 63) / 64, 0);
  mapped_ = idle_ = 0;
  max_idle_seq_ = 0;
  top_ = 0;
}

void Granules::first_last(std::uint64_t addr, std::uint64_t bytes, std::size_t* first, std::size_t* last) const {
  *first = index(addr);
  *last = index(addr + std::max<std::uint64_t>(bytes, 1) - 1);
}

void Granules::set_idle_bit(std::size_t i, bool on) {
  const std::uint64_t bit = std::uint64_t{1} << (i % 64);
  if (on) idle_bits_[i / 64] |= bit;
  else idle_bits_[i / 64] &= ~bit;
}

bool Granules::ready(std::uint64_t addr, std::uint64_t bytes) const {
  std::size_t first, last;
  first_last(addr, bytes, &first, &last);
  for (std::size_t i = first; i <= last; ++i)
    if (state_[i] != State::mapped) return false;
  return true;
}

bool Granules::busy(std::uint64_t addr, std::uint64_t bytes) const {
  std::size_t first, last;
  first_last(addr, bytes, &first, &last);
  for (std::size_t i = first; i <= last; ++i)
    if (state_[i] == State::mapping || state_[i] == State::unmapping) return true;
  return false;
}

std::uint64_t Granules::missing_bytes(std::uint64_t addr, std::uint64_t bytes) const {
  std::size_t first, last;
  first_last(addr, bytes, &first, &last);
  std::uint64_t n = 0;
  for (std::size_t i = first; i <= last; ++i) n += state_[i] == State::unmapped;
  return n * granule_;
}

std::uint64_t Granules::best_window(std::uint64_t addr, std::uint64_t size, std::uint64_t bytes,
                                    std::uint64_t* offset) const {
  const std::uint64_t g = granule_;
  auto absent = [&](std::size_t i) -> std::uint64_t { return state_[i] != State::mapped; };
  auto missing = [&](std::uint64_t at) {
    std::size_t first, last;
    first_last(at, bytes, &first, &last);
    std::uint64_t n = 0;
    for (std::size_t i = first; i <= last; ++i) n += absent(i);
    return n;
  };
  *offset = 0;
  std::uint64_t best = missing(addr);
  const std::uint64_t end = (addr + size - bytes) & ~std::uint64_t{511};  // the last start that fits
  if (best != 0 && end > addr)
    if (const std::uint64_t m = missing(end); m < best) {
      best = m;
      *offset = end - addr;
    }
  // Granule boundaries in between, one granule at a time, up to the most ever mapped (a block
  // that starts past it has every granule missing).
  std::size_t i = index(addr) + 1;
  const std::size_t k = static_cast<std::size_t>((bytes + g - 1) / g);  // granules of a block on a boundary
  const std::size_t stop = std::min<std::size_t>(index(end), std::max(top_, i));
  if (best == 0 || i > stop || base_ + i * g >= end) return best * g;
  std::uint64_t miss = 0;
  for (std::size_t j = i; j < i + k; ++j) miss += absent(j);
  for (;;) {
    if (miss < best) {
      best = miss;
      *offset = base_ + i * g - addr;
      if (best == 0) break;
    }
    if (i == stop || base_ + (i + 1) * g > end) break;
    miss += absent(i + k) - absent(i);
    ++i;
  }
  return best * g;
}

void Granules::touch(std::uint64_t addr, std::uint64_t bytes) {
  std::size_t first, last;
  first_last(addr, bytes, &first, &last);
  for (std::size_t i = first; i <= last; ++i) {
    if (is_idle(i)) {
      --idle_;
      set_idle_bit(i, false);
    }
    ++users_[i];
  }
}

void Granules::untouch(std::uint64_t addr, std::uint64_t bytes, std::uint64_t seq) {
  std::size_t first, last;
  first_last(addr, bytes, &first, &last);
  for (std::size_t i = first; i <= last; ++i) {
    // A granule's device work is ordered by the last block to leave it; an older block's
    // sequence number is covered by a newer one's (fences retire in order).
    if (seq != 0) seq_[i] = std::max(seq_[i], seq);
    if (--users_[i] == 0 && state_[i] == State::mapped) {
      since_[i] = ++stamp_;
      ++idle_;
      set_idle_bit(i, true);
      max_idle_seq_ = std::max(max_idle_seq_, seq_[i]);
    }
  }
}

std::vector<Granules::Run> Granules::begin_map(std::uint64_t addr, std::uint64_t bytes, std::uint64_t* total) {
  std::vector<Run> runs;
  *total = 0;
  std::size_t first, last;
  first_last(addr, bytes, &first, &last);
  for (std::size_t i = first; i <= last; ++i) {
    if (state_[i] != State::unmapped) continue;
    state_[i] = State::mapping;
    seq_[i] = 0;  // fresh memory: no device work has used it
    top_ = std::max(top_, i + 1);
    const std::uint64_t va = base_ + i * granule_;
    if (!runs.empty() && runs.back().va + runs.back().bytes == va) runs.back().bytes += granule_;
    else runs.push_back({va, granule_});
    *total += granule_;
  }
  return runs;
}

void Granules::end_map(const Run& run, bool mapped) {
  for (std::size_t i = index(run.va), end = index(run.va + run.bytes); i < end; ++i) {
    state_[i] = mapped ? State::mapped : State::unmapped;
    if (!mapped) continue;
    ++mapped_;
    if (users_[i] == 0) {  // the block that asked for it went meanwhile (a failed neighbour run)
      since_[i] = ++stamp_;
      ++idle_;
      set_idle_bit(i, true);
    }
  }
}

std::vector<Granules::Run> Granules::begin_unmap(std::uint64_t max_bytes, std::uint64_t safe_seq) {
  std::vector<Run> runs;
  const std::uint64_t want = max_bytes / granule_;
  if (want == 0) return runs;
  // The safe idle granules, longest idle first: in a loop that repeats, a granule idle through a
  // whole iteration is one that the loop does not use again, where one idle since a recent free
  // is often taken again in a moment.
  std::vector<std::pair<std::uint64_t, std::size_t>> idle;  // (since, index)
  idle.reserve(idle_);
  std::uint64_t still_unsafe = 0;
  for (std::size_t w = 0; w < idle_bits_.size(); ++w)
    for (std::uint64_t bits = idle_bits_[w]; bits != 0; bits &= bits - 1) {
      const std::size_t i = w * 64 + static_cast<std::size_t>(std::countr_zero(bits));
      if (seq_[i] > safe_seq) still_unsafe = std::max(still_unsafe, seq_[i]);
      else idle.emplace_back(since_[i], i);
    }
  if (idle.size() > want) {
    std::nth_element(idle.begin(), idle.begin() + static_cast<std::ptrdiff_t>(want), idle.end());
    idle.resize(want);
  }
  max_idle_seq_ = still_unsafe;  // every idle granule was looked at (those left safe need no fence)
  std::sort(idle.begin(), idle.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  for (const auto& [since, i] : idle) {
    set_idle_bit(i, false);
    --idle_;
    --mapped_;
    state_[i] = State::unmapping;
    seq_[i] = 0;
    const std::uint64_t va = base_ + i * granule_;
    if (!runs.empty() && runs.back().va + runs.back().bytes == va) runs.back().bytes += granule_;
    else runs.push_back({va, granule_});
  }
  return runs;
}

void Granules::end_unmap(const Run& run) {
  for (std::size_t i = index(run.va), end = index(run.va + run.bytes); i < end; ++i) state_[i] = State::unmapped;
}

std::uint32_t Granules::users(std::uint64_t addr) const { return users_[index(addr)]; }
bool Granules::mapped(std::uint64_t addr) const { return state_[index(addr)] == State::mapped; }

}  // namespace cupool
