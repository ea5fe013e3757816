// Configuration decoding: the configuration a trace's header records (written by config_json,
// config_json.h) back into a Config, for the reader's users.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>

#include "config.h"

namespace cupool {

// Nothing, with `why`, when a key is missing or malformed (a trace of another version).
std::optional<Config> decode_config(const nlohmann::json& config, std::string* why = nullptr);

}  // namespace cupool
