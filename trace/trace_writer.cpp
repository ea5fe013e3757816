// The trace writer (trace_writer.h): per-thread rings of events, the writer thread that takes
// them in time order, the file of each process (a fork child's too), and its header, devices and
// footer. An event's line is formatted in trace_writer_format.cpp.
#include "trace_writer.h"

#include "thread_id.h"

#include "event_clock.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>  // getenv, setenv
#include <cstring>

#include "log.h"
#include "options.h"
#include "output_file.h"
#include "quoted_string.h"
#include "config_json.h"
#include "trace_file_name.h"

#ifndef CUPOOL_VERSION
#define CUPOOL_VERSION "0.1.0"
#endif

namespace cupool {

namespace tk = trace::key;

// One thread's events on their way to the file. The thread is the only producer (head), the
// writer the only consumer (tail). Owned jointly by the thread and the writer (refs): whichever
// lets go last frees it, so neither a thread exit nor close() has to wait for the other.
struct TraceWriter::Ring {
  Ring(std::uint32_t capacity, std::uint32_t thread_id)
      : mask(capacity - 1),
        wake_mask(capacity >= 4 ? capacity / 4 - 1 : 0),
        tid(thread_id),
        slots(new trace::Record[capacity]) {}

  // Read-only after construction.
  const std::uint64_t mask;
  const std::uint64_t wake_mask;  // wake the writer each time a quarter of the ring has filled
  const std::uint32_t tid;
  const std::unique_ptr<trace::Record[]> slots;

  alignas(64) std::atomic<std::uint64_t> head{0};  // producer
  std::uint64_t cached_tail = 0;                     // producer's last view of tail
  // Producer counts, writer reads: a load and a store, no locked add (a full barrier), as it
  // alone writes it.
  std::atomic<std::uint64_t> dropped{0};
  void count_drop() { dropped.store(dropped.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); }

  alignas(64) std::atomic<std::uint64_t> tail{0};  // consumer
  std::uint64_t dropped_reported = 0;              // consumer
  std::uint64_t corrupt = 0;                       // consumer: slots it could not write, not yet reported

  alignas(64) std::atomic<std::uint32_t> refs{2};  // the thread and the writer
  std::atomic<bool> dead{false};                   // the thread let go: drain, then free
};

namespace {

using Ring = TraceWriter::Ring;

// A device as the footer lists it, and as a device line.
std::string device_object(int index, std::string_view name, std::uint64_t total_bytes) {
  namespace dk = trace::device_key;
  std::string o = fmt::format(R"({{"{}":{},"{}":)", dk::index, index, dk::name);
  append_quoted(o, name);
  o += fmt::format(R"(,"{}":{}}})", dk::total_bytes, total_bytes);
  return o;
}
std::string device_line(int index, std::string_view name, std::uint64_t total_bytes) {
  namespace dk = trace::device_key;
  std::string o = fmt::format(R"({{"type":"{}","{}":{},"{}":{},"{}":)", trace::line::device, trace::key::t,
                              EventClock::now(), dk::index, index, dk::name);
  append_quoted(o, name);
  o += fmt::format(R"(,"{}":{}}})", dk::total_bytes, total_bytes);
  o += '\n';
  return o;
}

std::atomic<std::uint64_t> g_next_writer_id{1};

// The calling thread's ring, for the writer whose id matches. Trivially destructible, so the
// hot path pays no TLS-constructor check; the thread-exit hook is a pthread key below.
struct ThreadCache {
  std::uint64_t writer_id = 0;
  Ring* ring = nullptr;
};
thread_local ThreadCache t_cache __attribute__((tls_model("initial-exec")));

void unref(Ring* ring) {
  if (ring->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete ring;
}

// The thread is done with its ring (it exits, or moves to another writer).
void release_by_thread(Ring* ring) {
  ring->dead.store(true, std::memory_order_release);
  unref(ring);
}

void on_thread_exit(void* p) {
  if (p == nullptr) return;
  // A later record() on this thread (another library's exit hook) registers afresh.
  t_cache = ThreadCache{};
  release_by_thread(static_cast<Ring*>(p));
}

pthread_key_t ring_key() {
  static const pthread_key_t key = [] {
    pthread_key_t k;
    pthread_key_create(&k, on_thread_exit);
    return k;
  }();
  return key;
}

std::uint64_t clock_ns(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t));
void futex_wait(std::atomic<std::uint32_t>* word, std::uint32_t expected, std::uint64_t timeout_ns) {
  timespec ts{static_cast<time_t>(timeout_ns / 1'000'000'000ull), static_cast<long>(timeout_ns % 1'000'000'000ull)};
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, &ts, nullptr, 0);
}
void futex_wake(std::atomic<std::uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
}

std::uint32_t round_up_pow2(std::uint32_t n) {
  std::uint32_t c = 2;
  while (c < n && c < (1u << 30)) c <<= 1;
  return c;
}

// Whether this process was started by another process tracing to the same CUPOOL_TRACE (an
// exec'd child: JAX runs ptxas dozens of times; worker processes). The first such process puts
// "<pid>:<pattern>" in the environment its children inherit; a child that traces elsewhere is a
// first process of its own.
bool started_by_traced_process(pid_t pid, const std::string& pattern) {
  const std::string mine = std::to_string(pid) + ":" + pattern;
  const char* root = std::getenv(kTraceRootVariable);
  const std::string_view r = root ? std::string_view(root) : std::string_view();
  const auto colon = r.find(':');
  const bool same_pattern = colon != std::string_view::npos && r.substr(colon + 1) == pattern;
  if (!same_pattern) {
    ::setenv(kTraceRootVariable, mine.c_str(), 1);
    return false;
  }
  return r != mine;
}

std::vector<std::string> read_cmdline() {
  std::vector<std::string> args;
  const int fd = ::open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return args;
  std::string all;
  char chunk[4096];
  for (;;) {
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    all.append(chunk, static_cast<std::size_t>(n));
  }
  ::close(fd);
  std::size_t start = 0;
  while (start < all.size()) {
    std::size_t end = all.find('\0', start);
    if (end == std::string::npos) end = all.size();
    args.emplace_back(all, start, end - start);
    start = end + 1;
  }
  return args;
}

}  // namespace

