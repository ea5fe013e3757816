// DriverCalls: the driver functions cupool calls itself but does not hook, one field per entry of
// driver_calls.def, found once (driver()).
#pragma once

#include "cuda_api.h"

namespace cupool::shim {

struct DriverCalls {
#define CUPOOL_DRIVER_CALL(field, symbol) decltype(&::symbol) field = nullptr;
#define CUPOOL_OPTIONAL_DRIVER_CALL(field, symbol) decltype(&::symbol) field = nullptr;
#include "driver_calls.def"
  bool ok = false;  // every CUPOOL_DRIVER_CALL was found (the optional ones may be nullptr)
};
// Looks every function up (driver_calls.cpp); driver() does it once.
DriverCalls find_driver_calls();
inline const DriverCalls& driver() {
  static const DriverCalls calls = find_driver_calls();
  return calls;
}

}  // namespace cupool::shim
