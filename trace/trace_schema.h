// The one description of the trace format, shared by the writer (trace/trace_writer.*) and the
// reader (trace/trace_reader.*). docs/trace-format.md documents it; a test checks the two agree.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>
#include <string_view>

#include "pool_events.h"

namespace cupool::trace {

// A reader accepts any minor version of its major version and refuses a newer major.
// 2.0: `dur` left out of calls that were not timed, and `timed_for` (docs/trace-format.md).
// 2.1: `graph_mem` events; arrays are `alloc`/`free` events (their handle in `ptr`).
// 2.2: `vmm_release` of cupool's own (`api` "cupool"): the VMM mapping cache gave a kept mapping
//      back to the driver. A mapping kept (a `recycled` release) stays reserved until then.
//      `vmm_map` events name the handle mapped and the offset into it (`handle`, `offset`), so
//      that replay can run the mapping cache.
// 3.0: the `oom` class `share` (the shared budget had no room), and the configuration's `share`,
//      `share_limit`, `share_wait_ns`, `share_access`.
// 3.1: the footer of a member of a shared budget says how often and how long it waited for room
//      (`share_waits`, `share_wait_ns`).
// 3.2: `grow`/`release` of the vmm policy say `"granules":true`: device memory mapped or unmapped
//      at `ptr` inside the pool's virtual range, not a chunk taken or given back.
// 3.3: CUPOOL_TRACE_STACKS: `stack` lines (a native call stack, its frames symbolized) and the
//      `stack` key of the allocations sampled (its id); the configuration's `trace_stacks`.
inline constexpr int kFormatMajor = 3;
inline constexpr int kFormatMinor = 3;
inline constexpr int kOldestReadMajor = 1;  // 1.x traces read as 2.0 ones in which every call is timed
inline constexpr int kLastMinorOfMajor1 = 1;  // 1.1: the last 1.x
inline constexpr int kLastMinorOfMajor2 = 2;  // 2.2: the last 2.x
// A call that a thread's cache serves is timed with probability 1/kCacheTimingSample. Timing it
// takes two clock reads; on the H200 host they cost more than the rest of the call
// (docs/performance.md).
inline constexpr std::uint16_t kCacheTimingSample = 16;
inline constexpr std::string_view kFormatName = "cupool-trace";

// What happened. One program-visible allocation is exactly one `alloc` event, whatever path it
// took; pool-internal work (grow, release, fence) has events of its own.
enum class EventKind : std::uint8_t {
  alloc = 0,      // the program got memory (or was refused: rc != 0)
  free,           // the program gave memory back
  mem_info,       // cudaMemGetInfo / cuMemGetInfo_v2 / nvmlDeviceGetMemoryInfo(_v2) answered
  vmm_create,     // cuMemCreate: physical memory (counts against the cap)
  vmm_release,    // cuMemRelease
  vmm_map,        // cuMemMap
  vmm_unmap,      // cuMemUnmap
  va_reserve,     // cuMemAddressReserve (address space only)
  va_free,        // cuMemAddressFree
  grow,           // the pool took a chunk from the driver
  release,        // the pool gave a chunk back to the driver
  fence_retired,  // a deferred-free fence retired and its blocks became reusable
  oom,            // an allocation was refused; `oom_class` says why
  device,         // first sight of a device: name and total memory
  context_reset,  // a context went away (cudaDeviceReset, cuCtxDestroy...): its pool is dropped
  stream_create,  // the process (or a library in it) created a stream; `flags` say whether it is non-blocking
  stream_destroy,
  graph_mem,      // the driver's graph-memory reservation changed: `size` is what it reserves now
  count_
};
// Events placed in time at the end of their call (memory is handed out by the time it returns);
// every other event at its start, as is an alloc that was not timed. docs/trace-format.md, key `t`.
constexpr bool timed_at_end(EventKind k) {
  return k == EventKind::alloc || k == EventKind::vmm_create || k == EventKind::va_reserve ||
         k == EventKind::stream_create;
}

inline constexpr std::array<std::string_view, static_cast<int>(EventKind::count_)> kEventKindNames = {
    "alloc", "free", "mem_info", "vmm_create", "vmm_release", "vmm_map", "vmm_unmap",
    "va_reserve", "va_free", "grow", "release", "fence_retired", "oom", "device", "context_reset",
    "stream_create", "stream_destroy", "graph_mem"};

// How the call reached cupool.
enum class Path : std::uint8_t {
  none = 0,      // pool-internal events
  symbol,        // the exported symbol itself (dynamic linking, LD_PRELOAD interposition)
  dlsym,         // a pointer cupool handed out from dlsym()
  proc_address,  // a pointer from cuGetProcAddress / cuGetProcAddress_v2
  entry_point,   // a pointer from cudaGetDriverEntryPoint[ByVersion]
  count_
};
inline constexpr std::array<std::string_view, static_cast<int>(Path::count_)> kPathNames = {
    "none", "symbol", "dlsym", "proc-address", "entry-point"};

// Why an allocation was refused: the pool's own classes (pool_events.h), named on the line.
using OomClass = cupool::OomClass;
inline constexpr std::array<std::string_view, static_cast<int>(OomClass::count_)> kOomClassNames = {
    "none", "limit", "fragmentation", "device", "share"};

// Pool state attached to pool-served events (all zero, and omitted from the line, otherwise):
// the pool's own statistics (pool_events.h).
using PoolState = cupool::PoolStats;

// Events a thread cache served carry the change to the bytes in use (cache_delta) instead of
// in_use and cached: this fills those in, per pool, from the last values seen, in time order.
// One home for the rule, run by the trace writer and by replay on their streams of events.
class PoolStateDerivation {
 public:
  void apply(PoolState& pool) {
    Last* last = nullptr;
    for (Last& l : last_)
      if (l.pool == pool.pool) last = &l;
    if (last == nullptr) last = &last_.emplace_back(Last{pool.pool, 0, 0});
    if (pool.cache_delta == 0) {
      last->in_use = pool.in_use;
      last->cached = pool.cached;
      return;
    }
    auto add = [](std::uint64_t v, std::int64_t d) {
      return d >= 0 ? v + static_cast<std::uint64_t>(d) : v - std::min(v, static_cast<std::uint64_t>(-d));
    };
    last->in_use = add(last->in_use, pool.cache_delta);
    last->cached = add(last->cached, -pool.cache_delta);
    pool.in_use = last->in_use;
    pool.cached = last->cached;
    pool.cache_delta = 0;
  }
  void clear() { last_.clear(); }

