// Looking up the driver functions of driver_calls.def in the libcuda the process uses (driver() does it once).
#include "driver_calls.h"

#include <type_traits>

#include "hook_table.h"

namespace cupool::shim {

DriverCalls find_driver_calls() {
  DriverCalls c;
  auto get = [](auto& slot, const char* name) {
    slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(driver_function(name));
    return slot != nullptr;
  };
  bool ok = true;
#define CUPOOL_DRIVER_CALL(field, symbol) ok &= get(c.field, #symbol);
#define CUPOOL_OPTIONAL_DRIVER_CALL(field, symbol) get(c.field, #symbol);
#include "driver_calls.def"
  c.ok = ok;
  return c;
}

}  // namespace cupool::shim
