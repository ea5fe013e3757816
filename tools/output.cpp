// Where the cupool command writes (output.h): output files replaced whole, and standard output.
#include "output.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "output_file.h"

namespace cupool::tools {

namespace {
constexpr std::size_t kBuffer = 1 << 20;
}

void OutputFile::fail(const std::string& why) const { throw OutputError("cannot write " + path_ + ": " + why); }

OutputFile::OutputFile(std::string path, bool stdout_ok) : path_(std::move(path)) {
  if (path_ == "-" && stdout_ok) {
    out_ = stdout;
    return;
  }
  if (path_.empty()) fail("the path is empty");
  std::string why;
  int fd = -1;
  struct stat st {};
  if (::lstat(path_.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode)) fail(kRefusedLink);
    if (S_ISDIR(st.st_mode)) fail("it is a directory");
    if (S_ISREG(st.st_mode) && st.st_uid != ::geteuid()) fail("it belongs to another user");
    if (!S_ISREG(st.st_mode)) {  // a device or a pipe: nothing to replace
      fd = open_output_file(path_, false, &why);
      if (fd < 0) fail(why);
    }
  }
  if (fd < 0) {
    const std::size_t slash = path_.rfind('/');
    const std::string dir = slash == std::string::npos ? "" : path_.substr(0, slash + 1);
    const std::string base = slash == std::string::npos ? path_ : path_.substr(slash + 1);
    // A random name, created exclusively: nobody can have it ready for us.
    std::random_device rng;
    for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
      char suffix[24];
      std::snprintf(suffix, sizeof suffix, ".%08x.tmp", rng());
      temp_ = dir + "." + base + suffix;
      fd = open_output_file(temp_, true, &why);
      if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
      temp_.clear();
      fail("cannot create a temporary file in " + (dir.empty() ? std::string(".") : dir) + ": " + why);
    }
  }
  out_ = ::fdopen(fd, "wb");
  if (!out_) {
    const int err = errno;
    ::close(fd);
    if (!temp_.empty()) ::unlink(temp_.c_str());
    temp_.clear();
    fail(std::strerror(err));
  }
  buffer_.reset(new char[kBuffer]);
  std::setvbuf(out_, buffer_.get(), _IOFBF, kBuffer);
}

OutputFile::~OutputFile() {
  if (committed_ || out_ == stdout) return;
  if (out_) std::fclose(out_);
  if (!temp_.empty()) ::unlink(temp_.c_str());
}

void OutputFile::commit() {
  if (out_ == stdout) {
    committed_ = true;
    return;  // flush_stdout() checks it at exit
  }
  const bool flushed = std::fflush(out_) == 0 && !std::ferror(out_);
  const int err = errno;
  const bool closed = std::fclose(out_) == 0;
  out_ = nullptr;
  committed_ = true;
  if (!flushed || !closed) {
    if (!temp_.empty()) ::unlink(temp_.c_str());
    fail(std::strerror(flushed ? errno : err));
  }
  if (!temp_.empty() && ::rename(temp_.c_str(), path_.c_str()) != 0) {
    const int rename_err = errno;
    ::unlink(temp_.c_str());
    fail(std::strerror(rename_err));
  }
}

bool flush_stdout(const char* command) {
  errno = 0;
  if (std::fflush(stdout) == 0 && !std::ferror(stdout)) return true;
  const int err = errno;
  std::fprintf(stderr, "cupool %s: cannot write to standard output%s%s\n", command, err ? ": " : "",
               err ? std::strerror(err) : "");
  return false;
}

}  // namespace cupool::tools
