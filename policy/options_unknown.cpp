// The warning for a CUPOOL_* variable that no row of kOptions names (options.h), with the
// closest known name when one is a small misspelling away.
#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "options.h"

namespace cupool {

namespace {

// Levenshtein distance: insertions, deletions and substitutions of one character each.
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::vector<std::string> unknown_variables(char** environ) {
  std::vector<std::string> lines;
  if (environ == nullptr) return lines;
  std::string known;
  for (const OptionInfo& option : kOptions) {
    if (!known.empty()) known += ", ";
    known += option.name;
  }
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    if (entry.substr(0, 7) != "CUPOOL_") continue;
    const std::string_view name = entry.substr(0, entry.find('='));
    if (name == kTraceRootVariable || name == kLibraryVariable) continue;
    const auto it = std::find_if(kOptions.begin(), kOptions.end(), [&](const OptionInfo& o) { return o.name == name; });
    if (it != kOptions.end()) continue;
    std::string_view best;
    std::size_t best_distance = 4;  // suggest only close misspellings
    for (const OptionInfo& option : kOptions) {
      const std::size_t d = edit_distance(name, option.name);
      if (d < best_distance) {
        best_distance = d;
        best = option.name;
      }
    }
    std::string line = fmt::format("unknown variable {} ignored", name);
    if (!best.empty()) line += fmt::format(" (did you mean {}?)", best);
    line += "; known: " + known;
    lines.push_back(std::move(line));
  }
  return lines;
}

}  // namespace cupool
