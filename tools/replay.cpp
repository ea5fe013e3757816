#include "replay.h"

#include <algorithm>
#include <stdexcept>
#include <unordered_map>

#include "options.h"
#include "process_memory.h"
#include "sim_upstream.h"

namespace cupool::tools {

using trace::EventKind;

namespace {

std::uint64_t replay_clock(void* ctx) { return *static_cast<const std::uint64_t*>(ctx); }

// The calls the shim serves from a pool (when the policy pools): shim/hooks_alloc.cpp.
bool pool_serves(const Event& e) {
  if (e.has_pool) return true;
  static const std::string_view kPoolApis[] = {"cudaMalloc", "cudaMallocPitch", "cuMemAlloc_v2", "cuMemAllocPitch_v2",
                                               "cuMemAlloc", "cuMemAllocPitch"};
  for (std::string_view api : kPoolApis)
    if (e.api == api) return true;
  return false;
}

// Managed memory is not device memory until it is touched: it is charged, not placed.
bool takes_device_memory(const Event& e) { return e.api.find("Managed") == std::string::npos; }

// The recorded process, as if it had run under the replayed configuration.
TraceMeta replayed_meta(TraceMeta meta, const Config& config, const std::string& name) {
  meta.config = config;
  meta.policy = name == "recorded" ? std::string(policy_name(config.policy)) : name;
  meta.free_mode = free_mode_name(config.free_mode);
  return meta;
}

// What the driver is to one context in a replay: the simulated device, and a record of all the
// context holds on it, so that a context reset gives it back as the driver does (the shim's
// DriverUpstream::detach, after which the pool's memory is forgotten without calls).
class ReplayContext final : public Upstream {
 public:
  ReplayContext(SimUpstream& device, const bool& streams_seen) : device_(device), streams_seen_(streams_seen) {}
  UpstreamStatus reserve(std::size_t bytes, std::uint64_t* base, int* driver_code) override {
    if (detached_) {
      *driver_code = SimUpstream::kOutOfMemoryCode;
      return UpstreamStatus::error;
    }
    const UpstreamStatus s = device_.reserve(bytes, base, driver_code);
    if (s == UpstreamStatus::ok) held_[*base] = bytes;
    return s;
  }
  void release(std::uint64_t base, std::size_t bytes) override {
    if (detached_ || held_.erase(base) == 0) return;
    device_.release(base, bytes);
  }
  void device_memory(std::size_t* total, std::size_t* free) override { device_.device_memory(total, free); }
  void synchronize() override { device_.synchronize(); }
  // As the shim's: fences only once the process has streams of its own.
  bool needs_fences() override { return streams_seen_; }
  FenceId place_fence() override { return device_.place_fence(); }
  bool fence_retired(FenceId fence) override { return device_.fence_retired(fence); }
  void wait_fence(FenceId fence) override { device_.wait_fence(fence); }
  bool capturing() override { return false; }
  // The vmm policy on the simulated device; a reset context's mapped granules go with it.
  std::size_t vmm_granularity() override { return device_.vmm_granularity(); }
  UpstreamStatus reserve_address(std::size_t bytes, std::uint64_t* va) override {
    if (detached_) return UpstreamStatus::error;
    return device_.reserve_address(bytes, va);
  }
  void free_address(std::uint64_t va, std::size_t bytes) override {
    if (!detached_) device_.free_address(va, bytes);
  }
  UpstreamStatus map(std::uint64_t va, std::size_t bytes, int* driver_code) override {
    if (detached_) {
      *driver_code = SimUpstream::kOutOfMemoryCode;
      return UpstreamStatus::error;
    }
    const UpstreamStatus s = device_.map(va, bytes, driver_code);
    if (s == UpstreamStatus::ok) mapped_[va] = bytes;
    return s;
  }
  void unmap(std::uint64_t va, std::size_t bytes) override {
    if (detached_) return;
    device_.unmap(va, bytes);
    forget_mapped(va, bytes);
  }

  void detach() {
    for (const auto& [base, bytes] : held_) device_.release(base, bytes);
    held_.clear();
    for (const auto& [va, bytes] : mapped_) device_.unmap(va, bytes);
    mapped_.clear();
    detached_ = true;
  }

