// Creating the files cupool writes: traces (trace/trace_writer.cpp), and the cupool command's
// reports and exports (tools/output.cpp). Traces are often written to world-writable directories
// (/tmp), where another user can plant a symbolic link or a file of their own at the path: the
// file is opened without following a link, must belong to the caller, and is readable by its
// owner only (it holds command lines).
#pragma once

#include <string>

namespace cupool {

// Why a symbolic link at an output path is refused.
inline constexpr const char* kRefusedLink = "it is a symbolic link (cupool does not write through links)";

// Opens `path` for writing, emptied, created if missing: mode 0600 whatever the umask (an
// existing file of ours is set to 0600 too), close-on-exec. `exclusive`: the file must not exist
// yet. Refuses a symbolic link at `path` and a regular file owned by another user. Other kinds of
// file (a character device such as /dev/null, a pipe) are opened as they are. Returns the
// descriptor, or -1 with *why set to the reason (kRefusedLink, "it belongs to another user"...);
// when open(2) itself failed, errno is what it set (EEXIST for an exclusive open of a file that exists).
int open_output_file(const std::string& path, bool exclusive, std::string* why);

// Would open_output_file(path, false, ...) succeed? Creates nothing: checks that the directory
// can hold a new file, and that nothing open_output_file refuses (a link, another user's file, a
// directory) is at `path` now. For a file made later (a trace, at the process's first event), so
// that a mistake is said when the process starts. False with *why set.
bool output_file_possible(const std::string& path, std::string* why);

}  // namespace cupool
