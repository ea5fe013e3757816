#include "replay.h"

#include <nlohmann/json.hpp>
#include <unordered_map>

#include "device_pool.h"
#include "event_sink.h"
#include "options.h"
#include "sim_upstream.h"

namespace cupool::tools {

using trace::EventKind;

namespace {

std::uint64_t replay_clock(void* ctx) { return *static_cast<const std::uint64_t*>(ctx); }

std::uint64_t round_up(std::uint64_t v, std::uint64_t g) { return (v + g - 1) / g * g; }

// The recorded process, as if it had run under the replayed policy.
TraceMeta replayed_meta(TraceMeta meta, const ReplayPolicy& p) {
  meta.policy = p.name;
  meta.free_mode = p.config.free_mode == FreeMode::deferred ? "deferred" : "sync";
  const auto config = nlohmann::json::parse(config_json(p.config), nullptr, false);
  meta.limit_json = config.is_object() && config.contains("limit") ? config["limit"].dump() : "null";
  return meta;
}

}  // namespace

// One policy: its simulated devices, pools per (trace, device), and the Analysis of what they did.
struct Replayer::Run : public EventSink {
  ReplayPolicy policy;
  bool passthrough = false;
  Analysis analysis;
  std::uint64_t now = 0;       // the replay clock: the recorded event's time
  std::size_t source = 0;      // whose event is being replayed (for the pool's own events)
  std::uint32_t tid = 0;
  std::uint64_t line = 0;

  struct Key {
    std::size_t source;
    int device;
    bool operator<(const Key& o) const { return source != o.source ? source < o.source : device < o.device; }
  };
  struct PerProcess {
    std::unique_ptr<DevicePool> pool;      // growth, preallocate
    std::uint64_t live_rounded = 0;        // passthrough: what plain cudaMalloc holds
    std::uint64_t cap = 0;                 // passthrough: the limit
    std::unordered_map<std::uint64_t, std::uint64_t> ptrs;  // recorded -> replayed (0: failed)
    std::unordered_map<std::uint64_t, std::uint64_t> sizes; // passthrough: replayed -> rounded size
    std::unordered_map<std::uint64_t, std::uint64_t> early_frees;  // recorded ptr -> free's time
    std::unordered_map<std::uint64_t, std::uint64_t> outside;      // recorded ptr -> bytes, outside the pool
  };
  std::map<int, std::unique_ptr<SimUpstream>> devices;
  std::map<Key, PerProcess> procs;

  // The pool's own events (grow, release, oom, fence_retired) join the replayed stream.
  void record(const trace::Record& r) override {
    Event e;
    e.kind = r.kind;
    e.api = r.api ? r.api : "";
    e.path = r.path;
    e.device = r.device;
    e.t_ns = now;
    e.dur_ns = 0;
    e.size = r.size;
    e.ptr = r.ptr;
    e.rc = r.rc;
    e.tid = tid;  // the thread whose call this is, so an oom pairs with its failed alloc
    e.oom_class = r.oom_class;
    e.has_pool = r.has_pool;
    e.pool = r.pool;
    analysis.add(source, e, line);
  }

  void emit(const Event& recorded, EventKind kind, std::uint64_t size, std::uint64_t ptr, int rc,
            const trace::PoolState& pool) {
    Event e;
    e.kind = kind;
    e.api = recorded.api;
    e.path = recorded.path;
    e.device = recorded.device;
    e.t_ns = now;
    e.size = size;
    e.ptr = ptr;
    e.rc = rc;
    e.tid = recorded.tid;
    e.has_pool = true;
    e.pool = pool;
    analysis.add(source, e, line);
  }

