// The Upstream of a pool on a real device: chunks from cuMemAlloc_v2, fences from CUDA events.
// Fences cover every stream the process uses (shim/streams.h), including non-blocking streams
// destroyed with work still queued; during a stream capture it waits only for uncaptured work.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cuda_api.h"
#include "driver_calls.h"
#include "upstream.h"

namespace cupool::shim {

class DriverUpstream final : public Upstream {
 public:
  explicit DriverUpstream(CUcontext ctx, CUdevice device);
  ~DriverUpstream() override;

  UpstreamStatus reserve(std::size_t bytes, std::size_t min_bytes, std::uint64_t* base, std::size_t* got,
                         int* driver_code) override;
  void release(std::uint64_t base, std::size_t bytes) override;
  void device_memory(std::size_t* total, std::size_t* free) override;
  void synchronize() override;
  bool needs_fences() override;
  FenceId place_fence() override;
  bool fence_retired(FenceId fence) override;
  void wait_fence(FenceId fence) override;
  bool capturing() override;
  // The vmm policy: one handle (cuMemCreate) per granule, so that any granule can be unmapped
  // and released on its own; a run of granules is mapped in one call of map() and made
  // accessible with one cuMemSetAccess.
  std::size_t vmm_granularity() override;
  std::string no_virtual_memory_reason() override;
  UpstreamStatus reserve_address(std::size_t bytes, std::uint64_t* va) override;
  void free_address(std::uint64_t va, std::size_t bytes) override;
  UpstreamStatus map(std::uint64_t va, std::size_t bytes, int* driver_code) override;
  void unmap(std::uint64_t va, std::size_t bytes) override;

  // CUDA IPC (shim/ipc_vmm.cpp): are granules made exportable as POSIX file descriptors (the
  // device says so and cuMemCreate took the handle type)? Known after the first map.
  bool shareable();
  // File descriptors for the `count` granules from `first_va` (each a new descriptor the caller
  // closes). Fails (nothing left open) if one is not mapped or cannot be exported.
  CUresult export_granules(std::uint64_t first_va, std::size_t count, std::vector<int>* fds);
  CUdevice device() const { return device_; }

  // The context is about to go (reset or destroy): the driver frees its cuMemAlloc memory with
  // it but not cuMemCreate memory, so the vmm policy's granules and virtual range are given back
  // here, once the device has finished with them. Call before detach().
  void release_virtual_memory();
  // Peer access (cuCtxEnablePeerAccess from a context of device `accessor` to this one): the
  // driver makes cuMemAlloc memory reachable from there by that alone, but cuMemCreate memory
  // only by cuMemSetAccess naming the device. So the vmm policy's granules get it: those mapped
  // now, and every map after. Idempotent.
  void grant_peer(CUdevice accessor);
  // The context is gone (reset or destroyed) or the process is exiting: call nothing more.
  void detach() { detached_ = true; }
  CUcontext context() const { return ctx_; }

  // The program is destroying non-blocking `stream`: work queued on it runs on, and the legacy
  // stream does not wait for it, so until that work is done every fence includes an event
  // recorded on it now (a tombstone).
  void stream_destroying(CUstream stream);
  // A blocking stream of this context is about to begin capturing, after which the legacy
  // stream cannot be used: an event on it now covers the work queued before (for waits during
  // the capture).
  void before_blocking_capture();
  // What the driver does to a call the capture mode forbids: an unsafe call of its own (a query
  // of an event that is complete) fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and
  // invalidates the captures that forbid it. Returns that code.
  CUresult refuse_as_capture_does();
  // An event of this context that was never recorded, so always complete (made on first use).
  CUevent probe_event();

 private:
  struct Tombstone;
  using TombstoneRef = std::shared_ptr<Tombstone>;
  void forget_fence(FenceId fence);
  void prune_tombstones_locked();  // drops those whose work is done
  CUevent take_event_locked();
  void wait_uncaptured();
  CUresult create_granule(CUmemGenericAllocationHandle* h, std::size_t g, CUmemAllocationProp prop);
  CUcontext ctx_;
  CUdevice device_;
  std::atomic<bool> detached_{false};
  std::mutex fence_mutex_;
  FenceId next_fence_ = 1;
  struct Fence {
    std::vector<CUevent> events;             // not yet seen complete
    std::vector<TombstoneRef> tombstones;    // destroyed streams' last work (shared, not recycled)
    int waiters = 0;  // threads in wait_fence: its events are not recycled meanwhile
  };
  std::unordered_map<FenceId, Fence> fences_;
  std::vector<CUevent> spare_events_;
  std::vector<TombstoneRef> tombstones_;  // not yet seen complete
  CUevent legacy_snapshot_ = nullptr;     // recorded before a blocking capture began
  CUevent probe_event_ = nullptr;         // never recorded: always complete
  // The vmm policy's granules: the handle mapped at each granule's address.
  std::mutex vmm_mutex_;
  std::unordered_map<std::uint64_t, CUmemGenericAllocationHandle> granule_handles_;
  std::unordered_map<std::uint64_t, std::size_t> vmm_ranges_;  // reserve_address's ranges, by address
  std::vector<CUdevice> peers_;  // devices granted access to this context's memory (grant_peer)
  bool vmm_released_ = false;    // release_virtual_memory ran: a map finishing later gives its handles back
  std::atomic<std::size_t> granularity_{0};  // 0: not asked yet
  bool vmm_unsupported_ = false;             // the driver has no VMM (under vmm_mutex_)...
  std::string no_vmm_reason_;                // ...and why (under vmm_mutex_)
  // Granules are asked for with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: set with the
  // granularity from the device's attribute, cleared for good if cuMemCreate refuses the type.
  std::atomic<bool> fd_handles_{false};
};

}  // namespace cupool::shim
