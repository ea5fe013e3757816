// Suballocator (suballocator.h): the two-level segregated fit that places blocks in chunks.
#include "suballocator.h"

#include <algorithm>
#include <bit>

namespace cupool {

namespace {
constexpr int kAlignShift = Suballocator::kAlignShift;
static_assert((std::size_t{1} << kAlignShift) == Suballocator::kAlignment);
constexpr std::size_t kInitialNodes = 1024;
constexpr std::size_t kInitialMap = 2048;
}  // namespace

Suballocator::Suballocator() {
  nodes_.reserve(kInitialNodes);
  map_.assign(kInitialMap, Slot{});
  map_mask_ = kInitialMap - 1;
  map_shift_ = 64 - std::countr_zero(kInitialMap);
  for (auto& row : heads_)
    for (auto& h : row) h = kNil;
}

// ---- node slab -------------------------------------------------------------------------------

std::uint32_t Suballocator::new_node() {
  if (unused_head_ != kNil) {
    std::uint32_t n = unused_head_;
    unused_head_ = nodes_[n].next_free;
    nodes_[n] = Node{};
    return n;
  }
  nodes_.emplace_back();  // amortised: the slab doubles, and freed nodes are recycled above
  return static_cast<std::uint32_t>(nodes_.size() - 1);
}

void Suballocator::drop_node(std::uint32_t n) {
  nodes_[n].state = State::unused;
  nodes_[n].next_free = unused_head_;
  unused_head_ = n;
}

// ---- size classes ------------------------------------------------------------------------------

// units = size / 512. Class (0, u) holds exactly u units for u < 32; above, each power of two is
// split into 32 classes, so a class spans at most 1/32 of its sizes (bounded internal waste).
void Suballocator::mapping(std::uint64_t units, int* fl, int* sl) {
  if (units < kSlCount) {
    *fl = 0;
    *sl = static_cast<int>(units);
    return;
  }
  int f = 63 - std::countl_zero(units);
  *fl = f - kSlBits + 1;
  *sl = static_cast<int>((units >> (f - kSlBits)) - kSlCount);
}

void Suballocator::list_insert(std::uint32_t n) {
  Node& node = nodes_[n];
  int fl, sl;
  mapping(node.size >> kAlignShift, &fl, &sl);
  node.fl = static_cast<std::uint8_t>(fl);
  node.sl = static_cast<std::uint8_t>(sl);
  std::uint32_t head = heads_[fl][sl];
  node.prev_free = kNil;
  node.next_free = head;
  if (head != kNil) nodes_[head].prev_free = n;
  heads_[fl][sl] = n;
  fl_bitmap_ |= std::uint64_t{1} << fl;
  sl_bitmap_[fl] |= 1u << sl;
  node.state = State::free;
  ++free_blocks_;
}

void Suballocator::list_remove(std::uint32_t n) {
  Node& node = nodes_[n];
  const int fl = node.fl, sl = node.sl;
  if (node.prev_free != kNil)
    nodes_[node.prev_free].next_free = node.next_free;
  else
    heads_[fl][sl] = node.next_free;
  if (node.next_free != kNil) nodes_[node.next_free].prev_free = node.prev_free;
  if (node.prev_free == kNil && node.next_free == kNil) {  // it was the only one in its class
    sl_bitmap_[fl] &= ~(1u << sl);
    if (sl_bitmap_[fl] == 0) fl_bitmap_ &= ~(std::uint64_t{1} << fl);
  }
  node.prev_free = node.next_free = kNil;
  --free_blocks_;
}

// Good fit: round the request up to the next class boundary, so any block of the first non-empty
// class at or above it fits (two bitmap scans). If that fails, the request's own class may still
// hold a large-enough block: scan that one list (only on the way to a miss, before growing).
std::uint32_t Suballocator::find_free(std::uint64_t units) const {
  std::uint64_t search = units;
  if (units >= kSlCount) search += (std::uint64_t{1} << (63 - std::countl_zero(units) - kSlBits)) - 1;
  int fl, sl;
  mapping(search, &fl, &sl);
  if (fl < kFlCount) {
    std::uint32_t sl_map = sl_bitmap_[fl] & (~0u << sl);
    if (sl_map == 0) {
      std::uint64_t fl_map = fl + 1 < 64 ? fl_bitmap_ & (~std::uint64_t{0} << (fl + 1)) : 0;
      if (fl_map != 0) {
        fl = std::countr_zero(fl_map);
        sl_map = sl_bitmap_[fl];
      }
    }
    if (sl_map != 0) return heads_[fl][std::countr_zero(sl_map)];
  }
  if (search == units) return kNil;
  mapping(units, &fl, &sl);
  if (fl >= kFlCount) return kNil;
  std::uint64_t need = units << kAlignShift;
  for (std::uint32_t n = heads_[fl][sl]; n != kNil; n = nodes_[n].next_free)
    if (nodes_[n].size >= need) return n;
  return kNil;
}

std::uint64_t Suballocator::largest_free() const {
  if (fl_bitmap_ == 0) return 0;
  int fl = 63 - std::countl_zero(fl_bitmap_);
  int sl = 31 - std::countl_zero(sl_bitmap_[fl]);
  std::uint64_t best = 0;
  for (std::uint32_t n = heads_[fl][sl]; n != kNil; n = nodes_[n].next_free)
    best = std::max(best, nodes_[n].size);
  return best;
}

// ---- chunks ------------------------------------------------------------------------------------

std::uint32_t Suballocator::find_chunk(std::uint64_t address) const {
  auto it = std::upper_bound(chunk_order_.begin(), chunk_order_.end(), address,
                             [this](std::uint64_t a, std::uint32_t id) { return a < chunks_[id].base; });
  if (it == chunk_order_.begin()) return kNoChunk;
  const Chunk& c = chunks_[*(it - 1)];
  return address - c.base < c.size ? *(it - 1) : kNoChunk;
}

std::uint32_t Suballocator::add_chunk(std::uint64_t base, std::size_t size) {
  if (base == 0 || size < kAlignment || base % kAlignment != 0 || size % kAlignment != 0 ||
      base + size < base)
    return kNoChunk;
  auto pos = std::upper_bound(chunk_order_.begin(), chunk_order_.end(), base,
                              [this](std::uint64_t a, std::uint32_t id) { return a < chunks_[id].base; });
  if (pos != chunk_order_.begin()) {
    const Chunk& prev = chunks_[*(pos - 1)];
    if (prev.base + prev.size > base) return kNoChunk;
  }
  if (pos != chunk_order_.end() && base + size > chunks_[*pos].base) return kNoChunk;

  std::uint32_t id;
  if (!free_chunk_ids_.empty()) {
    id = free_chunk_ids_.back();
    free_chunk_ids_.pop_back();
  } else {
    id = static_cast<std::uint32_t>(chunks_.size());
    chunks_.emplace_back();
  }
  std::uint32_t n = new_node();
  nodes_[n].addr = base;
  nodes_[n].size = size;
  nodes_[n].chunk = id;
  chunks_[id] = Chunk{base, size, n, 0, true};
  chunk_order_.insert(pos, id);
  list_insert(n);
  reserved_ += size;
  return id;
}

bool Suballocator::remove_chunk(std::uint64_t base) {
  std::uint32_t id = find_chunk(base);
  if (id == kNoChunk) return false;
  Chunk& c = chunks_[id];
  if (c.base != base || c.taken_blocks != 0) return false;
  std::uint32_t n = c.first;
  // Coalescing leaves a wholly free chunk as exactly one free block.
  if (nodes_[n].state != State::free || nodes_[n].size != c.size) return false;
  list_remove(n);
  drop_node(n);
  reserved_ -= c.size;
  c = Chunk{};
  free_chunk_ids_.push_back(id);
  chunk_order_.erase(std::find(chunk_order_.begin(), chunk_order_.end(), id));
  return true;
}

void Suballocator::clear() {
  nodes_.clear();
  unused_head_ = kNil;
  fl_bitmap_ = 0;
  for (auto& b : sl_bitmap_) b = 0;
  for (auto& row : heads_)
    for (auto& h : row) h = kNil;
  std::fill(map_.begin(), map_.end(), Slot{});
  map_count_ = 0;
  chunks_.clear();
  free_chunk_ids_.clear();
  chunk_order_.clear();
  reserved_ = in_use_ = held_ = 0;
  free_blocks_ = 0;
}

// ---- blocks ------------------------------------------------------------------------------------

std::uint64_t Suballocator::allocate(std::size_t size, std::uint32_t* chunk) {
  const std::uint64_t bytes = request_bytes(size);
  if (bytes == 0) return 0;
  std::uint32_t n = find_free(bytes >> kAlignShift);
  if (n == kNil) return 0;
  return take_node(n, bytes, chunk);
}

std::uint64_t Suballocator::allocate_best_fit(std::size_t size, int max_probe, std::uint32_t* chunk) {
  const std::uint64_t bytes = request_bytes(size);
  if (bytes == 0) return 0;
  // Classes ascend in size: the first class with a block that fits holds the best fit.
  std::uint32_t best = kNil;
  for_each_class_from(bytes, [&](std::uint32_t head) {
    int probe = max_probe;
    for (std::uint32_t n = head; n != kNil && probe > 0; n = nodes_[n].next_free, --probe) {
      const Node& node = nodes_[n];
      if (node.size < bytes) continue;
      if (best == kNil || node.size < nodes_[best].size || (node.size == nodes_[best].size && node.addr < nodes_[best].addr))
        best = n;
    }
    return best != kNil;
  });
  return best == kNil ? 0 : take_node(best, bytes, chunk);
}

std::uint64_t Suballocator::take_node(std::uint32_t n, std::uint64_t bytes, std::uint32_t* chunk) {
  list_remove(n);
  Node* node = &nodes_[n];
  if (node->size > bytes) {
    // Split: the front is handed out, the rest stays free (so a chunk's first node never moves).
    std::uint32_t r = new_node();
    node = &nodes_[n];  // new_node may have grown the slab
    Node& rest = nodes_[r];
    rest.addr = node->addr + bytes;
    rest.size = node->size - bytes;
    rest.chunk = node->chunk;
    rest.prev_phys = n;
    rest.next_phys = node->next_phys;
    if (node->next_phys != kNil) nodes_[node->next_phys].prev_phys = r;
    node->next_phys = r;
    node->size = bytes;
    list_insert(r);
  }
  node = &nodes_[n];
  node->state = State::live;
  ++chunks_[node->chunk].taken_blocks;
  in_use_ += bytes;
  map_insert(node->addr, n);
  if (chunk) *chunk = node->chunk;
  return node->addr;
}

std::uint64_t Suballocator::take_node_at(std::uint32_t n, std::uint64_t offset, std::uint64_t bytes, std::uint32_t* chunk) {
  if (offset == 0 || offset + bytes > nodes_[n].size) return take_node(n, bytes, chunk);
  // The front keeps node n (a chunk's first node never moves) and goes back to its size class;
  // the rest becomes a free node of its own, whose front is handed out.
  list_remove(n);
  const std::uint32_t r = new_node();
  Node& node = nodes_[n];  // after new_node: it may have grown the slab
  Node& rest = nodes_[r];
  rest.addr = node.addr + offset;
  rest.size = node.size - offset;
  rest.chunk = node.chunk;
  rest.prev_phys = n;
  rest.next_phys = node.next_phys;
  if (node.next_phys != kNil) nodes_[node.next_phys].prev_phys = r;
  node.next_phys = r;
  node.size = offset;
  list_insert(n);
  list_insert(r);
  return take_node(r, bytes, chunk);
}

std::uint32_t Suballocator::make_free(std::uint32_t n) {
  std::uint32_t next = nodes_[n].next_phys;
  if (next != kNil && nodes_[next].state == State::free) {
    list_remove(next);
    nodes_[n].size += nodes_[next].size;
    nodes_[n].next_phys = nodes_[next].next_phys;
    if (nodes_[n].next_phys != kNil) nodes_[nodes_[n].next_phys].prev_phys = n;
    drop_node(next);
  }
  std::uint32_t prev = nodes_[n].prev_phys;
  if (prev != kNil && nodes_[prev].state == State::free) {
    list_remove(prev);
    nodes_[prev].size += nodes_[n].size;
    nodes_[prev].next_phys = nodes_[n].next_phys;
    if (nodes_[prev].next_phys != kNil) nodes_[nodes_[prev].next_phys].prev_phys = prev;
    drop_node(n);
    n = prev;
  }
  list_insert(n);
  return n;
}

Suballocator::FreeStatus Suballocator::free(std::uint64_t address, FreeInfo* info) {
  std::uint64_t slot = map_slot(address);
  if (slot == map_.size()) return classify_miss(address);
  std::uint32_t n = map_[slot].node;
  if (nodes_[n].state != State::live) return FreeStatus::double_free;
  map_erase_slot(slot);
  std::uint64_t size = nodes_[n].size;
  std::uint32_t chunk = nodes_[n].chunk;
  in_use_ -= size;
  std::uint32_t left = --chunks_[chunk].taken_blocks;
  make_free(n);
  if (info) *info = FreeInfo{size, chunk, left == 0};
  return FreeStatus::freed;
}

Suballocator::FreeStatus Suballocator::hold(std::uint64_t address, std::size_t* size) {
  std::uint32_t n = map_find(address);
  if (n == kNil) return classify_miss(address);
  if (nodes_[n].state != State::live) return FreeStatus::double_free;
  nodes_[n].state = State::held;
  in_use_ -= nodes_[n].size;
  held_ += nodes_[n].size;
  if (size) *size = nodes_[n].size;
  return FreeStatus::freed;
}

bool Suballocator::release_held(std::uint64_t address, FreeInfo* info) {
  std::uint32_t n = map_find(address);
  if (n == kNil || nodes_[n].state != State::held) return false;
  map_erase(address);
  std::uint64_t size = nodes_[n].size;
  std::uint32_t chunk = nodes_[n].chunk;
  held_ -= size;
  std::uint32_t left = --chunks_[chunk].taken_blocks;
  make_free(n);
  if (info) *info = FreeInfo{size, chunk, left == 0};
  return true;
}

std::uint32_t Suballocator::block_containing(std::uint64_t address) const {
  std::uint32_t id = find_chunk(address);
  if (id == kNoChunk) return kNil;
  for (std::uint32_t n = chunks_[id].first; n != kNil; n = nodes_[n].next_phys)
    if (address - nodes_[n].addr < nodes_[n].size) return n;
  return kNil;
}

// Error path only: why is `address` not the start of a live block?
Suballocator::FreeStatus Suballocator::classify_miss(std::uint64_t address) const {
  std::uint32_t n = block_containing(address);
  if (n == kNil) return FreeStatus::not_owned;
  return nodes_[n].state == State::live ? FreeStatus::not_owned : FreeStatus::double_free;
}

std::size_t Suballocator::block_size(std::uint64_t address) const {
  std::uint32_t n = map_find(address);
  return n != kNil && nodes_[n].state == State::live ? nodes_[n].size : 0;
}

bool Suballocator::block_range(std::uint64_t address, std::uint64_t* base, std::size_t* size) const {
  std::uint32_t n = map_find(address);
  if (n == kNil) n = block_containing(address);
  if (n == kNil || nodes_[n].state != State::live) return false;
  if (base) *base = nodes_[n].addr;
  if (size) *size = nodes_[n].size;
  return true;
}

// ---- address -> node hash (linear probing, backward-shift deletion, load <= 1/2) ---------------

namespace {
inline std::uint64_t hash_slot(std::uint64_t key, int shift) {
  return ((key >> kAlignShift) * 0x9E3779B97F4A7C15ull) >> shift;
}
}  // namespace

std::uint64_t Suballocator::map_slot(std::uint64_t key) const {
  if (key == 0) return map_.size();
  for (std::uint64_t i = hash_slot(key, map_shift_);; i = (i + 1) & map_mask_) {
    const Slot& s = map_[i];
    if (s.key == key) return i;
    if (s.key == 0) return map_.size();
  }
}

std::uint32_t Suballocator::map_find(std::uint64_t key) const {
  std::uint64_t i = map_slot(key);
  return i == map_.size() ? kNil : map_[i].node;
}

void Suballocator::map_insert(std::uint64_t key, std::uint32_t node) {
  if ((map_count_ + 1) * 2 > map_.size()) map_grow();
  std::uint64_t i = hash_slot(key, map_shift_);
  while (map_[i].key != 0) i = (i + 1) & map_mask_;
  map_[i] = Slot{key, node};
  ++map_count_;
}

void Suballocator::map_erase(std::uint64_t key) {
  std::uint64_t i = map_slot(key);
  if (i != map_.size()) map_erase_slot(i);
}

void Suballocator::map_erase_slot(std::uint64_t i) {
  // Backward shift: pull later entries of the probe run into the hole so lookups stay tombstone-free.
  std::uint64_t hole = i;
  for (std::uint64_t j = (i + 1) & map_mask_; map_[j].key != 0; j = (j + 1) & map_mask_) {
    std::uint64_t home = hash_slot(map_[j].key, map_shift_);
    // Move j into the hole unless its home lies cyclically in (hole, j].
    bool home_between = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
    if (!home_between) {
      map_[hole] = map_[j];
      hole = j;
    }
  }
  map_[hole] = Slot{};
  --map_count_;
}

void Suballocator::map_grow() {
  std::vector<Slot> old(map_.size() * 2);
  old.swap(map_);
  map_mask_ = map_.size() - 1;
  map_shift_ = 64 - std::countr_zero(map_.size());
  map_count_ = 0;
  for (const Slot& s : old)
    if (s.key != 0) {
      std::uint64_t i = hash_slot(s.key, map_shift_);
      while (map_[i].key != 0) i = (i + 1) & map_mask_;
      map_[i] = s;
      ++map_count_;
    }
}

// ---- invariants (tests) ------------------------------------------------------------------------

bool Suballocator::check_invariants() const {
  std::uint64_t reserved = 0, in_use = 0, held = 0;
  std::uint32_t free_blocks = 0;
  std::size_t taken = 0;
  std::uint64_t prev_end = 0;
  for (std::uint32_t id : chunk_order_) {
    const Chunk& c = chunks_[id];
    if (!c.used || c.base < prev_end) return false;
    prev_end = c.base + c.size;
    reserved += c.size;
    std::uint64_t expect = c.base;
    std::uint32_t prev = kNil, chunk_taken = 0;
    bool prev_free = false;
    for (std::uint32_t n = c.first; n != kNil; n = nodes_[n].next_phys) {
      const Node& b = nodes_[n];
      if (b.addr != expect || b.prev_phys != prev || b.chunk != id || b.size == 0 || b.size % kAlignment) return false;
      expect += b.size;
      prev = n;
      switch (b.state) {
        case State::free: {
          if (prev_free) return false;  // two free neighbours: coalescing failed
          ++free_blocks;
          if (map_find(b.addr) != kNil) return false;
          break;
        }
        case State::live: in_use += b.size; ++chunk_taken; if (map_find(b.addr) != n) return false; break;
        case State::held: held += b.size; ++chunk_taken; if (map_find(b.addr) != n) return false; break;
        case State::unused: return false;
      }
      prev_free = b.state == State::free;
    }
    if (expect != c.base + c.size || chunk_taken != c.taken_blocks) return false;
    taken += chunk_taken;
  }
  // Every listed node is free, in its right class and bitmap bit; as many as the chunks hold.
  std::uint32_t listed = 0;
  for (int fl = 0; fl < kFlCount; ++fl)
    for (std::uint32_t sl = 0; sl < kSlCount; ++sl) {
      bool bit = (fl_bitmap_ >> fl & 1) && (sl_bitmap_[fl] >> sl & 1);
      if (bit != (heads_[fl][sl] != kNil)) return false;
      std::uint32_t prev = kNil;
      for (std::uint32_t m = heads_[fl][sl]; m != kNil; prev = m, m = nodes_[m].next_free) {
        int f, s;
        mapping(nodes_[m].size >> kAlignShift, &f, &s);
        if (nodes_[m].state != State::free || nodes_[m].prev_free != prev || f != fl ||
            static_cast<std::uint32_t>(s) != sl)
          return false;
        ++listed;
      }
    }
  return listed == free_blocks && reserved == reserved_ && in_use == in_use_ && held == held_ && free_blocks == free_blocks_ &&
         taken == map_count_;
}

}  // namespace cupool
