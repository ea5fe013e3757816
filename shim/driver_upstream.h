// The Upstream of a pool on a real device: chunks from cuMemAlloc_v2, fences from CUDA events.
#pragma once

#include <atomic>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cuda_api.h"
#include "upstream.h"

namespace cupool::shim {

// The driver functions cupool calls itself, found once.
struct DriverCalls {
  decltype(&::cuCtxGetCurrent) ctx_get_current = nullptr;
  decltype(&::cuCtxGetDevice) ctx_get_device = nullptr;
  decltype(&::cuCtxSynchronize) ctx_synchronize = nullptr;
  decltype(&::cuCtxPushCurrent_v2) ctx_push = nullptr;
  decltype(&::cuCtxPopCurrent_v2) ctx_pop = nullptr;
  decltype(&::cuDeviceGetName) device_get_name = nullptr;
  decltype(&::cuDeviceTotalMem_v2) device_total_mem = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) primary_ctx_retain = nullptr;
  decltype(&::cuDevicePrimaryCtxRelease_v2) primary_ctx_release = nullptr;
  decltype(&::cuStreamQuery) stream_query = nullptr;
  decltype(&::cuEventCreate) event_create = nullptr;
  decltype(&::cuEventRecord) event_record = nullptr;
  decltype(&::cuEventQuery) event_query = nullptr;
  decltype(&::cuEventSynchronize) event_synchronize = nullptr;
  decltype(&::cuEventDestroy_v2) event_destroy = nullptr;
  bool ok = false;  // every function above was found
};
const DriverCalls& driver();

// The streams the process has created. Deferred frees need fences only once two streams can
// run work at the same time: a non-blocking stream (fenced itself, since the legacy default
// stream does not wait for it), a second blocking stream (one blocking stream and the legacy
// stream wait for each other, so together they are still one order). Until then stream order
// alone makes reuse safe. Per-thread default streams are not seen (docs/design.md says why).
class StreamRegistry {
 public:
  // True when this stream is the one that lets work overlap for the first time.
  bool created(CUcontext ctx, CUstream stream, unsigned flags);
  void destroyed(CUstream stream);
  // Sticky: streams destroyed may still have work queued.
  bool concurrent() const { return concurrent_.load(std::memory_order_relaxed); }
  std::vector<CUstream> non_blocking(CUcontext ctx);

 private:
  std::mutex mutex_;
  std::unordered_map<CUstream, CUcontext> non_blocking_;
  std::unordered_set<CUstream> blocking_;  // live blocking streams
  unsigned blocking_created_ = 0;
  std::atomic<bool> concurrent_{false};
};
StreamRegistry& streams();

class DriverUpstream final : public Upstream {
 public:
  explicit DriverUpstream(CUcontext ctx, CUdevice device);
  ~DriverUpstream() override;

  UpstreamStatus reserve(std::size_t bytes, std::uint64_t* base, int* driver_code) override;
  void release(std::uint64_t base, std::size_t bytes) override;
  void device_memory(std::size_t* total, std::size_t* free) override;
  void synchronize() override;
  bool needs_fences() override;
  FenceId place_fence() override;
  bool fence_retired(FenceId fence) override;
  void wait_fence(FenceId fence) override;

  // The context is gone (reset or destroyed) or the process is exiting: call nothing more.
  void detach() { detached_ = true; }

 private:
  void forget_fence(FenceId fence);
  CUcontext ctx_;
  CUdevice device_;
  std::atomic<bool> detached_{false};
  std::mutex fence_mutex_;
  FenceId next_fence_ = 1;
  struct Fence {
    std::vector<CUevent> events;  // not yet seen complete
    int waiters = 0;              // threads in wait_fence: its events are not recycled meanwhile
  };
  std::unordered_map<FenceId, Fence> fences_;
  std::vector<CUevent> spare_events_;
};

}  // namespace cupool::shim
