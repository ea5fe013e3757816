// A member of a shared budget for test/tools/check_share.py: the real SharedBudget, as the shim
// drives it, with figures the test chooses, so that `cupool top` and `cupool metrics` can be
// checked to the byte.
//
//   share_member NAME LIMIT [--comm NAME] [--admit DEV:TOTAL:BYTES:IN_USE:RESERVED]... [--refuse DEV:TOTAL:BYTES]...
//       joins budget NAME (CUPOOL_SHARE_LIMIT=LIMIT), takes BYTES on device DEV (whose memory is
//       TOTAL) and publishes IN_USE and RESERVED there, asks for BYTES that must not fit and counts
//       the refusal as an out-of-memory, prints "ready" and sleeps until killed. --comm renames
//       the process first (its slot keeps the name it had when it joined).
//   share_member --layout
//       prints the segment's layout (sizes and offsets) as JSON, for segments the test writes itself.
#include <sys/prctl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "options.h"
#include "shared_budget.h"

namespace {

using cupool::SharedBudget;

std::vector<std::uint64_t> numbers(const std::string& text, std::size_t count) {
  std::vector<std::uint64_t> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t colon = text.find(':', start);
    if (colon == std::string::npos) colon = text.size();
    out.push_back(std::strtoull(text.substr(start, colon - start).c_str(), nullptr, 10));
    start = colon + 1;
  }
  if (out.size() != count) {
    std::fprintf(stderr, "share_member: \"%s\" is not %zu numbers separated by ':'\n", text.c_str(), count);
    std::exit(2);
  }
  return out;
}

int layout() {
  using Segment = SharedBudget::Segment;
  using Slot = SharedBudget::Slot;
  static_assert(std::is_standard_layout_v<Segment> && std::is_standard_layout_v<Slot>);
  std::printf(
      "{\"segment_size\":%zu,\"lock_base\":%lld,\"magic\":%llu,\"layout_version\":%u,\"max_members\":%d,\"max_devices\":%d,"
      "\"states\":{\"live\":%llu},"
      "\"segment\":{\"magic\":%zu,\"layout\":%zu,\"max_members\":%zu,\"max_devices\":%zu,\"ready\":%zu,"
      "\"limit\":%zu,\"limit_size\":%zu,\"slots\":%zu},"
      "\"slot\":{\"size\":%zu,\"owner\":%zu,\"start_ticks\":%zu,\"held\":%zu,\"in_use\":%zu,\"reserved\":%zu,"
      "\"waiting\":%zu,\"ooms\":%zu,\"command\":%zu,\"command_size\":%zu}}\n",
      sizeof(Segment), SharedBudget::kLockBase, static_cast<unsigned long long>(SharedBudget::kMagic), SharedBudget::kLayoutVersion,
      SharedBudget::kMaxMembers, SharedBudget::kMaxDevices, static_cast<unsigned long long>(SharedBudget::kLive),
      offsetof(Segment, magic), offsetof(Segment, layout), offsetof(Segment, max_members),
      offsetof(Segment, max_devices), offsetof(Segment, ready), offsetof(Segment, limit), sizeof(Segment::limit),
      offsetof(Segment, slots), sizeof(Slot), offsetof(Slot, owner), offsetof(Slot, start_ticks), offsetof(Slot, held),
      offsetof(Slot, in_use), offsetof(Slot, reserved), offsetof(Slot, waiting), offsetof(Slot, ooms),
      offsetof(Slot, command), sizeof(Slot::command));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--layout") == 0) return layout();
  if (argc < 3) {
    std::fprintf(stderr, "usage: share_member NAME LIMIT [--comm NAME] [--admit DEV:TOTAL:BYTES:IN_USE:RESERVED]... "
                         "[--refuse DEV:TOTAL:BYTES]...\n       share_member --layout\n");
    return 2;
  }
  const std::string name = argv[1], limit_text = argv[2];
  std::vector<std::vector<std::uint64_t>> admits, refusals;
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string option = argv[i], value = argv[i + 1];
    if (option == "--comm") {
      prctl(PR_SET_NAME, value.c_str(), 0, 0, 0);
    } else if (option == "--admit") {
      admits.push_back(numbers(value, 5));
    } else if (option == "--refuse") {
      refusals.push_back(numbers(value, 3));
    } else {
      std::fprintf(stderr, "share_member: unknown option %s\n", option.c_str());
      return 2;
    }
  }
  // The limit through the one parser of CUPOOL_SHARE_LIMIT, as a member process reads it.
  auto parsed = cupool::parse_options([&](const char* var) -> const char* {
    if (std::strcmp(var, "CUPOOL_SHARE") == 0) return name.c_str();
    if (std::strcmp(var, "CUPOOL_SHARE_LIMIT") == 0) return limit_text.c_str();
    return nullptr;
  });
  if (auto* e = std::get_if<cupool::OptionError>(&parsed)) {
    std::fprintf(stderr, "%s\n", e->message.c_str());
    return 2;
  }
  const cupool::Config& config = std::get<cupool::Config>(parsed);
  std::string error;
  auto budget = SharedBudget::join(name, config.share_limit, false, &error);
  if (!budget) {
    std::fprintf(stderr, "%s\n", error.c_str());
    return 1;
  }
  for (const auto& a : admits) {
    const int device = static_cast<int>(a[0]);
    if (!budget->admit(device, a[1], a[2], 0)) {
      std::fprintf(stderr, "share_member: %llu bytes on device %d refused\n", static_cast<unsigned long long>(a[2]),
                   device);
      return 1;
    }
    budget->publish(device, a[3], a[4]);
  }
  for (const auto& r : refusals) {
    if (budget->admit(static_cast<int>(r[0]), r[1], r[2], 0)) {
      std::fprintf(stderr, "share_member: %llu bytes on device %d fit; they were to be refused\n",
                   static_cast<unsigned long long>(r[2]), static_cast<int>(r[0]));
      return 1;
    }
    budget->note_oom();
  }
  std::printf("ready\n");
  std::fflush(stdout);
  for (;;) pause();
}
