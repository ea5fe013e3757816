// What `cupool top` and `cupool metrics` show: every shared budget on the node (policy/
// shared_budget.h), read from its segment without joining it, and the three ways of showing it
// (text for a terminal, JSON, the Prometheus text exposition format). docs/cli.md describes them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config.h"
#include "shared_budget.h"

namespace cupool::tools {

// One device of a budget.
struct ShareDevice {
  int device = 0;
  std::optional<SizeSpec> budget;              // the limit on this device, as the budget gives it
  std::optional<std::uint64_t> budget_bytes;   // none for a percent: the device's total is not known here
  std::uint64_t held = 0;                      // every member's claims, those of members gone included
  std::uint64_t held_by_gone = 0;              // of which members gone whose slots are not yet emptied
};

// One budget, as read at one moment.
struct ShareBudgetView {
  std::string name;     // CUPOOL_SHARE
  std::string owner;    // "1000" (a user's budget) or "g100" (a group's): from the segment's name
  std::string segment;  // the segment's path
  std::string limit;    // CUPOOL_SHARE_LIMIT as the budget holds it ("" when it has none)
  std::vector<SharedBudget::Member> members;  // the live ones, by pid (issue 26: gone ones drop out)
  std::size_t gone = 0;                       // members gone whose slots the next admission empties
  std::vector<ShareDevice> devices;           // used by a member or named by the limit, by index
};

struct ShareScan {
  std::vector<ShareBudgetView> budgets;  // by segment path
  std::vector<std::string> skipped;      // "PATH: why", per segment that could not be read
};

// Every budget whose segment is in `dir` (files named cupool-share-*). False, with *error,
// when `dir` itself cannot be read.
bool scan_shares(const std::string& dir, ShareScan& out, std::string* error);

// Does the member have anything on `device` (held, in use, reserved or waiting)?
bool member_uses(const SharedBudget::Member& m, int device);

// The text view. `header` is its first line; `skipped_lines`: the unreadable segments at the
// end (a live view, where stderr would be drawn over).
std::string top_text(const ShareScan& scan, const std::string& header, bool skipped_lines);
// {"format":"cupool-top","version":1,"budgets":[...]} (docs/cli.md).
nlohmann::json top_json(const ShareScan& scan);
// The Prometheus text exposition format, version 0.0.4.
std::string metrics_text(const ShareScan& scan);

// Text from a segment (a command name) made safe: invalid UTF-8 becomes U+FFFD and, when
// `printable`, control characters become '?' (a command named with escape sequences must not
// drive the terminal of whoever runs top).
std::string clean_text(std::string_view s, bool printable);

}  // namespace cupool::tools
