// ProcessMemory: all the device memory of one process, as cupool governs it, with no CUDA in it.
// The shim translates CUDA calls into calls on one ProcessMemory and its answers back into CUDA
// codes; `cupool replay` drives the very same object on simulated devices, so that a replay runs
// what the shim runs, not an imitation of it. It holds:
// - one ContextPool per device context (growth, preallocate, vmm, free modes);
// - one DeviceAdmission per device (the cap, then the shared budget), which the device's pools
//   and all memory outside them pass;
// - the table of memory the process holds outside the pools (passthrough, managed,
//   stream-ordered, virtual memory, arrays), admitted by its device and given back at its free;
// - the VMM mapping cache, and the rule that its kept mappings go back before anything is refused;
// - what each memory call does to the process, in the caller's terms (policy/memory_calls.h says
//   which API a pool serves): allocate, free, the VMM cache's protocol, context drop;
// - the memory-info answer, the out-of-memory warning, and the class a refusal is reported as.
// docs/design.md ("Process memory") explains the rules.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "clock.h"
#include "config.h"
#include "context_pool.h"
#include "device_admission.h"
#include "memory_calls.h"
#include "pool_events.h"
#include "shared_budget.h"
#include "upstream.h"
#include "vmm_cache.h"

namespace cupool {

// The memory of one device context. Records are never freed while the process runs: a thread may
// still hold one whose context another thread has just destroyed.
struct ContextMemory {
  std::uint64_t ctx = 0;      // the caller's handle for the context (a CUcontext in the shim)
  std::uint64_t primary = 0;  // the device's primary context, when the caller knows it
  int device = -1;
  Upstream* upstream = nullptr;  // owned by the caller
  std::unique_ptr<ContextPool> pool;
  std::uint64_t device_total = 0;  // the device's memory (set once, at creation): a percent budget's base
};

// How an allocation made outside the pools went, in the API's own terms.
enum class OutsideAnswer : std::uint8_t {
  ok,
  out_of_memory,  // the driver is short of memory: kept VMM mappings go back, then it is tried again
  failed,         // any other refusal
  refused_by_cap,   // cupool refused it (the cap) without calling the driver
  refused_by_share, // cupool refused it: the budget shared with other processes has no room
};

// Blocks whose free must wait: a vmm block shared over CUDA IPC stays the exporter's until the
// last importer let go of it (shim/ipc_vmm.cpp). hold() answers for a free of `ptr`: true if it
// took the free (*result: freed, or double_free; *size the block's bytes), false to let the pool
// free it now.
class FreeGate {
 public:
  virtual bool hold(ContextMemory& c, std::uint64_t ptr, std::size_t* size, FreeResult* result) = 0;

 protected:
  ~FreeGate() = default;
};

class ProcessMemory {
 public:
  static constexpr int kMaxContexts = 64;

  // `vmm`: the real calls the VMM cache makes itself (nullptr: no cache). `observer`: where the
  // pools and the process's memory report their events (nullptr: nowhere).
  // `share`: the budget shared with other processes (nullptr: none); it must outlive this.
  // `clock`: what the pools and the process's own events read the time from (nullptr:
  // CLOCK_MONOTONIC; the shim gives the trace's, policy/clock.h).
  ProcessMemory(const Config& cfg, PoolObserver* observer, VmmDriver* vmm, SharedBudget* share = nullptr,
                Clock clock = nullptr);
  ~ProcessMemory();
  ProcessMemory(const ProcessMemory&) = delete;
  ProcessMemory& operator=(const ProcessMemory&) = delete;

  const Config& config() const { return cfg_; }
  // Out-of-memory warnings on stderr (on by default; replay turns them off: its report says it).
  void set_warnings(bool on) { warnings_ = on; }
  bool pooled() const { return cfg_.policy != PolicyKind::passthrough; }

