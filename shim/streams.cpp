// The shim's record of the process's streams and stream captures (streams.h).
#include "streams.h"

#include <algorithm>

#include "driver_upstream.h"
#include "thread_id.h"

namespace cupool::shim {

// ---- StreamRegistry ----------------------------------------------------------------------------

bool StreamRegistry::overlap_locked(bool was) { return !was && concurrent_.load(std::memory_order_relaxed); }

bool StreamRegistry::created(CUcontext ctx, CUstream stream, unsigned flags) {
  std::lock_guard lock(mutex_);
  const bool was = concurrent_.load(std::memory_order_relaxed);
  if (flags & CU_STREAM_NON_BLOCKING) {
    non_blocking_[stream] = ctx;
    concurrent_.store(true, std::memory_order_relaxed);
  } else if (blocking_.emplace(stream, ctx).second && ++blocking_seen_ >= 2) {
    // A handle seen twice (the runtime's create calls the driver's) counts once.
    concurrent_.store(true, std::memory_order_relaxed);
  }
  return overlap_locked(was);
}

bool StreamRegistry::per_thread_used(std::uint32_t tid) {
  std::lock_guard lock(mutex_);
  const bool was = concurrent_.load(std::memory_order_relaxed);
  if (per_thread_.insert(tid).second && ++blocking_seen_ >= 2) concurrent_.store(true, std::memory_order_relaxed);
  return overlap_locked(was);
}

CUcontext StreamRegistry::destroyed(CUstream stream) {
  std::lock_guard lock(mutex_);
  blocking_.erase(stream);
  auto it = non_blocking_.find(stream);
  if (it == non_blocking_.end()) return nullptr;
  CUcontext ctx = it->second;
  non_blocking_.erase(it);
  return ctx;
}

bool StreamRegistry::non_blocking(CUstream stream) {
  std::lock_guard lock(mutex_);
  return non_blocking_.count(stream) != 0;
}

std::vector<CUstream> StreamRegistry::non_blocking_of(CUcontext ctx) {
  std::lock_guard lock(mutex_);
  std::vector<CUstream> out;
  for (const auto& [s, c] : non_blocking_)
    if (c == ctx) out.push_back(s);
  return out;
}

std::vector<CUstream> StreamRegistry::blocking_of(CUcontext ctx) {
  std::lock_guard lock(mutex_);
  std::vector<CUstream> out;
  for (const auto& [s, c] : blocking_)
    if (c == ctx) out.push_back(s);
  return out;
}

void StreamRegistry::child_after_fork() {
  non_blocking_.clear();
  blocking_.clear();
  per_thread_.clear();
  blocking_seen_ = 0;
  concurrent_.store(false, std::memory_order_relaxed);
  mutex_.unlock();
}

// ---- CaptureRegistry ---------------------------------------------------------------------------

void CaptureRegistry::begun(CUstream stream, CUcontext ctx, CUstreamCaptureMode mode, bool blocking) {
  std::lock_guard lock(mutex_);
  list_.push_back(Capture{stream, ctx, mode, current_thread_id(), blocking});
  active_.store(static_cast<int>(list_.size()), std::memory_order_release);
}

void CaptureRegistry::ended(CUstream stream) {
  std::lock_guard lock(mutex_);
  list_.erase(std::remove_if(list_.begin(), list_.end(), [&](const Capture& c) { return c.stream == stream; }),
              list_.end());
  active_.store(static_cast<int>(list_.size()), std::memory_order_release);
}

bool CaptureRegistry::capturing(CUstream stream) {
  if (!any()) return false;
  std::lock_guard lock(mutex_);
  return std::any_of(list_.begin(), list_.end(), [&](const Capture& c) { return c.stream == stream; });
}

bool CaptureRegistry::captures_work_on(CUstream stream) {
  if (!any() || stream == nullptr || stream == CU_STREAM_LEGACY) return false;  // the legacy stream never captures
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  auto is_capturing = driver().stream_is_capturing;
  if (is_capturing && is_capturing(stream, &status) == CUDA_SUCCESS) return status != CU_STREAM_CAPTURE_STATUS_NONE;
  return capturing(stream);
}

bool CaptureRegistry::blocking_capture(CUcontext ctx) {
  if (!any()) return false;
  std::lock_guard lock(mutex_);
  return std::any_of(list_.begin(), list_.end(), [&](const Capture& c) { return c.blocking && c.ctx == ctx; });
}

bool CaptureRegistry::prohibited_here() {
  if (!any()) return false;
  // The thread's mode: exchanging it for itself reads it and changes nothing (the driver allows
  // the exchange at any time, also during a capture).
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  if (auto exchange = driver().thread_exchange_capture_mode) {
    if (exchange(&mode) != CUDA_SUCCESS) return false;
    CUstreamCaptureMode back = mode;
    exchange(&back);
  }
  if (mode == CU_STREAM_CAPTURE_MODE_RELAXED) return false;
  const std::uint32_t me = current_thread_id();
  std::lock_guard lock(mutex_);
  for (const Capture& c : list_) {
    if (c.tid == me && c.mode != CU_STREAM_CAPTURE_MODE_RELAXED) return true;
    if (c.tid != me && mode == CU_STREAM_CAPTURE_MODE_GLOBAL && c.mode == CU_STREAM_CAPTURE_MODE_GLOBAL) return true;
  }
  return false;
}

void CaptureRegistry::child_after_fork() {
  list_.clear();
  active_.store(0, std::memory_order_release);
  mutex_.unlock();
}

}  // namespace cupool::shim
