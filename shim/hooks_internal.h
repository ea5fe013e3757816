// What the hook implementations share: each hook `X` has an implementation impl::X that takes
// the path the call came by first; the exported symbol and the per-path thunks call it.
#pragma once

#include "cuda_api.h"
#include "trace_schema.h"

namespace cupool::shim {

template <typename F>
struct WithPath;
template <typename R, typename... A>
struct WithPath<R(A...)> {
  using type = R(trace::Path, A...);
};

namespace impl {
#define CUPOOL_RUNTIME_HOOK(symbol) WithPath<decltype(::symbol)>::type symbol;
#define CUPOOL_DRIVER_HOOK(symbol, base, min_version, max_version, stream) \
  WithPath<decltype(::symbol)>::type symbol;
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
