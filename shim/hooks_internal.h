// What the hook implementations share: each hook `X` has an implementation impl::X that takes
// the path the call came by first; the exported symbol and the per-path thunks call it.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda_api.h"
#include "hook_table.h"
#include "nvml_api.h"
#include "trace_schema.h"

namespace cupool::shim {

// The runtime's device pointers are void*, the driver's CUdeviceptr, handles are pointers or
// integers: all of them as the 64-bit values the pools, ProcessMemory and the trace key by, and back.
template <typename Ptr>
std::uint64_t address(Ptr p) {
  if constexpr (std::is_pointer_v<Ptr>) return reinterpret_cast<std::uintptr_t>(p);
  else return static_cast<std::uint64_t>(p);
}
template <typename Ptr>
Ptr pointer(std::uint64_t a) {
  if constexpr (std::is_pointer_v<Ptr>) return reinterpret_cast<Ptr>(static_cast<std::uintptr_t>(a));
  else return static_cast<Ptr>(a);
}

template <typename F>
struct WithPath;
template <typename R, typename... A>
struct WithPath<R(A...)> {
  using type = R(trace::Path, A...);
};

// Work hooks (CUPOOL_WORK_HOOK): the first work a thread puts on its per-thread default stream
// is noted (hooks_streams.cpp); then the real function, whatever it was.
void note_per_thread_stream_work();

// The context a stream belongs to, which need not be the calling thread's: the driver's answer
// (cuStreamGetCtx); the calling thread's current one for the default streams, or when the driver
// has none to give (hooks_streams.cpp).
CUcontext stream_context(CUstream stream);

template <typename T>
void pick_stream(T arg, CUstream* stream, bool* has) {
  if (*has) return;
  if constexpr (std::is_same_v<T, CUstream>) {
    *stream = arg;
    *has = true;
  } else if constexpr (std::is_same_v<T, const CUlaunchConfig*>) {
    if (arg) {
      *stream = arg->hStream;
      *has = true;
    }
  }
}

// Does a call of this flavour with these arguments put work on the calling thread's per-thread
// default stream? The legacy flavour only when given CU_STREAM_PER_THREAD; the per-thread flavour
// (_ptsz, _ptds) also for stream 0, and always when it takes no stream (synchronous copies).
template <StreamFlavour F, typename... A>
bool on_per_thread_stream(A... args) {
  CUstream stream = nullptr;
  bool has = false;
  (pick_stream(args, &stream, &has), ...);
  if (stream == CU_STREAM_PER_THREAD) return true;
  if constexpr (F == StreamFlavour::PER_THREAD) return !has || stream == nullptr;
  return false;
}

template <HookId Id, StreamFlavour F, typename Sig>
struct WorkHook;
template <HookId Id, StreamFlavour F, typename... A>
struct WorkHook<Id, F, CUresult(A...)> {
  static CUresult call(trace::Path, A... args) {
    if (on_per_thread_stream<F>(args...)) note_per_thread_stream_work();
    auto real = reinterpret_cast<CUresult (*)(A...)>(real_function(Id));
    return real ? real(args...) : CUDA_ERROR_NOT_INITIALIZED;
  }
};

namespace impl {
#define CUPOOL_RUNTIME_HOOK(symbol) WithPath<decltype(::symbol)>::type symbol;
#define CUPOOL_DRIVER_HOOK(symbol, base, min_version, max_version, stream) \
  WithPath<decltype(::symbol)>::type symbol;
#define CUPOOL_WORK_HOOK(symbol, base, min_version, max_version, stream) \
  inline constexpr auto symbol = &WorkHook<HookId::symbol, StreamFlavour::stream, decltype(::symbol)>::call;
#define CUPOOL_NVML_HOOK(symbol) WithPath<decltype(::symbol)>::type symbol;
#include "hooks.def"
}  // namespace impl

// A distinct function per (hook, path): a pointer handed out by dlsym, cuGetProcAddress or
// cudaGetDriverEntryPoint tells the implementation which way it was reached.
template <auto Impl, trace::Path P>
struct PathThunk;
template <typename R, typename... A, R (*Impl)(trace::Path, A...), trace::Path P>
struct PathThunk<Impl, P> {
  static R call(A... args) { return Impl(P, args...); }
};

}  // namespace cupool::shim
