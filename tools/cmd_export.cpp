#include <cstdio>

#include "cli.h"
#include "commands.h"

namespace cupool::tools {
const char* const kExportHelp = "usage: cupool export --perfetto TRACE -o FILE (not implemented yet)\n";
int cmd_export(const std::vector<std::string>&) {
  std::fputs("cupool export: not implemented yet\n", stderr);
  return kExitInternal;
}
}  // namespace cupool::tools