 private:
  SimUpstream& device_;
  const bool& streams_seen_;
  // What map() was asked, by address; an unmap may take any granules of it (the pieces stay).
  void forget_mapped(std::uint64_t va, std::size_t bytes) {
    const std::size_t g = device_.vmm_granularity();
    for (std::uint64_t at = va; at < va + bytes; at += g) {
      auto it = mapped_.upper_bound(at);
      if (it == mapped_.begin()) continue;
      --it;
      const std::uint64_t base = it->first, size = it->second;
      if (at >= base + size) continue;
      mapped_.erase(it);
      if (at > base) mapped_[base] = at - base;
      if (at + g < base + size) mapped_[at + g] = base + size - at - g;
    }
  }
  std::unordered_map<std::uint64_t, std::size_t> held_;
  std::map<std::uint64_t, std::size_t> mapped_;  // mapped granules, as ranges
  bool detached_ = false;
};

}  // namespace

// One policy: its simulated devices, one ProcessMemory per recorded process (the object the shim
// runs), and the Analysis of what they did.
struct Replayer::Run : public PoolObserver {
  ReplayPolicy policy;
  Analysis analysis;
  std::uint64_t now = 0;       // the replay clock: the recorded event's time
  std::size_t source = 0;      // whose event is being replayed (for the pool's own events)
  std::uint32_t tid = 0;
  std::uint64_t line = 0;

  struct Outside {
    std::uint64_t bytes = 0;
    ReplayContext* context = nullptr;  // where it took device memory (nullptr: none)
  };
  struct Process;
  // The calls the VMM mapping cache makes itself, on the simulated device: giving a kept
  // mapping's memory back. Address space is not modelled.
  class ReplayVmm final : public VmmDriver {
   public:
    explicit ReplayVmm(Process& p) : p_(p) {}
    void unmap(std::uint64_t, std::uint64_t) override {}
    void address_free(std::uint64_t, std::uint64_t) override {}
    bool release(std::uint64_t handle) override;

   private:
    Process& p_;
  };
  struct Process {
    Config config;
    // Declared before the memory that uses them: destroyed after it.
    std::unique_ptr<SharedBudget> member;  // its membership of the run's budget (null: none)
    std::vector<std::unique_ptr<ReplayContext>> contexts;   // every context, alive as its records
    std::unique_ptr<ReplayVmm> vmm;
    std::unique_ptr<ProcessMemory> memory;
    // Traces from format 2.2 name what each cuMemMap maps: the mapping cache is replayed too.
    bool replays_vmm_cache = false;
    std::unordered_map<std::uint64_t, std::uint64_t> vas;   // recorded -> replayed reservation
    std::uint64_t next_va = 1ull << 48;                      // replayed reservations (no device memory)
    std::map<int, std::uint64_t> context_key;               // device -> its current context
    std::uint64_t next_context = 1;
    bool streams_seen = false;
    struct OnDevice {  // forgotten with the device's context
      std::unordered_map<std::uint64_t, std::uint64_t> ptrs;          // recorded -> replayed (0: failed)
      std::unordered_map<std::uint64_t, std::uint64_t> early_frees;   // recorded ptr -> free's time
    };
    std::map<int, OnDevice> on_device;
    std::unordered_map<std::uint64_t, Outside> outside;             // replayed -> where it lives
    std::uint64_t next_host_key = 1ull << 62;  // keys of allocations that take no device memory
  };
  std::map<int, std::unique_ptr<SimUpstream>> devices;
  std::unique_ptr<SharedBudget> budget;  // every process's (a private segment); null: none
  std::map<std::size_t, Process> procs;

  std::optional<ReplayFailure> first_failure, first_refusal;
  std::uint64_t share_refusals = 0;
  std::map<int, std::uint64_t> share_peak;

  // The allocation of `recorded` was refused now, for `oom`: counted, and kept if the recording got it.
  void refused(const Event& recorded, OomClass oom) {
    if (oom == OomClass::share) ++share_refusals;
    if (recorded.rc != 0) return;  // the recording did not get it either
    const bool new_refusal = oom == OomClass::share && !first_refusal;
    if (first_failure && !new_refusal) return;
    ReplayFailure f;
    f.oom.t = now;
    f.oom.line = line;
    f.oom.device = recorded.device;
    f.oom.api = recorded.api;
    f.oom.size = recorded.size;
    f.oom.oom_class = oom;
    f.oom.tid = tid;
    f.source = source;
    if (budget)
      for (const auto& [s, p] : procs) f.held.emplace_back(s, p.member->held_mine(recorded.device));
    if (!first_failure) first_failure = f;
    if (new_refusal) first_refusal = std::move(f);
  }

