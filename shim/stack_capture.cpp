// CUPOOL_TRACE_STACKS: capturing an allocation's native call stack for the trace (stack_capture.h).
#include "stack_capture.h"

#include <link.h>
#include <unwind.h>

namespace cupool::shim {

namespace {

// Where libcupool.so's own code lies: frames there are the hook's, not the program's.
struct OwnRange {
  std::uintptr_t lo = 0, hi = 0;
};

int find_own(dl_phdr_info* info, std::size_t, void* arg) {
  auto* r = static_cast<OwnRange*>(arg);
  const auto self = reinterpret_cast<std::uintptr_t>(&capture_stack);
  std::uintptr_t lo = UINTPTR_MAX, hi = 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    const std::uintptr_t b = info->dlpi_addr + ph.p_vaddr;
    if (b < lo) lo = b;
    if (b + ph.p_memsz > hi) hi = b + ph.p_memsz;
  }
  if (self < lo || self >= hi) return 0;
  r->lo = lo;
  r->hi = hi;
  return 1;
}

const OwnRange& own_range() {
  static const OwnRange range = [] {
    OwnRange r;
    dl_iterate_phdr(find_own, &r);
    return r;
  }();
  return range;
}

struct Walk {
  std::uintptr_t* out;
  std::size_t max, count;
  OwnRange own;
  bool in_own;  // still inside cupool's frames (the hook, then the capture itself)
};

_Unwind_Reason_Code step(_Unwind_Context* ctx, void* arg) {
  auto* w = static_cast<Walk*>(arg);
  const auto pc = static_cast<std::uintptr_t>(_Unwind_GetIP(ctx));
  if (pc == 0) return _URC_END_OF_STACK;
  if (w->in_own && pc >= w->own.lo && pc < w->own.hi) return _URC_NO_REASON;
  w->in_own = false;
  w->out[w->count++] = pc;
  return w->count == w->max ? _URC_END_OF_STACK : _URC_NO_REASON;
}

}  // namespace

std::size_t capture_stack(std::uintptr_t* out, std::size_t max) {
  if (max == 0) return 0;
  Walk w{out, max, 0, own_range(), true};
  _Unwind_Backtrace(step, &w);
  return w.count;
}

}  // namespace cupool::shim
