// VmmCache (vmm_cache.h): which whole virtual-memory mappings are kept for reuse, and which go
// back to the driver.
#include "vmm_cache.h"

#include <algorithm>

namespace cupool {

// The mapping whose handle this thread was just given by take(): the next reserve() on the
// thread returns its address (XLA's sequence is create, reserve, map, set access on one thread).
struct LastTaken {
  const void* cache = nullptr;
  std::uint64_t id = 0;
};

namespace {
thread_local LastTaken t_last;
}  // namespace

VmmCache::Entry* VmmCache::by_id(std::uint64_t id) {
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : &it->second;
}

VmmCache::Entry* VmmCache::by_handle(std::uint64_t handle) {
  auto it = by_handle_.find(handle);
  return it == by_handle_.end() ? nullptr : by_id(it->second);
}

std::vector<std::uint64_t> VmmCache::overlapping(std::uint64_t va, std::uint64_t size) const {
  std::vector<std::uint64_t> out;
  if (by_va_.empty()) return out;
  const std::uint64_t end = va + std::max<std::uint64_t>(size, 1);
  auto it = by_va_.upper_bound(va);
  if (it != by_va_.begin()) --it;
  for (; it != by_va_.end() && it->first < end; ++it) {
    const Entry& e = entries_.at(it->second);
    if (e.va + e.size > va) out.push_back(it->second);
  }
  return out;
}

// ---- lifecycle of an entry -------------------------------------------------------------------

// The program has given up handle, reservation and mapping: the mapping may be handed out
// again once reusing it is as safe as the driver's fresh memory would be (the free mode).
void VmmCache::became_free(std::uint64_t id, Entry& e) {
  free_[Key{e.owner, e.size, e.props}].push_back(id);
  if (mode_ == FreeMode::deferred && !e.owner->needs_fences()) {
    e.stage = Stage::safe;  // one stream only: stream order makes reuse safe
    return;
  }
  e.stage = Stage::pending;
  pending_.push_back(id);
  pending_bytes_ += e.size;
  // Deferred: a fence now, at the free, covers exactly the work that may still use the mapping.
  // Placed later (at the next cuMemCreate) it would cover work issued since, and waiting for it
  // would be a full synchronize. Not during a stream capture (a fence is a query the capture
  // may forbid): then the mapping waits, unfenced, until a cuMemCreate after the capture.
  if (mode_ == FreeMode::deferred && !e.owner->capturing()) seal(e.owner);
}

void VmmCache::make_safe(std::uint64_t, Entry& e) {
  if (e.stage == Stage::pending) pending_bytes_ -= std::min(pending_bytes_, e.size);
  e.stage = Stage::safe;
}

void VmmCache::unlink_free(std::uint64_t id, const Entry& e) {
  auto it = free_.find(Key{e.owner, e.size, e.props});
  if (it == free_.end()) return;
  auto& ids = it->second;
  ids.erase(std::remove(ids.begin(), ids.end(), id), ids.end());
  if (ids.empty()) free_.erase(it);
}

void VmmCache::erase(std::uint64_t id) {
  Entry* e = by_id(id);
  if (e == nullptr) return;
  if (e->stage != Stage::used) unlink_free(id, *e);
  if (e->stage == Stage::pending) pending_bytes_ -= std::min(pending_bytes_, e->size);
  by_handle_.erase(e->handle);
  by_va_.erase(e->va);
  if (auto it = per_key_.find(Key{e->owner, e->size, e->props}); it != per_key_.end() && --it->second == 0)
    per_key_.erase(it);
  entries_.erase(id);  // ids in pending_ and batches_ that are gone are skipped there
}

void VmmCache::forget(std::uint64_t id) {
  erase(id);
  ++stats_.materialized;
}

// Makes the driver's state what the program believes (whatever it gave up is given up for
// real), then drops the entry. What the program still holds may form a mapping again.
void VmmCache::materialize(std::uint64_t id) {
  Entry* p = by_id(id);
  if (p == nullptr) return;
  const Entry e = *p;
  erase(id);
  if (!e.mapped) driver_.unmap(e.va, e.size);
  if (!e.has_handle) driver_.release(e.handle);
  if (!e.has_va && !e.mapped) driver_.address_free(e.va, e.size);
  if (e.has_handle && !e.mapped) cand_handles_[e.handle] = Candidate{e.size, e.owner, e.props};
  if (e.has_va && !e.mapped) cand_vas_[e.va] = e.size;
  if (e.any()) ++stats_.materialized;
  else ++stats_.evicted;
}

// Before a call the cache does not serve: what it touches must be as the program believes.
void VmmCache::clear_range(std::uint64_t va, std::uint64_t size) {
  for (std::uint64_t id : overlapping(va, size)) {
    if (entries_.at(id).live()) forget(id);  // the driver's state is the program's already
    else materialize(id);
  }
}

LastTaken VmmCache::last_taken() const {
  if (recorded_thread_) [[unlikely]] {
    auto it = recorded_last_.find(*recorded_thread_);
    return it != recorded_last_.end() && it->second ? LastTaken{this, it->second} : LastTaken{};
  }
  return t_last;
}

void VmmCache::set_last_taken(std::uint64_t id) {
  if (recorded_thread_) [[unlikely]] {
    recorded_last_[*recorded_thread_] = id;
    return;
  }
  t_last = id ? LastTaken{this, id} : LastTaken{};
}

std::uint64_t VmmCache::hand_out(std::uint64_t id, Entry& e) {
  unlink_free(id, e);
  e.stage = Stage::used;
  e.has_handle = true;
  e.has_va = false;
  e.mapped = false;
  set_last_taken(id);
  ++stats_.hits;
  return e.handle;
}

// ---- fences (deferred free mode) ------------------------------------------------------------

void VmmCache::seal(Upstream* owner) {
  Batch b;
  b.owner = owner;
  std::vector<std::uint64_t> rest;
  for (std::uint64_t id : pending_) {
    Entry* e = by_id(id);
    if (e == nullptr || e->stage != Stage::pending) continue;
    if (e->owner != owner) {
      rest.push_back(id);
      continue;
    }
    pending_bytes_ -= std::min(pending_bytes_, e->size);
    e->stage = Stage::fenced;
    b.ids.push_back(id);
  }
  pending_.swap(rest);
  if (b.ids.empty()) return;
  b.fence = owner->place_fence();
  ++stats_.fences_placed;
  batches_.push_back(std::move(b));
}

// Fences of one owner retire in order: poll from the oldest until one has not retired.
void VmmCache::poll(Upstream* owner) {
  for (auto it = batches_.begin(); it != batches_.end();) {
    if (it->owner != owner) {
      ++it;
      continue;
    }
    if (!owner->fence_retired(it->fence)) return;
    for (std::uint64_t id : it->ids)
      if (Entry* e = by_id(id); e && e->stage == Stage::fenced) make_safe(id, *e);
    it = batches_.erase(it);
  }
}

// ---- cuMemCreate ----------------------------------------------------------------------------

std::uint64_t VmmCache::take(Upstream* owner, std::uint64_t size, const VmmProps& props, bool room) {
  if (owner == nullptr) return 0;
  Lock lock(mu_);
  const Key key{owner, size, props};
  auto safe_one = [&]() -> std::uint64_t {
    auto it = free_.find(key);
    if (it == free_.end()) return 0;
    for (std::size_t i = it->second.size(); i-- > 0;) {
      const std::uint64_t id = it->second[i];
      Entry& e = entries_.at(id);
      if (e.stage == Stage::safe) return hand_out(id, e);
    }
    return 0;
  };
  if (std::uint64_t h = safe_one()) return h;
  if (free_.find(key) == free_.end()) return 0;  // nothing of this size: create for real
  // During a stream capture no synchronize, fence or wait: what is not safe yet stays kept, and
  // the program's cuMemCreate goes to the driver.
  if (owner->capturing()) return 0;

  // Waits (a synchronize, a fence) happen with the lock dropped: they last as long as the
  // device's queue, and other threads' VMM calls, or a host callback the device is waiting for,
  // must not queue behind them.
  if (mode_ == FreeMode::sync) {
    // What cudaFree does: wait for the device; then every mapping freed before the wait began
    // is reusable.
    std::vector<std::uint64_t> before;
    for (std::uint64_t id : pending_)
      if (const Entry* e = by_id(id); e && e->stage == Stage::pending && e->owner == owner) before.push_back(id);
    lock.unlock();
    owner->synchronize();
    lock.lock();
    ++stats_.synchronizes;
    for (std::uint64_t id : before)
      if (Entry* e = by_id(id); e && e->stage == Stage::pending) make_safe(id, *e);
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                  [&](std::uint64_t id) {
                                    const Entry* e = by_id(id);
                                    return e == nullptr || e->stage != Stage::pending;
                                  }),
                   pending_.end());
    return safe_one();
  }

  // Deferred: reuse what has retired, else create for real while the key has fewer than
  // kMaxPerKey mappings and the cap has room, else wait for the oldest fence of the key. Waiting at
  // once (as the pool waits for its quarantine before it grows) starved the device on the H200:
  // XLA frees a buffer and at once asks for the same size for the next operation, so each wait
  // held the host until the device had drained its queue (JAX step 6.4 ms against 2.4 ms with
  // BFC). Creating lets the cache grow to the host's lead over the device, bounded per key.
  seal(owner);
  poll(owner);
  if (std::uint64_t h = safe_one()) return h;
  if (auto it = per_key_.find(key); room && (it == per_key_.end() || it->second < kMaxPerKey)) return 0;
  const auto holds_key = [&](const Batch& b) {
    return b.owner == owner && std::any_of(b.ids.begin(), b.ids.end(), [&](std::uint64_t id) {
             const Entry* e = by_id(id);
             return e && e->stage == Stage::fenced && e->size == size && e->props == props;
           });
  };
  const auto oldest = std::find_if(batches_.begin(), batches_.end(), holds_key);
  if (oldest == batches_.end()) return 0;
  const FenceId fence = oldest->fence;
  lock.unlock();
  owner->wait_fence(fence);
  lock.lock();
  ++stats_.fence_waits;
  // That fence and every older one of the owner have retired (fences of one owner retire in
  // order); another thread may have retired some of them meanwhile.
  const auto waited = std::find_if(batches_.begin(), batches_.end(),
                                   [&](const Batch& b) { return b.owner == owner && b.fence == fence; });
  if (waited != batches_.end()) {
    const auto last = static_cast<std::size_t>(waited - batches_.begin());
    std::size_t j = 0;
    for (std::size_t k = 0; k < batches_.size(); ++k) {
      Batch& c = batches_[k];
      if (k <= last && c.owner == owner) {
        // Asking lets the upstream forget (and recycle) the fence's events, which it does only
        // once it has seen it retired.
        if (k < last) owner->fence_retired(c.fence);
        for (std::uint64_t id : c.ids)
          if (Entry* e = by_id(id); e && e->stage == Stage::fenced) make_safe(id, *e);
      } else {
        if (j != k) batches_[j] = std::move(c);
        ++j;
      }
    }
    batches_.resize(j);
  }
  return safe_one();
}

