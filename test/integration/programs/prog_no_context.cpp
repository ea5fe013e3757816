// Calls that name their device or pool themselves, made from threads with no current context or
// with a context on another device, as monitoring agents, XLA's allocator threads and multi-GPU
// runtimes make them. Under cupool at 51ba0d9, four such threads each created 64 MiB with
// cuMemCreate under CUPOOL_LIMIT=48MiB and nothing was charged (issue 25). Every such call must be
// charged to the device it names: the cap, the shared budget and memory info see it.
//  1. four threads with no context (the process has none yet) each cuMemCreate 64 MiB on device 0;
//  2. a context made with cuCtxCreate: cuMemGetInfo counts what step 1 holds;
//  3. a thread with no context allocates 32 MiB on a stream of that context (cuMemAllocAsync);
//  4. two contexts of device 0 (cuCtxCreate twice) allocate 32 MiB each: one cap for both;
//  5. with two devices: a memory pool made on device 1, used from a stream of device 0's context,
//     is charged to device 1.
// PROG_CAP_MIB=<MiB>: the cap (or shared budget) the run sets on device 0, which decides what
// must be refused; unset: nothing is. PROG_CAP1_MIB likewise for device 1. Refusals must be
// CUDA_ERROR_OUT_OF_MEMORY, what the driver answers when memory is short.
#include <cuda.h>

#include <cstdlib>
#include <thread>
#include <vector>

#include "prog_common.hpp"

namespace {

constexpr std::uint64_t kMiB = 1ull << 20;

std::uint64_t cap_mib(const char* var) {
  const char* v = std::getenv(var);
  return v ? std::strtoull(v, nullptr, 10) : ~std::uint64_t{0} / kMiB;
}

// Expects success when `fits`, else the driver's out-of-memory code.
void expect(CUresult rc, bool fits, const char* what, int line) {
  if (fits ? rc != CUDA_SUCCESS : rc != CUDA_ERROR_OUT_OF_MEMORY) prog::fail(__FILE__, line, what, rc);
}

CUmemAllocationProp device_prop(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

}  // namespace

int main() {
  const std::uint64_t cap = cap_mib("PROG_CAP_MIB");
  long long allocs = 0, frees = 0, bytes = 0, vmm_creates = 0, vmm_releases = 0, vmm_bytes = 0;
  DRV(cuInit(0));
  CUdevice dev = 0;
  DRV(cuDeviceGet(&dev, 0));

  // 1. Four threads, no context in the process.
  constexpr int kThreads = 4;
  const std::uint64_t piece = 64 * kMiB;
  std::vector<CUmemGenericAllocationHandle> handles(kThreads, 0);
  std::vector<CUresult> rcs(kThreads, CUDA_SUCCESS);
  {
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i)
      threads.emplace_back([&, i] {
        CUcontext none = reinterpret_cast<CUcontext>(1);
        cuCtxGetCurrent(&none);
        if (none != nullptr) prog::fail(__FILE__, __LINE__, "a new thread has a current context", 0);
        const CUmemAllocationProp prop = device_prop(0);
        rcs[i] = cuMemCreate(&handles[i], piece, &prop, 0);
      });
    for (auto& t : threads) t.join();
  }
  int created = 0;
  for (int i = 0; i < kThreads; ++i) {
    if (rcs[i] == CUDA_SUCCESS) ++created;
    else if (rcs[i] != CUDA_ERROR_OUT_OF_MEMORY) prog::fail(__FILE__, __LINE__, "cuMemCreate", rcs[i]);
  }
  const int may_create = static_cast<int>(std::min<std::uint64_t>(kThreads, cap / 64));
  if (created != may_create) prog::fail(__FILE__, __LINE__, "cuMemCreate without a context: wrong number created", created);
  vmm_creates += created;
  vmm_bytes += created * static_cast<long long>(piece);
  const std::uint64_t held = created * piece;

