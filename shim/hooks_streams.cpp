// Hooks that tell the pools which streams can run work at the same time, and when a stream
// capture forbids them their usual calls: stream creation and destruction, the first work a
// thread puts on its per-thread default stream (the work hooks of hooks.def), and the beginning
// and end of stream captures. docs/design.md, "Streams" and "Stream capture".
#include <dlfcn.h>

#include <string>

#include "driver_calls.h"
#include "hook_table.h"
#include "hooks_internal.h"
#include "log.h"
#include "shim_state.h"
#include "streams.h"
#include "thread_id.h"

namespace cupool::shim {
namespace {

CUcontext current_context() {
  CUcontext ctx = nullptr;
  if (driver().ok) driver().ctx_get_current(&ctx);
  return ctx;
}

void emit_stream_event(trace::EventKind kind, trace::Path path, const char* api, CUstream stream, std::uint64_t t0,
                       const unsigned* flags) {
  trace::Record r;
  r.t_ns = now_ns();
  if (t0) r.dur_ns = r.t_ns - t0;
  r.kind = kind;
  r.api = api;
  r.path = path;
  r.has_stream = true;
  r.stream = reinterpret_cast<std::uintptr_t>(stream);
  if (flags) {
    r.has_flags = true;
    r.flags = *flags;
  }
  r.tid = current_thread_id();
  CUdevice device = 0;
  if (kind == trace::EventKind::stream_create && driver().ok && driver().ctx_get_device(&device) == CUDA_SUCCESS)
    r.device = static_cast<std::int16_t>(device);
  emit(r);
}

// Memory freed while all work was one order was reusable at once, and some of it waits in the
// pools (free lists, thread caches, kept VMM mappings) with work still running on it. Once a
// second stream can run beside that work, wait for it once, so that nothing freed before this
// point is handed to the new stream early.
void work_may_overlap_now() { synchronize_all_pools(); }

// A stream the process created: registered and, for the outermost call, one trace event.
// `caller` names the object that asked, in the debug log: libraries create streams of their
// own, and they change what deferred frees cost.
void stream_created(trace::Path path, const char* api, bool outermost, CUstream stream, unsigned flags,
                    std::uint64_t t0, const void* caller) {
  if (streams().created(current_context(), stream, flags)) work_may_overlap_now();
  if (!outermost) return;
  if (log_debug_enabled()) {
    Dl_info info{};
    const char* who = dladdr(caller, &info) && info.dli_fname ? info.dli_fname : "?";
    log_debug(std::string(api) + ": stream " + std::to_string(reinterpret_cast<std::uintptr_t>(stream)) +
              ((flags & CU_STREAM_NON_BLOCKING) ? " (non-blocking)" : " (blocking)") + " created by " + who);
  }
  if (tracing()) emit_stream_event(trace::EventKind::stream_create, path, api, stream, t0, &flags);
}

// Before the real destroy: work queued on a non-blocking stream runs on after it (the driver
// allows the destroy), and the legacy stream's events do not wait for it (measured on the H200),
// so its pool keeps fencing it until that work is done. A capture on the stream ends with it.
void stream_destroying(trace::Path path, const char* api, bool outermost, CUstream stream) {
  if (CUcontext ctx = streams().destroyed(stream))
    if (ContextMemory* cp = existing_pool(ctx)) driver_upstream(*cp).stream_destroying(stream);
  captures().ended(stream);
  if (outermost && tracing()) emit_stream_event(trace::EventKind::stream_destroy, path, api, stream, 0, nullptr);
}

unsigned runtime_stream_flags(unsigned flags) { return (flags & cudaStreamNonBlocking) ? CU_STREAM_NON_BLOCKING : 0; }

// The stream-creating hooks of both APIs: the real call, then, if it made a stream, its record.
template <typename Code, typename Handle, typename Call>
Code create_stream(trace::Path path, const char* api, Code ok, Handle* stream, unsigned flags, Call&& call,
                   const void* caller) {
  HookScope scope;
  initialize();
  const std::uint64_t t0 = now_ns();
  const Code rc = call();
  if (rc == ok) stream_created(path, api, scope.outermost(), reinterpret_cast<CUstream>(*stream), flags, t0, caller);
  return rc;
}

// Before a capture begins on `stream`: if it is a blocking stream, the legacy stream of its
// context cannot be used until the capture ends, so what was queued there is marked now.
void capture_beginning(CUstream stream) {
  if (streams().non_blocking(stream)) return;
  const CUcontext ctx = stream_context(stream);
  if (captures().blocking_capture(ctx)) return;  // marked when the first one began
  if (ContextMemory* cp = existing_pool(ctx)) driver_upstream(*cp).before_blocking_capture();
}

// Begins a capture through `call` (any of the begin entry points), registering it if it began.
template <typename Call>
CUresult begin_capture(CUstream stream, CUstreamCaptureMode mode, Call&& call) {
  initialize();
  capture_beginning(stream);
  const CUresult rc = call();
  if (rc == CUDA_SUCCESS) captures().begun(stream, stream_context(stream), mode, !streams().non_blocking(stream));
  return rc;
}

template <typename Call>
CUresult end_capture(CUstream stream, Call&& call) {
  const CUresult rc = call();
  // Ended whatever the driver answered: an invalidated capture ends here too. A call for a
  // stream that was not capturing changes nothing.
  captures().ended(stream);
  return rc;
}

}  // namespace

// The context a stream belongs to, which need not be the calling thread's (a capture may begin on
// a stream of another context): the driver's answer; the thread's for the default streams.
CUcontext stream_context(CUstream stream) {
  const auto get_ctx = driver().stream_get_ctx;
  CUcontext ctx = nullptr;
  if (stream != nullptr && stream != CU_STREAM_LEGACY && stream != CU_STREAM_PER_THREAD && get_ctx &&
      get_ctx(stream, &ctx) == CUDA_SUCCESS && ctx != nullptr)
    return ctx;
  return current_context();
}


// The first work this thread puts on its per-thread default stream: from then on, that stream
// counts as one more blocking stream (the legacy stream's fence events cover it: measured).
void note_per_thread_stream_work() {
  static thread_local bool noted = false;
  if (noted) return;
  noted = true;
  initialize();
  if (streams().per_thread_used(current_thread_id())) work_may_overlap_now();
  if (tracing()) {
    const unsigned flags = 0;
    emit_stream_event(trace::EventKind::stream_create, trace::Path::none, "per-thread default stream",
                      CU_STREAM_PER_THREAD, 0, &flags);
  }
}

namespace impl {

using trace::Path;

cudaError_t cudaStreamCreate(Path path, cudaStream_t* stream) {
  auto real = CUPOOL_REAL(cudaStreamCreate);
  return create_stream(path, "cudaStreamCreate", cudaSuccess, stream, 0,
                       [&] { return real ? real(stream) : cudaErrorInitializationError; },
                       __builtin_return_address(0));
}

cudaError_t cudaStreamCreateWithFlags(Path path, cudaStream_t* stream, unsigned int flags) {
  auto real = CUPOOL_REAL(cudaStreamCreateWithFlags);
  return create_stream(path, "cudaStreamCreateWithFlags", cudaSuccess, stream, runtime_stream_flags(flags),
                       [&] { return real ? real(stream, flags) : cudaErrorInitializationError; },
                       __builtin_return_address(0));
}

cudaError_t cudaStreamCreateWithPriority(Path path, cudaStream_t* stream, unsigned int flags, int priority) {
  auto real = CUPOOL_REAL(cudaStreamCreateWithPriority);
  return create_stream(path, "cudaStreamCreateWithPriority", cudaSuccess, stream, runtime_stream_flags(flags),
                       [&] { return real ? real(stream, flags, priority) : cudaErrorInitializationError; },
                       __builtin_return_address(0));
}

cudaError_t cudaStreamDestroy(Path path, cudaStream_t stream) {
  HookScope scope;
  auto real = CUPOOL_REAL(cudaStreamDestroy);
  initialize();
  stream_destroying(path, "cudaStreamDestroy", scope.outermost(), reinterpret_cast<CUstream>(stream));
  return real ? real(stream) : cudaErrorInitializationError;
}

// Streams the runtime creates for its own purposes are seen here too: they count.
CUresult cuStreamCreate(Path path, CUstream* stream, unsigned int flags) {
  auto real = CUPOOL_REAL(cuStreamCreate);
  return create_stream(path, "cuStreamCreate", CUDA_SUCCESS, stream, flags,
                       [&] { return real ? real(stream, flags) : CUDA_ERROR_NOT_INITIALIZED; },
                       __builtin_return_address(0));
}

CUresult cuStreamCreateWithPriority(Path path, CUstream* stream, unsigned int flags, int priority) {
  auto real = CUPOOL_REAL(cuStreamCreateWithPriority);
  return create_stream(path, "cuStreamCreateWithPriority", CUDA_SUCCESS, stream, flags,
                       [&] { return real ? real(stream, flags, priority) : CUDA_ERROR_NOT_INITIALIZED; },
                       __builtin_return_address(0));
}

CUresult cuStreamDestroy_v2(Path path, CUstream stream) {
  HookScope scope;
  auto real = CUPOOL_REAL(cuStreamDestroy_v2);
  initialize();
  stream_destroying(path, "cuStreamDestroy_v2", scope.outermost(), stream);
  return real ? real(stream) : CUDA_ERROR_NOT_INITIALIZED;
}

// ---- Stream capture ------------------------------------------------------------------------

CUresult cuStreamBeginCapture(Path, CUstream stream) {
  auto real = CUPOOL_REAL(cuStreamBeginCapture);
  return begin_capture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL,
                       [&] { return real ? real(stream) : CUDA_ERROR_NOT_INITIALIZED; });
}

CUresult cuStreamBeginCapture_ptsz(Path, CUstream stream) {
  auto real = CUPOOL_REAL(cuStreamBeginCapture_ptsz);
  return begin_capture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL,
                       [&] { return real ? real(stream) : CUDA_ERROR_NOT_INITIALIZED; });
}

