// The one table of the allocation APIs cupool knows, and what each does to the process: served by
// a pool (when the policy pools), or made by the driver outside the pools, on the device or not.
// The shim's hooks name their API by its entry here (a compile-time index); `cupool replay` looks a
// recorded event's API up here by name. Adding an allocation API: shim/hooks.def, its hook, and
// one line below (test/unit/test_memory_calls.cpp checks the table against hooks.def and replay).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace cupool {

// Where an allocation API's memory comes from.
enum class Serve : std::uint8_t {
  pool,     // a pool of the context, when the policy pools; else the driver, outside the pools
  device,   // the driver, outside the pools: charged against the cap, and device memory
  managed,  // the driver, outside the pools: charged, but not device memory until it is touched
  mapping,  // physical memory for mappings (outside, on the device): the VMM cache may keep it
};

// X(api, serve): one line per API, by the name the trace records. Every name is a hook of
// shim/hooks.def, or the base name of one (cuGetProcAddress's, which older traces recorded).
#define CUPOOL_MEMORY_CALLS(X)       \
  X(cudaMalloc, pool)                \
  X(cudaMallocPitch, pool)           \
  X(cuMemAlloc_v2, pool)             \
  X(cuMemAllocPitch_v2, pool)        \
  X(cuMemAlloc, pool)                \
  X(cuMemAllocPitch, pool)           \
  X(cudaMallocManaged, managed)      \
  X(cuMemAllocManaged, managed)      \
  X(cudaMallocAsync, device)         \
  X(cudaMallocAsync_ptsz, device)    \
  X(cuMemAllocAsync, device)         \
  X(cuMemAllocAsync_ptsz, device)    \
  X(cuMemAllocFromPoolAsync, device) \
  X(cuMemAllocFromPoolAsync_ptsz, device) \
  X(cuArrayCreate_v2, device)        \
  X(cuArray3DCreate_v2, device)      \
  X(cuMipmappedArrayCreate, device)  \
  X(cuMemCreate, mapping)

enum class MemoryApi : std::uint8_t {
#define CUPOOL_MEMORY_CALL_ENUM(api, serve) api,
  CUPOOL_MEMORY_CALLS(CUPOOL_MEMORY_CALL_ENUM)
#undef CUPOOL_MEMORY_CALL_ENUM
};

struct MemoryCall {
  const char* name;  // static, as the trace records it
  Serve serve;
  // Takes device memory when it is made (managed memory does not).
  constexpr bool on_device() const { return serve != Serve::managed; }
};

inline constexpr MemoryCall kMemoryCalls[] = {
#define CUPOOL_MEMORY_CALL_ROW(api, serve) MemoryCall{#api, Serve::serve},
    CUPOOL_MEMORY_CALLS(CUPOOL_MEMORY_CALL_ROW)
#undef CUPOOL_MEMORY_CALL_ROW
};
inline constexpr std::size_t kMemoryCallCount = sizeof kMemoryCalls / sizeof kMemoryCalls[0];

constexpr const MemoryCall& memory_call(MemoryApi api) { return kMemoryCalls[static_cast<std::size_t>(api)]; }

// The entry of a recorded API name; nullptr for a name the table does not know (a trace written
// by another tool): replay takes such memory as the driver's, on the device.
constexpr const MemoryCall* find_memory_call(std::string_view name) {
  for (const MemoryCall& c : kMemoryCalls)
    if (name == c.name) return &c;
  return nullptr;
}

}  // namespace cupool
