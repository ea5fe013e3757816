// Finding the real functions behind the hooks, and the wrapper table built from hooks.def.
#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <cstring>

#include "cuda_api.h"
#include "hook_table.h"
#include "hooks_internal.h"

namespace cupool::shim {
namespace {

std::atomic<void*> g_real[kHookCount];

// The wrapper a hook hands out on each path: the exported symbol itself, and one thunk per
// lookup path, so that the trace can say how the call arrived.
#define CUPOOL_WRAPPERS(symbol)                                                                \
  {nullptr, reinterpret_cast<void*>(&::symbol),                                               \
   reinterpret_cast<void*>(&PathThunk<&impl::symbol, trace::Path::dlsym>::call),              \
   reinterpret_cast<void*>(&PathThunk<&impl::symbol, trace::Path::proc_address>::call),       \
   reinterpret_cast<void*>(&PathThunk<&impl::symbol, trace::Path::entry_point>::call)}

// An NVML hook is reached by symbol or through dlsym only (cuGetProcAddress hands out driver hooks).
#define CUPOOL_NVML_WRAPPERS(symbol)                                                           \
  {nullptr, reinterpret_cast<void*>(&::symbol),                                               \
   reinterpret_cast<void*>(&PathThunk<&impl::symbol, trace::Path::dlsym>::call), nullptr, nullptr}

// A work hook's implementation is a generated function (impl::symbol is a pointer to it).
#define CUPOOL_WORK_WRAPPERS(symbol)                                                           \
  {nullptr, reinterpret_cast<void*>(&::symbol),                                               \
   reinterpret_cast<void*>(&PathThunk<impl::symbol, trace::Path::dlsym>::call),               \
   reinterpret_cast<void*>(&PathThunk<impl::symbol, trace::Path::proc_address>::call),        \
   reinterpret_cast<void*>(&PathThunk<impl::symbol, trace::Path::entry_point>::call)}

const HookEntry kHooks[kHookCount] = {
#define CUPOOL_RUNTIME_HOOK(symbol) \
  {#symbol, #symbol, 0, 0, StreamFlavour::ANY, HookKind::runtime, CUPOOL_WRAPPERS(symbol)},
#define CUPOOL_DRIVER_HOOK(symbol, base, min_version, max_version, stream) \
  {#symbol, #base, min_version, max_version, StreamFlavour::stream, HookKind::driver, CUPOOL_WRAPPERS(symbol)},
#define CUPOOL_WORK_HOOK(symbol, base, min_version, max_version, stream) \
  {#symbol, #base, min_version, max_version, StreamFlavour::stream, HookKind::driver, CUPOOL_WORK_WRAPPERS(symbol)},
#define CUPOOL_LOADER_HOOK(symbol) \
  {#symbol, #symbol, 0, 0, StreamFlavour::ANY, HookKind::loader, {nullptr, reinterpret_cast<void*>(&::symbol), reinterpret_cast<void*>(&::symbol), reinterpret_cast<void*>(&::symbol), reinterpret_cast<void*>(&::symbol)}},
#define CUPOOL_NVML_HOOK(symbol) \
  {#symbol, #symbol, 0, 0, StreamFlavour::ANY, HookKind::nvml, CUPOOL_NVML_WRAPPERS(symbol)},
#include "hooks.def"
};

// libcuda / libcudart / libnvidia-ml as this process loaded them; loaded by us only if `load`.
void* library_handle(const char* const* sonames, bool load) {
  for (const char* const* name = sonames; *name; ++name)
    if (void* h = dlopen(*name, RTLD_LAZY | RTLD_NOLOAD)) return h;
  return load ? dlopen(sonames[0], RTLD_LAZY | RTLD_LOCAL) : nullptr;
}
constexpr const char* kDriverSonames[] = {"libcuda.so.1", "libcuda.so", nullptr};
constexpr const char* kRuntimeSonames[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so", nullptr};
constexpr const char* kNvmlSonames[] = {"libnvidia-ml.so.1", "libnvidia-ml.so", nullptr};

void* resolve(const HookEntry& e) {
  DlsymFn dl = real_dlsym();
  if (e.kind == HookKind::loader) return reinterpret_cast<void*>(dl);
  if (void* fn = dl(RTLD_NEXT, e.symbol)) return fn;
  const bool driver = e.kind == HookKind::driver;
  // NVML is never loaded by cupool: a process that did not load it has asked it nothing.
  const char* const* sonames = driver ? kDriverSonames : e.kind == HookKind::nvml ? kNvmlSonames : kRuntimeSonames;
  void* h = library_handle(sonames, driver);
  return h ? dl(h, e.symbol) : nullptr;
}

}  // namespace

const HookEntry& hook(HookId id) { return kHooks[static_cast<int>(id)]; }

const HookEntry* find_hook_by_symbol(const char* symbol) {
  for (const HookEntry& e : kHooks)
    if (std::strcmp(e.symbol, symbol) == 0) return &e;
  return nullptr;
}

namespace {
// More names under which cuGetProcAddress hands out a driver hook (CUPOOL_DRIVER_ALIAS).
struct Alias {
  HookId id;
  const char* base_name;
  int min_version, max_version;
  StreamFlavour stream;
};
const Alias kAliases[] = {
#define CUPOOL_DRIVER_ALIAS(symbol, base, min_version, max_version, stream) \
  {HookId::symbol, #base, min_version, max_version, StreamFlavour::stream},
#include "hooks.def"
};

bool answers(const char* base_name, int version, bool per_thread, const char* name, int min_version, int max_version,
             StreamFlavour stream) {
  if (std::strcmp(name, base_name) != 0) return false;
  if (version < min_version || (max_version != 0 && version >= max_version)) return false;
  if (stream == StreamFlavour::PER_THREAD && !per_thread) return false;
  if (stream == StreamFlavour::LEGACY && per_thread) return false;
  return true;
}

}  // namespace

const HookEntry* find_proc_hook(const char* base_name, int version, unsigned long long flags) {
  const bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  for (const HookEntry& e : kHooks)
    if (e.kind == HookKind::driver &&
        answers(base_name, version, per_thread, e.base_name, e.min_version, e.max_version, e.stream))
      return &e;
  for (const Alias& a : kAliases)
    if (answers(base_name, version, per_thread, a.base_name, a.min_version, a.max_version, a.stream))
      return &hook(a.id);
  return nullptr;
}

const HookEntry* hook_of_wrapper(const void* fn) {
  for (const HookEntry& e : kHooks)
    for (void* w : e.wrapper)
      if (w != nullptr && w == fn) return &e;
  return nullptr;
}

HookId id_of(const HookEntry& entry) { return static_cast<HookId>(&entry - kHooks); }

void* real_function(HookId id) {
  std::atomic<void*>& slot = g_real[static_cast<int>(id)];
  void* fn = slot.load(std::memory_order_acquire);
  if (fn) return fn;
  fn = resolve(hook(id));
  if (fn == nullptr || is_wrapper(fn)) return nullptr;
  void* expected = nullptr;
  slot.compare_exchange_strong(expected, fn, std::memory_order_acq_rel);
  return slot.load(std::memory_order_acquire);
}

void learn_real_function(HookId id, void* fn) {
  if (fn == nullptr || is_wrapper(fn)) return;
  // NVML is the program's to load and unload (cupool never holds it open): after a dlclose and a
  // dlopen it may lie elsewhere, and the address the program looked up last is the live one.
  if (hook(id).kind == HookKind::nvml) {
    g_real[static_cast<int>(id)].store(fn, std::memory_order_release);
    return;
  }
  void* expected = nullptr;
  g_real[static_cast<int>(id)].compare_exchange_strong(expected, fn, std::memory_order_acq_rel);
}

DlsymFn real_dlsym() {
  static std::atomic<DlsymFn> cached{nullptr};
  DlsymFn fn = cached.load(std::memory_order_acquire);
  if (fn) return fn;
  // dlvsym does not go through dlsym, so this cannot recurse into our own hook. glibc 2.34
  // moved dlsym into libc with a new version; older ones only have the 2.2.5 version.
  fn = reinterpret_cast<DlsymFn>(dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34"));
  if (!fn) fn = reinterpret_cast<DlsymFn>(dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5"));
  cached.store(fn, std::memory_order_release);
  return fn;
}

void* driver_function(const char* symbol) {
  DlsymFn dl = real_dlsym();
  if (void* fn = dl(RTLD_NEXT, symbol)) return fn;
  void* h = library_handle(kDriverSonames, true);
  return h ? dl(h, symbol) : nullptr;
}

void* runtime_function(const char* symbol) {
  DlsymFn dl = real_dlsym();
  if (void* fn = dl(RTLD_NEXT, symbol)) return fn;
  void* h = library_handle(kRuntimeSonames, false);
  return h ? dl(h, symbol) : nullptr;
}

ObjectHandle::ObjectHandle(const void* addr) : ObjectHandle(object_of(addr)) {}

ObjectHandle::ObjectHandle(const link_map* object) : object_(object) {
  if (object == nullptr || object->l_name == nullptr) return;
  // The main program's link_map comes first and has an empty name: dlopen(NULL) is its handle.
  // Another without a path gives none (dlopen cannot name it).
  const bool main_program = object->l_name[0] == '\0' && object->l_prev == nullptr;
  if (main_program || object->l_name[0] != '\0')
    handle_ = dlopen(main_program ? nullptr : object->l_name, RTLD_LAZY | RTLD_NOLOAD);
}

ObjectHandle::~ObjectHandle() {
  if (handle_ != nullptr) dlclose(handle_);
}

void* ObjectHandle::own_symbol(const char* symbol) const {
  if (handle_ == nullptr) return nullptr;
  void* fn = real_dlsym()(handle_, symbol);
  return fn != nullptr && object_of(fn) == object_ ? fn : nullptr;
}

const link_map* object_of(const void* addr) {
  Dl_info info;
  link_map* map = nullptr;
  if (addr == nullptr || dladdr1(addr, &info, reinterpret_cast<void**>(&map), RTLD_DL_LINKMAP) == 0) return nullptr;
  return map;
}

void* nvml_function(const char* symbol, HookId beside) {
  DlsymFn dl = real_dlsym();
  // The NVML the process uses is the one holding the real function of `beside`: searched through
  // a real handle of that object (issue 25: a link_map is no handle for one loaded at start-up).
  if (void* sibling = real_function(beside)) {
    ObjectHandle nvml(sibling);
    if (void* fn = nvml.own_symbol(symbol)) return fn;
  }
  if (void* fn = dl(RTLD_NEXT, symbol)) return fn;
  void* h = library_handle(kNvmlSonames, false);
  if (h == nullptr) return nullptr;
  void* fn = dl(h, symbol);
  dlclose(h);  // NVML is the program's to unload: cupool holds no reference of its own
  return fn;
}

}  // namespace cupool::shim
