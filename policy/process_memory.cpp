// ProcessMemory (process_memory.h): all the device memory of one process, as cupool governs it.
#include "process_memory.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <optional>
#include <string>

#include "log.h"
#include "thread_id.h"

namespace cupool {

std::uint64_t ProcessMemory::device_total(const ContextMemory& c) { return c.device_total; }

ProcessMemory::ProcessMemory(const Config& cfg, PoolObserver* observer, VmmDriver* vmm, SharedBudget* share,
                             Clock clock)
    : cfg_(cfg), observer_(observer), share_(share), clock_(clock ? clock : &monotonic_clock) {
  for (auto& s : slot_ctx_) s.store(0, std::memory_order_relaxed);
  if (vmm) vmm_driver_ = std::make_unique<ChargingVmm>(*this, *vmm);
}

ProcessMemory::~ProcessMemory() {
  // Pools give their chunks back to their upstreams (replay, tests); the shim never destroys it.
  for (auto& r : records_) r->pool.reset();
  delete vmm_cache_.load();
}

// ---- contexts --------------------------------------------------------------------------------

bool ProcessMemory::device_known(int device) const {
  const int n = slot_count_.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i)
    if (slot_ctx_[i].load(std::memory_order_acquire) != kDropped && slot_[i] && slot_[i]->device == device)
      return true;
  return false;
}

ContextMemory* ProcessMemory::find_or_add(std::uint64_t ctx, const std::function<bool(ContextMemory&)>& describe) {
  if (ContextMemory* c = find(ctx)) return c;
  std::lock_guard lock(contexts_mutex_);
  if (ContextMemory* c = find(ctx)) return c;
  const int n = slot_count_.load(std::memory_order_acquire);
  int slot = -1;
  for (int i = 0; i < n && slot < 0; ++i)
    if (slot_ctx_[i].load() == kDropped) slot = i;
  if (slot < 0 && n == kMaxContexts) {
    log_error("more than 64 CUDA contexts in one process; allocations in the others go to the driver");
    return nullptr;
  }
  auto record = std::make_unique<ContextMemory>();
  record->ctx = ctx;
  if (!describe(*record) || record->upstream == nullptr) return nullptr;
  // The device's memory, once (a percent budget resolves against it); asked before the slot is
  // published, so no thread ever writes it later.
  {
    std::size_t total = 0, free = 0;
    record->upstream->device_memory(&total, &free);
    record->device_total = total;
  }
  record->pool = std::make_unique<ContextPool>(cfg_, record->device, *record->upstream, observer_,
                                              &admission(record->device, record->device_total));
  record->pool->set_clock(clock_, nullptr);
  ContextMemory* c = record.get();
  records_.push_back(std::move(record));
  if (slot < 0) slot = n;
  slot_[slot] = c;
  slot_ctx_[slot].store(ctx, std::memory_order_release);
  if (slot == n) slot_count_.store(n + 1, std::memory_order_release);
  return c;
}

void ProcessMemory::for_each(const std::function<void(ContextMemory&)>& fn) const {
  const int n = slot_count_.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i)
    if (slot_ctx_[i].load(std::memory_order_acquire) != kDropped && slot_[i]) fn(*slot_[i]);
}

void ProcessMemory::drop_slot_locked(int i, const std::function<void(ContextMemory&)>& before) {
  ContextMemory* c = slot_[i];
  slot_ctx_[i].store(kDropped, std::memory_order_release);
  if (before) before(*c);
  // The driver frees all of it with the context: the device's admission gets back what the
  // pool's chunks and the memory outside the pool held (chunks in flight settle themselves).
  DeviceAdmission& admission = c->pool->admission();
  const std::uint64_t pooled = c->pool->state().reserved;
  c->pool->abandon();
  admission.release_shared(pooled);  // (the cap's part goes with the pool's next post)
  if (VmmCache* cache = vmm_cache_.load(std::memory_order_acquire)) cache->abandon(c->upstream);
  std::uint64_t outside = 0;
  {
    std::lock_guard lock(outside_mutex_);
    for (auto it = outside_.begin(); it != outside_.end();) {
      if (it->second.owner != c) {
        ++it;
        continue;
      }
      outside += it->second.bytes;
      it = outside_.erase(it);
    }
  }
  admission.release_outside(outside);
}

void ProcessMemory::drop(std::uint64_t ctx, const std::function<void(ContextMemory&)>& before) {
  drop_if([ctx](const ContextMemory& c) { return c.ctx == ctx; }, before);
}

void ProcessMemory::drop_if(const std::function<bool(const ContextMemory&)>& which,
                            const std::function<void(ContextMemory&)>& before) {
  std::lock_guard lock(contexts_mutex_);
  const int n = slot_count_.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i)
    if (slot_ctx_[i].load() != kDropped && slot_[i] && which(*slot_[i])) drop_slot_locked(i, before);
}

// ---- allocation ------------------------------------------------------------------------------

