// Contexts and threads the way multi-GPU runtimes and driver-API tools use them, not the way a
// single-threaded test does (issue 25):
//  - two contexts made with cuCtxCreate on one device (not the primary one), pushed and popped
//    across threads: a buffer allocated in a context by one thread is written by a second, which
//    pushes the same context, and freed by a third;
//  - threads with no current context: cuMemCreate (the device is named in prop.location), mapped
//    and read back through a context; cuMemAllocAsync on a stream of a context; and the calls
//    that need a context (cuMemAlloc, cuMemGetInfo) answering the driver's own error code;
//  - cuCtxSetCurrent switching one thread between the two contexts.
// Every buffer is checked on the host. The error codes go to stdout: they must be the driver's.
#include <cuda.h>

#include <atomic>
#include <thread>
#include <vector>

#include "common.h"

#define DRV(call)                                                                              \
  do {                                                                                         \
    CUresult r_ = (call);                                                                      \
    if (r_ != CUDA_SUCCESS) compat::die("%s returned %d (%s:%d)", #call, r_, __FILE__, __LINE__); \
  } while (0)

namespace {

bool filled(CUdeviceptr p, std::size_t bytes, unsigned char value) {
  std::vector<unsigned char> host(bytes);
  DRV(cuMemcpyDtoH(host.data(), p, bytes));
  for (unsigned char c : host)
    if (c != value) return false;
  return true;
}

}  // namespace

int main() {
  compat::Verdict v("contexts_threads");
  std::atomic<int> bad{0};
  DRV(cuInit(0));
  CUdevice dev;
  DRV(cuDeviceGet(&dev, 0));
  CUcontext a = nullptr, b = nullptr;
  DRV(cuCtxCreate(&a, nullptr, 0, dev));
  DRV(cuCtxCreate(&b, nullptr, 0, dev));  // b current on this thread now, a below it
  const std::size_t bytes = 64ull << 20;

  // A buffer of context a crosses three threads.
  CUdeviceptr shared = 0;
  std::thread([&] {
    DRV(cuCtxPushCurrent(a));
    DRV(cuMemAlloc(&shared, bytes));
    CUcontext out;
    DRV(cuCtxPopCurrent(&out));
  }).join();
  std::thread([&] {
    DRV(cuCtxPushCurrent(a));
    DRV(cuMemsetD8(shared, 0x42, bytes));
    DRV(cuCtxSynchronize());
    if (!filled(shared, bytes, 0x42)) ++bad;
    CUcontext out;
    DRV(cuCtxPopCurrent(&out));
  }).join();
  std::thread([&] {
    DRV(cuCtxSetCurrent(a));
    DRV(cuMemFree(shared));
  }).join();

  // Buffers in both contexts, one thread switching between them.
  CUdeviceptr in_a = 0, in_b = 0;
  DRV(cuCtxSetCurrent(a));
  DRV(cuMemAlloc(&in_a, bytes));
  DRV(cuMemsetD8(in_a, 0x0a, bytes));
  DRV(cuCtxSetCurrent(b));
  DRV(cuMemAlloc(&in_b, bytes));
  DRV(cuMemsetD8(in_b, 0x0b, bytes));
  DRV(cuCtxSynchronize());
  if (!filled(in_b, bytes, 0x0b)) ++bad;
  DRV(cuCtxSetCurrent(a));
  if (!filled(in_a, bytes, 0x0a)) ++bad;

  // Threads with no current context.
  CUstream stream;
  DRV(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  std::vector<CUmemGenericAllocationHandle> handles(4);
  std::vector<CUresult> no_ctx_alloc(4), no_ctx_info(4), no_ctx_async(4);
  std::vector<std::thread> threads;
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  std::size_t granularity = 0;
  DRV(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  const std::size_t piece = ((32ull << 20) + granularity - 1) / granularity * granularity;
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&, i] {
      CUcontext none = nullptr;
      DRV(cuCtxGetCurrent(&none));
      if (none != nullptr) compat::die("a new thread has a current context");
      DRV(cuMemCreate(&handles[i], piece, &prop, 0));
      CUdeviceptr p = 0;
      no_ctx_alloc[i] = cuMemAlloc(&p, 4096);
      std::size_t f = 0, t = 0;
      no_ctx_info[i] = cuMemGetInfo(&f, &t);
      // The stream names its context: what the driver answers here without a current context,
      // the program must get under cupool too (printed below).
      CUdeviceptr async = 0;
      no_ctx_async[i] = cuMemAllocAsync(&async, bytes, stream);
      if (no_ctx_async[i] != CUDA_SUCCESS) return;
      DRV(cuMemsetD8Async(async, static_cast<unsigned char>(0x30 + i), bytes, stream));
      std::vector<unsigned char> host(bytes);
      DRV(cuMemcpyDtoHAsync(host.data(), async, bytes, stream));
      DRV(cuStreamSynchronize(stream));
      for (unsigned char c : host)
        if (c != 0x30 + i) {
          ++bad;
          break;
        }
      DRV(cuMemFreeAsync(async, stream));
      DRV(cuStreamSynchronize(stream));
    });
  for (auto& t : threads) t.join();
  // The handles made without a context, mapped in context a and read back.
  CUdeviceptr va = 0;
  DRV(cuMemAddressReserve(&va, piece * 4, 0, 0, 0));
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  for (int i = 0; i < 4; ++i) DRV(cuMemMap(va + i * piece, piece, 0, handles[i], 0));
  DRV(cuMemSetAccess(va, piece * 4, &access, 1));
  DRV(cuMemsetD8(va, 0x77, piece * 4));
  DRV(cuCtxSynchronize());
  if (!filled(va, piece * 4, 0x77)) ++bad;
  DRV(cuMemUnmap(va, piece * 4));
  DRV(cuMemAddressFree(va, piece * 4));
  for (auto h : handles) DRV(cuMemRelease(h));
  for (int i = 0; i < 4; ++i)
    std::printf("thread %d without a context: cuMemAlloc %d, cuMemGetInfo %d, cuMemAllocAsync %d\n", i, no_ctx_alloc[i],
                no_ctx_info[i], no_ctx_async[i]);

  DRV(cuMemFree(in_a));
  DRV(cuCtxSetCurrent(b));
  DRV(cuMemFree(in_b));
  DRV(cuStreamDestroy(stream));
  DRV(cuCtxDestroy(b));
  DRV(cuCtxDestroy(a));
  std::printf("buffers checked: %d bad\n", bad.load());
  return v.finish(bad == 0);
}
