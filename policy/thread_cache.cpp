// Thread caches (thread_cache.h): a thread's bins of freed blocks in front of a ContextPool, and
// the per-thread list of the caches it owns.
#include "thread_cache.h"

#include <mutex>
#include <unordered_map>

namespace cupool {

static_assert((ThreadCache::kLiveSlots & (ThreadCache::kLiveSlots - 1)) == 0);
static_assert(ThreadCache::kLiveSlots == std::size_t{1} << 11, "home() yields 11 bits");

// Open addressing with linear probing, at most 3/4 full; deletion shifts entries back, so
// there are no tombstones and a probe stops at the first empty slot.
bool ThreadCache::track(std::uint64_t ptr, std::uint64_t size) {
  if (ptr == 0) return false;
  if (live_count_ >= kLiveSlots / 4 * 3) return false;
  std::size_t i = home(ptr);
  while (live_[i].ptr != 0) {
    if (live_[i].ptr == ptr) {  // cannot happen for a pool handing out each block once
      live_[i].size = size;
      return true;
    }
    i = (i + 1) & (kLiveSlots - 1);
  }
  live_[i] = Slot{ptr, size};
  ++live_count_;
  return true;
}

bool ThreadCache::untrack(std::uint64_t ptr, std::uint64_t* size) {
  if (ptr == 0) return false;
  std::size_t i = home(ptr);
  while (live_[i].ptr != ptr) {
    if (live_[i].ptr == 0) return false;
    i = (i + 1) & (kLiveSlots - 1);
  }
  *size = live_[i].size;
  // Backward-shift deletion: move later entries of the cluster into the hole when their home
  // is not between the hole and them.
  std::size_t hole = i;
  for (std::size_t j = (i + 1) & (kLiveSlots - 1); live_[j].ptr != 0; j = (j + 1) & (kLiveSlots - 1)) {
    const std::size_t h = home(live_[j].ptr);
    const bool movable = hole <= j ? (h <= hole || h > j) : (h <= hole && h > j);
    if (movable) {
      live_[hole] = live_[j];
      hole = j;
    }
  }
  live_[hole] = Slot{};
  --live_count_;
  return true;
}

void ThreadCache::forget_live() {
  live_.fill(Slot{});
  live_count_ = 0;
}

bool ThreadCache::put(std::uint64_t ptr, std::uint64_t size) {
  if (size > kMaxBlock) {
    if (large_.ptr != 0 || ptr == 0) return false;
    large_ = Slot{ptr, size};
    bytes_.store(bytes() + size, std::memory_order_relaxed);
    return true;
  }
  if (bin_bytes_ + size > kMaxBytes) return false;
  Bin* target = nullptr;
  for (Bin& b : bins_) {
    if (b.size == size) {
      target = &b;
      break;
    }
    if (b.count == 0 && target == nullptr) target = &b;  // an empty bin can take a new size
  }
  if (target == nullptr || target->count == kBinBlocks) return false;
  target->size = size;
  target->ptrs[static_cast<std::size_t>(target->count++)] = ptr;
  bin_bytes_ += size;
  bytes_.store(bytes() + size, std::memory_order_relaxed);
  return true;
}

std::uint64_t ThreadCache::take(std::uint64_t size) {
  if (size > kMaxBlock) {
    if (large_.ptr == 0 || large_.size != size) return 0;
    const std::uint64_t ptr = large_.ptr;
    large_ = Slot{};
    bytes_.store(bytes() - size, std::memory_order_relaxed);
    return ptr;
  }
  for (Bin& b : bins_) {
    if (b.size != size || b.count == 0) continue;
    const std::uint64_t ptr = b.ptrs[static_cast<std::size_t>(--b.count)];
    bin_bytes_ -= size;
    bytes_.store(bytes() - size, std::memory_order_relaxed);
    return ptr;
  }
  return 0;
}

bool ThreadCache::holds(std::uint64_t ptr) const {
  if (ptr != 0 && large_.ptr == ptr) return true;
  for (const Bin& b : bins_)
    for (int i = 0; i < b.count; ++i)
      if (b.ptrs[static_cast<std::size_t>(i)] == ptr) return true;
  return false;
}

// ---- which owners are alive, and each thread's caches ---------------------------------------

namespace thread_caches {
namespace {

std::mutex*& registry_mutex() {
  static std::mutex* m = new std::mutex;
  return m;
}
std::unordered_map<std::uint64_t, ThreadCacheOwner*>& owners() {
  static auto* p = new std::unordered_map<std::uint64_t, ThreadCacheOwner*>;
  return *p;
}
bool alive(std::uint64_t id) {
  std::lock_guard g(*registry_mutex());
  return owners().count(id) != 0;
}

struct Mine {
  struct Ref {
    std::uint64_t owner = 0;
    ThreadCache* cache = nullptr;
  };
  std::array<Ref, 8> refs{};
  ~Mine() {
    for (Ref& r : refs) {
      if (r.cache == nullptr) continue;
      std::lock_guard g(*registry_mutex());  // held throughout: the owner cannot be destroyed meanwhile
      if (auto it = owners().find(r.owner); it != owners().end()) it->second->retire_cache(r.cache);
    }
  }
  Mine::Ref* free_slot() {
    for (int pass = 0; pass < 2; ++pass)
      for (auto& r : refs)
        if (r.cache == nullptr || (pass == 1 && !alive(r.owner))) return &r;  // empty, or an owner's since destroyed
    return nullptr;
  }
};
thread_local Mine t_mine;

}  // namespace

void add_owner(std::uint64_t id, ThreadCacheOwner* owner) {
  std::lock_guard g(*registry_mutex());
  owners()[id] = owner;
}

void remove_owner(std::uint64_t id) {
  std::lock_guard g(*registry_mutex());
  owners().erase(id);
}

ThreadCache* mine(std::uint64_t id) {
  for (const auto& r : t_mine.refs)
    if (r.owner == id) return r.cache;
  return nullptr;
}

bool room() { return t_mine.free_slot() != nullptr; }

void adopt(std::uint64_t id, ThreadCache* cache) {
  if (Mine::Ref* slot = t_mine.free_slot()) *slot = Mine::Ref{id, cache};
}

// A thread the child lacks may have held the lock at the fork: a new one (the old one is leaked).
void after_fork_in_child() { registry_mutex() = new std::mutex; }

}  // namespace thread_caches

}  // namespace cupool