  // ---- contexts
  // The record of `ctx`, without a lock; nullptr if it has none. (Inline, below, as owning():
  // every allocation and free asks one.)
  ContextMemory* find(std::uint64_t ctx) const;
  // The record of `ctx`, made if need be: `describe` (called under the contexts' lock, at most
  // once) fills in device, primary and upstream, and returns false if it cannot. nullptr if it
  // could not, or the process already has kMaxContexts contexts.
  ContextMemory* find_or_add(std::uint64_t ctx, const std::function<bool(ContextMemory&)>& describe);
  bool device_known(int device) const;  // some live context is on it (under find_or_add's lock)
  // The context whose pool handed out `ptr`.
  ContextMemory* owning(std::uint64_t ptr) const;
  void for_each(const std::function<void(ContextMemory&)>& fn) const;  // every live context
  // A context went away: its pool, its kept mappings and its memory outside the pool are
  // forgotten, with no upstream call. `before` runs first (the shim stops its driver calls).
  void drop(std::uint64_t ctx, const std::function<void(ContextMemory&)>& before);
  void drop_if(const std::function<bool(const ContextMemory&)>& which,
               const std::function<void(ContextMemory&)>& before);

  // ---- allocation in a pool: on a refusal, kept VMM mappings go back and it is tried once more.
  // A refusal is warned about (`api` names the call).
  AllocResult allocate(ContextMemory& c, std::size_t size, const char* api, PoolStats* state = nullptr);
  // Whether a pool serves a call of `api` here (the policy pools and the table says so); else the
  // driver makes it, outside the pools (allocate_outside).
  bool serves_from_pool(const MemoryCall& api) const { return api.serve == Serve::pool && pooled(); }
  // A free of a block the pool of `c` handed out (with the free mode's wait). A double free
  // changes nothing, and is warned about (`api` names the call).
  FreeResult free(ContextMemory& c, std::uint64_t ptr, const char* api, std::size_t* size, PoolStats* state) {
    FreeResult r = FreeResult::not_owned;
    if (FreeGate* gate = free_gate_.load(std::memory_order_acquire); gate && gate->hold(c, ptr, size, &r)) {
      if (state) *state = c.pool->state();
      if (r == FreeResult::double_free) warn_double_free(api);
      return r;
    }
    r = c.pool->deallocate(ptr, size, state);
    if (r == FreeResult::double_free) warn_double_free(api);
    return r;
  }
  // Set once, the first time a block is shared (nullptr: every free goes to its pool at once).
  void set_free_gate(FreeGate* gate) { free_gate_.store(gate, std::memory_order_release); }
  // The class a refusal outside the pools on `device` is reported as (none for ok): the device's
  // admission says what a refusal at the cap is (DeviceAdmission::cap_refusal).
  OomClass refusal_class(OutsideAnswer answer, int device) const;

  // ---- the device's admission: what the process holds there, across its contexts and memory
  // that names the device but no context. Made at first use; `device_total` resolves a percent cap.
  DeviceAdmission& admission(int device, std::uint64_t device_total);

  // ---- memory outside the pools. `c` may be nullptr (no context and no device: nothing is charged).
  // `call` makes the allocation and returns how it went and, on success, the key its free will
  // name (pointer or handle). Charged against the cap first; a driver short of memory gets the
  // kept VMM mappings back and one more try.
  template <typename Call>
  OutsideAnswer allocate_outside(ContextMemory* c, std::uint64_t bytes, const char* api, Call&& call);
  // Memory outside the pools that names its device but no context (cuMemCreate's location from a
  // thread with no current context, or one current on another device; a stream's device): charged
  // to the device's account and the shared budget as allocate_outside charges a context's.
  template <typename Call>
  OutsideAnswer allocate_on_device(int device, std::uint64_t device_total, std::uint64_t bytes, const char* api,
                                   Call&& call);
  // A pointer or handle the driver has freed: if it was counted, it is uncharged. Returns its bytes,
  // owner (nullptr for memory charged to a device alone) and device (false: not known).
  bool forget_outside(std::uint64_t key, std::uint64_t* bytes = nullptr, ContextMemory** owner = nullptr,
                      int* device = nullptr);
  // Memory the driver takes on its own during a call, outside any allocation (graph memory):
  // the most it could take is admitted first, by the device's admission as allocate_outside's
  // is (ok, refused_by_cap or refused_by_share), and unadmitted after the call; what the driver
  // then reports is charged, without admission, and unadmitted.
  OutsideAnswer admit_outside(ContextMemory& c, std::uint64_t bytes, const char* api);
  void unadmit_outside(ContextMemory& c, std::uint64_t bytes);
  void charge_outside(ContextMemory& c, std::uint64_t bytes);