void VmmCache::created(Upstream* owner, std::uint64_t handle, std::uint64_t size, const VmmProps& props) {
  if (owner == nullptr) return;
  std::lock_guard lock(mu_);
  cand_handles_[handle] = Candidate{size, owner, props};
}

// ---- cuMemAddressReserve --------------------------------------------------------------------

std::uint64_t VmmCache::reserve(std::uint64_t size, std::uint64_t alignment) {
  const LastTaken last = last_taken();
  if (last.cache != this) return 0;
  std::lock_guard lock(mu_);
  const std::uint64_t id = last.id;
  set_last_taken(0);
  Entry* e = by_id(id);
  if (e == nullptr || e->stage != Stage::used || !e->has_handle || e->has_va || e->mapped || e->size != size)
    return 0;
  if (alignment != 0 && e->va % alignment != 0) return 0;
  e->has_va = true;
  return e->va;
}

void VmmCache::before_reserve_at(std::uint64_t addr, std::uint64_t size) {
  std::lock_guard lock(mu_);
  for (std::uint64_t id : overlapping(addr, size))
    if (!entries_.at(id).has_va) materialize(id);
}

void VmmCache::reserved(std::uint64_t va, std::uint64_t size) {
  std::lock_guard lock(mu_);
  cand_vas_[va] = size;
}

