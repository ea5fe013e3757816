// `cupool report` output: text, JSON and the HTML page, all from one Analysis.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "analysis.h"

namespace cupool::tools {

std::string report_text(const Analysis& a);
nlohmann::json report_json(const Analysis& a);
std::string report_html(const Analysis& a);  // html.cpp

// Plain aligned columns for text output. `align`: one letter per column, 'l' or 'r' (default:
// the first column left, the others right).
class Table {
 public:
  explicit Table(std::string align = "") : align_(std::move(align)) {}
  void row(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }
  std::string render(const std::string& indent) const;
  bool empty() const { return rows_.empty(); }
  std::size_t rows() const { return rows_.size(); }

 private:
  std::string align_;
  std::vector<std::vector<std::string>> rows_;
};

// "3.250 s" since time zero.
std::string at_time(std::uint64_t t, std::uint64_t origin);
std::string device_title(const DeviceInfo& info, int device);
std::string pool_state_text(const trace::PoolState& p);
nlohmann::json pool_state_json(const trace::PoolState& p);
nlohmann::json oom_json(const OomInfo& o, std::uint64_t origin);
std::string oom_text(const OomInfo& o, std::uint64_t origin);  // one line, no indent

}  // namespace cupool::tools