  trace::PoolState passthrough_state(const PerProcess& p) const {
    trace::PoolState s;
    s.reserved = s.in_use = p.live_rounded;
    return s;
  }
};

Replayer::Replayer(ReplayOptions options) : options_(std::move(options)) {
  for (const auto& p : options_.policies) {
    runs_.push_back(std::make_unique<Run>());
    runs_.back()->policy = p;
    runs_.back()->passthrough = p.config.policy == PolicyKind::passthrough;
  }
}

Replayer::~Replayer() {
  // Pools give their chunks back to the simulated devices: destroy them first.
  for (auto& run : runs_) run->procs.clear();
}

const Analysis& Replayer::analysis(std::size_t run) const { return runs_[run]->analysis; }
const ReplayPolicy& Replayer::policy(std::size_t run) const { return runs_[run]->policy; }

std::uint64_t Replayer::capacity(int device) const {
  auto it = capacities_.find(device);
  return it == capacities_.end() ? 0 : it->second;
}

void Replayer::visit(std::size_t source, const Event& e, TraceInput& input) {
  if (!started_) {
    for (auto& run : runs_) run->analysis.set_origin(e.t_ns);  // the merged stream's first event
    started_ = true;
  }
  const bool replayed = (e.kind == EventKind::alloc || e.kind == EventKind::free ||
                         e.kind == EventKind::context_reset || e.kind == EventKind::vmm_create ||
                         e.kind == EventKind::vmm_release) &&
                        e.device >= 0;
  if (!replayed) return;
  if (e.kind == EventKind::alloc && e.size == 0) {
    ++skipped_;
    return;
  }
  // Memory the recording's pool did not serve (managed, stream-ordered) is held outside the
  // replayed pools too, and charged against their cap, as the shim does.
  const bool recorded_outside = e.kind == EventKind::alloc && e.rc == 0 && !e.has_pool &&
                                input.meta().policy != "passthrough" && !input.meta().policy.empty();

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
    while (run.analysis.sources().size() <= source) run.analysis.add_source(replayed_meta(input.meta(), run.policy));
    run.now = e.t_ns;
    run.source = source;
    run.tid = e.tid;
    run.line = input.line();

    auto& dev = run.devices[e.device];
    if (!dev)
      dev = std::make_unique<SimUpstream>(capacity, run.passthrough ? ReplayOptions::kPassthroughGranularity
                                                                    : DevicePool::kChunkGranularity);
    Run::PerProcess& proc = run.procs[Run::Key{source, e.device}];
    if (!run.passthrough && !proc.pool) {
      proc.pool = std::make_unique<DevicePool>(run.policy.config, e.device, *dev, &run);
      proc.pool->set_clock(&replay_clock, &run.now);
    }
    if (run.passthrough && proc.cap == 0) {
      auto limit = run.policy.config.limit.for_device(e.device);
      proc.cap = limit ? std::min(limit->resolve(capacity), capacity) : capacity;
    }

    switch (e.kind) {
      case EventKind::alloc: {
        std::uint64_t ptr = 0;
        if (recorded_outside && !run.passthrough) {
          // A refused charge is one out-of-memory: the pool's own oom event (it emits one, as
          // for the shim) and the failed call that follows it.
          if (!proc.pool->try_charge_external(e.size)) {
            Event failed = e;
            failed.t_ns = run.now;
            failed.ptr = 0;
            failed.rc = 2;
            run.analysis.add(source, failed, run.line);
            break;
          }
          proc.outside[e.ptr] = e.size;
          Event held = e;  // no pool fields: the fold counts it outside the pool
          held.t_ns = run.now;
          held.dur_ns = 0;
          run.analysis.add(source, held, run.line);
          break;
        }
        if (run.passthrough) {
          const std::uint64_t need = round_up(e.size, ReplayOptions::kPassthroughGranularity);
          trace::OomClass why = trace::OomClass::none;
          int code = 0;
          if (proc.live_rounded + need > proc.cap) {
            why = trace::OomClass::limit;
          } else if (dev->reserve(need, &ptr, &code) != UpstreamStatus::ok) {
            why = trace::OomClass::device;
            ptr = 0;
          }
          if (why == trace::OomClass::none) {
            proc.live_rounded += need;
            proc.sizes[ptr] = need;
            run.emit(e, EventKind::grow, need, ptr, 0, run.passthrough_state(proc));
          } else {
            trace::Record r;
            r.kind = EventKind::oom;
            r.api = "";
            r.size = e.size;
            r.device = static_cast<std::int16_t>(e.device);
            r.oom_class = why;
            r.rc = why == trace::OomClass::device ? code : 0;  // as the pool reports it: the driver's code
            r.has_pool = true;
            r.pool = run.passthrough_state(proc);
            run.record(r);
          }
          run.emit(e, EventKind::alloc, e.size, ptr, ptr ? 0 : 2, run.passthrough_state(proc));
        } else {
          ptr = proc.pool->allocate(e.size).ptr;
          run.emit(e, EventKind::alloc, e.size, ptr, ptr ? 0 : 2, proc.pool->state());
        }
        bool freed_already = false;
        if (auto early = proc.early_frees.find(e.ptr); e.rc == 0 && early != proc.early_frees.end()) {
          // Its free came first in the file (another thread's line): it is freed at once.
          freed_already = early->second >= e.t_ns;
          proc.early_frees.erase(early);
        }
        if (e.rc == 0 && e.ptr && !freed_already) {
          proc.ptrs[e.ptr] = ptr;
        } else if (ptr) {
          // The recorded program got nothing and kept nothing (or freed it already): give it back.
          if (run.passthrough) {
            dev->release(ptr, proc.sizes[ptr]);
            proc.live_rounded -= proc.sizes[ptr];
            run.emit(e, EventKind::release, proc.sizes[ptr], ptr, 0, run.passthrough_state(proc));
            proc.sizes.erase(ptr);
          } else {
            proc.pool->deallocate(ptr);
          }
          Event f = e;
          f.kind = EventKind::free;
          run.emit(f, EventKind::free, 0, ptr, 0, run.passthrough ? run.passthrough_state(proc) : proc.pool->state());
        }
        break;
      }
      case EventKind::free: {
        if (auto out = proc.outside.find(e.ptr); out != proc.outside.end()) {
          proc.pool->uncharge_external(out->second);
          proc.outside.erase(out);
          Event f = e;
          f.t_ns = run.now;
          f.dur_ns = 0;
          f.has_pool = false;
          run.analysis.add(source, f, run.line);
          break;
        }
        auto it = proc.ptrs.find(e.ptr);
        if (it == proc.ptrs.end()) {
          // Allocated before the trace began, or its allocation is yet to come in the file.
          if (e.ptr) proc.early_frees[e.ptr] = e.t_ns;
          break;
        }
        const std::uint64_t ptr = it->second;
        proc.ptrs.erase(it);
        if (!ptr) break;  // its allocation failed in this replay
        if (run.passthrough) {
          const std::uint64_t size = proc.sizes[ptr];
          proc.sizes.erase(ptr);
          dev->release(ptr, size);
          proc.live_rounded -= size;
          run.emit(e, EventKind::release, size, ptr, 0, run.passthrough_state(proc));
          run.emit(e, EventKind::free, 0, ptr, 0, run.passthrough_state(proc));
        } else {
          proc.pool->deallocate(ptr);
          run.emit(e, EventKind::free, 0, ptr, 0, proc.pool->state());
        }
        break;
      }
      case EventKind::vmm_create:
      case EventKind::vmm_release:
        // Physical memory outside the pool counts against the cap (the shim charges it so).
        if (!run.passthrough && e.rc == 0) {
          if (e.kind == EventKind::vmm_create) {
            if (!proc.pool->try_charge_external(e.size)) break;  // the pool's oom event says so
            proc.sizes[e.ptr] = e.size;
          } else {
            auto it = proc.sizes.find(e.ptr);
            if (it == proc.sizes.end()) break;
            proc.pool->uncharge_external(it->second);
            proc.sizes.erase(it);
          }
          Event v = e;
          v.t_ns = run.now;
          v.tid = e.tid;
          v.has_pool = false;
          run.analysis.add(source, v, run.line);
        }
        break;
      case EventKind::context_reset: {
        // The context and its memory are gone: the pool gives its chunks back to the device.
        for (const auto& [ptr, size] : proc.sizes)
          if (run.passthrough) dev->release(ptr, size);
        run.procs.erase(Run::Key{source, e.device});
        Event r = e;
        r.t_ns = run.now;
        run.analysis.add(source, r, run.line);
        break;
      }
      default:
        break;
    }
  }
}

void Replayer::finish(const Analysis& recorded) {
  for (auto& run : runs_) {
    for (std::size_t i = 0; i < recorded.sources().size(); ++i) {
      while (run->analysis.sources().size() <= i)
        run->analysis.add_source(replayed_meta(recorded.sources()[i].meta, run->policy));
      std::vector<DeviceInfo> devices = recorded.sources()[i].device_infos;
      for (auto& d : devices) {
        // The replayed cap: the policy's limit on the simulated device.
        if (auto c = capacities_.find(d.index); c != capacities_.end()) d.total_bytes = c->second;
      }
      run->analysis.finish(i, devices, 0, true);
    }
  }
}

}  // namespace cupool::tools
