#include "device_pool.h"


#include <algorithm>
#include <utility>

#include "event_clock.h"
#include "thread_id.h"

namespace cupool {

namespace {

constexpr std::uint64_t kNever = ~std::uint64_t{0};
constexpr std::size_t kMaxRequest = std::size_t{1} << 62;

// Pool events share the trace's clock with the shim's.
std::uint64_t event_clock(void*) { return EventClock::now(); }

constexpr std::uint64_t round_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }
constexpr std::uint64_t round_down(std::uint64_t v, std::uint64_t a) { return v / a * a; }

FreeResult to_free_result(Suballocator::FreeStatus s) {
  switch (s) {
    case Suballocator::FreeStatus::freed: return FreeResult::freed;
    case Suballocator::FreeStatus::double_free: return FreeResult::double_free;
    case Suballocator::FreeStatus::not_owned: break;
  }
  return FreeResult::not_owned;
}

}  // namespace

DevicePool::DevicePool(const Config& cfg, int device, Upstream& upstream, EventSink* sink)
    : cfg_(cfg), device_(device), up_(upstream), sink_(sink), clock_(&event_clock) {
  std::size_t total = 0, free = 0;
  up_.device_memory(&total, &free);
  device_total_ = total;
  if (auto limit = cfg_.limit.for_device(device)) {
    has_limit_ = true;
    cap_ = limit->resolve(total);
  } else {
    cap_ = total;
  }
  step_ = std::max<std::uint64_t>(round_up(std::max<std::uint64_t>(cfg_.growth_chunk, 1), kChunkGranularity),
                                  kChunkGranularity);
  deferred_ = cfg_.free_mode == FreeMode::deferred;
  pending_.reserve(kBatchBlocks);
}

DevicePool::~DevicePool() {
  if (abandoned_) return;
  sub_.for_each_chunk([&](std::uint32_t id, std::uint64_t, std::size_t) {
    up_.release(reservations_[id].base, reservations_[id].size);
  });
}

void DevicePool::set_clock(Clock clock, void* ctx) {
  Lock lk(mu_);
  clock_ = clock ? clock : &event_clock;
  clock_ctx_ = ctx;
}

bool DevicePool::may_grow() const {
  return cfg_.policy != PolicyKind::preallocate || cfg_.preallocate_grow;
}

// ---- allocation ----------------------------------------------------------------------------------

AllocResult DevicePool::allocate(std::size_t size, trace::PoolState* state) {
  if (size == 0) return {};
  Lock lk(mu_);
  if (cfg_.release_idle_ns) check_idle(lk);
  AllocResult r;
  if (std::uint64_t p = sub_.allocate(size))
    r.ptr = p;
  else
    r = allocate_slow(lk, size);
  if (state) {
    if (!lk.owns_lock()) lk.lock();
    *state = state_locked();
  }
  return r;
}

// Waits for quarantined blocks, oldest fence first, trying the allocation after each fence.
std::uint64_t DevicePool::wait_for_quarantine(Lock& lk, std::uint64_t bytes) {
  for (;;) {
    if (std::uint64_t p = sub_.allocate(bytes)) return p;
    seal_pending();
    std::size_t i = batch_head_;
    while (i < batches_.size() && batches_[i].taken) ++i;  // another thread waits on those
    if (i == batches_.size()) return 0;
    batches_[i].taken = true;  // nobody else polls or waits on a fence the upstream will forget
    const FenceId fence = batches_[i].fence;
    const std::uint64_t seq = batches_[i].seq;
    lk.unlock();
    up_.wait_fence(fence);
    lk.lock();
    while (batch_head_ < batches_.size() && batches_[batch_head_].seq <= seq) retire_front();
    retire_ready();
  }
}

