// One trace file opened for reading (trace_input.h): the streaming reader and its header.
#include "trace_input.h"

#include <sys/stat.h>

#include <algorithm>

#include "options.h"

namespace cupool::tools {

std::string TraceMeta::label() const {
  std::string out = "pid " + std::to_string(pid);
  for (std::size_t i = 0; i < cmdline.size() && i < 4; ++i) out += " " + cmdline[i];
  if (cmdline.size() > 4) out += " ...";
  return out;
}

std::uint64_t TraceMeta::cap(int device, std::uint64_t device_total) const {
  const std::optional<SizeSpec> limit = config ? config->limit.for_device(device) : std::nullopt;
  if (!limit) return device_total;
  const std::uint64_t cap = limit->resolve(device_total);
  return device_total ? std::min(cap, device_total) : cap;
}

TraceInput::TraceInput(const std::string& path) {
  meta_.path = valid_utf8(path);
  reader_ = TraceReader::open(path);
  struct stat st{};
  if (path != "-" && ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) size_ = static_cast<std::uint64_t>(st.st_size);
  const auto& h = reader_->header();
  meta_.pid = h.pid;
  meta_.cmdline = h.cmdline;
  meta_.format_major = h.major;
  meta_.format_minor = h.minor;
  meta_.start_unix_ns = h.start_unix_ns;
  meta_.start_mono_ns = h.start_mono_ns;
  meta_.config = decode_config(h.config, &meta_.config_error);
  if (const auto trace = h.config.find("trace"); trace != h.config.end() && trace->is_string())
    meta_.trace_pattern = trace->get<std::string>();
  if (meta_.config) {
    meta_.policy = policy_name(meta_.config->policy);
    meta_.free_mode = free_mode_name(meta_.config->free_mode);
  }
}

TraceInput::~TraceInput() = default;

bool TraceInput::next(Event& e) {
  if (!truncated_.empty()) return false;
  try {
    return reader_->next(e);
  } catch (const TraceCutShort& err) {  // what a killed process leaves: the trace ends there
    truncated_ = err.what();
    return false;
  }
}

std::vector<DeviceInfo> TraceInput::devices() const {
  return reader_->devices();
}

std::uint64_t TraceInput::dropped() const { return reader_->dropped(); }

bool TraceInput::has_footer() const { return reader_->footer().has_value(); }

std::optional<std::uint64_t> TraceInput::end_mono_ns() const {
  const auto& footer = reader_->footer();
  if (!footer || footer->end_mono_ns == 0) return std::nullopt;
  return footer->end_mono_ns;
}

std::uint64_t TraceInput::bytes_read() { return size_ ? std::min(reader_->bytes_read(), size_) : 0; }

}  // namespace cupool::tools
