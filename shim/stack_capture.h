// CUPOOL_TRACE_STACKS: the native call stack of an allocation, captured in the hook that serves
// it, for the trace (trace/stack_table.h interns and symbolizes it).
#pragma once

#include <cstddef>
#include <cstdint>

namespace cupool::shim {

// The return addresses of the calling thread's stack, innermost first, from the program's call
// into CUDA outwards (cupool's own frames left out); at most `max`. Walked by GCC's unwinder
// (_Unwind_Backtrace, from the call-frame information every module carries for exceptions), so
// code built without frame pointers is walked too; it stops at code with none (made at run time).
std::size_t capture_stack(std::uintptr_t* out, std::size_t max);

}  // namespace cupool::shim
