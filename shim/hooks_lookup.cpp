// The lookups by which a process finds CUDA functions without linking to them: dlsym (XLA,
// TensorFlow, the runtime itself, pynvml for NVML), cuGetProcAddress (the runtime, statically
// linked runtimes) and cudaGetDriverEntryPoint (PyTorch's expandable segments). Each hands out
// cupool's wrapper for a hooked function. They map on every call, also re-entered ones: the
// runtime's own first lookups happen inside an intercepted call, and a pointer it caches then is
// used for ever.
#include <dlfcn.h>
#include <link.h>

#include <cstring>

#include "cuda_api.h"
#include "hook_table.h"
#include "hooks_internal.h"

namespace cupool::shim {
namespace {

// Replaces a looked-up real function by cupool's wrapper for `path`, remembering the real one.
void redirect(const char* symbol, int version, unsigned long long flags, void** pfn, trace::Path path) {
  if (symbol == nullptr || pfn == nullptr || *pfn == nullptr) return;
  const HookEntry* entry = hook_of_wrapper(*pfn);  // an inner lookup already went through cupool
  if (entry == nullptr) {
    entry = find_proc_hook(symbol, version, flags);
    if (entry == nullptr) return;
    learn_real_function(id_of(*entry), *pfn);
  }
  *pfn = entry->wrapper[static_cast<int>(path)];
}

// dlsym(RTLD_NEXT, ...) means "after the caller", but the real dlsym would take cupool as the
// caller. cupool is preloaded, so "after cupool" is right for every caller but one that defines
// the name itself (an interposer looking for the next definition): for it, continue after the
// caller's object. (The common case stays a plain lookup: the sanitizer runtimes call dlsym
// while they start, before most of the loader's lookup structures can be used as handles.)
void* lookup_next(const void* caller, const char* name) {
  DlsymFn dl = real_dlsym();
  void* fn = dl(RTLD_NEXT, name);
  if (fn == nullptr) return nullptr;
  const link_map* caller_object = object_of(caller);
  if (caller_object == nullptr || caller_object != object_of(fn)) return fn;
  // The objects after the caller's, in load order, each searched through a real handle (a
  // link_map is none: issue 25). Reading the chain is safe; handing its links to dlsym is not.
  for (const link_map* m = caller_object->l_next; m != nullptr; m = m->l_next)
    if (void* next = ObjectHandle(m).own_symbol(name)) return next;
  return nullptr;
}

// Every hooked name starts "cu", "dl" or "nvml": other lookups skip the table's search.
bool may_be_hooked(const char* name) {
  return name[0] == 'c' || name[0] == 'd' || (name[0] == 'n' && std::strncmp(name, "nvml", 4) == 0);
}

}  // namespace
}  // namespace cupool::shim

using cupool::shim::HookId;
using cupool::shim::redirect;
using cupool::trace::Path;

extern "C" __attribute__((visibility("default"))) void* dlsym(void* handle, const char* name) {
  using namespace cupool::shim;
  void* fn = handle == RTLD_NEXT ? lookup_next(__builtin_return_address(0), name) : real_dlsym()(handle, name);
  if (fn == nullptr || !may_be_hooked(name)) return fn;
  const HookEntry* entry = hook_of_wrapper(fn);
  if (entry != nullptr && handle == RTLD_DEFAULT) {
    // The search found cupool's own export: without cupool it would have found the next
    // definition, or none (NVML, or CUDA, not loaded): the program must see the same.
    void* next = real_dlsym()(RTLD_NEXT, name);
    if (next == nullptr) return nullptr;
    learn_real_function(id_of(*entry), next);
  }
  if (entry == nullptr) {
    entry = find_hook_by_symbol(name);
    if (entry == nullptr || entry->kind == HookKind::loader) return fn;
    learn_real_function(id_of(*entry), fn);
  }
  return entry->wrapper[static_cast<int>(Path::dlsym)];
}

namespace cupool::shim::impl {

CUresult cuGetProcAddress(trace::Path, const char* symbol, void** pfn, int version, cuuint64_t flags) {
  auto real = CUPOOL_REAL(cuGetProcAddress);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  CUresult rc = real(symbol, pfn, version, flags);
  if (rc == CUDA_SUCCESS) redirect(symbol, version, flags, pfn, trace::Path::proc_address);
  return rc;
}

CUresult cuGetProcAddress_v2(trace::Path, const char* symbol, void** pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult* status) {
  auto real = CUPOOL_REAL(cuGetProcAddress_v2);
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;
  CUresult rc = real(symbol, pfn, version, flags, status);
  if (rc == CUDA_SUCCESS) redirect(symbol, version, flags, pfn, trace::Path::proc_address);
  return rc;
}

namespace {
// cudaGetDriverEntryPoint asks for the driver ABI of the runtime's own version.
constexpr int kRuntimeAbiVersion = CUDART_VERSION;
}  // namespace

namespace {
// The four cudaGetDriverEntryPoint flavours: the real lookup, then cupool's wrapper for what it
// found. `version`: the driver ABI asked for (the runtime's own for the unversioned ones).
template <typename Real, typename... Args>
cudaError_t entry_point(Real real, const char* symbol, void** funcPtr, int version, unsigned long long flags,
                        Args... args) {
  if (real == nullptr) return cudaErrorSymbolNotFound;
  const cudaError_t rc = real(symbol, funcPtr, args...);
  if (rc == cudaSuccess) redirect(symbol, version, flags, funcPtr, trace::Path::entry_point);
  return rc;
}
}  // namespace

cudaError_t cudaGetDriverEntryPoint(trace::Path, const char* symbol, void** funcPtr, unsigned long long flags,
                                    cudaDriverEntryPointQueryResult* status) {
  return entry_point(CUPOOL_REAL(cudaGetDriverEntryPoint), symbol, funcPtr, kRuntimeAbiVersion, flags, flags, status);
}

cudaError_t cudaGetDriverEntryPoint_ptsz(trace::Path, const char* symbol, void** funcPtr, unsigned long long flags,
                                         cudaDriverEntryPointQueryResult* status) {
  return entry_point(CUPOOL_REAL(cudaGetDriverEntryPoint_ptsz), symbol, funcPtr, kRuntimeAbiVersion, flags, flags,
                     status);
}

cudaError_t cudaGetDriverEntryPointByVersion(trace::Path, const char* symbol, void** funcPtr, unsigned int version,
                                             unsigned long long flags, cudaDriverEntryPointQueryResult* status) {
  return entry_point(CUPOOL_REAL(cudaGetDriverEntryPointByVersion), symbol, funcPtr, static_cast<int>(version), flags,
                     version, flags, status);
}

cudaError_t cudaGetDriverEntryPointByVersion_ptsz(trace::Path, const char* symbol, void** funcPtr,
                                                  unsigned int version, unsigned long long flags,
                                                  cudaDriverEntryPointQueryResult* status) {
  return entry_point(CUPOOL_REAL(cudaGetDriverEntryPointByVersion_ptsz), symbol, funcPtr, static_cast<int>(version),
                     flags, version, flags, status);
}

}  // namespace cupool::shim::impl
