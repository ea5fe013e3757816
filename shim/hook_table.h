// The table generated from hooks.def: one entry per hook, with the wrapper handed out on each
// path and the slot that holds the real function behind it.
#pragma once

#include <atomic>
#include <cstddef>

#include "trace_schema.h"

struct link_map;

namespace cupool::shim {

enum class HookId : int {
#define CUPOOL_RUNTIME_HOOK(symbol) symbol,
#define CUPOOL_DRIVER_HOOK(symbol, base, min_version, max_version, stream) symbol,
#define CUPOOL_WORK_HOOK(symbol, base, min_version, max_version, stream) symbol,
#define CUPOOL_LOADER_HOOK(symbol) symbol,
#define CUPOOL_NVML_HOOK(symbol) symbol,
#include "hooks.def"
  count_
};
inline constexpr std::size_t kHookCount = static_cast<std::size_t>(HookId::count_);

enum class HookKind : unsigned char { runtime, driver, loader, nvml };  // work hooks are driver hooks
enum class StreamFlavour : unsigned char { ANY, LEGACY, PER_THREAD };

struct HookEntry {
  const char* symbol;
  const char* base_name;  // the name cuGetProcAddress is asked for (driver hooks)
  int min_version;
  int max_version;  // 0: no upper bound
  StreamFlavour stream;
  HookKind kind;
  // The wrapper for each way in, indexed by trace::Path (none unused). symbol == the export.
  void* wrapper[static_cast<int>(trace::Path::count_)];
};

const HookEntry& hook(HookId id);
const HookEntry* find_hook_by_symbol(const char* symbol);
// The driver hook that cuGetProcAddress(base_name, version, flags) must answer with, if any.
const HookEntry* find_proc_hook(const char* base_name, int version, unsigned long long flags);
// The hook whose wrapper (on any path) `fn` is, or nullptr.
const HookEntry* hook_of_wrapper(const void* fn);
inline bool is_wrapper(const void* fn) { return hook_of_wrapper(fn) != nullptr; }
HookId id_of(const HookEntry& entry);

// The real function behind a hook: found on first use (RTLD_NEXT, then the loaded libcuda,
// libcudart or libnvidia-ml), or learnt from a lookup the process made (dlsym,
// cuGetProcAddress). nullptr if the library is not there at all.
void* real_function(HookId id);
// Remember `fn` as the real function for `id` if none is known yet.
void learn_real_function(HookId id, void* fn);

// The loader's own dlsym, found without calling dlsym.
using DlsymFn = void* (*)(void*, const char*);
DlsymFn real_dlsym();

// A driver function cupool calls itself but does not hook (cuCtxSynchronize, cuEventRecord...).
void* driver_function(const char* symbol);
// A runtime function of the process's shared runtime (nullptr if it has none: a static runtime).
void* runtime_function(const char* symbol);
// An NVML function cupool calls itself but does not hook: from the library that holds the real
// function of `beside` (the process may have dlopened it locally), else the loaded libnvidia-ml.
// nullptr if the process has not loaded NVML.
void* nvml_function(const char* symbol, HookId beside);

// A handle the dynamic linker can search, for the loaded object that holds an address: always
// dlopen(its path, RTLD_NOLOAD), never its link_map. A link_map of an object loaded at start-up
// (DT_NEEDED) has an empty search list, and glibc's dlsym faults on it (issue 25: every program
// linked against NVML crashed in its first memory query). Closed again when this goes.
class ObjectHandle {
 public:
  explicit ObjectHandle(const void* addr);
  explicit ObjectHandle(const link_map* object);
  ~ObjectHandle();
  ObjectHandle(const ObjectHandle&) = delete;
  ObjectHandle& operator=(const ObjectHandle&) = delete;
  // `symbol` as this object itself defines it (a definition found in one of its dependencies
  // does not count); nullptr if it has none or no handle could be had.
  void* own_symbol(const char* symbol) const;

 private:
  const link_map* object_ = nullptr;
  void* handle_ = nullptr;
};
// The loaded object holding `addr` (to compare objects only: never a handle).
const link_map* object_of(const void* addr);

}  // namespace cupool::shim

// Calls the real function of a hook with the hook's own signature.
#define CUPOOL_REAL(symbol) \
  (reinterpret_cast<decltype(&::symbol)>(::cupool::shim::real_function(::cupool::shim::HookId::symbol)))