 private:
  struct Last {
    std::uint64_t pool, in_use, cached;
  };
  std::vector<Last> last_;  // a handful of pools: a scan beats a map
};

// The values of one event line: one definition for the writer's Record and the reader's Event,
// so that every field written is a field read (a test round-trips them whole, every kind).
struct EventValues {
  std::uint64_t t_ns = 0;      // CLOCK_MONOTONIC (an EventClock stamp where the Record is `stamped`)
  std::uint64_t dur_ns = 0;    // how long the call took (the real driver call, or the pool)
  std::uint64_t size = 0;      // bytes asked for (or chunk size for grow/release)
  std::uint64_t ptr = 0;       // device address (or VMM handle for vmm_create/vmm_release)
  std::uint64_t stream = 0;    // stream handle, where the API has one
  std::uint64_t handle = 0;    // vmm_map: the physical allocation mapped (has_handle)...
  std::uint64_t offset = 0;    // ...at this offset into it
  PoolState pool{};
  std::int32_t rc = 0;         // the CUDA result code returned to the caller
  std::uint32_t flags = 0;     // stream events: the stream's flags (1: non-blocking)
  std::uint32_t tid = 0;       // kernel thread id
  // How many calls dur_ns stands for: 1; kCacheTimingSample for the one timed call of a sample;
  // 0 when the call was not timed (then `t` is its start, and dur_ns is not written).
  std::uint32_t timed_for = 1;
  std::uint32_t stack = 0;     // alloc sampled by CUPOOL_TRACE_STACKS: its stack line's id (0: none)
  std::int16_t device = -1;    // device ordinal, -1 when unknown
  EventKind kind = EventKind::alloc;
  Path path = Path::none;
  OomClass oom_class = OomClass::none;
  bool has_stream = false;
  bool has_pool = false;
  bool has_flags = false;
  bool has_handle = false;
  bool recycled = false;       // served by cupool's VMM mapping cache, no driver call (key only when true)
  bool granules = false;       // grow/release: the vmm policy's granules, not a chunk (key only when true)
  bool operator==(const EventValues&) const = default;
};

// One event as the hot path records it: plain data, no heap, formatted later by the writer.
struct Record : EventValues {
  const char* api = nullptr;   // static string: the API name ("cudaMalloc", "cuMemAlloc_v2")
  bool stamped = false;        // t_ns and dur_ns are in EventClock stamps: the writer converts them
};

// A pool's event as a trace line: the one mapping, used by the trace writer and by replay.
inline Record record_of(const PoolEvent& e) {
  Record r;
  switch (e.kind) {
    case PoolEvent::Kind::grow: r.kind = EventKind::grow; break;
    case PoolEvent::Kind::release: r.kind = EventKind::release; break;
    case PoolEvent::Kind::fence_retired: r.kind = EventKind::fence_retired; break;
    case PoolEvent::Kind::oom: r.kind = EventKind::oom; break;
    case PoolEvent::Kind::vmm_given_back: r.kind = EventKind::vmm_release; break;
  }
  // The pool's own events say "pool"; a kept VMM mapping given back, "cupool" (format 2.2).
  r.api = e.kind == PoolEvent::Kind::vmm_given_back ? "cupool" : "pool";
  r.t_ns = e.t_ns;
  r.dur_ns = e.dur_ns;
  r.size = e.size;
  r.ptr = e.ptr;
  r.rc = e.driver_code;
  r.tid = e.tid;
  r.device = static_cast<std::int16_t>(e.device);
  r.oom_class = e.oom;
  r.granules = e.granules;
  r.has_pool = e.has_stats;
  r.pool = e.stats;
  return r;
}

// The keys of event lines, each spelled once, here: X(identifier, "text"). The key:: constants
// below that the writer writes, and the reader's key enum and its lookup by name
// (trace_event_decoder.cpp), all come from this list: adding a key is one line.
#define CUPOOL_TRACE_EVENT_KEYS(X)                                                            \
  X(type, "type")                 /* "header", "event", "footer" */                          \
  X(t, "t")                                                                                   \
  X(tid, "tid")                                                                               \
  X(ev, "ev")                                                                                 \
  X(api, "api")                                                                               \
  X(path, "path")                                                                             \
  X(dev, "dev")                                                                               \
  X(size, "size")                                                                             \
  X(ptr, "ptr")                                                                               \
  X(stream, "stream")                                                                         \
  X(rc, "rc")                                                                                 \
  X(dur, "dur")                                                                               \
  X(timed_for, "timed_for")       /* present when not 1 */                                   \
  X(oom_class, "oom")                                                                         \
  X(reserved, "reserved")                                                                     \
  X(in_use, "in_use")                                                                         \
  X(largest_free, "largest_free")                                                             \
  X(quarantined, "quarantined")                                                               \
  X(cached, "cached")                                                                         \
  X(free_blocks, "free_blocks")                                                               \
  X(flags, "flags")                                                                           \
  X(handle, "handle")             /* vmm_map: the handle mapped ("0x...") */                 \
  X(offset, "offset")             /* vmm_map: bytes into the handle */                       \
  X(recycled, "recycled")         /* true: a VMM call served by the mapping cache */         \
  X(granules, "granules")         /* true: grow/release of the vmm policy's granules */      \
  X(stack, "stack")               /* the id of the allocation's stack line (format 3.3) */

// JSON keys, used by writer and reader alike.
namespace key {
#define CUPOOL_TRACE_KEY_CONSTANT(id, text) inline constexpr std::string_view id = text;
CUPOOL_TRACE_EVENT_KEYS(CUPOOL_TRACE_KEY_CONSTANT)
#undef CUPOOL_TRACE_KEY_CONSTANT
inline constexpr std::string_view name = "name";  // device events: device name (text field)
}  // namespace key

// Line types ("type") and the keys of the non-event lines (docs/trace-format.md), used by writer
// and reader alike.
namespace line {
inline constexpr std::string_view header = "header";
inline constexpr std::string_view event = "event";
inline constexpr std::string_view device = "device";  // keys: t, index, name, total_bytes
inline constexpr std::string_view drop = "drop";      // keys: t, tid, count
inline constexpr std::string_view stack = "stack";    // keys: id, frames (stack_key); before its first use
inline constexpr std::string_view footer = "footer";  // keys: events, dropped, allocs, frees, ooms, end_mono_ns, devices (, share_waits, share_wait_ns)
}  // namespace line
namespace header_key {
inline constexpr const char* format = "format";  // kFormatName
inline constexpr const char* version = "version";  // "major.minor"
inline constexpr const char* cupool_version = "cupool_version";
inline constexpr const char* pid = "pid";
inline constexpr const char* ppid = "ppid";
inline constexpr const char* host = "host";
inline constexpr const char* cmdline = "cmdline";
inline constexpr const char* start_unix_ns = "start_unix_ns";
inline constexpr const char* start_mono_ns = "start_mono_ns";
inline constexpr const char* config = "config";    // config_json, decode_config (trace/config_json.h, config_decode.h)
inline constexpr const char* devices = "devices";  // devices known when the file was opened
}  // namespace header_key
namespace device_key {  // device lines, and the devices of the footer
inline constexpr const char* index = "index";
inline constexpr const char* name = "name";
inline constexpr const char* total_bytes = "total_bytes";
}  // namespace device_key
// A stack line: `frames`, innermost first (the program's call into CUDA first), each an object of
// `pc` ("0x..."), `module` (the file it lies in), `offset` ("0x...", pc - 1 from the module's load
// address: the call instruction, for addr2line) and, where the module exports one, `symbol`
// (demangled) with `symbol_offset` ("0x...").
namespace stack_key {
inline constexpr const char* id = "id";
inline constexpr const char* frames = "frames";
inline constexpr const char* pc = "pc";
inline constexpr const char* module = "module";
inline constexpr const char* offset = "offset";
inline constexpr const char* symbol = "symbol";
inline constexpr const char* symbol_offset = "symbol_offset";
}  // namespace stack_key
namespace drop_key {
inline constexpr const char* count = "count";
}  // namespace drop_key
namespace footer_key {
inline constexpr const char* events = "events";
inline constexpr const char* dropped = "dropped";
inline constexpr const char* allocs = "allocs";
inline constexpr const char* frees = "frees";
inline constexpr const char* ooms = "ooms";
inline constexpr const char* end_mono_ns = "end_mono_ns";
inline constexpr const char* devices = "devices";
inline constexpr const char* share_waits = "share_waits";      // only with a shared budget
inline constexpr const char* share_wait_ns = "share_wait_ns";  // only with a shared budget
}  // namespace footer_key

}  // namespace cupool::trace