// ---- construction, open, close -------------------------------------------------------------

TraceWriter::TraceWriter(const Config& config)
    : config_(config),
      pattern_(config.trace_path),
      started_child_(started_by_traced_process(::getpid(), config.trace_path)),
      path_(trace_path_for_process(config.trace_path, ::getpid(), started_child_)),
      id_(g_next_writer_id.fetch_add(1)),
      ring_capacity_(round_up_pow2(config.trace_buffer_events)),
      buf_(new char[kBufferSize]) {
  (void)ring_key();
}

std::unique_ptr<TraceWriter> TraceWriter::open(const Config& config, std::string* error) {
  std::unique_ptr<TraceWriter> writer(new TraceWriter(config));
  // Every process opens its file at its first event or device (ensure_started): the dozens of
  // ptxas runs under JAX, and every process of a job script that never uses CUDA, leave none.
  // A path that could not be written is a configuration error, said before the program starts.
  std::string why;
  if (!output_file_possible(writer->path_, &why)) {
    if (error) {
      *error = "cupool: CUPOOL_TRACE: cannot write the trace to ";
      append_quoted(*error, writer->path_);
      *error += ": " + why;
    }
    return nullptr;
  }
  return writer;
}

TraceWriter::~TraceWriter() { close(); }

bool TraceWriter::open_file_locked(std::string* error) {
  std::string why;
  fd_ = open_output_file(path_, false, &why);
  if (fd_ < 0) {
    std::string line = "cupool: CUPOOL_TRACE: cannot write the trace to ";
    append_quoted(line, path_);
    *error = line + ": " + why;
    return false;
  }
  io_failed_ = false;
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  namespace hk = trace::header_key;
  std::string h = fmt::format(R"({{"type":"{}","{}":"{}","{}":"{}.{}","{}":)", trace::line::header, hk::format,
                              trace::kFormatName, hk::version, trace::kFormatMajor, trace::kFormatMinor,
                              hk::cupool_version);
  append_quoted(h, CUPOOL_VERSION);
  h += fmt::format(R"(,"{}":{},"{}":{},"{}":)", hk::pid, ::getpid(), hk::ppid, ::getppid(), hk::host);
  append_quoted(h, host);
  h += fmt::format(R"(,"{}":[)", hk::cmdline);
  bool first = true;
  for (const std::string& arg : read_cmdline()) {
    if (!first) h += ',';
    first = false;
    append_quoted(h, arg);
  }
  h += fmt::format(R"(],"{}":{},"{}":{},"{}":)", hk::start_unix_ns, clock_ns(CLOCK_REALTIME), hk::start_mono_ns,
                   EventClock::now(), hk::config);
  h += config_json(config_);
  h += fmt::format(R"(,"{}":[]}})", hk::devices);
  h += '\n';
  // A fork child's file repeats the devices its parent had already seen.
  for (const Device& d : devices_) h += device_line(d.index, d.name, d.total_bytes);
  write_all_locked(h.data(), h.size());
  return true;
}