  // While process `waiting` waits for room, the others' give-back threads return their wholly
  // free memory (shim: SharedBudget::serve_give_back); their events are their own.
  void give_back_others(std::size_t waiting) {
    const std::size_t saved = source;
    for (auto& [s, p] : procs) {
      if (s == waiting) continue;
      source = s;
      p.memory->give_back();
    }
    source = saved;
  }

  ~Run() override {
    // Pools give their chunks back to the simulated devices: destroy them first.
    procs.clear();
  }

  // Cache-served events' in_use and cached, as the trace writer derives them.
  trace::PoolStateDerivation derived;

  // The class of a refusal on `device` by process `source`'s memory. The cap is the device's
  // size when no limit is set: then a refusal at the cap is of class device, as the pool's own
  // growth rule says (policy/context_pool.cpp, grow()). The pool's last resort (a preallocation
  // that may not grow, used up) names limit whatever the configuration: not repeated here.
  OomClass refusal_class(OomClass c, std::size_t of, int device) const {
    auto p = procs.find(of);
    if (c != OomClass::limit || p == procs.end() || p->second.config.limit.for_device(device)) return c;
    return OomClass::device;
  }

  // The pools' own events (grow, release, oom, fence_retired) join the replayed stream.
  void pool_event(const PoolEvent& pe) override {
    const trace::Record r = trace::record_of(pe);
    Event e;
    static_cast<trace::EventValues&>(e) = r;
    if (e.has_pool) derived.apply(e.pool);
    e.api = r.api ? r.api : "";
    e.t_ns = now;
    e.dur_ns = 0;
    e.tid = tid;  // the thread whose call this is, so an oom pairs with its failed alloc
    if (e.kind == EventKind::oom) e.oom_class = refusal_class(e.oom_class, source, e.device);
    analysis.add(source, e, line);
  }