// ---- cuMemMap / cuMemUnmap / cuMemSetAccess ---------------------------------------------------

VmmCache::Verdict VmmCache::map(std::uint64_t va, std::uint64_t size, std::uint64_t offset, std::uint64_t handle) {
  std::lock_guard lock(mu_);
  if (by_handle_.empty() && by_va_.empty()) return Verdict::forward;
  auto hit = by_handle_.find(handle);
  if (hit != by_handle_.end()) {
    Entry& e = entries_.at(hit->second);
    if (e.va == va && e.size == size && offset == 0 && e.has_handle && e.has_va && !e.mapped) {
      e.mapped = true;  // it never stopped being mapped
      return Verdict::served;
    }
    // The handle goes elsewhere (or is mapped a second time): no longer a whole mapping.
    if (e.live()) forget(hit->second);
    else materialize(hit->second);  // what the program still holds may form a mapping again
  }
  clear_range(va, size);
  return Verdict::forward;
}

// A real map succeeded: a handle created for real mapped whole over a reservation of its exact
// size forms a mapping; any other use of a candidate handle or reservation rules it out.
void VmmCache::map_done(std::uint64_t va, std::uint64_t size, std::uint64_t offset, std::uint64_t handle) {
  std::lock_guard lock(mu_);
  auto ch = cand_handles_.find(handle);
  auto cv = cand_vas_.find(va);
  if (ch != cand_handles_.end() && cv != cand_vas_.end() && offset == 0 && ch->second.size == size &&
      cv->second == size) {
    Entry e;
    e.va = va;
    e.size = size;
    e.handle = handle;
    e.owner = ch->second.owner;
    e.props = ch->second.props;
    const std::uint64_t id = next_id_++;
    entries_.emplace(id, e);
    ++per_key_[Key{e.owner, e.size, e.props}];
    by_handle_[handle] = id;
    by_va_[va] = id;
    cand_handles_.erase(ch);
    cand_vas_.erase(cv);
    return;
  }
  if (ch != cand_handles_.end()) cand_handles_.erase(ch);
  if (cv != cand_vas_.end()) cand_vas_.erase(cv);
}

