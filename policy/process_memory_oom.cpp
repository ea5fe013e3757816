// ProcessMemory's words for a refusal (process_memory.h): the out-of-memory warning, its
// description of the pool's state, and the double-free warning.
#include "process_memory.h"

#include <string>

#include "log.h"
#include "units.h"

namespace cupool {

std::string ProcessMemory::describe_oom(const ContextMemory& c, const char* api, std::uint64_t size,
                                        OomClass oom) {
  const PoolStats s = c.pool->state();
  std::size_t free = 0, total = 0;
  c.pool->mem_info(&free, &total);
  std::string why;
  switch (oom) {
    case OomClass::limit:
      why = "limit: the cap of " + human_bytes(total) + " would be exceeded";
      break;
    case OomClass::fragmentation:
      why = "fragmentation: the pool holds " + human_bytes(s.reserved - s.in_use) +
            " free but its largest free block is " + human_bytes(s.largest_free);
      break;
    case OomClass::device:
      why = c.pool->may_grow() ? "device: the driver itself is out of memory"
                               : "device: the preallocated region is used up, and the preallocate policy does not "
                                 "grow (CUPOOL_PREALLOCATE_GROW)";
      break;
    case OomClass::share:
      why = "share: the shared budget has no room";
      break;
    default:
      why = "unclassified";
  }
  return std::string("out of memory on device ") + std::to_string(c.device) + ": " + api + " of " +
         human_bytes(size) + " refused (" + why + "); reserved " + human_bytes(s.reserved) + ", in use " +
         human_bytes(s.in_use) + ", " + std::to_string(s.free_blocks) + " free blocks";
}

void ProcessMemory::warn_device_oom(int device, const char* api, std::uint64_t size, OomClass oom,
                                    const DeviceAdmission& a) const {
  if (!warnings_) return;
  std::string message = std::string("out of memory on device ") + std::to_string(device) + ": " + api + " of " +
                        human_bytes(size) + " refused (";
  message += oom == OomClass::share && share_ ? "share: " + share_->refusal()
             : oom == OomClass::device ? "device: the device's " + human_bytes(a.cap()) + " would be exceeded"
                                       : "limit: the cap of " + human_bytes(a.cap()) + " would be exceeded";
  message += "); the process holds " + human_bytes(a.charged()) + " on the device (memory that names its device, "
             "made on a thread with no context there)";
  if (oom == OomClass::share && share_)
    message += "; budget \"" + share_->name() + "\" on device " + std::to_string(device) + " is held by " +
               share_->holders(device);
  log_warn(message);
}

void ProcessMemory::warn_double_free(const char* api) const {
  if (warnings_) log_warn(std::string(api) + " of a block that is already free (double free); the pool is unchanged");
}

void ProcessMemory::warn_oom(const ContextMemory& c, const char* api, std::uint64_t size, OomClass oom) const {
  if (!warnings_) return;
  std::string message = describe_oom(c, api, size, oom);
  // The budget says why it refused: no room, no free slot, or a device it does not count.
  if (const std::string generic = "the shared budget has no room"; oom == OomClass::share && share_)
    if (const std::size_t at = message.find(generic); at != std::string::npos)
      message.replace(at, generic.size(), share_->refusal());
  if (oom == OomClass::share && share_)
    message += "; budget \"" + share_->name() + "\" on device " + std::to_string(c.device) + " is held by " +
               share_->holders(c.device);
  log_warn(message);
}

}  // namespace cupool