  // ---- memory info: total is the cap, free what the process could still get. False when the
  // process is not governed (pure passthrough with no cap): the driver's answer stands.
  bool mem_info(ContextMemory* c, std::size_t* free, std::size_t* total) const;
  // The same for a device on which the process has no context but holds memory that names the
  // device (false if it never did: the driver's answer stands). `device_free`: the driver's free.
  bool mem_info_device(int device, std::uint64_t device_total, std::uint64_t device_free, std::size_t* free,
                       std::size_t* total);

  // What the table holds of a pointer or handle not yet freed (false: nothing; *owner as forget_outside).
  bool find_outside(std::uint64_t key, std::uint64_t* bytes, ContextMemory** owner) const;

  // ---- the VMM mapping cache (nullptr when off: passthrough, CUPOOL_VMM_CACHE=off, no driver)
  VmmCache* vmm_cache();
  std::uint64_t vmm_evict(ContextMemory* c);  // the context's free mappings go back; bytes
  std::uint64_t vmm_free_bytes(ContextMemory* c) const;
  // Its protocol, one operation per driver call. Each serves the call from the cache when it can
  // (no driver call), else runs `driver` (the real call; true when it succeeded) and tells the
  // cache what the driver did. With no cache, each is `driver` alone.
  // cuMemCreate of `size` on `c`: with `props` (nullptr: not recyclable) a kept mapping of equal
  // properties goes out again (*recycled), else `make` (returning the handle, 0: refused; the
  // caller's allocate_outside) makes one, which the cache then knows. The handle, 0 if none.
  template <typename Make>
  std::uint64_t vmm_create(ContextMemory* c, std::uint64_t size, const VmmProps* props, bool* recycled, Make&& make);
  // cuMemRelease: true when the cache keeps the mapping (still charged; *bytes its size). Else
  // `driver` releases it, and on success it is uncharged (*bytes, *owner, *device: forget_outside's).
  template <typename Driver>
  bool vmm_release(std::uint64_t handle, Driver&& driver, std::uint64_t* bytes, ContextMemory** owner = nullptr,
                   int* device = nullptr);
  // cuMemAddressReserve of `size`: a kept reservation goes out again (*recycled) when `recyclable`
  // (no fixed address, no flags), else `driver` (which sets *va); the cache makes room first at a
  // fixed address `at`, and then knows a reservation made with no flags (`plain`). The address, 0 if none.
  template <typename Driver>
  std::uint64_t vmm_reserve(std::uint64_t size, std::uint64_t alignment, std::uint64_t at, bool plain, bool recyclable,
                            bool* recycled, Driver&& driver);
  // cuMemMap (`plain`: no flags), cuMemUnmap, cuMemAddressFree: true when the cache served it.
  template <typename Driver>
  bool vmm_map(std::uint64_t va, std::uint64_t size, std::uint64_t offset, std::uint64_t handle, bool plain,
               Driver&& driver);
  template <typename Driver>
  bool vmm_unmap(std::uint64_t va, std::uint64_t size, Driver&& driver);
  template <typename Driver>
  bool vmm_address_free(std::uint64_t va, std::uint64_t size, Driver&& driver);

  // ---- the shared budget (nullptr: none)
  SharedBudget* share() const { return share_; }
  // Wholly free memory goes back to the driver (and so to the budget): what a member does when
  // another waits for room.
  void give_back();
  // What top and the metrics show of this member, per device (the budget's give-back thread calls
  // it at least every 100 ms).
  void publish_share();