AllocResult ProcessMemory::allocate(ContextMemory& c, std::size_t size, const char* api, PoolStats* state) {
  AdmissionWait wait;  // every budget wait of this allocation ends at one deadline
  AllocResult r = c.pool->allocate(size, state, &wait);
  if (r.ptr == 0 && vmm_evict(&c) > 0) r = c.pool->allocate(size, state, &wait);  // kept VMM mappings first
  if (r.ptr == 0) {
    if (r.oom == OomClass::share && share_) share_->note_oom();
    warn_oom(c, api, size, r.oom == OomClass::none ? OomClass::device : r.oom);
  }
  return r;
}

OomClass ProcessMemory::refusal_class(OutsideAnswer answer, int device) const {
  switch (answer) {
    case OutsideAnswer::ok:
      return OomClass::none;
    case OutsideAnswer::refused_by_cap:
      if (const DeviceAdmission* a = find_admission(device)) return a->cap_refusal();
      return OomClass::device;
    case OutsideAnswer::refused_by_share:
      return OomClass::share;
    default:
      return OomClass::device;
  }
}

void ProcessMemory::remember_outside(std::uint64_t key, std::uint64_t bytes, ContextMemory* owner, int device) {
  std::lock_guard lock(outside_mutex_);
  outside_[key] = Outside{bytes, owner, device};
}

DeviceAdmission& ProcessMemory::admission(int device, std::uint64_t device_total) {
  std::lock_guard lock(admissions_mutex_);
  std::unique_ptr<DeviceAdmission>& a = admissions_[device];
  if (!a) a = std::make_unique<DeviceAdmission>(cfg_, device, device_total, share_);
  return *a;
}

DeviceAdmission* ProcessMemory::find_admission(int device) const {
  std::lock_guard lock(admissions_mutex_);
  auto it = admissions_.find(device);
  return it == admissions_.end() ? nullptr : it->second.get();
}

OutsideAnswer ProcessMemory::refused_outside(int device, ContextMemory* c, std::uint64_t bytes, OomClass oom) {
  if (oom == OomClass::share) share_->note_oom();
  if (observer_) {
    PoolEvent e;
    e.kind = PoolEvent::Kind::oom;
    e.t_ns = clock_(nullptr);
    e.size = bytes;
    e.tid = current_thread_id();
    e.device = device;
    e.oom = oom;
    if (c) {
      e.has_stats = true;
      e.stats = c->pool->state();
    }
    observer_->pool_event(e);
  }
  return oom == OomClass::share ? OutsideAnswer::refused_by_share : OutsideAnswer::refused_by_cap;
}

OutsideAnswer ProcessMemory::admit_on_device(int device, std::uint64_t device_total, std::uint64_t bytes,
                                             const char* api) {
  DeviceAdmission& a = admission(device, device_total);
  const OomClass oom = a.admit_outside(bytes, nullptr);
  if (oom == OomClass::none) return OutsideAnswer::ok;
  warn_device_oom(device, api, bytes, oom, a);
  return refused_outside(device, nullptr, bytes, oom);
}

OutsideAnswer ProcessMemory::admit_outside(ContextMemory& c, std::uint64_t bytes, const char* api) {
  // Free mappings the cache keeps are charged: past the cap, they go back first (before the
  // admission, whose refusal is an oom event of its own).
  if (vmm_free_bytes(&c) > 0 && !c.pool->has_room(bytes)) vmm_evict(&c);
  const OomClass oom = c.pool->admission().admit_outside(bytes, nullptr);
  if (oom == OomClass::none) return OutsideAnswer::ok;
  warn_oom(c, api, bytes, oom);
  return refused_outside(c.device, &c, bytes, oom);
}

void ProcessMemory::unadmit_outside(ContextMemory& c, std::uint64_t bytes) { c.pool->admission().release_outside(bytes); }

void ProcessMemory::charge_outside(ContextMemory& c, std::uint64_t bytes) { c.pool->admission().charge_outside(bytes); }

bool ProcessMemory::forget_outside(std::uint64_t key, std::uint64_t* bytes, ContextMemory** owner, int* device) {
  Outside o{};
  {
    std::lock_guard lock(outside_mutex_);
    auto it = outside_.find(key);
    if (it == outside_.end()) return false;
    o = it->second;
    outside_.erase(it);
  }
  if (o.owner) unadmit_outside(*o.owner, o.bytes);
  else if (o.device >= 0) find_admission(o.device)->release_outside(o.bytes);
  if (bytes) *bytes = o.bytes;
  if (owner) *owner = o.owner;
  if (device) *device = o.device;
  return true;
}

bool ProcessMemory::find_outside(std::uint64_t key, std::uint64_t* bytes, ContextMemory** owner) const {
  std::lock_guard lock(outside_mutex_);
  auto it = outside_.find(key);
  if (it == outside_.end()) return false;
  if (bytes) *bytes = it->second.bytes;
  if (owner) *owner = it->second.owner;
  return true;
}

void ProcessMemory::given_back(std::uint64_t handle) {
  std::uint64_t bytes = 0;
  ContextMemory* owner = nullptr;
  int device = -1;
  if (!forget_outside(handle, &bytes, &owner, &device) || observer_ == nullptr) return;
  PoolEvent e;
  e.kind = PoolEvent::Kind::vmm_given_back;
  e.t_ns = clock_(nullptr);
  e.size = bytes;
  e.ptr = handle;
  e.tid = current_thread_id();
  e.device = owner ? owner->device : device;
  observer_->pool_event(e);
}