// The miss path, in order: retired fences; (first use) preallocation; waiting for the oldest
// fences when the quarantine holds enough; growth; waiting for the remaining fences; giving back wholly free chunks and growing once more; then out of memory.
AllocResult DevicePool::allocate_slow(Lock& lk, std::size_t size) {
  if (abandoned_) return {0, trace::OomClass::device, 0};
  if (size > kMaxRequest) {
    emit(trace::EventKind::oom, size, 0, now(), 0, trace::OomClass::limit);
    return {0, trace::OomClass::limit, 0};
  }
  const std::uint64_t bytes = round_up(size, Suballocator::kAlignment);
  Grow last{0, trace::OomClass::limit, 0};

  if (!quarantine_empty()) {
    seal_pending();
    retire_ready();
    if (std::uint64_t p = sub_.allocate(bytes)) return {p};
  }
  if (cfg_.policy == PolicyKind::preallocate && !prealloc_done_) {
    Grow g = preallocate(lk, bytes);
    if (g.ptr) return {g.ptr};
    if (std::uint64_t p = sub_.allocate(bytes)) return {p};  // another thread's preallocation
    if (g.fail != trace::OomClass::none) last = g;
  }
  // Memory in quarantine is the program's own and free again once the device catches up.
  // Waiting for it (oldest fence first) before growing keeps the pool from growing by however
  // far the host runs ahead of the device (measured on the H200: a PyTorch step loop grew the
  // pool tenfold when growth came first). The host waits only for old work; newer work stays
  // queued, so the device does not go idle.
  if (sub_.held() >= bytes)
    if (std::uint64_t p = wait_for_quarantine(lk, bytes)) return {p};
  if (may_grow()) {
    Grow g = grow(lk, bytes);
    if (g.ptr) return {g.ptr};
    last = g;
  }
  if (std::uint64_t p = wait_for_quarantine(lk, bytes)) return {p};
  if (may_grow() && release_free_chunks(lk, false, kNever) > 0) {
    if (std::uint64_t p = sub_.allocate(bytes)) return {p};
    Grow g = grow(lk, bytes);
    if (g.ptr) return {g.ptr};
    last = g;
  }
  if (std::uint64_t p = sub_.allocate(bytes)) return {p};  // another thread freed meanwhile

  AllocResult r{0, last.fail, last.driver_code};
  if (sub_.free_bytes() >= bytes) r = {0, trace::OomClass::fragmentation, 0};
  if (r.oom == trace::OomClass::none) r.oom = trace::OomClass::limit;
  emit(trace::EventKind::oom, size, 0, now(), 0, r.oom, r.driver_code);
  return r;
}

// Growth rule: max(round_up(bytes, 2 MiB), step), step doubling from growth_chunk up to
// growth_chunk_max; never more than the cap leaves, and if the driver refuses a chunk larger
// than needed, ask once more for just what is needed.
DevicePool::Grow DevicePool::grow(Lock& lk, std::size_t bytes) {
  const std::uint64_t left = headroom();
  std::uint64_t need = round_up(bytes, kChunkGranularity);
  if (need > left && bytes <= round_down(left, Suballocator::kAlignment))
    need = round_down(left, Suballocator::kAlignment);  // the cap is not a multiple of 2 MiB
  // Past the cap: class limit, unless no limit was set and the cap is just the device's size.
  if (need > left || need < bytes) return {0, has_limit_ ? trace::OomClass::limit : trace::OomClass::device, 0};
  std::uint64_t chunk = std::max(need, step_);
  if (chunk > left) chunk = std::max(need, round_down(left, kChunkGranularity));

  transit_ += chunk;
  lk.unlock();
  std::uint64_t t0 = now();
  std::uint64_t base = 0;
  int code = 0;
  UpstreamStatus st = up_.reserve(chunk, &base, &code);
  std::uint64_t got = chunk;
  if (st == UpstreamStatus::out_of_memory && chunk > need) {
    got = need;
    st = up_.reserve(need, &base, &code);
  }
  std::uint64_t dur = now() - t0;
  lk.lock();
  transit_ -= chunk;
  if (abandoned_) return {0, trace::OomClass::device, 0};  // the context went away meanwhile
  if (st != UpstreamStatus::ok) return {0, trace::OomClass::device, code};
  step_ = std::min<std::uint64_t>(step_ * 2, std::max<std::uint64_t>(cfg_.growth_chunk_max, step_));
  Grow g = add_reserved(base, got, bytes, false);
  emit(trace::EventKind::grow, got, base, t0, dur);
  return g;
}

