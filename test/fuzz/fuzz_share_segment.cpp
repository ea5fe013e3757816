// libFuzzer target: reading a shared budget's segment as `cupool top` and `cupool metrics` do
// (SharedBudget::observe, policy/shared_budget.cpp) from a file anyone may have planted or forged.
// The input is the file: padded or cut to a segment's size when it starts with the magic (so
// that the fields behind it are reached), as it comes otherwise. Besides "no crash, no sanitizer
// error, no hang": a segment read gives bounded strings, and its members' figures can be summed.
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "shared_budget.h"

#define FUZZ_CHECK(cond)                                                      \
  do {                                                                        \
    if (!(cond)) {                                                            \
      std::fprintf(stderr, "fuzz_share_segment: check failed: %s\n", #cond);  \
      std::abort();                                                           \
    }                                                                         \
  } while (0)

using cupool::SharedBudget;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = "/tmp/cupool-fuzz-share-segment-" + std::to_string(getpid());
  std::vector<std::uint8_t> file(data, data + size);
  std::uint64_t magic = 0;
  if (size >= sizeof magic) std::memcpy(&magic, data, sizeof magic);
  if (magic == SharedBudget::kMagic) file.resize(sizeof(SharedBudget::Segment));
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return 0;
  const bool written = write(fd, file.data(), file.size()) == static_cast<ssize_t>(file.size());
  close(fd);
  if (!written) return 0;
  std::string error;
  auto budget = SharedBudget::observe(path, &error);
  if (!budget) {
    FUZZ_CHECK(!error.empty());
    return 0;
  }
  FUZZ_CHECK(budget->limit_text().size() < sizeof(SharedBudget::Segment::limit));
  for (const SharedBudget::Member& m : budget->members()) FUZZ_CHECK(m.command.size() < sizeof(SharedBudget::Slot::command));
  for (int d = 0; d < SharedBudget::kMaxDevices; ++d) {
    (void)budget->held_total(d);  // saturating: a forged 2^64 - 1 does not wrap
    (void)budget->holders(d);
  }
  return 0;
}