VmmCache::Verdict VmmCache::unmap(std::uint64_t va, std::uint64_t size) {
  std::lock_guard lock(mu_);
  auto it = by_va_.find(va);
  if (it != by_va_.end()) {
    Entry& e = entries_.at(it->second);
    if (e.size == size && e.mapped) {
      e.mapped = false;  // stays mapped for real
      if (!e.any()) became_free(it->second, e);
      return Verdict::served;
    }
  }
  clear_range(va, size);
  return Verdict::forward;
}

VmmCache::Verdict VmmCache::set_access(std::uint64_t va, std::uint64_t size, const VmmAccess& access) {
  std::lock_guard lock(mu_);
  auto it = by_va_.find(va);
  if (it != by_va_.end()) {
    Entry& e = entries_.at(it->second);
    if (e.size == size && e.mapped && e.access_known && access.storable() && e.access == access)
      return Verdict::served;
  }
  // Ranges the program has unmapped must be unmapped for real, so the driver answers as it would.
  for (std::uint64_t id : overlapping(va, size))
    if (!entries_.at(id).mapped) materialize(id);
  return Verdict::forward;
}

void VmmCache::set_access_done(std::uint64_t va, std::uint64_t size, const VmmAccess& access) {
  std::lock_guard lock(mu_);
  for (std::uint64_t id : overlapping(va, size)) {
    Entry& e = entries_.at(id);
    const bool whole = e.va == va && e.size == size;
    e.access = access;
    e.access_known = whole && access.storable();
  }
}

// ---- cuMemRelease / cuMemAddressFree --------------------------------------------------------