bool ProcessMemory::mem_info(ContextMemory* c, std::size_t* free, std::size_t* total) const {
  if (c == nullptr || free == nullptr || total == nullptr) return false;
  if (!pooled() && !cfg_.limit.for_device(c->device) && !share_) return false;  // pure passthrough
  c->pool->mem_info(free, total);
  *free = std::min<std::uint64_t>(*total, *free + vmm_free_bytes(c));  // kept VMM mappings are free to it
  // With a shared budget: no more than the budget still allows, besides what this process holds
  // free already (free bytes in its pools are its own).
  if (share_) {
    if (const auto room = share_->room(c->device, device_total(*c))) {
      const PoolStats s = c->pool->state();
      const std::uint64_t own_free = s.reserved > s.in_use ? s.reserved - s.in_use : 0;
      *free = std::min<std::uint64_t>(*free, *room + own_free);
    }
  }
  return true;
}

bool ProcessMemory::mem_info_device(int device, std::uint64_t device_total, std::uint64_t device_free,
                                    std::size_t* free, std::size_t* total) {
  if (free == nullptr || total == nullptr || device < 0) return false;
  // A device the process never charged anything to keeps the driver's answer, as one it never used does.
  DeviceAdmission* a = find_admission(device);
  if (a == nullptr) return false;
  const auto limit = cfg_.limit.for_device(device);
  const std::uint64_t cap = a->cap();
  const std::uint64_t held = a->charged();
  std::uint64_t f = std::min<std::uint64_t>(cap > held ? cap - held : 0, device_free);
  if (share_)
    if (const auto room = share_->room(device, device_total)) f = std::min<std::uint64_t>(f, *room);
  *total = limit ? cap : device_total;
  *free = std::min<std::uint64_t>(f, *total);
  return true;
}

// ---- the VMM mapping cache -------------------------------------------------------------------

VmmCache* ProcessMemory::vmm_cache() {
  if (!pooled() || !cfg_.vmm_cache || !vmm_driver_) return nullptr;
  VmmCache* c = vmm_cache_.load(std::memory_order_acquire);
  if (c) return c;
  auto* fresh = new VmmCache(*vmm_driver_, cfg_.free_mode);
  if (vmm_cache_.compare_exchange_strong(c, fresh, std::memory_order_acq_rel)) return fresh;
  delete fresh;
  return c;
}

std::uint64_t ProcessMemory::vmm_evict(ContextMemory* c) {
  VmmCache* cache = c ? vmm_cache_.load(std::memory_order_acquire) : nullptr;
  return cache ? cache->evict_free(c->upstream) : 0;
}

std::uint64_t ProcessMemory::vmm_free_bytes(ContextMemory* c) const {
  VmmCache* cache = c ? vmm_cache_.load(std::memory_order_acquire) : nullptr;
  return cache ? cache->free_bytes(c->upstream) : 0;
}

void ProcessMemory::publish_share() {
  if (!share_) return;
  // Per device: every context's pool there and the memory outside them (the admission sums them).
  std::vector<DeviceAdmission*> all;
  {
    std::lock_guard lock(admissions_mutex_);
    for (const auto& [device, a] : admissions_) all.push_back(a.get());
  }
  for (DeviceAdmission* a : all) a->publish();
}

void ProcessMemory::give_back() {
  for_each([this](ContextMemory& c) {
    c.pool->trim();
    vmm_evict(&c);
  });
  // Top's figures once, summed per device: a context's own figures would stand for its device's
  // until the next publish (wrong where a device has two contexts).
  publish_share();
}

// ---- fork ------------------------------------------------------------------------------------

void ProcessMemory::prepare_fork() {
  contexts_mutex_.lock();
  outside_mutex_.lock();
}

void ProcessMemory::parent_after_fork() {
  outside_mutex_.unlock();
  contexts_mutex_.unlock();
}

void ProcessMemory::child_after_fork(const std::function<void(ContextMemory&)>& before) {
  ContextPool::after_fork_in_child();
  const int n = slot_count_.load();
  for (int i = 0; i < n; ++i) {
    if (slot_ctx_[i].load() == kDropped || !slot_[i]) continue;
    if (before) before(*slot_[i]);
    slot_[i]->pool->abandon_after_fork();
    slot_ctx_[i].store(kDropped);
  }
  // The parent's mappings are not the child's; the cache's lock may have been held at the fork.
  // The old cache is leaked, not destroyed, for that reason.
  if (vmm_cache_.load(std::memory_order_acquire))
    vmm_cache_.store(new VmmCache(*vmm_driver_, cfg_.free_mode), std::memory_order_release);
  outside_.clear();
  {
    std::lock_guard lock(admissions_mutex_);  // taken by no thread but this one in the child
    for (auto& [device, a] : admissions_) a->reset();
  }
  outside_mutex_.unlock();
  contexts_mutex_.unlock();
}

}  // namespace cupool