// First use under the preallocate policy: one chunk of preallocate.resolve(total), clamped to
// the cap. If the driver refuses, try once with what it reports free.
DevicePool::Grow DevicePool::preallocate(Lock& lk, std::size_t bytes) {
  if (prealloc_busy_) {  // another thread is reserving it: wait for the outcome
    prealloc_cv_.wait(lk, [&] { return !prealloc_busy_; });
    return {};
  }
  auto granular = [](std::uint64_t v) {
    return v >= kChunkGranularity ? round_down(v, kChunkGranularity) : round_down(v, Suballocator::kAlignment);
  };
  std::uint64_t want = granular(std::min<std::uint64_t>(cfg_.preallocate.resolve(device_total_), headroom()));
  if (want == 0) {
    prealloc_done_ = true;
    return {};
  }
  prealloc_busy_ = true;
  transit_ += want;
  lk.unlock();
  std::uint64_t t0 = now();
  std::uint64_t base = 0;
  int code = 0;
  std::uint64_t got = want;
  UpstreamStatus st = up_.reserve(want, &base, &code);
  if (st == UpstreamStatus::out_of_memory) {
    std::size_t total = 0, free = 0;
    up_.device_memory(&total, &free);
    got = granular(std::min<std::uint64_t>(free, want));
    if (got > 0 && got < want) st = up_.reserve(got, &base, &code);
  }
  std::uint64_t dur = now() - t0;
  lk.lock();
  transit_ -= want;
  prealloc_busy_ = false;
  prealloc_cv_.notify_all();
  if (abandoned_) return {0, trace::OomClass::device, 0};
  if (st != UpstreamStatus::ok) return {0, trace::OomClass::device, code};
  prealloc_done_ = true;
  Grow g = add_reserved(base, got, bytes, true);
  emit(trace::EventKind::grow, got, base, t0, dur);
  return g;
}

// A new reservation joins the suballocator (aligned to 512 bytes if the upstream gave less),
// and serves `bytes` at once, in the same critical section, so no other thread can take it.
DevicePool::Grow DevicePool::add_reserved(std::uint64_t base, std::size_t size, std::size_t bytes, bool is_prealloc) {
  std::uint64_t start = round_up(base, Suballocator::kAlignment);
  std::uint64_t usable = size > start - base ? round_down(size - (start - base), Suballocator::kAlignment) : 0;
  std::uint32_t id = usable ? sub_.add_chunk(start, usable) : Suballocator::kNoChunk;
  if (id == Suballocator::kNoChunk) {
    up_.release(base, size);  // unusable (overlaps a chunk we hold?): give it straight back
    return {0, trace::OomClass::device, 0};
  }
  if (reservations_.size() <= id) {
    reservations_.resize(id + 1);
    idle_since_.resize(id + 1, 0);
  }
  reservations_[id] = Reservation{base, size};
  idle_since_[id] = now();
  if (is_prealloc) prealloc_chunk_ = id;
  return {sub_.allocate(bytes), trace::OomClass::none, 0};
}

// Gives back wholly free chunks (those idle since before `idle_before`, kNever: all); the
// preallocated chunk only when asked. The lock is dropped around the upstream calls.
std::size_t DevicePool::release_free_chunks(Lock& lk, bool include_prealloc, std::uint64_t idle_before) {
  std::vector<Reservation> gone;
  std::vector<std::uint64_t> bases;
  sub_.for_each_free_chunk([&](std::uint32_t id, std::uint64_t base, std::size_t) {
    if (id == prealloc_chunk_ && !include_prealloc) return;
    if (idle_before != kNever && idle_since_[id] > idle_before) return;
    gone.push_back(reservations_[id]);
    bases.push_back(base);
    if (id == prealloc_chunk_) {
      prealloc_chunk_ = Suballocator::kNoChunk;
      prealloc_done_ = false;  // the next allocation preallocates again
    }
  });
  if (gone.empty()) return 0;
  std::uint64_t bytes = 0;
  for (std::size_t i = 0; i < gone.size(); ++i) {
    sub_.remove_chunk(bases[i]);
    bytes += gone[i].size;
  }
  transit_ += bytes;  // still counts against the cap until the driver has it back
  lk.unlock();
  std::vector<std::pair<std::uint64_t, std::uint64_t>> times;
  times.reserve(gone.size());
  for (const Reservation& r : gone) {
    std::uint64_t t0 = now();
    up_.release(r.base, r.size);
    times.emplace_back(t0, now() - t0);
  }
  lk.lock();
  transit_ -= bytes;
  for (std::size_t i = 0; i < gone.size(); ++i)
    emit(trace::EventKind::release, gone[i].size, gone[i].base, times[i].first, times[i].second);
  return gone.size();
}

