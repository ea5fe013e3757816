// The trace writer: JSON Lines, format in trace_schema.h and docs/trace-format.md.
//
// record() is the hot path: it copies the record into the calling thread's own ring buffer
// (single producer, single consumer) and returns; no heap, no JSON, no lock shared by threads.
// One background thread drains every ring, formats lines into a fixed buffer and write(2)s them
// at least every Config::trace_flush_ns. A full ring counts the event as dropped; the writer
// writes a "drop" line when it notices, and the footer carries the total.
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <optional>
#include <string_view>
#include <vector>

#include "config.h"
#include "stack_table.h"
#include "pool_events.h"
#include "trace_schema.h"

namespace cupool {

class TraceWriter final : public PoolObserver {
 public:
  // A writer for the file Config::trace_path names ("%p" expanded). The file itself is created
  // (truncated, with its header) at the process's first event or device, not here: a process
  // that never uses CUDA (every `ls` of a job script the library is preloaded into) leaves no
  // file. It is opened as policy/output_file.h says: no symbolic link followed, mode 0600. Here
  // only the directory is checked; if it cannot hold the file, returns null and sets *error to
  // one line "cupool: CUPOOL_TRACE: ...".
  static std::unique_ptr<TraceWriter> open(const Config& config, std::string* error);
  ~TraceWriter() override;  // close()

  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  // Hot path. Any thread. A no-op once close() has begun.
  void record(const trace::Record& record);
  // Hot path: is the calling thread's ring full? An event it would record now is dropped, so a
  // hook need not time it or fill it in: it calls drop_here() instead of record(). A program that
  // allocates faster than the writer writes spends most of its calls here (2026-12-03: 88 % of a
  // pair benchmark's events on the 2-core dev VM).
  bool full_here();
  void drop_here();  // counts one event of this thread as dropped
  // CUPOOL_TRACE_STACKS: the id to put in a Record's `stack` for these return addresses
  // (innermost first); 0 when none. Any thread. The stack's line is written before the first
  // event that names it, in each file (a fork child's too).
  std::uint32_t intern_stack(const std::uintptr_t* pcs, std::size_t count) { return stacks_.intern(pcs, count); }

  // A pool's event (or a kept VMM mapping given back), as its trace line.
  void pool_event(const PoolEvent& e) override { record(trace::record_of(e)); }

  // A device seen for the first time: writes a "device" line now; the footer lists every device.
  // Calling it again for the same device with the same data writes nothing.
  void write_device(int device, std::string_view name, std::uint64_t total_bytes);

  // Drains every ring and writes it out now, on the calling thread.
  void flush();

  // Drains, writes the footer, stops the writer thread and closes the file. Idempotent. Events
  // recorded by other threads while close() runs may be lost; after it, record() does nothing.
  // `share_waits`: a member of a shared budget's waits for room (count, total ns), for the footer.
  struct ShareWaits {
    std::uint64_t waits = 0, wait_ns = 0;
  };
  void close(const std::optional<ShareWaits>& share_waits = std::nullopt);

  // pthread_atfork handlers. The child gets a file of its own: the path with "%p" expanded for
  // the child's pid, or, without "%p", the parent's path + "." + pid. It is created (with a new
  // header) when the child first records an event or a device, or never; the writer thread too
  // starts then. Events the parent had buffered stay the parent's.
  void prepare_fork();
  void parent_after_fork();
  void child_after_fork();

  const std::string& path() const { return path_; }

  struct Stats {
    std::uint64_t events = 0;   // event lines written to this file
    std::uint64_t dropped = 0;  // events dropped (full ring) and reported so far
  };
  Stats stats();  // after a flush() or close(), complete

  // Tests: the writer thread sleeps this long after each pass, so rings fill up.
  void set_writer_delay_for_testing(std::uint64_t ns) { test_delay_ns_.store(ns); }

  struct Ring;  // one per thread; trace_writer.cpp

 private:
  static constexpr std::size_t kBufferSize = 256 * 1024;
  static constexpr std::size_t kMaxLine = 2048;     // an event or drop line is always shorter
  explicit TraceWriter(const Config& config);

  Ring* register_thread();
  void ensure_started();
  bool open_file_locked(std::string* error);  // out_mu_ held
  void pass_locked();                         // out_mu_ held: drain all rings, write
  bool drain_ring_locked(Ring& ring);         // true when the ring is dead and empty
  void format_event_locked(const trace::Record& r);
  void write_stack_locked(std::uint32_t id);  // its line, once per file
  void write_buffer_locked();
  void write_all_locked(const char* data, std::size_t size);
  void wake_writer();
  void writer_loop();
  static void* writer_main(void* self);

  const Config config_;
  const std::string pattern_;  // CUPOOL_TRACE as given
  const bool started_child_;   // started by another traced process: file opened at first use
  std::string path_;
  std::uint64_t id_;  // unique per writer and per process: thread caches compare it

  std::atomic<bool> closed_{false};
  std::atomic<bool> started_{false};
  std::atomic<bool> stop_{false};
  std::atomic<std::uint32_t> wake_{0};  // futex word: bumped to wake the writer
  std::atomic<std::uint64_t> test_delay_ns_{0};
  std::uint32_t ring_capacity_;
  pthread_t thread_{};
  bool thread_running_ = false;

  StackTable stacks_;  // locks on its own, after out_mu_ and rings_mu_

  std::mutex rings_mu_;  // rings_ (registration, snapshot, removal); after out_mu_
  std::vector<Ring*> rings_;

  std::mutex out_mu_;  // everything below; before rings_mu_
  int fd_ = -1;
  bool io_failed_ = false;
  std::vector<Ring*> snapshot_;
  std::vector<trace::Record> batch_;  // one pass's events, written in time order...
  std::vector<std::pair<std::uint64_t, std::size_t>> order_;  // ...which is this: (t_ns, index)
  std::unique_ptr<char[]> buf_;
  std::size_t buf_used_ = 0;
  struct Device {
    int index;
    std::string name;
    std::uint64_t total_bytes;
  };
  std::vector<Device> devices_;
  std::vector<bool> stack_written_;    // by stack id: its line is in this file
  FrameCache frames_;                  // frames symbolized so far
  trace::PoolStateDerivation derived_;  // pools' in_use and cached as of the last event written
  std::uint64_t events_ = 0, dropped_ = 0, allocs_ = 0, frees_ = 0, ooms_ = 0;
};

}  // namespace cupool
