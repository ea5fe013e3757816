// NVML's memory queries (nvmlDeviceGetMemoryInfo, _v2) inside the process: once the process is
// governed, they give what cudaMemGetInfo gives on the same device (the cap, the shared budget and
// the device, whichever allows least), so that a tool asking NVML (pynvml, a framework's monitor)
// sees the same memory as one asking CUDA. NVML numbers devices in its own order and ignores
// CUDA_VISIBLE_DEVICES, so its device is matched to a CUDA device by UUID, never by index.
#include <cstddef>
#include <cstring>
#include <type_traits>

#include "driver_calls.h"
#include "hook_table.h"
#include "hooks_internal.h"
#include "hooks_memory.h"

namespace cupool::shim {
namespace {

using trace::EventKind;
using trace::Path;

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The 16 bytes of an NVML UUID ("GPU-" or "MIG-", then 8-4-4-4-12 hex digits). False for any
// other form (the pre-R470 "MIG-GPU-.../gi/ci" one): such a device is matched to nothing.
bool parse_uuid(const char* text, unsigned char out[16]) {
  const char* dash = std::strchr(text, '-');
  if (dash == nullptr) return false;
  int n = 0, high = -1;
  for (const char* p = dash + 1; *p; ++p) {
    if (*p == '-') continue;
    const int v = hex_digit(*p);
    if (v < 0) return false;
    if (high < 0) {
      high = v;
      continue;
    }
    if (n == 16) return false;
    out[n++] = static_cast<unsigned char>(high << 4 | v);
    high = -1;
  }
  return n == 16 && high < 0;
}

// The CUDA device NVML's `device` is, or -1. `via`: the hook being served (its real function's
// library is the NVML the process loaded).
int cuda_device_of(nvmlDevice_t device, HookId via) {
  using NvmlGetUuid = decltype(&::nvmlDeviceGetUUID);
  auto nvml_uuid = reinterpret_cast<NvmlGetUuid>(nvml_function("nvmlDeviceGetUUID", via));
  char text[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
  unsigned char want[16];
  if (nvml_uuid == nullptr || nvml_uuid(device, text, sizeof text) != NVML_SUCCESS || !parse_uuid(text, want))
    return -1;
  // The driver calls that name devices, real ones (cupool hooks none of them); a MIG instance's
  // own UUID (cuDeviceGetUuid_v2) where the driver has it, as NVML gives.
  const DriverCalls& calls = driver();
  const auto get_uuid = calls.device_get_uuid_v2 ? calls.device_get_uuid_v2 : calls.device_get_uuid;
  int count = 0;
  if (!calls.device_get_count || !calls.device_get || !get_uuid || calls.device_get_count(&count) != CUDA_SUCCESS)
    return -1;
  for (int i = 0; i < count; ++i) {
    CUdevice d = 0;
    CUuuid uuid;
    if (calls.device_get(&d, i) == CUDA_SUCCESS && get_uuid(&uuid, d) == CUDA_SUCCESS &&
        std::memcmp(uuid.bytes, want, sizeof want) == 0)
      return d;
  }
  return -1;
}

// The pool whose memory info answers for `device`: the calling thread's current context if it is
// on that device (what cudaMemGetInfo on this thread would answer), else the device's primary
// context (the runtime's), else any context on it. nullptr if the process has none there.
ContextMemory* pool_on_device(int device) {
  CUcontext ctx = nullptr;
  if (driver().ok && driver().ctx_get_current(&ctx) == CUDA_SUCCESS)
    if (ContextMemory* cp = existing_pool(ctx); cp && cp->device == device) return cp;
  ContextMemory* found = nullptr;
  memory().for_each([&](ContextMemory& cp) {
    if (cp.device == device && (found == nullptr || (cp.ctx == cp.primary && found->ctx != found->primary)))
      found = &cp;
  });
  return found;
}

// NVML's answer first: its refusals (not initialised, a bad handle, a wrong struct version) stand
// unchanged. Then, when cupool governs the device's memory, total, free and used are cupool's
// (used = total - free; v2: nothing reserved). A process that has not reached CUDA has no pools:
// NVML's answer stands, and nothing is recorded.
template <typename Memory>
nvmlReturn_t memory_info_hook(Path path, const char* api, HookId id, nvmlDevice_t device, Memory* out) {
  auto real = reinterpret_cast<nvmlReturn_t (*)(nvmlDevice_t, Memory*)>(real_function(id));
  if (real == nullptr) return NVML_ERROR_LIBRARY_NOT_FOUND;
  HookScope scope;
  if (!scope.outermost() || !reached_cuda()) return real(device, out);
  HookEvent ev(EventKind::mem_info, api, path);
  const nvmlReturn_t rc = real(device, out);
  ContextMemory* cp = nullptr;
  int cuda_device = -1;
  if (rc == NVML_SUCCESS) {
    const int d = cuda_device = cuda_device_of(device, id);
    if (d >= 0) cp = pool_on_device(d);
    std::size_t free = 0, total = 0;
    // No context of the process on the device: memory that names the device alone may be held
    // there (cuMemCreate from a thread with no context), under the same cap.
    const bool governed = cp ? memory().mem_info(cp, &free, &total)
                             : d >= 0 && memory().mem_info_device(d, device_total_memory(d), out->free, &free, &total);
    if (governed) {
      out->total = total;
      out->free = free;
      out->used = total - free;  // mem_info never answers free > total
      if constexpr (std::is_same_v<Memory, nvmlMemory_v2_t>) out->reserved = 0;
    }
  }
  if (cp == nullptr && cuda_device >= 0) ev.device(cuda_device);
  ev.done(rc, rc == NVML_SUCCESS ? out->free : 0, 0, cp);
  return rc;
}

}  // namespace

namespace impl {

nvmlReturn_t nvmlDeviceGetMemoryInfo(Path path, nvmlDevice_t device, nvmlMemory_t* memory) {
  return memory_info_hook(path, "nvmlDeviceGetMemoryInfo", HookId::nvmlDeviceGetMemoryInfo, device, memory);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(Path path, nvmlDevice_t device, nvmlMemory_v2_t* memory) {
  return memory_info_hook(path, "nvmlDeviceGetMemoryInfo_v2", HookId::nvmlDeviceGetMemoryInfo_v2, device, memory);
}

}  // namespace impl
}  // namespace cupool::shim