// ---- free ------------------------------------------------------------------------------------------

FreeResult DevicePool::deallocate(std::uint64_t ptr, std::size_t* size, trace::PoolState* state) {
  std::size_t freed_size = 0;
  auto finish = [&](Suballocator::FreeStatus st) {
    if (size) *size = st == Suballocator::FreeStatus::freed ? freed_size : 0;
    if (state) *state = state_locked();
    return to_free_result(st);
  };
  if (!deferred_) {
    // As cudaFree does: wait for the device, then the memory is reusable at once. Done before
    // looking the pointer up so the lock is taken once; a foreign pointer's free waits anyway.
    up_.synchronize();
  } else if (up_.needs_fences()) {
    Lock lk(mu_);
    auto st = sub_.hold(ptr, &freed_size);
    if (st != Suballocator::FreeStatus::freed) return finish(st);
    if (pending_.capacity() == 0) pending_.reserve(kBatchBlocks);
    pending_.push_back(ptr);
    pending_bytes_ += freed_size;
    if (pending_.size() >= kBatchBlocks || pending_bytes_ >= kBatchBytes) {
      seal_pending();
      retire_ready();
    }
    if (cfg_.release_idle_ns) check_idle(lk);
    return finish(st);
  }
  // sync mode, or deferred with one stream only: stream order alone makes reuse safe
  Lock lk(mu_);
  Suballocator::FreeInfo info;
  auto st = sub_.free(ptr, &info);
  freed_size = info.size;
  if (st == Suballocator::FreeStatus::freed && cfg_.release_idle_ns) {
    note_free(info);
    check_idle(lk);
  }
  return finish(st);
}

void DevicePool::note_free(const Suballocator::FreeInfo& info) {
  if (!info.chunk_now_free || !cfg_.release_idle_ns) return;
  std::uint64_t t = now();
  idle_since_[info.chunk] = t;
  next_idle_check_ = std::min(next_idle_check_, t + *cfg_.release_idle_ns);
}

// Idle release: a chunk (not the preallocated one) wholly free for release_idle_ns is given back.
// Checked on allocate/deallocate, only once the earliest candidate can have expired.
void DevicePool::check_idle(Lock& lk) {
  if (next_idle_check_ == kNever) return;  // no wholly free chunk: no need to read the clock
  std::uint64_t t = now();
  if (t < next_idle_check_ || abandoned_) return;
  const std::uint64_t idle = *cfg_.release_idle_ns;
  std::uint64_t next = kNever;
  sub_.for_each_free_chunk([&](std::uint32_t id, std::uint64_t, std::size_t) {
    if (id != prealloc_chunk_ && idle_since_[id] + idle > t) next = std::min(next, idle_since_[id] + idle);
  });
  next_idle_check_ = next;
  if (t >= idle) release_free_chunks(lk, false, t - idle);
}

void DevicePool::seal_pending() {
  if (pending_.empty()) return;
  Batch b;
  b.fence = up_.place_fence();
  b.seq = ++batch_seq_;
  b.bytes = pending_bytes_;
  b.blocks.swap(pending_);
  if (!spare_.empty()) {
    pending_.swap(spare_.back());
    spare_.pop_back();
  }
  pending_bytes_ = 0;
  batches_.push_back(std::move(b));
}

// Fences retire in order: poll from the oldest until one has not retired; a retired fence
// proves every older batch reusable, including those another thread is still waiting on.
void DevicePool::retire_ready() {
  std::size_t i = batch_head_;
  while (i < batches_.size()) {
    if (batches_[i].taken) {  // its fence belongs to a waiting thread: look further
      ++i;
      continue;
    }
    if (!up_.fence_retired(batches_[i].fence)) return;
    const std::uint64_t seq = batches_[i].seq;
    while (batch_head_ < batches_.size() && batches_[batch_head_].seq <= seq) retire_front();
    i = batch_head_;
  }
}