  // 2. Memory info from a context of the device counts it.
  CUcontext a = nullptr;
  DRV(cuCtxCreate(&a, nullptr, 0, dev));
  std::size_t free = 0, total = 0;
  DRV(cuMemGetInfo(&free, &total));
  if (std::getenv("PROG_CAP_MIB")) {
    EXPECT(total == cap * kMiB || total > cap * kMiB);  // the cap, or (a shared budget) the device
    EXPECT(free + held <= cap * kMiB);
  }

  // 3. A thread with no context allocates on a stream of context a.
  CUstream stream = nullptr;
  DRV(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  {
    std::thread t([&] {
      CUdeviceptr p = 0;
      const CUresult rc = cuMemAllocAsync(&p, 32 * kMiB, stream);
      expect(rc, held + 32 * kMiB <= cap * kMiB, "cuMemAllocAsync from a thread without a context", __LINE__);
      if (rc == CUDA_SUCCESS) {
        ++allocs;
        bytes += 32 * kMiB;
        DRV(cuMemsetD8Async(p, 0x3c, 32 * kMiB, stream));
        DRV(cuMemFreeAsync(p, stream));
        ++frees;
        DRV(cuStreamSynchronize(stream));
      }
    });
    t.join();
  }
  for (int i = 0; i < kThreads; ++i)
    if (rcs[i] == CUDA_SUCCESS) {
      DRV(cuMemRelease(handles[i]));
      ++vmm_releases;
    }

  // 4. Two contexts of one device share its cap.
  CUcontext b = nullptr;
  DRV(cuCtxCreate(&b, nullptr, 0, dev));  // b is now current
  CUdeviceptr in_b = 0, in_a = 0;
  DRV(cuMemAlloc(&in_b, 32 * kMiB));
  ++allocs;
  bytes += 32 * kMiB;
  DRV(cuCtxPushCurrent(a));
  const CUresult rc_a = cuMemAlloc(&in_a, 32 * kMiB);
  expect(rc_a, 64 * kMiB <= cap * kMiB, "cuMemAlloc in a second context of the device", __LINE__);
  if (rc_a == CUDA_SUCCESS) {
    ++allocs;
    bytes += 32 * kMiB;
    DRV(cuMemFree(in_a));
    ++frees;
  }
  CUcontext popped = nullptr;
  DRV(cuCtxPopCurrent(&popped));
  DRV(cuMemFree(in_b));
  ++frees;

  // 5. A pool on device 1 used from a stream of device 0.
  int count = 0;
  DRV(cuDeviceGetCount(&count));
  if (count > 1) {
    const std::uint64_t cap1 = cap_mib("PROG_CAP1_MIB");
    DRV(cuCtxSetCurrent(a));
    CUmemPoolProps props{};
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 1;
    CUmemoryPool pool = nullptr;
    DRV(cuMemPoolCreate(&pool, &props));
    CUdeviceptr p = 0;
    const CUresult rc = cuMemAllocFromPoolAsync(&p, 32 * kMiB, pool, stream);
    expect(rc, 32 <= cap1, "cuMemAllocFromPoolAsync from a pool of device 1", __LINE__);
    if (rc == CUDA_SUCCESS) {
      ++allocs;
      bytes += 32 * kMiB;
      DRV(cuMemFreeAsync(p, stream));
      ++frees;
    }
    DRV(cuStreamSynchronize(stream));
    DRV(cuMemPoolDestroy(pool));
  }
  DRV(cuStreamDestroy(stream));
  DRV(cuCtxDestroy(b));
  DRV(cuCtxDestroy(a));
  return prog::finish(prog::Json()
                          .num("allocs", allocs)
                          .num("frees", frees)
                          .num("bytes", bytes)
                          .num("vmm_creates", vmm_creates)
                          .num("vmm_releases", vmm_releases)
                          .num("vmm_bytes", vmm_bytes));
}
