// `cupool replay` (replay.h): recorded events driven through ProcessMemory on simulated devices,
// one run per policy, into one Analysis each.
#include "replay.h"

#include <algorithm>
#include <stdexcept>
#include <unordered_map>

#include "options.h"
#include "process_memory.h"
#include "replay_context.h"
#include "sim_upstream.h"

namespace cupool::tools {

using trace::EventKind;

namespace {

std::uint64_t replay_clock(void* ctx) { return *static_cast<const std::uint64_t*>(ctx); }

// The recorded process, as if it had run under the replayed configuration.
TraceMeta replayed_meta(TraceMeta meta, const Config& config, const std::string& name) {
  meta.config = config;
  meta.policy = name == "recorded" ? std::string(policy_name(config.policy)) : name;
  meta.free_mode = free_mode_name(config.free_mode);
  return meta;
}

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

  // One recorded event of process `source`, replayed: the process and its context on the event's
  // device are made at first use (on a simulated device of `capacity`), then the event's call
  // runs on its ProcessMemory.
  void replay(std::size_t source, const Event& e, TraceInput& input, const ReplayOptions& options, bool streams,
              std::uint64_t capacity);

 private:
  Process& process(std::size_t source, TraceInput& input, const ReplayOptions& options, bool streams);
  ContextMemory* context(Process& proc, int device, std::uint64_t capacity);

  // The event being replayed, and where it lands.
  struct Here {
    const Event& e;
    Process& proc;
    ProcessMemory& memory;
    ContextMemory& ctx;  // the process's context on the event's device
    Process::OnDevice& on;
  };
  // One operation per kind of event: ProcessMemory's operation in trace terms.
  void alloc(Here& h);
  void free_ptr(Here& h);
  void vmm_create(Here& h);
  void vmm_release(Here& h);
  void va_reserve(Here& h);
  void vmm_map(Here& h);
  void vmm_unmap(Here& h);
  void va_free(Here& h);
  void context_reset(Here& h);