void DevicePool::retire_front() {
  Batch& b = batches_[batch_head_];
  std::uint64_t t0 = now();
  for (std::uint64_t p : b.blocks) {
    Suballocator::FreeInfo info;
    if (sub_.release_held(p, &info)) note_free(info);
  }
  emit(trace::EventKind::fence_retired, b.bytes, 0, t0, now() - t0);
  b.blocks.clear();
  spare_.push_back(std::move(b.blocks));
  ++batch_head_;
  if (batch_head_ == batches_.size()) {
    batches_.clear();
    batch_head_ = 0;
  } else if (batch_head_ >= 64 && batch_head_ * 2 >= batches_.size()) {
    batches_.erase(batches_.begin(), batches_.begin() + static_cast<std::ptrdiff_t>(batch_head_));
    batch_head_ = 0;
  }
}

// ---- queries ---------------------------------------------------------------------------------------

bool DevicePool::owns(std::uint64_t ptr) const {
  Lock lk(mu_);
  return sub_.in_chunk(ptr);
}

bool DevicePool::block_range(std::uint64_t ptr, std::uint64_t* base, std::size_t* size) const {
  Lock lk(mu_);
  return sub_.block_range(ptr, base, size);
}

std::size_t DevicePool::block_size(std::uint64_t ptr) const {
  Lock lk(mu_);
  return sub_.block_size(ptr);
}

trace::PoolState DevicePool::state_locked() const {
  trace::PoolState s;
  s.reserved = sub_.reserved();
  s.in_use = sub_.in_use();
  s.largest_free = sub_.largest_free();
  s.quarantined = sub_.held();
  s.free_blocks = sub_.free_blocks();
  return s;
}

trace::PoolState DevicePool::state() const {
  Lock lk(mu_);
  return state_locked();
}

void DevicePool::mem_info(std::size_t* free, std::size_t* total) {
  std::size_t dev_total = 0, dev_free = 0;
  up_.device_memory(&dev_total, &dev_free);  // outside the lock: the real query is a driver call
  Lock lk(mu_);
  std::uint64_t t = has_limit_ ? cap_ : dev_total;
  std::uint64_t f = std::min<std::uint64_t>(headroom(), dev_free) + sub_.free_bytes();
  if (free) *free = std::min(f, t);
  if (total) *total = t;
}

std::uint64_t DevicePool::external() const {
  Lock lk(mu_);
  return external_;
}

bool DevicePool::try_charge_external(std::size_t bytes) {
  Lock lk(mu_);
  if (bytes <= headroom()) {
    external_ += bytes;
    return true;
  }
  if (!abandoned_) {
    retire_ready();
    release_free_chunks(lk, false, kNever);
    if (bytes <= headroom()) {
      external_ += bytes;
      return true;
    }
  }
  emit(trace::EventKind::oom, bytes, 0, now(), 0, has_limit_ ? trace::OomClass::limit : trace::OomClass::device);
  return false;
}

void DevicePool::uncharge_external(std::size_t bytes) {
  Lock lk(mu_);
  external_ -= std::min<std::uint64_t>(external_, bytes);
}

void DevicePool::trim() {
  Lock lk(mu_);
  if (abandoned_) return;
  seal_pending();
  retire_ready();
  release_free_chunks(lk, true, kNever);
}

void DevicePool::abandon() {
  Lock lk(mu_);
  abandoned_ = true;
  sub_.clear();
  reservations_.clear();
  idle_since_.clear();
  pending_.clear();
  pending_bytes_ = 0;
  batches_.clear();
  batch_head_ = 0;
  external_ = 0;
  prealloc_chunk_ = Suballocator::kNoChunk;
  next_idle_check_ = kNever;
}

// ---- events ----------------------------------------------------------------------------------------

void DevicePool::emit(trace::EventKind kind, std::uint64_t size, std::uint64_t ptr, std::uint64_t t0,
                      std::uint64_t dur, trace::OomClass oom, int code) {
  if (!sink_) return;
  trace::Record r;
  r.t_ns = t0;
  r.dur_ns = dur;
  r.size = size;
  r.ptr = ptr;
  r.api = "pool";
  r.pool = state_locked();
  r.rc = code;
  r.tid = current_thread_id();
  r.device = static_cast<std::int16_t>(device_);
  r.kind = kind;
  r.oom_class = oom;
  r.has_pool = true;
  sink_->record(r);
}

}  // namespace cupool
