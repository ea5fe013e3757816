// The trace-file naming rule and its inverse (trace_file_name.h).
#include "trace_file_name.h"

namespace cupool {
namespace {

// Does `name` match `pattern`, in which %p stands for one or more digits and %% for '%'?
bool matches_pattern(std::string_view pattern, std::string_view name) {
  while (!pattern.empty()) {
    if (pattern.size() >= 2 && pattern[0] == '%' && pattern[1] == 'p') {
      std::size_t digits = 0;
      while (digits < name.size() && name[digits] >= '0' && name[digits] <= '9') ++digits;
      for (std::size_t k = digits; k >= 1; --k)
        if (matches_pattern(pattern.substr(2), name.substr(k))) return true;
      return false;
    }
    const std::size_t step = pattern.size() >= 2 && pattern[0] == '%' && pattern[1] == '%' ? 2 : 1;
    if (name.empty() || name[0] != pattern[0]) return false;
    pattern.remove_prefix(step);
    name.remove_prefix(1);
  }
  return name.empty();
}

}  // namespace

std::string expand_trace_path(const std::string& pattern, pid_t pid) {
  std::string out;
  out.reserve(pattern.size() + 8);
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size()) {
      if (pattern[i + 1] == 'p') {
        out += std::to_string(pid);
        ++i;
        continue;
      }
      if (pattern[i + 1] == '%') {
        out += '%';
        ++i;
        continue;
      }
    }
    out += pattern[i];
  }
  return out;
}

bool has_pid_placeholder(std::string_view pattern) {
  for (std::size_t i = 0; i + 1 < pattern.size(); ++i) {
    if (pattern[i] != '%') continue;
    if (pattern[i + 1] == 'p') return true;
    ++i;  // "%%" and others: skip the escaped character
  }
  return false;
}

std::string trace_path_for_process(const std::string& pattern, pid_t pid, bool child) {
  if (has_pid_placeholder(pattern)) return expand_trace_path(pattern, pid);
  return child ? expand_trace_path(pattern, pid) + "." + std::to_string(pid) : expand_trace_path(pattern, pid);
}

bool is_trace_file_name(std::string_view pattern, std::string_view name) {
  if (has_pid_placeholder(pattern)) return matches_pattern(pattern, name);
  const std::string root = expand_trace_path(std::string(pattern), 0);  // only %% to expand
  if (name == root) return true;
  return name.size() > root.size() + 1 && name.substr(0, root.size()) == root && name[root.size()] == '.' &&
         name.find_first_not_of("0123456789", root.size() + 1) == std::string_view::npos;
}

}  // namespace cupool