void TraceWriter::close(const std::optional<ShareWaits>& share_waits) {
  if (closed_.exchange(true, std::memory_order_acq_rel)) return;
  stop_.store(true, std::memory_order_release);
  wake_writer();
  bool running;
  {
    std::lock_guard lock(out_mu_);
    running = thread_running_;
    thread_running_ = false;
  }
  if (running) pthread_join(thread_, nullptr);

  std::lock_guard lock(out_mu_);
  if (fd_ >= 0) {
    pass_locked();
    namespace fk = trace::footer_key;
    std::string f = fmt::format(R"({{"type":"{}","{}":{},"{}":{},"{}":{},"{}":{},"{}":{},"{}":{},"{}":[)",
                                trace::line::footer, fk::events, events_, fk::dropped, dropped_, fk::allocs, allocs_,
                                fk::frees, frees_, fk::ooms, ooms_, fk::end_mono_ns, EventClock::now(), fk::devices);
    for (std::size_t i = 0; i < devices_.size(); ++i) {
      if (i) f += ',';
      f += device_object(devices_[i].index, devices_[i].name, devices_[i].total_bytes);
    }
    f += ']';
    if (share_waits)
      f += fmt::format(R"(,"{}":{},"{}":{})", fk::share_waits, share_waits->waits, fk::share_wait_ns, share_waits->wait_ns);
    f += "}\n";
    write_all_locked(f.data(), f.size());
    ::close(fd_);
    fd_ = -1;
  }
  std::lock_guard rings_lock(rings_mu_);
  for (Ring* ring : rings_) unref(ring);
  rings_.clear();
}

// ---- the hot path ------------------------------------------------------------------------------

void TraceWriter::record(const trace::Record& record) {
  if (closed_.load(std::memory_order_relaxed)) [[unlikely]]
    return;
  Ring* ring = t_cache.ring;
  if (t_cache.writer_id != id_) [[unlikely]] {
    ring = register_thread();
    if (ring == nullptr) return;
  }
  const std::uint64_t head = ring->head.load(std::memory_order_relaxed);
  if (head - ring->cached_tail > ring->mask) [[unlikely]] {
    ring->cached_tail = ring->tail.load(std::memory_order_acquire);
    if (head - ring->cached_tail > ring->mask) {
      ring->count_drop();
      return;
    }
  }
  ring->slots[head & ring->mask] = record;
  ring->head.store(head + 1, std::memory_order_release);
  if (((head + 1) & ring->wake_mask) == 0) [[unlikely]]
    wake_writer();
}

bool TraceWriter::full_here() {
  if (t_cache.writer_id != id_) return false;  // no ring yet: record() makes one
  Ring* ring = t_cache.ring;
  const std::uint64_t head = ring->head.load(std::memory_order_relaxed);
  if (head - ring->cached_tail <= ring->mask) [[likely]]
    return false;
  ring->cached_tail = ring->tail.load(std::memory_order_acquire);
  return head - ring->cached_tail > ring->mask;
}

void TraceWriter::drop_here() {
  if (closed_.load(std::memory_order_relaxed) || t_cache.writer_id != id_) [[unlikely]]
    return;
  t_cache.ring->count_drop();
}

TraceWriter::Ring* TraceWriter::register_thread() {
  if (t_cache.ring != nullptr) {  // a ring of another writer, or of this one before a fork
    release_by_thread(t_cache.ring);
    t_cache = ThreadCache{};
    pthread_setspecific(ring_key(), nullptr);
  }
  Ring* ring;
  try {
    ring = new Ring(ring_capacity_, current_thread_id());
  } catch (...) {
    return nullptr;
  }
  {
    std::lock_guard lock(rings_mu_);
    if (closed_.load(std::memory_order_acquire)) {
      delete ring;
      return nullptr;
    }
    rings_.push_back(ring);
  }
  pthread_setspecific(ring_key(), ring);
  t_cache = ThreadCache{id_, ring};
  ensure_started();
  return ring;
}

void TraceWriter::wake_writer() {
  wake_.fetch_add(1, std::memory_order_release);
  futex_wake(&wake_);
}

// ---- the writer thread ------------------------------------------------------------------------

