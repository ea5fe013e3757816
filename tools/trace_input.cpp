#include "trace_input.h"

#include <sys/stat.h>

#include <algorithm>
#include <nlohmann/json.hpp>

namespace cupool::tools {

std::string TraceMeta::label() const {
  std::string out = "pid " + std::to_string(pid);
  for (std::size_t i = 0; i < cmdline.size() && i < 4; ++i) out += " " + cmdline[i];
  if (cmdline.size() > 4) out += " ...";
  return out;
}

std::uint64_t TraceMeta::cap(int device, std::uint64_t device_total) const {
  auto resolve = [&](const nlohmann::json& spec) -> std::optional<std::uint64_t> {
    if (spec.is_number_unsigned() || spec.is_number_integer()) return spec.get<std::uint64_t>();
    if (spec.is_object() && spec.contains("bytes") && spec["bytes"].is_number_unsigned())
      return spec["bytes"].get<std::uint64_t>();
    if (spec.is_object() && spec.contains("percent") && spec["percent"].is_number())
      return static_cast<std::uint64_t>(static_cast<double>(device_total) * spec["percent"].get<double>() / 100.0);
    return std::nullopt;
  };
  const auto limit = nlohmann::json::parse(limit_json.empty() ? "null" : limit_json, nullptr, false);
  std::optional<std::uint64_t> cap;
  if (limit.is_object()) {
    if (auto d = limit.find("devices"); d != limit.end() && d->is_object()) {
      if (auto s = d->find(std::to_string(device)); s != d->end()) cap = resolve(*s);
    }
    if (!cap) {
      if (auto a = limit.find("all"); a != limit.end()) cap = resolve(*a);
    }
  }
  if (cap && device_total) return std::min(*cap, device_total);
  return cap ? *cap : device_total;
}

TraceInput::TraceInput(const std::string& path) {
  meta_.path = valid_utf8(path);
  reader_ = TraceReader::open(path);
  struct stat st{};
  if (path != "-" && ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) size_ = static_cast<std::uint64_t>(st.st_size);
  const auto& h = reader_->header();
  meta_.pid = h.pid;
  meta_.cmdline = h.cmdline;
  const nlohmann::json& config = h.config;
  if (config.is_object()) {
    meta_.policy = config.value("policy", "");
    meta_.free_mode = config.value("free", "");
    if (auto l = config.find("limit"); l != config.end()) meta_.limit_json = l->dump();
  }
}

TraceInput::~TraceInput() = default;

bool TraceInput::next(Event& e) {
  if (!truncated_.empty()) return false;
  try {
    return reader_->next(e);
  } catch (const TraceError& err) {
    // The reader's words for a cut last line (policy/trace_reader.cpp): what a killed process leaves.
    if (std::string_view(err.what()).find("the last line is cut short") == std::string_view::npos) throw;
    truncated_ = err.what();
    return false;
  }
}

std::vector<DeviceInfo> TraceInput::devices() const {
  return reader_->devices();
}

std::uint64_t TraceInput::dropped() const { return reader_->dropped(); }

bool TraceInput::has_footer() const { return reader_->footer().has_value(); }

std::uint64_t TraceInput::bytes_read() { return size_ ? std::min(reader_->bytes_read(), size_) : 0; }

}  // namespace cupool::tools
