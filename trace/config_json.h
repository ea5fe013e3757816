// The configuration as the trace header records it: written here as JSON text (linked into
// libcupool.so, so no nlohmann), decoded back by decode_config (config_decode.h).
#pragma once

#include <string>

#include "config.h"

namespace cupool {

// The effective configuration as a JSON object (text), for the trace header. Sizes are bytes;
// a percent is {"percent":50}; durations are nanoseconds; "never"/"none" are null.
// The trace reader decodes it (decode_config, config_decode.h); a unit test round-trips it.
std::string config_json(const Config& config);

}  // namespace cupool
