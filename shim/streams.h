// What the shim knows of the process's streams and stream captures. Deferred frees need fences
// only once work can run on two streams at the same time, and must keep fencing a stream that was
// destroyed with work still queued; during a stream capture the driver forbids some calls, so
// the pools make none of them. docs/design.md, "Streams" and "Stream capture".
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cuda_api.h"

namespace cupool::shim {

// The streams the process has created or used. One blocking stream and the legacy default
// stream wait for each other, so together they are still one order of work; a non-blocking
// stream, a second blocking stream, or a second thread's per-thread default stream (a blocking
// stream no call creates) let work overlap.
class StreamRegistry {
 public:
  // True when this stream is the one that lets work overlap for the first time.
  bool created(CUcontext ctx, CUstream stream, unsigned flags);
  // The calling thread put work on its per-thread default stream (first time only: the hooks
  // remember it per thread). True when that lets work overlap for the first time.
  bool per_thread_used(std::uint32_t tid);
  // The program destroys `stream`. Its context if it was a non-blocking stream (the legacy
  // stream does not wait for such a stream's queued work, which outlives the destroy), else null.
  CUcontext destroyed(CUstream stream);
  // Sticky: streams destroyed may still have work queued.
  bool concurrent() const { return concurrent_.load(std::memory_order_relaxed); }
  bool non_blocking(CUstream stream);
  std::vector<CUstream> non_blocking_of(CUcontext ctx);
  std::vector<CUstream> blocking_of(CUcontext ctx);  // created ones; per-thread streams are not handles
  // fork: held across it; the child, which cannot use the parent's CUDA, starts empty.
  void prepare_fork() { mutex_.lock(); }
  void parent_after_fork() { mutex_.unlock(); }
  void child_after_fork();

 private:
  bool overlap_locked(bool was);
  std::mutex mutex_;
  std::unordered_map<CUstream, CUcontext> non_blocking_;
  std::unordered_map<CUstream, CUcontext> blocking_;  // live blocking streams
  std::unordered_set<std::uint32_t> per_thread_;      // threads whose per-thread stream has work
  unsigned blocking_seen_ = 0;                         // blocking streams and per-thread streams
  std::atomic<bool> concurrent_{false};
};
// Inline: every pool-served free asks it (through DriverUpstream::needs_fences).
inline StreamRegistry& streams() {
  static StreamRegistry* registry = new StreamRegistry;  // never destroyed: used until exit
  return *registry;
}

// Stream captures in progress (cuStreamBeginCapture .. cuStreamEndCapture, on any thread).
class CaptureRegistry {
 public:
  // One relaxed load: the hot paths ask this first.
  bool any() const { return active_.load(std::memory_order_acquire) > 0; }
  void begun(CUstream stream, CUcontext ctx, CUstreamCaptureMode mode, bool blocking);
  void ended(CUstream stream);  // cuStreamEndCapture, whatever it returned, or the stream's destroy
  bool capturing(CUstream stream);
  // Work put on `stream` now would be captured into a graph rather than run: the stream is
  // capturing, or has joined another stream's capture (asked of the driver, during captures only).
  bool captures_work_on(CUstream stream);
  // A blocking stream of `ctx` is capturing: any use of the legacy stream would invalidate it.
  bool blocking_capture(CUcontext ctx);
  // The driver would refuse an "unsafe" call (cuMemAlloc, cuMemFree, a query or a wait) from the
  // calling thread now, with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, invalidating the captures
  // that forbid it: its capture-interaction mode is not relaxed, and it has begun a capture
  // still in progress that was not begun relaxed, or its mode is global and another thread's
  // global-mode capture is in progress. Measured on the H200 for every combination of modes,
  // threads and stream kinds (docs/gpu-runs/2026-12-01-capture-probe.txt).
  bool prohibited_here();
  void prepare_fork() { mutex_.lock(); }
  void parent_after_fork() { mutex_.unlock(); }
  void child_after_fork();

 private:
  struct Capture {
    CUstream stream;
    CUcontext ctx;
    CUstreamCaptureMode mode;
    std::uint32_t tid;
    bool blocking;
  };
  std::atomic<int> active_{0};
  std::mutex mutex_;
  std::vector<Capture> list_;
};
// Inline: every pooled allocation and free asks captures().any().
inline CaptureRegistry& captures() {
  static CaptureRegistry* registry = new CaptureRegistry;  // never destroyed: used until exit
  return *registry;
}

}  // namespace cupool::shim
