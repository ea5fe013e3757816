#include <cstdio>

#include "cli.h"
#include "commands.h"

namespace cupool::tools {
const char* const kReplayHelp = "usage: cupool replay TRACE --policy P[,P...] (not implemented yet)\n";
int cmd_replay(const std::vector<std::string>&) {
  std::fputs("cupool replay: not implemented yet\n", stderr);
  return kExitInternal;
}
}  // namespace cupool::tools
