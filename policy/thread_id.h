// The calling thread's kernel id, for trace events. Cached per thread (a syscall per event cost
// ~200 ns in the H200's VM); a fork makes the calling thread the child's only thread, with a new
// id, so the cache is keyed by a count of forks.
#pragma once

#include <cstdint>

namespace cupool {

std::uint32_t current_thread_id();

}  // namespace cupool
