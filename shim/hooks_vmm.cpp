// Virtual-memory hooks of the driver: cuMemCreate (physical memory, counted against the cap),
// cuMemRelease, and the address-space and mapping calls, each translated into ProcessMemory's
// operation for it (policy/process_memory.h). Under growth and preallocate, whole mappings (one
// handle over one reservation of its size) are recycled by the VMM mapping cache (policy/
// vmm_cache.h, owned by ProcessMemory): a call it serves makes no driver call and its event says
// "recycled". Anything else goes to the driver.
#include <cstring>

#include "hook_table.h"
#include "hooks_internal.h"
#include "hooks_memory.h"
#include "vmm_cache.h"

namespace cupool::shim {
namespace impl {

using trace::EventKind;
using trace::Path;

namespace {

VmmCache* vmm_cache() { return memory().vmm_cache(); }

// Packs what must be equal for a mapping to be reused.
VmmProps pack_props(const CUmemAllocationProp& p) {
  VmmProps k;
  k.w[0] = static_cast<std::uint64_t>(p.type) | (static_cast<std::uint64_t>(p.requestedHandleTypes) << 32);
  k.w[1] = static_cast<std::uint64_t>(p.location.type) |
           (static_cast<std::uint64_t>(static_cast<std::uint32_t>(p.location.id)) << 32);
  static_assert(sizeof p.allocFlags <= sizeof k.w[2]);
  std::memcpy(&k.w[2], &p.allocFlags, sizeof p.allocFlags);
  k.w[3] = reinterpret_cast<std::uintptr_t>(p.win32HandleMetaData);
  return k;
}

VmmAccess pack_access(const CUmemAccessDesc* desc, size_t count) {
  VmmAccess a;
  if (desc == nullptr || count == 0 || count > VmmAccess::kMax) {
    a.count = VmmAccess::kMax + 1;  // never served from the cache
    return a;
  }
  a.count = static_cast<std::uint32_t>(count);
  for (size_t i = 0; i < count; ++i)
    a.w[i] = (static_cast<std::uint64_t>(desc[i].location.type) << 48) |
             (static_cast<std::uint64_t>(static_cast<std::uint16_t>(desc[i].location.id)) << 32) |
             static_cast<std::uint32_t>(desc[i].flags);
  return a;
}

}  // namespace

CUresult cuMemCreate(Path path, CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                     unsigned long long flags) {
  HookScope scope;
  auto real = CUPOOL_REAL(cuMemCreate);
  if (!scope.outermost() || handle == nullptr) return real ? real(handle, size, prop, flags) : CUDA_ERROR_NOT_INITIALIZED;
  initialize();
  constexpr const MemoryCall& call = memory_call(MemoryApi::cuMemCreate);
  HookEvent ev(EventKind::vmm_create, call.name, path);
  // The memory is on the device prop->location names, which need not be the calling thread's
  // context's, and the thread needs no context at all (issue 25): it is charged there. Host
  // memory (a host location) is recorded and charged nowhere.
  const bool on_device = prop && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE;
  const Placement where = on_device ? placed_on_device(prop->location.id) : Placement{};
  ContextMemory* cp = where.cp;
  VmmProps key;
  if (cp && flags == 0) key = pack_props(*prop);
  CUresult rc = CUDA_SUCCESS;
  bool recycled = false;
  const std::uint64_t h =
      memory().vmm_create(cp, size, cp && flags == 0 ? &key : nullptr, &recycled, [&]() -> std::uint64_t {
        std::uint64_t made = 0;
        rc = outside_allocate<DriverApi>(where, size, call.name, &made, [&] {
          CUresult r = real ? real(handle, size, prop, flags) : CUDA_ERROR_NOT_INITIALIZED;
          made = *handle;
          return r;
        });
        return rc == CUDA_SUCCESS ? made : 0;
      });
  if (recycled) {
    *handle = h;
    ev.recycled();
    ev.done(CUDA_SUCCESS, size, h, cp);
    return CUDA_SUCCESS;
  }
  ev.device(where.device);
  ev.done(rc, size, h, cp);
  return rc;
}

CUresult cuMemRelease(Path path, CUmemGenericAllocationHandle handle) {
  HookScope scope;
  auto real = CUPOOL_REAL(cuMemRelease);
  if (!scope.outermost()) return real ? real(handle) : CUDA_ERROR_NOT_INITIALIZED;
  initialize();
  HookEvent ev(EventKind::vmm_release, "cuMemRelease", path);
  CUresult rc = CUDA_SUCCESS;
  std::uint64_t bytes = 0;
  ContextMemory* owner = nullptr;
  int device = -1;
  const bool kept = memory().vmm_release(
      handle,
      [&] {
        rc = real ? real(handle) : CUDA_ERROR_NOT_INITIALIZED;
        return rc == CUDA_SUCCESS;
      },
      &bytes, &owner, &device);
  if (kept) {
    ev.recycled();  // kept, and still charged, until it is reused or given back
    ev.done(CUDA_SUCCESS, bytes, handle, driver_pool());
    return CUDA_SUCCESS;
  }
  ev.device(device);
  ev.done(rc, bytes, handle, owner);
  return rc;
}

namespace {
// An address-space or mapping call on `ptr`: one event; `run` (given the real call, as a driver
// step returning true on success) runs ProcessMemory's operation for it, which says whether the
// cache served it.
template <typename Call, typename Run>
CUresult vmm_range_call(Path path, EventKind kind, const char* api, CUdeviceptr ptr, size_t size, Call&& call,
                        Run&& run, const CUmemGenericAllocationHandle* mapped = nullptr, size_t offset = 0) {
  HookScope scope;
  if (!scope.outermost()) return call();
  initialize();
  HookEvent ev(kind, api, path);
  if (mapped) ev.mapped(*mapped, offset);  // cuMemMap: so that replay can run the mapping cache
  CUresult rc = CUDA_SUCCESS;
  if (run([&] {
        rc = call();
        return rc == CUDA_SUCCESS;
      }))
    ev.recycled();
  ev.done(rc, size, ptr, driver_pool());
  return rc;
}
}  // namespace

// Address-space and mapping calls: recorded; the cache may serve them.
CUresult cuMemMap(Path path, CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
  auto real = CUPOOL_REAL(cuMemMap);
  return vmm_range_call(
      path, EventKind::vmm_map, "cuMemMap", ptr, size,
      [&] { return real ? real(ptr, size, offset, handle, flags) : CUDA_ERROR_NOT_INITIALIZED; },
      [&](auto&& driver) { return memory().vmm_map(ptr, size, offset, handle, flags == 0, driver); }, &handle, offset);
}

CUresult cuMemUnmap(Path path, CUdeviceptr ptr, size_t size) {
  auto real = CUPOOL_REAL(cuMemUnmap);
  return vmm_range_call(
      path, EventKind::vmm_unmap, "cuMemUnmap", ptr, size,
      [&] { return real ? real(ptr, size) : CUDA_ERROR_NOT_INITIALIZED; },
      [&](auto&& driver) { return memory().vmm_unmap(ptr, size, driver); });
}

// Not an event of its own: the mapping's events say enough.
CUresult cuMemSetAccess(Path, CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  HookScope scope;
  auto real = CUPOOL_REAL(cuMemSetAccess);
  auto call = [&] { return real ? real(ptr, size, desc, count) : CUDA_ERROR_NOT_INITIALIZED; };
  if (!scope.outermost()) return call();
  initialize();
  VmmCache* cache = vmm_cache();
  if (cache == nullptr) return call();
  const VmmAccess access = pack_access(desc, count);
  if (cache->set_access(ptr, size, access) == VmmCache::Verdict::served) return CUDA_SUCCESS;
  CUresult rc = call();
  if (rc == CUDA_SUCCESS) cache->set_access_done(ptr, size, access);
  return rc;
}

CUresult cuMemAddressReserve(Path path, CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
  HookScope scope;
  auto real = CUPOOL_REAL(cuMemAddressReserve);
  auto call = [&] { return real ? real(ptr, size, alignment, addr, flags) : CUDA_ERROR_NOT_INITIALIZED; };
  if (!scope.outermost()) return call();
  initialize();
  HookEvent ev(EventKind::va_reserve, "cuMemAddressReserve", path);
  CUresult rc = CUDA_SUCCESS;
  bool recycled = false;
  const std::uint64_t out = memory().vmm_reserve(size, alignment, addr, flags == 0, ptr && addr == 0 && flags == 0,
                                                 &recycled, [&](std::uint64_t* va) {
                                                   rc = call();
                                                   if (rc != CUDA_SUCCESS || ptr == nullptr) return false;
                                                   *va = *ptr;
                                                   return true;
                                                 });
  if (recycled) {
    *ptr = out;
    ev.recycled();
  }
  ev.done(rc, size, out, driver_pool());
  return rc;
}

CUresult cuMemAddressFree(Path path, CUdeviceptr ptr, size_t size) {
  auto real = CUPOOL_REAL(cuMemAddressFree);
  return vmm_range_call(
      path, EventKind::va_free, "cuMemAddressFree", ptr, size,
      [&] { return real ? real(ptr, size) : CUDA_ERROR_NOT_INITIALIZED; },
      [&](auto&& driver) { return memory().vmm_address_free(ptr, size, driver); });
}

// A handle shared with another process lives on there: it must never be recycled here.
CUresult cuMemExportToShareableHandle(Path, void* shareableHandle, CUmemGenericAllocationHandle handle,
                                      CUmemAllocationHandleType handleType, unsigned long long flags) {
  HookScope scope;
  auto real = CUPOOL_REAL(cuMemExportToShareableHandle);
  if (scope.outermost()) {
    initialize();
    if (VmmCache* cache = vmm_cache()) cache->pin_handle(handle);
  }
  return real ? real(shareableHandle, handle, handleType, flags) : CUDA_ERROR_NOT_INITIALIZED;
}

// A retained handle is released once more by the program: its calls go to the driver from now on.
CUresult cuMemRetainAllocationHandle(Path, CUmemGenericAllocationHandle* handle, void* addr) {
  HookScope scope;
  auto real = CUPOOL_REAL(cuMemRetainAllocationHandle);
  if (scope.outermost()) {
    initialize();
    if (VmmCache* cache = vmm_cache()) cache->pin_address(reinterpret_cast<std::uintptr_t>(addr));
  }
  return real ? real(handle, addr) : CUDA_ERROR_NOT_INITIALIZED;
}

}  // namespace impl
}  // namespace cupool::shim