void TraceWriter::ensure_started() {
  if (started_.load(std::memory_order_acquire)) return;
  std::lock_guard lock(out_mu_);
  if (started_.load(std::memory_order_relaxed) || closed_.load(std::memory_order_acquire)) return;
  if (fd_ < 0 && !io_failed_) {  // a child's first event: its own file
    std::string error;
    if (!open_file_locked(&error)) {
      io_failed_ = true;
      log_error(error.substr(std::string_view("cupool: ").size()));
    }
  }
  // The writer thread takes no signals: they belong to the program's threads.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  const int rc = pthread_create(&thread_, nullptr, &TraceWriter::writer_main, this);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (rc != 0) {
    log_error(fmt::format("cannot start the trace writer thread: {}; the trace is written only at exit",
                          std::strerror(rc)));
  } else {
    thread_running_ = true;
    pthread_setname_np(thread_, "cupool-trace");
  }
  started_.store(true, std::memory_order_release);
}

void* TraceWriter::writer_main(void* self) {
  static_cast<TraceWriter*>(self)->writer_loop();
  return nullptr;
}

void TraceWriter::writer_loop() {
  while (!stop_.load(std::memory_order_acquire)) {
    const std::uint32_t seq = wake_.load(std::memory_order_acquire);
    {
      std::lock_guard lock(out_mu_);
      pass_locked();
    }
    if (const std::uint64_t delay = test_delay_ns_.load(std::memory_order_relaxed)) {
      timespec ts{static_cast<time_t>(delay / 1'000'000'000ull), static_cast<long>(delay % 1'000'000'000ull)};
      nanosleep(&ts, nullptr);
    }
    if (stop_.load(std::memory_order_acquire)) break;
    futex_wait(&wake_, seq, config_.trace_flush_ns);
  }
}

void TraceWriter::flush() {
  std::lock_guard lock(out_mu_);
  pass_locked();
}

TraceWriter::Stats TraceWriter::stats() {
  std::lock_guard lock(out_mu_);
  return Stats{events_, dropped_};
}

void TraceWriter::pass_locked() {
  {
    std::lock_guard lock(rings_mu_);
    snapshot_.assign(rings_.begin(), rings_.end());
  }
  bool any_dead = false;
  // Hot paths only stamp; reading the clock here keeps its fit refitted while they run.
  (void)EventClock::now();
  // Each thread's buffer is in its own order; lines of one pass are written in time order, so a
  // reader sees events of different threads interleaved as they happened (up to one pass).
  batch_.clear();
  for (Ring* ring : snapshot_) any_dead |= drain_ring_locked(*ring);
  // Sorted by (time, place in the batch): as stable as sorting the records, without moving
  // 168-byte records or a temporary buffer of them (a tenth of a busy writer's time).
  order_.clear();
  for (std::size_t i = 0; i < batch_.size(); ++i) order_.push_back({batch_[i].t_ns, i});
  std::sort(order_.begin(), order_.end());
  for (const auto& [t, i] : order_) {
    trace::Record& r = batch_[i];
    // In time order: a cache-served event's in_use and cached from its pool's last values. Events
    // dropped from a full ring leave the derived values off until the pool's next locked event,
    // and cache-served events of other threads around a locked one may be counted on the wrong
    // side of it.
    if (r.has_pool) derived_.apply(r.pool);
    format_event_locked(r);
  }
  write_buffer_locked();
  if (!any_dead) return;
  std::lock_guard lock(rings_mu_);
  for (auto it = rings_.begin(); it != rings_.end();) {
    Ring* ring = *it;
    if (ring->dead.load(std::memory_order_acquire) &&
        ring->tail.load(std::memory_order_relaxed) == ring->head.load(std::memory_order_acquire) &&
        ring->dropped_reported == ring->dropped.load(std::memory_order_relaxed)) {
      it = rings_.erase(it);
      unref(ring);
    } else {
      ++it;
    }
  }
}