  // ---- fork: the child has no CUDA (contexts, mappings, driver memory are the parent's).
  void prepare_fork();
  void parent_after_fork();
  void child_after_fork(const std::function<void(ContextMemory&)>& before);

  // What an out-of-memory of `api` for `size` on `c` was, in words (the warning's text).
  static std::string describe_oom(const ContextMemory& c, const char* api, std::uint64_t size, OomClass oom);

 private:
  struct Outside {
    std::uint64_t bytes;
    ContextMemory* owner;  // nullptr: charged to `device` alone, or (device -1) not charged
    int device;
  };
  // The VmmDriver the cache calls: the caller's, and a released handle is uncharged.
  class ChargingVmm final : public VmmDriver {
   public:
    ChargingVmm(ProcessMemory& pm, VmmDriver& real) : pm_(pm), real_(real) {}
    void unmap(std::uint64_t va, std::uint64_t size) override { real_.unmap(va, size); }
    bool release(std::uint64_t handle) override {
      if (!real_.release(handle)) return false;
      pm_.given_back(handle);
      return true;
    }
    void address_free(std::uint64_t va, std::uint64_t size) override { real_.address_free(va, size); }

   private:
    ProcessMemory& pm_;
    VmmDriver& real_;
  };

  void warn_oom(const ContextMemory& c, const char* api, std::uint64_t size, OomClass oom) const;
  void warn_double_free(const char* api) const;
  void warn_device_oom(int device, const char* api, std::uint64_t size, OomClass oom, const DeviceAdmission& a) const;
  static std::uint64_t device_total(const ContextMemory& c);
  void remember_outside(std::uint64_t key, std::uint64_t bytes, ContextMemory* owner, int device);
  OutsideAnswer admit_on_device(int device, std::uint64_t device_total, std::uint64_t bytes, const char* api);
  DeviceAdmission* find_admission(int device) const;
  // A refusal outside the pools, as the pools record theirs: an oom event of its class.
  OutsideAnswer refused_outside(int device, ContextMemory* c, std::uint64_t bytes, OomClass oom);
  // The VMM cache gave a kept mapping's handle back to the driver: uncharged, and a `vmm_release`
  // event of cupool's own says so (reports count kept mappings as reserved until then).
  void given_back(std::uint64_t handle);
  void drop_slot_locked(int i, const std::function<void(ContextMemory&)>& before);

  const Config cfg_;
  PoolObserver* const observer_;
  SharedBudget* const share_;
  const Clock clock_;
  bool warnings_ = true;
  std::unique_ptr<ChargingVmm> vmm_driver_;
  std::atomic<VmmCache*> vmm_cache_{nullptr};
  std::atomic<FreeGate*> free_gate_{nullptr};

  // One slot per context that ever allocated; read without a lock on the hot path. A dropped
  // slot holds kDropped and may be reused; its record stays allocated.
  static constexpr std::uint64_t kDropped = ~std::uint64_t{0};
  std::atomic<std::uint64_t> slot_ctx_[kMaxContexts];
  ContextMemory* slot_[kMaxContexts] = {};
  std::atomic<int> slot_count_{0};
  std::mutex contexts_mutex_;  // making and dropping records only
  std::vector<std::unique_ptr<ContextMemory>> records_;

  mutable std::mutex admissions_mutex_;
  std::unordered_map<int, std::unique_ptr<DeviceAdmission>> admissions_;  // never erased: pools point in

