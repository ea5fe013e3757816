// The trace-file naming rule: the file a process writes for a CUPOOL_TRACE pattern, and its
// inverse, whether a file's name is one that the pattern gives some process (docs/trace-format.md,
// "Fork, and programs a traced program starts").
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

namespace cupool {

// CUPOOL_TRACE: "%p" becomes the pid, "%%" a single '%'; anything else is kept.
std::string expand_trace_path(const std::string& pattern, pid_t pid);

// Does a CUPOOL_TRACE pattern hold "%p" ("%%p" is a literal "%p")? With it, every process writes
// the pattern expanded for its pid; without it, processes after the first write "<path>.<pid>".
bool has_pid_placeholder(std::string_view pattern);

// The file process `pid` writes: the pattern expanded; without "%p", a `child` (forked, or
// started by a traced process) writes "<path>.<pid>" instead of truncating its parent's file.
std::string trace_path_for_process(const std::string& pattern, pid_t pid, bool child);

// The inverse, for the last part of a path: is `name` a file name that `pattern` (a file name
// pattern, no directory) gives some process? With "%p", `pattern` with digits in place of each
// "%p"; without, the pattern expanded, or that and ".<pid>".
bool is_trace_file_name(std::string_view pattern, std::string_view name);

}  // namespace cupool