bool TraceWriter::drain_ring_locked(Ring& ring) {
  const bool dead = ring.dead.load(std::memory_order_acquire);  // before head: then head is final
  const std::uint64_t head = ring.head.load(std::memory_order_acquire);
  std::uint64_t tail = ring.tail.load(std::memory_order_relaxed);
  while (tail != head) {
    trace::Record r = ring.slots[tail & ring.mask];
    ++tail;
    const auto kind = static_cast<std::size_t>(r.kind);
    const auto path = static_cast<std::size_t>(r.path);
    const auto oom = static_cast<std::size_t>(r.oom_class);
    if (kind >= trace::kEventKindNames.size() || path >= trace::kPathNames.size() ||
        oom >= trace::kOomClassNames.size()) {
      ++ring.corrupt;  // counted as dropped, never a broken line
      continue;
    }
    if (r.tid == 0) r.tid = ring.tid;
    if (r.stamped) {  // the call ran from t - dur to t, or from t to t + dur
      const std::uint64_t t = EventClock::stamp_to_ns(r.t_ns);
      if (r.timed_for == 0)
        r.dur_ns = 0;
      else
        r.dur_ns = trace::timed_at_end(r.kind) ? t - EventClock::stamp_to_ns(r.t_ns - r.dur_ns)
                                               : EventClock::stamp_to_ns(r.t_ns + r.dur_ns) - t;
      r.t_ns = t;
      r.stamped = false;
    }
    batch_.push_back(r);
  }
  ring.tail.store(tail, std::memory_order_release);

  const std::uint64_t dropped = ring.dropped.load(std::memory_order_relaxed);
  if (dropped != ring.dropped_reported || ring.corrupt != 0) {
    if (buf_used_ + kMaxLine > kBufferSize) write_buffer_locked();
    const std::uint64_t count = dropped - ring.dropped_reported + ring.corrupt;
    ring.corrupt = 0;
    char* p = fmt::format_to(buf_.get() + buf_used_, R"({{"type":"{}","{}":{},"{}":{},"{}":{}}})" "\n",
                             trace::line::drop, tk::t, EventClock::now(), tk::tid, ring.tid, trace::drop_key::count,
                             count);
    buf_used_ = static_cast<std::size_t>(p - buf_.get());
    dropped_ += count;
    ring.dropped_reported = dropped;
  }
  return dead;
}

void TraceWriter::write_buffer_locked() {
  if (buf_used_ == 0) return;
  write_all_locked(buf_.get(), buf_used_);
  buf_used_ = 0;
}

void TraceWriter::write_all_locked(const char* data, std::size_t size) {
  if (fd_ < 0 || io_failed_) return;
  while (size > 0) {
    const ssize_t n = ::write(fd_, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      io_failed_ = true;
      log_error(fmt::format("writing the trace to {} failed: {}; the rest of the trace is lost", path_,
                            n < 0 ? std::strerror(errno) : "no progress"));
      return;
    }
    data += n;
    size -= static_cast<std::size_t>(n);
  }
}

void TraceWriter::write_device(int device, std::string_view name, std::uint64_t total_bytes) {
  if (closed_.load(std::memory_order_acquire)) return;
  ensure_started();  // a fork child's file is created here if no event came first
  std::lock_guard lock(out_mu_);
  const auto known = std::find_if(devices_.begin(), devices_.end(), [&](const Device& d) { return d.index == device; });
  if (known == devices_.end()) {
    devices_.push_back(Device{device, std::string(name), total_bytes});
  } else {
    if (known->name == name && known->total_bytes == total_bytes) return;
    known->name = std::string(name);
    known->total_bytes = total_bytes;
  }
  const std::string line = device_line(device, name, total_bytes);
  write_buffer_locked();
  write_all_locked(line.data(), line.size());
}

// ---- fork ----------------------------------------------------------------------------------------

void TraceWriter::prepare_fork() {
  out_mu_.lock();  // the writer is between passes: its buffer is empty
  rings_mu_.lock();
  stacks_.lock();
}

void TraceWriter::parent_after_fork() {
  stacks_.unlock();
  rings_mu_.unlock();
  out_mu_.unlock();
}

void TraceWriter::child_after_fork() {
  // One thread now: this one. The writer thread, and every other thread, did not come along.
  id_ = g_next_writer_id.fetch_add(1);  // every thread cache is stale: this thread re-registers
  thread_running_ = false;
  started_.store(false);
  stop_.store(false);
  wake_.store(0);
  if (fd_ >= 0) ::close(fd_);  // the parent's file stays the parent's
  fd_ = -1;
  io_failed_ = false;
  buf_used_ = 0;
  events_ = dropped_ = allocs_ = frees_ = ooms_ = 0;
  derived_.clear();
  stack_written_.clear();  // the child's file names its stacks again
  const pid_t pid = ::getpid();
  path_ = trace_path_for_process(pattern_, pid, true);
  // The parent's rings hold the parent's events: abandon them. Only this thread's ring is
  // still referenced (by this thread, which lets go of it when it next records).
  for (Ring* ring : rings_) {
    if (ring == t_cache.ring) unref(ring);
    else delete ring;
  }
  rings_.clear();
  snapshot_.clear();
  stacks_.unlock();
  rings_mu_.unlock();
  out_mu_.unlock();
}

}  // namespace cupool