  mutable std::mutex outside_mutex_;
  std::unordered_map<std::uint64_t, Outside> outside_;
};

template <typename Call>
OutsideAnswer ProcessMemory::allocate_outside(ContextMemory* c, std::uint64_t bytes, const char* api, Call&& call) {
  if (c) {
    const OutsideAnswer admitted = admit_outside(*c, bytes, api);
    if (admitted != OutsideAnswer::ok) return admitted;
  }
  std::uint64_t key = 0;
  OutsideAnswer answer = call(&key);
  if (answer == OutsideAnswer::out_of_memory && vmm_evict(c) > 0) answer = call(&key);  // the same, with room
  if (answer == OutsideAnswer::ok) remember_outside(key, bytes, c, c ? c->device : -1);
  else if (c) unadmit_outside(*c, bytes);
  return answer;
}

template <typename Call>
OutsideAnswer ProcessMemory::allocate_on_device(int device, std::uint64_t device_total, std::uint64_t bytes,
                                                const char* api, Call&& call) {
  const OutsideAnswer admitted = admit_on_device(device, device_total, bytes, api);
  if (admitted != OutsideAnswer::ok) return admitted;
  std::uint64_t key = 0;
  const OutsideAnswer answer = call(&key);
  if (answer == OutsideAnswer::ok) remember_outside(key, bytes, nullptr, device);
  else find_admission(device)->release_outside(bytes);
  return answer;
}

template <typename Make>
std::uint64_t ProcessMemory::vmm_create(ContextMemory* c, std::uint64_t size, const VmmProps* props, bool* recycled,
                                        Make&& make) {
  VmmCache* cache = vmm_cache();
  // Recycled only on the device of the context, whose fences cover the work that used it.
  if (c == nullptr || props == nullptr) cache = nullptr;
  *recycled = false;
  if (cache)
    if (const std::uint64_t h = cache->take(c->upstream, size, *props, c->pool->has_room(size))) {
      *recycled = true;
      return h;
    }
  const std::uint64_t h = make();
  if (h && cache) cache->created(c->upstream, h, size, *props);
  return h;
}

template <typename Driver>
bool ProcessMemory::vmm_release(std::uint64_t handle, Driver&& driver, std::uint64_t* bytes, ContextMemory** owner,
                                int* device) {
  if (VmmCache* cache = vmm_cache())
    if (cache->release(handle, bytes) == VmmCache::Verdict::served) return true;
  if (driver()) forget_outside(handle, bytes, owner, device);
  return false;
}

template <typename Driver>
std::uint64_t ProcessMemory::vmm_reserve(std::uint64_t size, std::uint64_t alignment, std::uint64_t at, bool plain,
                                         bool recyclable, bool* recycled, Driver&& driver) {
  VmmCache* cache = vmm_cache();
  *recycled = false;
  if (cache && recyclable)
    if (const std::uint64_t va = cache->reserve(size, alignment)) {
      *recycled = true;
      return va;
    }
  if (cache && at != 0) cache->before_reserve_at(at, size);
  std::uint64_t va = 0;
  if (!driver(&va)) return 0;
  if (cache && plain) cache->reserved(va, size);
  return va;
}

template <typename Driver>
bool ProcessMemory::vmm_map(std::uint64_t va, std::uint64_t size, std::uint64_t offset, std::uint64_t handle,
                            bool plain, Driver&& driver) {
  VmmCache* cache = vmm_cache();
  if (cache && plain && cache->map(va, size, offset, handle) == VmmCache::Verdict::served) return true;
  if (driver() && cache) cache->map_done(va, size, offset, handle);
  return false;
}

template <typename Driver>
bool ProcessMemory::vmm_unmap(std::uint64_t va, std::uint64_t size, Driver&& driver) {
  VmmCache* cache = vmm_cache();
  if (cache && cache->unmap(va, size) == VmmCache::Verdict::served) return true;
  driver();
  return false;
}

template <typename Driver>
bool ProcessMemory::vmm_address_free(std::uint64_t va, std::uint64_t size, Driver&& driver) {
  VmmCache* cache = vmm_cache();
  if (cache && cache->address_free(va, size) == VmmCache::Verdict::served) return true;
  driver();
  return false;
}

inline ContextMemory* ProcessMemory::find(std::uint64_t ctx) const {
  const int n = slot_count_.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i)
    if (slot_ctx_[i].load(std::memory_order_acquire) == ctx) return slot_[i];
  return nullptr;
}

inline ContextMemory* ProcessMemory::owning(std::uint64_t ptr) const {
  const int n = slot_count_.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i)
    if (slot_ctx_[i].load(std::memory_order_acquire) != kDropped && slot_[i]->pool->owns(ptr)) return slot_[i];
  return nullptr;
}

}  // namespace cupool
