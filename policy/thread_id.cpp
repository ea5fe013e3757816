// The calling thread's kernel id (thread_id.h), cached per thread and per fork.
#include "thread_id.h"

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>

namespace cupool {
namespace {

std::atomic<std::uint64_t> fork_count{0};

[[maybe_unused]] const int registered = [] {
  pthread_atfork(nullptr, nullptr, [] { fork_count.fetch_add(1, std::memory_order_relaxed); });
  return 0;
}();

}  // namespace

std::uint32_t current_thread_id() {
  thread_local std::uint64_t cached_generation = ~std::uint64_t{0};
  thread_local std::uint32_t cached_tid = 0;
  const std::uint64_t generation = fork_count.load(std::memory_order_relaxed);
  if (generation != cached_generation) {
    cached_generation = generation;
    cached_tid = static_cast<std::uint32_t>(syscall(SYS_gettid));
  }
  return cached_tid;
}

}  // namespace cupool
