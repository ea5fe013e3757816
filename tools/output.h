// Where the cupool command writes: output files (report --html, export -o) and standard output.
// A failed write is exit 4 with a message naming what could not be written (docs/cli.md).
#pragma once

#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>

namespace cupool::tools {

// Output that could not be written; main() prints "cupool CMD: <what>" and exits 4.
struct OutputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// An output file written whole or not at all: into a temporary file beside it (created as
// policy/output_file.h says: mode 0600, no link followed), renamed over it by commit(). A path
// that is a symbolic link, a directory or another user's file is refused; one that is neither a
// regular file nor missing (/dev/null, a pipe) is written in place. "-" is standard output when
// `stdout_ok`.
class OutputFile {
 public:
  OutputFile(std::string path, bool stdout_ok);  // throws OutputError
  ~OutputFile();  // without commit(): the temporary file is removed and the path left as it was
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  std::FILE* stream() { return out_; }
  void commit();  // flush, check, rename; throws OutputError

 private:
  [[noreturn]] void fail(const std::string& why) const;
  std::string path_;
  std::string temp_;  // "" when written in place
  std::FILE* out_ = nullptr;
  std::unique_ptr<char[]> buffer_;
  bool committed_ = false;
};

// Flushes standard output at exit; false, with "cupool CMD: cannot write to standard output"
// on stderr, when anything written to it was lost (a full disk, a closed pipe).
bool flush_stdout(const char* command);

}  // namespace cupool::tools