  // A replayed call's event: the recorded one with what happened now.
  void emit(const Event& recorded, EventKind kind, std::uint64_t size, std::uint64_t ptr, int rc,
            const trace::PoolState* pool) {
    Event e = recorded;
    e.kind = kind;
    e.t_ns = now;
    e.dur_ns = 0;
    e.size = size;
    e.ptr = ptr;
    e.rc = rc;
    e.oom_class = trace::OomClass::none;
    e.recycled = false;
    e.has_pool = pool != nullptr;
    e.pool = pool ? *pool : trace::PoolState{};
    if (e.has_pool) derived.apply(e.pool);
    analysis.add(source, e, line);
  }
};

bool Replayer::Run::ReplayVmm::release(std::uint64_t handle) {
  auto it = p_.outside.find(handle);
  if (it == p_.outside.end()) return false;
  if (it->second.context) it->second.context->release(handle, it->second.bytes);
  p_.outside.erase(it);
  return true;
}

Replayer::Replayer(ReplayOptions options) : options_(std::move(options)) {
  for (const auto& p : options_.policies) {
    runs_.push_back(std::make_unique<Run>());
    runs_.back()->policy = p;
    if (options_.share_limit) {
      std::string error;
      runs_.back()->budget = SharedBudget::create_private(*options_.share_limit, &error);
      if (!runs_.back()->budget) throw std::runtime_error(error);
    }
  }
}

Replayer::~Replayer() = default;

const Analysis& Replayer::analysis(std::size_t run) const { return runs_[run]->analysis; }
const std::optional<ReplayFailure>& Replayer::first_failure(std::size_t run) const { return runs_[run]->first_failure; }
const std::optional<ReplayFailure>& Replayer::first_refusal(std::size_t run) const { return runs_[run]->first_refusal; }
std::uint64_t Replayer::share_refusals(std::size_t run) const { return runs_[run]->share_refusals; }
const std::map<int, std::uint64_t>& Replayer::share_peak(std::size_t run) const { return runs_[run]->share_peak; }
const ReplayPolicy& Replayer::policy(std::size_t run) const { return runs_[run]->policy; }

Config Replayer::config(std::size_t run, std::size_t source) const {
  const Run& r = *runs_[run];
  if (auto p = r.procs.find(source); p != r.procs.end()) return p->second.config;
  if (r.policy.recorded && source < r.analysis.sources().size() && r.analysis.sources()[source].meta.config)
    return *r.analysis.sources()[source].meta.config;
  return r.policy.config;
}

std::uint64_t Replayer::capacity(int device) const {
  auto it = capacities_.find(device);
  return it == capacities_.end() ? 0 : it->second;
}

void Replayer::visit(std::size_t source, const Event& e, TraceInput& input) {
  if (!started_) {
    for (auto& run : runs_) run->analysis.set_origin(e.t_ns);  // the merged stream's first event
    started_ = true;
  }
  if (e.kind == EventKind::stream_create) {
    // From now on the process's work is in several orders: its pools need fences, as the shim's.
    for (auto& run : runs_)
      if (auto p = run->procs.find(source); p != run->procs.end()) p->second.streams_seen = true;
    streams_seen_.insert(source);
    return;
  }
  const bool replayed = (e.kind == EventKind::alloc || e.kind == EventKind::free ||
                         e.kind == EventKind::context_reset || e.kind == EventKind::vmm_create ||
                         e.kind == EventKind::vmm_release || e.kind == EventKind::va_reserve ||
                         e.kind == EventKind::vmm_map || e.kind == EventKind::vmm_unmap ||
                         e.kind == EventKind::va_free) &&
                        e.device >= 0;
  if (!replayed) return;
  if (e.kind == EventKind::alloc && e.size == 0) {
    ++skipped_;
    return;
  }
  // cupool's own give-back of a kept VMM mapping: the replayed cache decides its own.
  if (e.kind == EventKind::vmm_release && e.api == "cupool") return;

  if (!capacities_.count(e.device)) {
    std::uint64_t cap = options_.capacity.value_or(0);
    if (!cap)
      for (const auto& d : input.devices())
        if (d.index == e.device) cap = d.total_bytes;
    capacities_[e.device] = cap ? cap : ReplayOptions::kDefaultCapacity;
  }
  const std::uint64_t capacity = capacities_[e.device];

  for (auto& run_ptr : runs_) {
    Run& run = *run_ptr;
    run.now = e.t_ns;
    run.source = source;
    run.tid = e.tid;
    run.line = input.line();

    auto proc_it = run.procs.find(source);
    if (proc_it == run.procs.end()) {
      Run::Process fresh;
      if (run.policy.recorded) {
        if (!input.meta().config)
          throw TraceError(input.meta().path + ": cannot replay under the recorded configuration: " +
                           input.meta().config_error);
        fresh.config = *input.meta().config;
      } else {
        fresh.config = run.policy.config;
      }
      if (options_.share_limit) {
        fresh.config.share = "replay";
        fresh.config.share_limit = *options_.share_limit;
        fresh.config.share_wait_ns = options_.share_wait_ns;
      }
      fresh.streams_seen = streams_seen_.count(source) > 0;
      proc_it = run.procs.emplace(source, std::move(fresh)).first;
      Run::Process& p = proc_it->second;
      const TraceMeta& meta = input.meta();
      p.replays_vmm_cache = meta.format_major > 2 || (meta.format_major == 2 && meta.format_minor >= 2);
      p.vmm = std::make_unique<Run::ReplayVmm>(p);
      if (run.budget) {
        p.member = run.budget->another_member();
        p.member->wait_by([&run, source] { run.give_back_others(source); });
      }
      p.memory = std::make_unique<ProcessMemory>(p.config, &run, p.replays_vmm_cache ? p.vmm.get() : nullptr,
                                                 p.member.get());
      p.memory->set_warnings(false);
      if (VmmCache* cache = p.memory->vmm_cache()) cache->set_recorded_thread(&run.tid);
    }
    Run::Process& proc = proc_it->second;
    while (run.analysis.sources().size() <= source)
      run.analysis.add_source(replayed_meta(input.meta(), proc.config, run.policy.name));

    auto& dev = run.devices[e.device];
    if (!dev) {
      dev = std::make_unique<SimUpstream>(capacity, ReplayOptions::kDeviceGranularity);
      dev->set_needs_fences(false);  // ReplayContext decides, per process
    }
    if (!proc.context_key.count(e.device)) proc.context_key[e.device] = proc.next_context++;
    const std::uint64_t key = proc.context_key[e.device];
    ContextMemory* ctx = proc.memory->find_or_add(key, [&](ContextMemory& c) {
      c.device = e.device;
      proc.contexts.push_back(std::make_unique<ReplayContext>(*dev, proc.streams_seen));
      c.upstream = proc.contexts.back().get();
      return true;
    });
    if (ctx == nullptr) continue;  // more contexts than a process may have: the shim refuses them too
    if (ctx->pool) {
      ctx->pool->set_clock(&replay_clock, &run.now);
      ctx->pool->set_recorded_thread(&run.tid);  // each recorded thread its own cache
    }
    auto* context = static_cast<ReplayContext*>(ctx->upstream);
    ProcessMemory& memory = *proc.memory;
    auto& ptrs = proc.on_device[e.device].ptrs;
    auto& early_frees = proc.on_device[e.device].early_frees;

    // Memory outside the pools, as the shim's hooks take it: charged, then placed on the device.
    // `refusal`: the class of a refusal (none when it succeeded).
    auto allocate_outside = [&](std::uint64_t bytes, bool on_device, OomClass* refusal) -> std::uint64_t {
      std::uint64_t got = 0;
      const OutsideAnswer answer = memory.allocate_outside(ctx, bytes, e.api.c_str(), [&](std::uint64_t* made) {
        if (!on_device) {
          *made = got = proc.next_host_key++;
          return OutsideAnswer::ok;
        }
        int code = 0;
        if (context->reserve(bytes, &got, &code) != UpstreamStatus::ok) return OutsideAnswer::out_of_memory;
        *made = got;
        return OutsideAnswer::ok;
      });
      *refusal = answer == OutsideAnswer::ok                 ? OomClass::none
                 : answer == OutsideAnswer::refused_by_cap   ? run.refusal_class(OomClass::limit, source, e.device)
                 : answer == OutsideAnswer::refused_by_share ? OomClass::share
                                                             : OomClass::device;
      if (answer != OutsideAnswer::ok) {
        // The budget's refusal is an out-of-memory of class share, as the pool's is (the shim
        // records none for memory outside the pools: the class would read "device").
        if (answer == OutsideAnswer::refused_by_share) {
          PoolEvent oom;
          oom.kind = PoolEvent::Kind::oom;
          oom.size = bytes;
          oom.device = e.device;
          oom.oom = OomClass::share;
          run.pool_event(oom);
        }
        return 0;
      }
      proc.outside[got] = Run::Outside{bytes, on_device ? context : nullptr};
      return got;
    };
    auto free_outside = [&](std::uint64_t replayed) {
      auto it = proc.outside.find(replayed);
      if (it == proc.outside.end()) return false;
      if (it->second.context) it->second.context->release(replayed, it->second.bytes);
      proc.outside.erase(it);
      memory.forget_outside(replayed);
      return true;
    };
    // As the shim's cuMemRelease: the cache keeps the mapping (still charged), or the driver
    // releases it and it is uncharged.
    auto release_handle = [&](const Event& recorded, std::uint64_t handle) {
      VmmCache* cache = proc.replays_vmm_cache ? memory.vmm_cache() : nullptr;
      std::uint64_t kept = 0;
      Event v = recorded;
      v.kind = EventKind::vmm_release;
      v.rc = 0;
      v.ptr = handle;
      v.t_ns = run.now;
      v.dur_ns = 0;
      v.has_pool = false;
      v.recycled = cache && cache->release(handle, &kept) == VmmCache::Verdict::served;
      if (v.recycled) {
        v.size = kept;
      } else {
        v.size = proc.outside.count(handle) ? proc.outside[handle].bytes : 0;
        free_outside(handle);
      }
      run.analysis.add(source, v, run.line);
    };
    auto free_replayed = [&](const Event& recorded, std::uint64_t replayed) {
      if (free_outside(replayed)) {
        run.emit(recorded, EventKind::free, 0, replayed, 0, nullptr);
        return;
      }
      std::size_t size = 0;
      trace::PoolState state;
      ctx->pool->deallocate(replayed, &size, &state);
      run.emit(recorded, EventKind::free, size, replayed, 0, &state);
    };

    switch (e.kind) {
      case EventKind::alloc: {
        std::uint64_t ptr = 0;
        OomClass refusal = OomClass::none;
        if (memory.pooled() && pool_serves(e)) {
          trace::PoolState state;
          const AllocResult r = memory.allocate(*ctx, e.size, e.api.c_str(), &state);
          ptr = r.ptr;
          refusal = r.oom == OomClass::none ? OomClass::device : run.refusal_class(r.oom, source, e.device);
          run.emit(e, EventKind::alloc, e.size, ptr, ptr ? 0 : SimUpstream::kOutOfMemoryCode, &state);
        } else {
          ptr = allocate_outside(e.size, takes_device_memory(e), &refusal);
          run.emit(e, EventKind::alloc, e.size, ptr, ptr ? 0 : SimUpstream::kOutOfMemoryCode, nullptr);
        }
        if (!ptr) run.refused(e, refusal);
        bool freed_already = false;
        if (auto early = early_frees.find(e.ptr); e.rc == 0 && early != early_frees.end()) {
          // Its free came first in the file (another thread's line): it is freed at once.
          freed_already = early->second >= e.t_ns;
          early_frees.erase(early);
        }
        if (e.rc == 0 && e.ptr && !freed_already) {
          ptrs[e.ptr] = ptr;
        } else if (ptr) {
          // The recorded program got nothing and kept nothing (or freed it already): give it back.
          free_replayed(e, ptr);
        }
        break;
      }
      case EventKind::free: {
        auto it = ptrs.find(e.ptr);
        if (it == ptrs.end()) {
          // Allocated before the trace began, or its allocation is yet to come in the file.
          if (e.ptr) early_frees[e.ptr] = e.t_ns;
          break;
        }
        const std::uint64_t ptr = it->second;
        ptrs.erase(it);
        if (ptr) free_replayed(e, ptr);  // 0: its allocation failed in this replay
        break;
      }
      case EventKind::vmm_create: {
        // As the shim's cuMemCreate: a safe kept mapping of this size is handed out again (the
        // mapping cache, when the trace lets it be replayed), else the driver makes one, charged.
        // Tried whatever the recording got; what the program did not keep goes back at once.
        VmmCache* cache = proc.replays_vmm_cache ? memory.vmm_cache() : nullptr;
        std::uint64_t handle = cache ? cache->take(ctx->upstream, e.size, VmmProps{}, ctx->pool->has_room(e.size)) : 0;
        const bool recycled = handle != 0;
        if (!recycled) {
          OomClass refusal = OomClass::none;
          handle = allocate_outside(e.size, true, &refusal);
          if (handle && cache) cache->created(ctx->upstream, handle, e.size, VmmProps{});
          if (!handle) run.refused(e, refusal);
        }
        Event v = e;
        v.recycled = recycled;
        v.rc = handle ? 0 : SimUpstream::kOutOfMemoryCode;
        v.ptr = handle;
        v.t_ns = run.now;
        v.dur_ns = 0;
        v.has_pool = false;
        run.analysis.add(source, v, run.line);
        if (handle && e.rc == 0) {
          ptrs[e.ptr] = handle;
        } else if (handle) {
          release_handle(e, handle);
        }
        break;
      }
      case EventKind::vmm_release: {
        auto it = ptrs.find(e.ptr);
        if (e.rc != 0 || it == ptrs.end()) break;
        const std::uint64_t handle = it->second;
        ptrs.erase(it);
        release_handle(e, handle);
        break;
      }
      case EventKind::va_reserve: {
        if (e.rc != 0 || !proc.replays_vmm_cache) break;
        VmmCache* cache = memory.vmm_cache();
        std::uint64_t va = cache ? cache->reserve(e.size, 0) : 0;
        if (va == 0) {
          va = proc.next_va;
          proc.next_va += (e.size + (2u << 20) - 1) / (2u << 20) * (2u << 20);
          if (cache) cache->reserved(va, e.size);
        }
        proc.vas[e.ptr] = va;
        break;
      }
      case EventKind::vmm_map: {
        VmmCache* cache = proc.replays_vmm_cache ? memory.vmm_cache() : nullptr;
        auto va = proc.vas.find(e.ptr);
        auto handle = ptrs.find(e.handle);
        if (e.rc != 0 || !cache || !e.has_handle || va == proc.vas.end() || handle == ptrs.end()) break;
        if (cache->map(va->second, e.size, e.offset, handle->second) == VmmCache::Verdict::forward)
          cache->map_done(va->second, e.size, e.offset, handle->second);
        break;
      }
      case EventKind::vmm_unmap: {
        VmmCache* cache = proc.replays_vmm_cache ? memory.vmm_cache() : nullptr;
        auto va = proc.vas.find(e.ptr);
        if (e.rc != 0 || !cache || va == proc.vas.end()) break;
        cache->unmap(va->second, e.size);
        break;
      }
      case EventKind::va_free: {
        VmmCache* cache = proc.replays_vmm_cache ? memory.vmm_cache() : nullptr;
        auto va = proc.vas.find(e.ptr);
        if (e.rc != 0 || va == proc.vas.end()) break;
        if (cache) cache->address_free(va->second, e.size);
        proc.vas.erase(va);
        break;
      }
      case EventKind::context_reset: {
        // The context and all its memory are gone: the driver gets everything back.
        memory.drop(key, [](ContextMemory& c) { static_cast<ReplayContext*>(c.upstream)->detach(); });
        for (auto it = proc.outside.begin(); it != proc.outside.end();)
          it = it->second.context == context ? proc.outside.erase(it) : std::next(it);
        proc.context_key.erase(e.device);
        proc.on_device.erase(e.device);
        Event r = e;
        r.t_ns = run.now;
        run.analysis.add(source, r, run.line);
        break;
      }
      default:
        break;
    }
    if (run.budget) {
      std::uint64_t& peak = run.share_peak[e.device];
      peak = std::max(peak, run.budget->held_total(e.device));
    }
  }
  for (const auto& run : runs_) {
    if ((options_.stop == ReplayOptions::Stop::failure && run->first_failure) ||
        (options_.stop == ReplayOptions::Stop::share_refusal && run->first_refusal))
      throw Stopped{};
  }
}

void Replayer::end(std::size_t source, std::uint64_t t, TraceInput&) {
  for (auto& run : runs_) {
    auto it = run->procs.find(source);
    if (it == run->procs.end()) continue;
    Run::Process& proc = it->second;
    proc.memory->drop_if([](const ContextMemory&) { return true; },
                         [](ContextMemory& c) { static_cast<ReplayContext*>(c.upstream)->detach(); });
    run->analysis.exit(source, t);  // as the recording's analysis does
    proc.outside.clear();
    proc.context_key.clear();
    proc.on_device.clear();
  }
}

void Replayer::finish(const Analysis& recorded) {
  for (auto& run : runs_) {
    for (std::size_t i = 0; i < recorded.sources().size(); ++i) {
      while (run->analysis.sources().size() <= i) {
        const TraceMeta& meta = recorded.sources()[i].meta;
        const Config config = run->policy.recorded && meta.config ? *meta.config : run->policy.config;
        run->analysis.add_source(replayed_meta(meta, config, run->policy.name));
      }
      std::vector<DeviceInfo> devices = recorded.sources()[i].device_infos;
      for (auto& d : devices) {
        // The replayed cap: the policy's limit on the simulated device.
        if (auto c = capacities_.find(d.index); c != capacities_.end()) d.total_bytes = c->second;
      }
      run->analysis.finish(i, devices, 0, true);
    }
  }
}

Probe probe(const std::vector<std::string>& paths, const ReplayPolicy& policy, ReplayOptions options) {
  options.policies = {policy};
  const ReplayOptions::Stop stop = options.stop;
  Analysis analysis;
  Replayer replayer(std::move(options));
  try {
    analyze(paths, analysis, false, "cupool replay", &replayer);
  } catch (const Replayer::Stopped&) {
  }
  Probe p;
  p.failure = stop == ReplayOptions::Stop::share_refusal ? replayer.first_refusal(0) : replayer.first_failure(0);
  for (const auto& [device, peak] : replayer.share_peak(0)) p.share_peak = std::max(p.share_peak, peak);
  return p;
}

Smallest smallest_fitting(std::uint64_t upper, std::uint64_t granularity,
                          const std::function<std::optional<ReplayFailure>(std::uint64_t)>& failure_at) {
  // Candidates k x granularity for k = 1..steps, the last one clamped to `upper` (known to fit);
  // k = 0 is taken to fail.
  const std::uint64_t steps = (upper + granularity - 1) / granularity;
  auto value = [&](std::uint64_t k) { return std::min(k * granularity, upper); };
  Smallest out;
  std::uint64_t fails = 0, fits = steps;
  while (fits - fails > 1) {
    const std::uint64_t mid = fails + (fits - fails) / 2;
    ++out.probes;
    if (auto failure = failure_at(value(mid))) {
      fails = mid;
      out.below = std::move(failure);
      out.below_value = value(mid);
    } else {
      fits = mid;
    }
  }
  out.value = value(fits);
  return out;
}

}  // namespace cupool::tools
