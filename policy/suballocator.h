// Suballocator: hands out 512-byte-aligned blocks from device address ranges ("chunks") it is
// given. Two-level segregated fit (TLSF): free blocks sit in size-class lists found through two
// bitmaps, so allocate and free take bounded time whatever the number of blocks; neighbours within
// a chunk are coalesced on free (never across chunks). All metadata lives in host memory: a node
// slab (grows by doubling, rarely) and an open-addressing hash from block address to node.
// Not thread-safe: ContextPool serialises access.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace cupool {

class Suballocator {
 public:
  static constexpr std::size_t kAlignment = 512;
  static constexpr int kAlignShift = 9;
  static constexpr std::uint32_t kNoChunk = 0xffffffffu;

  enum class FreeStatus : std::uint8_t {
    freed,        // the block is free again (or, for hold(), quarantined)
    not_owned,    // outside every chunk, or inside a live block but not at its start
    double_free,  // inside a chunk but not a live block: already freed (or quarantined)
  };

  // What free()/release_held() tell the caller about the block that went away.
  struct FreeInfo {
    std::size_t size = 0;             // the block's (rounded) size
    std::uint32_t chunk = kNoChunk;   // the chunk it belonged to
    bool chunk_now_free = false;      // the chunk holds no live or held block any more
  };

  Suballocator();
  Suballocator(const Suballocator&) = delete;
  Suballocator& operator=(const Suballocator&) = delete;

  // Hand over [base, base+size). base and size must be multiples of kAlignment and the range
  // must not overlap another chunk. Returns the chunk's id (stable until remove_chunk), or kNoChunk.
  std::uint32_t add_chunk(std::uint64_t base, std::size_t size);
  // Take a wholly free chunk back (by its base). False if unknown or not wholly free.
  bool remove_chunk(std::uint64_t base);
  // Forget every chunk and block (nothing is given back to anybody).
  void clear();

  // A block of at least `size` bytes (rounded up to kAlignment; 0 counts as kAlignment), or 0.
  // Succeeds whenever some free block is large enough. `chunk` receives the block's chunk id.
  std::uint64_t allocate(std::size_t size, std::uint32_t* chunk = nullptr);
  // Best fit: the smallest free block that holds the request (the lowest address of those in
  // its size class that are as small, up to `max_probe` of them looked at), its front handed
  // out; 0 if none is large enough. The vmm policy places by it: TLSF's allocate() skips the
  // request's own size class (its first block might not fit), which cuts larger free blocks,
  // and in the vmm range those cuts strand mapped granules.
  std::uint64_t allocate_best_fit(std::size_t size, int max_probe, std::uint32_t* chunk = nullptr);
  // The vmm policy's miss path: of every free block large enough, the place inside it that
  // `cost(address, size, bytes, &offset)` scores lowest (it sets the block's offset from the free
  // block's start, a multiple of kAlignment); ties go to the smaller free block, then the lower
  // address. 0 if no free block is large enough. Visits every free block of the size classes
  // that can hold the request: a path taken only where memory would otherwise be mapped.
  template <class Cost>
  std::uint64_t allocate_best(std::size_t size, Cost&& cost, std::uint32_t* chunk = nullptr) {
    const std::uint64_t bytes = request_bytes(size);
    if (bytes == 0) return 0;
    std::uint32_t best = kNil;
    std::uint64_t best_cost = ~std::uint64_t{0}, best_offset = 0;
    for_each_class_from(bytes, [&](std::uint32_t head) {
      for (std::uint32_t n = head; n != kNil; n = nodes_[n].next_free) {
        const Node& node = nodes_[n];
        if (node.size < bytes) continue;
        std::uint64_t offset = 0;
        const std::uint64_t c = cost(node.addr, node.size, bytes, &offset);
        if (best == kNil || c < best_cost ||
            (c == best_cost && (node.size < nodes_[best].size ||
                                (node.size == nodes_[best].size && node.addr < nodes_[best].addr)))) {
          best = n;
          best_cost = c;
          best_offset = offset;
        }
      }
      return false;  // every class
    });
    return best == kNil ? 0 : take_node_at(best, best_offset, bytes, chunk);
  }
  // Give back a block that allocate() returned.
  FreeStatus free(std::uint64_t address, FreeInfo* info = nullptr);
  // Quarantine: the program freed the block but it may not be reused yet. The block stays taken,
  // counts as held rather than in use, and a second free() or hold() of it is a double free.
  FreeStatus hold(std::uint64_t address, std::size_t* size = nullptr);
  // Make a held block free. False if `address` is not a held block.
  bool release_held(std::uint64_t address, FreeInfo* info = nullptr);

  // The live (allocated, not held) block starting exactly at `address`: its size, else 0.
  std::size_t block_size(std::uint64_t address) const;
  // The live block containing `address` (interior pointers too). Exact starts are a hash lookup;
  // an interior pointer walks its chunk's blocks in address order (rare: cuMemGetAddressRange).
  bool block_range(std::uint64_t address, std::uint64_t* base, std::size_t* size) const;
  // The chunk holding `address` (kNoChunk: none).
  std::uint32_t chunk_of(std::uint64_t address) const { return find_chunk(address); }

  // Calls fn(chunk_id, base, size) for every chunk with no live or held block.
  template <class Fn>
  void for_each_free_chunk(Fn&& fn) const {
    for (std::uint32_t id : chunk_order_) {
      const Chunk& c = chunks_[id];
      if (c.taken_blocks == 0) fn(id, c.base, c.size);
    }
  }
  // Calls fn(chunk_id, base, size) for every chunk.
  template <class Fn>
  void for_each_chunk(Fn&& fn) const {
    for (std::uint32_t id : chunk_order_) fn(id, chunks_[id].base, chunks_[id].size);
  }