CUresult cuStreamBeginCapture_v2(Path, CUstream stream, CUstreamCaptureMode mode) {
  auto real = CUPOOL_REAL(cuStreamBeginCapture_v2);
  return begin_capture(stream, mode, [&] { return real ? real(stream, mode) : CUDA_ERROR_NOT_INITIALIZED; });
}

CUresult cuStreamBeginCapture_v2_ptsz(Path, CUstream stream, CUstreamCaptureMode mode) {
  auto real = CUPOOL_REAL(cuStreamBeginCapture_v2_ptsz);
  return begin_capture(stream, mode, [&] { return real ? real(stream, mode) : CUDA_ERROR_NOT_INITIALIZED; });
}

CUresult cuStreamBeginCaptureToGraph(Path, CUstream stream, CUgraph graph, const CUgraphNode* deps,
                                     const CUgraphEdgeData* data, size_t count, CUstreamCaptureMode mode) {
  auto real = CUPOOL_REAL(cuStreamBeginCaptureToGraph);
  return begin_capture(stream, mode, [&] {
    return real ? real(stream, graph, deps, data, count, mode) : CUDA_ERROR_NOT_INITIALIZED;
  });
}

CUresult cuStreamBeginCaptureToGraph_ptsz(Path, CUstream stream, CUgraph graph, const CUgraphNode* deps,
                                          const CUgraphEdgeData* data, size_t count, CUstreamCaptureMode mode) {
  auto real = CUPOOL_REAL(cuStreamBeginCaptureToGraph_ptsz);
  return begin_capture(stream, mode, [&] {
    return real ? real(stream, graph, deps, data, count, mode) : CUDA_ERROR_NOT_INITIALIZED;
  });
}

CUresult cuStreamEndCapture(Path, CUstream stream, CUgraph* graph) {
  auto real = CUPOOL_REAL(cuStreamEndCapture);
  return end_capture(stream, [&] { return real ? real(stream, graph) : CUDA_ERROR_NOT_INITIALIZED; });
}

CUresult cuStreamEndCapture_ptsz(Path, CUstream stream, CUgraph* graph) {
  auto real = CUPOOL_REAL(cuStreamEndCapture_ptsz);
  return end_capture(stream, [&] { return real ? real(stream, graph) : CUDA_ERROR_NOT_INITIALIZED; });
}

}  // namespace impl
}  // namespace cupool::shim