  // Memory outside the pools, as the shim's hooks take it: charged, then placed on the device
  // (`on_device`). The replayed key, 0 if refused (`refusal`: the class of a refusal, else none).
  std::uint64_t allocate_outside(Here& h, std::uint64_t bytes, bool on_device, OomClass* refusal);
  // Memory outside the pools, freed: uncharged, and the simulated device gets it back. False: not outside memory.
  static bool free_outside(Process& proc, std::uint64_t replayed);
  // As the shim's cuMemRelease: the cache keeps the mapping (still charged), or the driver releases it.
  void release_handle(Here& h, std::uint64_t handle);
  void free_replayed(Here& h, std::uint64_t replayed);  // whatever it was: a pool's block or outside memory
};

bool Replayer::Run::ReplayVmm::release(std::uint64_t handle) {
  std::uint64_t bytes = 0;
  ContextMemory* owner = nullptr;
  if (!p_.memory->find_outside(handle, &bytes, &owner)) return false;
  if (owner) owner->upstream->release(handle, bytes);
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

namespace {
// The kinds of event replay runs (on a device); others are the recording's alone.
bool replayed_kind(EventKind k) {
  switch (k) {
    case EventKind::alloc:
    case EventKind::free:
    case EventKind::context_reset:
    case EventKind::vmm_create:
    case EventKind::vmm_release:
    case EventKind::va_reserve:
    case EventKind::vmm_map:
    case EventKind::vmm_unmap:
    case EventKind::va_free:
      return true;
    default:
      return false;
  }
}
}  // namespace

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
  if (!replayed_kind(e.kind) || e.device < 0) return;
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
  for (auto& run : runs_)
    run->replay(source, e, input, options_, streams_seen_.count(source) > 0, capacities_[e.device]);
  for (const auto& run : runs_) {
    if ((options_.stop == ReplayOptions::Stop::failure && run->first_failure) ||
        (options_.stop == ReplayOptions::Stop::share_refusal && run->first_refusal))
      throw Stopped{};
  }
}

void Replayer::Run::replay(std::size_t of, const Event& e, TraceInput& input, const ReplayOptions& options,
                           bool streams, std::uint64_t capacity) {
  now = e.t_ns;
  source = of;
  tid = e.tid;
  line = input.line();
  Process& proc = process(of, input, options, streams);
  ContextMemory* ctx = context(proc, e.device, capacity);
  if (ctx == nullptr) return;  // more contexts than a process may have: the shim refuses them too
  Here h{e, proc, *proc.memory, *ctx, proc.on_device[e.device]};
  switch (e.kind) {
    case EventKind::alloc: alloc(h); break;
    case EventKind::free: free_ptr(h); break;
    case EventKind::vmm_create: vmm_create(h); break;
    case EventKind::vmm_release: vmm_release(h); break;
    case EventKind::va_reserve: va_reserve(h); break;
    case EventKind::vmm_map: vmm_map(h); break;
    case EventKind::vmm_unmap: vmm_unmap(h); break;
    case EventKind::va_free: va_free(h); break;
    case EventKind::context_reset: context_reset(h); break;
    default: break;
  }
  if (budget) {
    std::uint64_t& peak = share_peak[e.device];
    peak = std::max(peak, budget->held_total(e.device));
  }
}

Replayer::Run::Process& Replayer::Run::process(std::size_t of, TraceInput& input, const ReplayOptions& options,
                                               bool streams) {
  auto it = procs.find(of);
  if (it == procs.end()) {
    Process fresh;
    if (policy.recorded) {
      if (!input.meta().config)
        throw TraceError(input.meta().path + ": cannot replay under the recorded configuration: " +
                         input.meta().config_error);
      fresh.config = *input.meta().config;
    } else {
      fresh.config = policy.config;
    }
    if (options.share_limit) {
      fresh.config.share = "replay";
      fresh.config.share_limit = *options.share_limit;
      fresh.config.share_wait_ns = options.share_wait_ns;
    }
    fresh.streams_seen = streams;
    it = procs.emplace(of, std::move(fresh)).first;
    Process& p = it->second;
    const TraceMeta& meta = input.meta();
    p.replays_vmm_cache = meta.format_major > 2 || (meta.format_major == 2 && meta.format_minor >= 2);
    p.vmm = std::make_unique<ReplayVmm>(p);
    if (budget) {
      p.member = budget->another_member();
      p.member->wait_by([this, of] { give_back_others(of); });
    }
    p.memory = std::make_unique<ProcessMemory>(p.config, this, p.replays_vmm_cache ? p.vmm.get() : nullptr,
                                               p.member.get());
    p.memory->set_warnings(false);
    if (VmmCache* cache = p.memory->vmm_cache()) cache->set_recorded_thread(&tid);
  }
  while (analysis.sources().size() <= of)
    analysis.add_source(replayed_meta(input.meta(), it->second.config, policy.name));
  return it->second;
}

ContextMemory* Replayer::Run::context(Process& proc, int device, std::uint64_t capacity) {
  auto& dev = devices[device];
  if (!dev) {
    dev = std::make_unique<SimUpstream>(capacity, ReplayOptions::kDeviceGranularity);
    dev->set_needs_fences(false);  // ReplayContext decides, per process
  }
  if (!proc.context_key.count(device)) proc.context_key[device] = proc.next_context++;
  ContextMemory* ctx = proc.memory->find_or_add(proc.context_key[device], [&](ContextMemory& c) {
    c.device = device;
    proc.contexts.push_back(std::make_unique<ReplayContext>(*dev, proc.streams_seen));
    c.upstream = proc.contexts.back().get();
    return true;
  });
  if (ctx && ctx->pool) {
    ctx->pool->set_clock(&replay_clock, &now);
    ctx->pool->set_recorded_thread(&tid);  // each recorded thread its own cache
  }
  return ctx;
}

std::uint64_t Replayer::Run::allocate_outside(Here& h, std::uint64_t bytes, bool on_device, OomClass* refusal) {
  std::uint64_t got = 0;
  const OutsideAnswer answer = h.memory.allocate_outside(&h.ctx, bytes, h.e.api.c_str(), [&](std::uint64_t* made) {
    if (!on_device) {
      *made = got = h.proc.next_host_key++;
      return OutsideAnswer::ok;
    }
    int code = 0;
    std::size_t size = 0;
    if (h.ctx.upstream->reserve(bytes, bytes, &got, &size, &code) != UpstreamStatus::ok)
      return OutsideAnswer::out_of_memory;
    *made = got;
    return OutsideAnswer::ok;
  });
  *refusal = h.memory.refusal_class(answer, h.e.device);  // its oom event came from the admission, as in the shim
  return answer == OutsideAnswer::ok ? got : 0;
}

bool Replayer::Run::free_outside(Process& proc, std::uint64_t replayed) {
  std::uint64_t bytes = 0;
  ContextMemory* owner = nullptr;
  if (!proc.memory->forget_outside(replayed, &bytes, &owner)) return false;
  // Its context's simulated device gets back what it placed (managed memory: nothing).
  if (owner) owner->upstream->release(replayed, bytes);
  return true;
}

void Replayer::Run::release_handle(Here& h, std::uint64_t handle) {
  std::uint64_t bytes = 0;
  ContextMemory* owner = nullptr;
  Event v = h.e;
  v.kind = EventKind::vmm_release;
  v.rc = 0;
  v.ptr = handle;
  v.t_ns = now;
  v.dur_ns = 0;
  v.has_pool = false;
  v.recycled = h.memory.vmm_release(handle, [] { return true; }, &bytes, &owner);
  if (!v.recycled && owner) owner->upstream->release(handle, bytes);
  v.size = bytes;
  analysis.add(source, v, line);
}

void Replayer::Run::free_replayed(Here& h, std::uint64_t replayed) {
  if (free_outside(h.proc, replayed)) {
    emit(h.e, EventKind::free, 0, replayed, 0, nullptr);
    return;
  }
  std::size_t size = 0;
  trace::PoolState state;
  h.memory.free(h.ctx, replayed, h.e.api.c_str(), &size, &state);
  emit(h.e, EventKind::free, size, replayed, 0, &state);
}

void Replayer::Run::alloc(Here& h) {
  const Event& e = h.e;
  // What the API does, by the table the shim's hooks use (policy/memory_calls.h); a call the
  // recording's pool served is served by one here too, whatever its name.
  const MemoryCall* call = find_memory_call(e.api);
  std::uint64_t ptr = 0;
  OomClass refusal = OomClass::none;
  if ((e.has_pool && h.memory.pooled()) || (call && h.memory.serves_from_pool(*call))) {
    trace::PoolState state;
    const AllocResult r = h.memory.allocate(h.ctx, e.size, e.api.c_str(), &state);
    ptr = r.ptr;
    refusal = r.oom == OomClass::none ? OomClass::device : r.oom;
    emit(e, EventKind::alloc, e.size, ptr, ptr ? 0 : SimUpstream::kOutOfMemoryCode, &state);
  } else {
    ptr = allocate_outside(h, e.size, call == nullptr || call->on_device(), &refusal);
    emit(e, EventKind::alloc, e.size, ptr, ptr ? 0 : SimUpstream::kOutOfMemoryCode, nullptr);
  }
  if (!ptr) refused(e, refusal);
  bool freed_already = false;
  if (auto early = h.on.early_frees.find(e.ptr); e.rc == 0 && early != h.on.early_frees.end()) {
    // Its free came first in the file (another thread's line): it is freed at once.
    freed_already = early->second >= e.t_ns;
    h.on.early_frees.erase(early);
  }
  if (e.rc == 0 && e.ptr && !freed_already) {
    h.on.ptrs[e.ptr] = ptr;
  } else if (ptr) {
    // The recorded program got nothing and kept nothing (or freed it already): give it back.
    free_replayed(h, ptr);
  }
}

void Replayer::Run::free_ptr(Here& h) {
  auto it = h.on.ptrs.find(h.e.ptr);
  if (it == h.on.ptrs.end()) {
    // Allocated before the trace began, or its allocation is yet to come in the file.
    if (h.e.ptr) h.on.early_frees[h.e.ptr] = h.e.t_ns;
    return;
  }
  const std::uint64_t ptr = it->second;
  h.on.ptrs.erase(it);
  if (ptr) free_replayed(h, ptr);  // 0: its allocation failed in this replay
}

void Replayer::Run::vmm_create(Here& h) {
  // As the shim's cuMemCreate (the mapping cache when the trace lets it be replayed). Tried
  // whatever the recording got; what the program did not keep goes back at once.
  const Event& e = h.e;
  const VmmProps props{};
  bool recycled = false;
  OomClass refusal = OomClass::none;
  const std::uint64_t handle = h.memory.vmm_create(&h.ctx, e.size, &props, &recycled,
                                                   [&] { return allocate_outside(h, e.size, true, &refusal); });
  if (!handle) refused(e, refusal);
  Event v = e;
  v.recycled = recycled;
  v.rc = handle ? 0 : SimUpstream::kOutOfMemoryCode;
  v.ptr = handle;
  v.t_ns = now;
  v.dur_ns = 0;
  v.has_pool = false;
  analysis.add(source, v, line);
  if (handle && e.rc == 0) {
    h.on.ptrs[e.ptr] = handle;
  } else if (handle) {
    release_handle(h, handle);
  }
}

void Replayer::Run::vmm_release(Here& h) {
  auto it = h.on.ptrs.find(h.e.ptr);
  if (h.e.rc != 0 || it == h.on.ptrs.end()) return;
  const std::uint64_t handle = it->second;
  h.on.ptrs.erase(it);
  release_handle(h, handle);
}

void Replayer::Run::va_reserve(Here& h) {
  if (h.e.rc != 0 || !h.proc.replays_vmm_cache) return;
  bool recycled = false;
  h.proc.vas[h.e.ptr] = h.memory.vmm_reserve(h.e.size, 0, 0, true, true, &recycled, [&](std::uint64_t* va) {
    *va = h.proc.next_va;  // address space is not modelled: 2 MiB-aligned addresses, never reused
    h.proc.next_va += (h.e.size + (2u << 20) - 1) / (2u << 20) * (2u << 20);
    return true;
  });
}

void Replayer::Run::vmm_map(Here& h) {
  auto va = h.proc.vas.find(h.e.ptr);
  auto handle = h.on.ptrs.find(h.e.handle);
  if (h.e.rc != 0 || !h.e.has_handle || va == h.proc.vas.end() || handle == h.on.ptrs.end()) return;
  h.memory.vmm_map(va->second, h.e.size, h.e.offset, handle->second, true, [] { return true; });
}

void Replayer::Run::vmm_unmap(Here& h) {
  auto va = h.proc.vas.find(h.e.ptr);
  if (h.e.rc != 0 || va == h.proc.vas.end()) return;
  h.memory.vmm_unmap(va->second, h.e.size, [] { return true; });
}

void Replayer::Run::va_free(Here& h) {
  auto va = h.proc.vas.find(h.e.ptr);
  if (h.e.rc != 0 || va == h.proc.vas.end()) return;
  h.memory.vmm_address_free(va->second, h.e.size, [] { return true; });
  h.proc.vas.erase(va);
}

void Replayer::Run::context_reset(Here& h) {
  // The context and all its memory are gone: the driver gets everything back.
  h.memory.drop(h.ctx.ctx, [](ContextMemory& c) { static_cast<ReplayContext*>(c.upstream)->detach(); });
  h.proc.context_key.erase(h.e.device);
  h.proc.on_device.erase(h.e.device);  // `h.on` with it
  Event r = h.e;
  r.t_ns = now;
  analysis.add(source, r, line);
}

void Replayer::end(std::size_t source, std::uint64_t t, TraceInput&) {
  for (auto& run : runs_) {
    auto it = run->procs.find(source);
    if (it == run->procs.end()) continue;
    Run::Process& proc = it->second;
    proc.memory->drop_if([](const ContextMemory&) { return true; },
                         [](ContextMemory& c) { static_cast<ReplayContext*>(c.upstream)->detach(); });
    run->analysis.exit(source, t);  // as the recording's analysis does
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