  std::uint64_t reserved() const { return reserved_; }    // bytes in all chunks
  std::uint64_t in_use() const { return in_use_; }        // bytes in live blocks
  std::uint64_t held() const { return held_; }            // bytes in held (quarantined) blocks
  std::uint64_t free_bytes() const { return reserved_ - in_use_ - held_; }
  std::uint64_t largest_free() const;                     // exact: scans the top size class only
  std::uint32_t free_blocks() const { return free_blocks_; }
  std::size_t chunk_count() const { return chunk_order_.size(); }
  std::size_t live_blocks() const { return map_count_; }  // live + held

  // Debug aid for tests: walks every chunk and checks links, sizes, lists, counters.
  bool check_invariants() const;

 private:
  static constexpr std::uint32_t kNil = 0xffffffffu;
  static constexpr int kSlBits = 5;
  static constexpr std::uint32_t kSlCount = 1u << kSlBits;
  static constexpr int kFlCount = 52;  // sizes up to 2^(kFlCount + kSlBits + 8) bytes: far past any device

  enum class State : std::uint8_t { unused, free, live, held };

  struct Node {
    std::uint64_t addr = 0;
    std::uint64_t size = 0;
    std::uint32_t prev_phys = kNil, next_phys = kNil;  // neighbours in the same chunk
    std::uint32_t prev_free = kNil, next_free = kNil;  // size-class list; next_free links unused nodes too
    std::uint32_t chunk = kNoChunk;
    State state = State::unused;
    std::uint8_t fl = 0, sl = 0;  // size class while listed (saves recomputing it on removal)
  };
  struct Chunk {
    std::uint64_t base = 0;
    std::uint64_t size = 0;
    std::uint32_t first = kNil;       // the node at base (never absorbed by a neighbour)
    std::uint32_t taken_blocks = 0;   // live + held
    bool used = false;
  };
  struct Slot {
    std::uint64_t key = 0;  // block address; 0 = empty (no chunk starts at address 0)
    std::uint32_t node = kNil;
  };

  std::uint32_t new_node();
  void drop_node(std::uint32_t n);
  static void mapping(std::uint64_t units, int* fl, int* sl);
  // A request's size rounded up to kAlignment (0 counts as kAlignment); 0 if it is past any device.
  static std::uint64_t request_bytes(std::size_t size) {
    if (size > (std::size_t{1} << 62)) return 0;
    return size == 0 ? kAlignment : (size + kAlignment - 1) & ~std::uint64_t{kAlignment - 1};
  }
  // Calls fn(head of a free list) for each non-empty size class from the one that `bytes` maps to
  // (its blocks may be smaller than `bytes`), ascending, until fn returns true.
  template <class Fn>
  void for_each_class_from(std::uint64_t bytes, Fn&& fn) const {
    int fl, sl;
    mapping(bytes >> kAlignShift, &fl, &sl);
    for (std::uint64_t fls = fl_bitmap_ & (~std::uint64_t{0} << fl); fls != 0; fls &= fls - 1) {
      const int f = std::countr_zero(fls);
      for (std::uint32_t m = sl_bitmap_[f] & (f == fl ? ~0u << sl : ~0u); m != 0; m &= m - 1)
        if (fn(heads_[f][std::countr_zero(m)])) return;
    }
  }
  void list_insert(std::uint32_t n);
  void list_remove(std::uint32_t n);
  std::uint32_t find_free(std::uint64_t units) const;
  std::uint64_t take_node(std::uint32_t n, std::uint64_t bytes, std::uint32_t* chunk);  // free node n: its front
  // Free node n, `offset` bytes in (a multiple of kAlignment): the front stays free.
  std::uint64_t take_node_at(std::uint32_t n, std::uint64_t offset, std::uint64_t bytes, std::uint32_t* chunk);
  std::uint32_t make_free(std::uint32_t n);  // coalesce and list; returns surviving node
  std::uint32_t find_chunk(std::uint64_t address) const;
  std::uint32_t block_containing(std::uint64_t address) const;
  FreeStatus classify_miss(std::uint64_t address) const;

  // Hash of live/held blocks: address -> node.
  std::uint32_t map_find(std::uint64_t key) const;
  std::uint64_t map_slot(std::uint64_t key) const;  // index of key's slot, or map_.size()
  void map_insert(std::uint64_t key, std::uint32_t node);
  void map_erase(std::uint64_t key);
  void map_erase_slot(std::uint64_t slot);
  void map_grow();

  std::vector<Node> nodes_;
  std::uint32_t unused_head_ = kNil;
  std::uint64_t fl_bitmap_ = 0;
  std::uint32_t sl_bitmap_[kFlCount] = {};
  std::uint32_t heads_[kFlCount][kSlCount];

  std::vector<Slot> map_;
  std::uint64_t map_mask_ = 0;
  int map_shift_ = 0;
  std::size_t map_count_ = 0;

  std::vector<Chunk> chunks_;
  std::vector<std::uint32_t> free_chunk_ids_;
  std::vector<std::uint32_t> chunk_order_;  // chunk ids sorted by base

  std::uint64_t reserved_ = 0, in_use_ = 0, held_ = 0;
  std::uint32_t free_blocks_ = 0;
};

}  // namespace cupool