VmmCache::Verdict VmmCache::release(std::uint64_t handle, std::uint64_t* size) {
  std::lock_guard lock(mu_);
  auto it = by_handle_.find(handle);
  if (it != by_handle_.end()) {
    Entry& e = entries_.at(it->second);
    if (e.has_handle) {
      e.has_handle = false;  // kept for real
      if (size) *size = e.size;
      if (!e.any()) became_free(it->second, e);
      return Verdict::served;
    }
    materialize(it->second);  // released twice: let the driver say so
  }
  cand_handles_.erase(handle);
  return Verdict::forward;
}

VmmCache::Verdict VmmCache::address_free(std::uint64_t va, std::uint64_t size) {
  std::lock_guard lock(mu_);
  auto it = by_va_.find(va);
  if (it != by_va_.end()) {
    Entry& e = entries_.at(it->second);
    if (e.size == size && e.has_va && !e.mapped) {
      e.has_va = false;  // kept reserved for real
      if (!e.any()) became_free(it->second, e);
      return Verdict::served;
    }
  }
  clear_range(va, size);
  cand_vas_.erase(va);
  return Verdict::forward;
}

// ---- sharing, pressure, context loss ------------------------------------------------------------

void VmmCache::pin_handle(std::uint64_t handle) {
  std::lock_guard lock(mu_);
  auto it = by_handle_.find(handle);
  if (it != by_handle_.end()) {
    if (entries_.at(it->second).live()) forget(it->second);
    else materialize(it->second);
  }
  cand_handles_.erase(handle);
}

void VmmCache::pin_address(std::uint64_t addr) {
  std::lock_guard lock(mu_);
  for (std::uint64_t id : overlapping(addr, 1)) {
    const std::uint64_t handle = entries_.at(id).handle;
    if (entries_.at(id).live()) forget(id);
    else materialize(id);
    cand_handles_.erase(handle);
  }
}

std::uint64_t VmmCache::evict_free(Upstream* owner) {
  std::lock_guard lock(mu_);
  std::vector<std::uint64_t> ids;
  std::uint64_t bytes = 0;
  std::vector<Upstream*> unsafe_owners;  // with freed mappings device work may still use
  for (const auto& [key, list] : free_)
    if (owner == nullptr || key.owner == owner)
      for (std::uint64_t id : list) {
        const Entry* e = by_id(id);
        const bool safe = e && e->stage == Stage::safe;
        if (!safe && key.owner->capturing()) continue;  // no synchronize during a capture: kept
        ids.push_back(id);
        bytes += key.size;
        if (!safe && std::find(unsafe_owners.begin(), unsafe_owners.end(), key.owner) == unsafe_owners.end())
          unsafe_owners.push_back(key.owner);
      }
  // The program freed these, but the device may still be using them: a kept mapping is not
  // unmapped for real before the work issued before its free is done (the program's own unmap
  // would have come after that work was issued, and the cache must not make it earlier).
  for (Upstream* u : unsafe_owners) {
    u->synchronize();
    ++stats_.synchronizes;
  }
  for (std::uint64_t id : ids) materialize(id);
  return bytes;
}

void VmmCache::abandon(Upstream* owner) {
  std::lock_guard lock(mu_);
  std::vector<std::uint64_t> ids;
  for (const auto& [id, e] : entries_)
    if (e.owner == owner) ids.push_back(id);
  for (std::uint64_t id : ids) erase(id);
  for (auto it = cand_handles_.begin(); it != cand_handles_.end();)
    it = it->second.owner == owner ? cand_handles_.erase(it) : std::next(it);
  batches_.erase(std::remove_if(batches_.begin(), batches_.end(), [&](const Batch& b) { return b.owner == owner; }),
                 batches_.end());
}

std::uint64_t VmmCache::free_bytes(Upstream* owner) const {
  std::lock_guard lock(mu_);
  std::uint64_t bytes = 0;
  for (const auto& [key, list] : free_)
    if (owner == nullptr || key.owner == owner) bytes += key.size * list.size();
  return bytes;
}

VmmCache::Stats VmmCache::stats() const {
  std::lock_guard lock(mu_);
  Stats s = stats_;
  s.entries = entries_.size();
  for (const auto& [key, list] : free_) {
    s.free_entries += list.size();
    s.free_bytes += key.size * list.size();
  }
  return s;
}

}  // namespace cupool
