// Graph memory: a graph's memory nodes (cudaMallocAsync captured into a graph,
// cudaGraphAddMemAllocNode) take device memory from one pool per device that the driver fills
// when a graph is instantiated, uploaded or launched, and keeps until cuDeviceGraphMemTrim. No
// cuMemAlloc is involved, so cupool asks the driver what it reserves
// (CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) after each of those calls and charges the change
// against the cap and the shared budget; before them, it admits the most the call could add: the
// graph's allocation nodes beyond what the pool has reserved and unused. docs/design.md, "Graph
// memory".
#include <mutex>
#include <unordered_map>
#include <vector>

#include "context_pool.h"
#include "driver_calls.h"
#include "hook_table.h"
#include "hooks_internal.h"
#include "log.h"
#include "shim_state.h"
#include "streams.h"
#include "thread_id.h"
#include "units.h"

namespace cupool::shim {
namespace {

using trace::Path;

// The bytes of every allocation node of `graph`, child graphs included.
std::uint64_t allocation_bytes(CUgraph graph, int depth = 0) {
  const DriverCalls& g = driver();  // the graph-walking calls are optional: a driver without them is not sized
  if (!g.graph_get_nodes || !g.graph_node_get_type || !g.graph_mem_alloc_node_get_params || graph == nullptr ||
      depth > 16)
    return 0;
  size_t count = 0;
  if (g.graph_get_nodes(graph, nullptr, &count) != CUDA_SUCCESS || count == 0) return 0;
  std::vector<CUgraphNode> nodes(count);
  if (g.graph_get_nodes(graph, nodes.data(), &count) != CUDA_SUCCESS) return 0;
  std::uint64_t bytes = 0;
  for (CUgraphNode n : nodes) {
    CUgraphNodeType type;
    if (g.graph_node_get_type(n, &type) != CUDA_SUCCESS) continue;
    if (type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
      CUDA_MEM_ALLOC_NODE_PARAMS params{};
      if (g.graph_mem_alloc_node_get_params(n, &params) == CUDA_SUCCESS) bytes += params.bytesize;
    } else if (type == CU_GRAPH_NODE_TYPE_GRAPH && g.graph_child_graph_node_get_graph) {
      CUgraph child = nullptr;
      if (g.graph_child_graph_node_get_graph(n, &child) == CUDA_SUCCESS) bytes += allocation_bytes(child, depth + 1);
    }
  }
  return bytes;
}

constexpr int kMaxDevices = 64;

class GraphMemory {
 public:
  void instantiated(CUgraphExec exec, std::uint64_t bytes) {
    std::lock_guard lock(mu_);
    if (bytes) exec_bytes_[exec] = bytes;
  }
  void destroyed(CUgraphExec exec) {
    std::lock_guard lock(mu_);
    exec_bytes_.erase(exec);
  }
  std::uint64_t bytes_of(CUgraphExec exec) {
    std::lock_guard lock(mu_);
    auto it = exec_bytes_.find(exec);
    return it == exec_bytes_.end() ? 0 : it->second;
  }

  // The most a call that needs `bytes` of graph allocations could add to the reservation.
  static std::uint64_t could_add(int device, std::uint64_t bytes) {
    std::uint64_t reserved = 0, used = 0;
    if (!read(device, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &reserved) ||
        !read(device, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &used))
      return 0;
    const std::uint64_t idle = reserved > used ? reserved - used : 0;
    return bytes > idle ? bytes - idle : 0;
  }

  // After a call that may have changed the reservation: the pool's charge follows the driver's
  // figure. One event when it changed.
  void settle(ContextMemory* cp, const char* api, Path path, int rc) {
    if (cp == nullptr || cp->device < 0 || cp->device >= kMaxDevices) return;
    std::uint64_t reserved = 0;
    if (!read(cp->device, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &reserved)) return;
    std::lock_guard lock(mu_);
    Account& a = accounts_[cp->device];
    if (a.pool && a.pool != cp) {  // the charge follows the context that touched it last
      process_memory().unadmit_outside(*a.pool, a.charged);
      a.charged = 0;
    }
    a.pool = cp;
    if (reserved == a.charged) return;
    if (reserved > a.charged) process_memory().charge_outside(*cp, reserved - a.charged);
    else process_memory().unadmit_outside(*cp, a.charged - reserved);
    a.charged = reserved;
    if (tracing()) {
      trace::Record r;
      r.t_ns = now_ns();
      r.kind = trace::EventKind::graph_mem;
      r.api = api;
      r.path = path;
      r.size = reserved;
      r.rc = rc;
      r.tid = current_thread_id();
      r.device = static_cast<std::int16_t>(cp->device);
      emit(r);
    }
  }

  void dropped(ContextMemory& cp) {
    if (cp.device < 0 || cp.device >= kMaxDevices) return;
    std::lock_guard lock(mu_);
    Account& a = accounts_[cp.device];
    if (a.pool != &cp) return;
    process_memory().unadmit_outside(cp, a.charged);
    a = Account{};
  }

 private:
  static bool read(int device, CUgraphMem_attribute attr, std::uint64_t* value) {
    auto get = driver().device_get_graph_mem_attribute;
    cuuint64_t v = 0;
    if (get == nullptr || get(device, attr, &v) != CUDA_SUCCESS) return false;
    *value = v;
    return true;
  }
  struct Account {
    ContextMemory* pool = nullptr;
    std::uint64_t charged = 0;
  };
  std::mutex mu_;
  std::unordered_map<CUgraphExec, std::uint64_t> exec_bytes_;
  Account accounts_[kMaxDevices];
};

GraphMemory& graph_memory() {
  static auto* g = new GraphMemory;  // never destroyed: hooks may run during exit
  return *g;
}

ContextMemory* this_context_pool() {
  CUresult rc = CUDA_SUCCESS;
  return current_pool(&rc);
}

// A call that may make the driver reserve graph memory for `bytes` of allocation nodes: admitted
// against the cap first (the most it could add is charged meanwhile), then settled against what
// the driver reports. A refusal is the driver's own answer to a graph it cannot fit.
template <typename Call>
CUresult with_graph_memory(Path path, const char* api, std::uint64_t bytes, Call&& call) {
  HookScope scope;
  if (!scope.outermost()) return call();
  initialize();
  ContextMemory* cp = bytes ? this_context_pool() : nullptr;
  std::uint64_t admitted = 0;
  if (cp) {
    admitted = GraphMemory::could_add(cp->device, bytes);
    if (admitted && process_memory().admit_outside(*cp, admitted, api) != OutsideAnswer::ok) {
      graph_memory().settle(cp, api, path, CUDA_ERROR_OUT_OF_MEMORY);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  const CUresult rc = call();
  if (cp) {
    if (admitted) process_memory().unadmit_outside(*cp, admitted);
    graph_memory().settle(cp, api, path, rc);
  }
  return rc;
}

}  // namespace

void drop_graph_memory(ContextMemory& cp) { graph_memory().dropped(cp); }

namespace impl {

CUresult cuGraphInstantiateWithFlags(Path path, CUgraphExec* exec, CUgraph graph, unsigned long long flags) {
  auto real = CUPOOL_REAL(cuGraphInstantiateWithFlags);
  const std::uint64_t bytes = allocation_bytes(graph);
  const CUresult rc = with_graph_memory(path, "cuGraphInstantiateWithFlags", bytes, [&] {
    return real ? real(exec, graph, flags) : CUDA_ERROR_NOT_INITIALIZED;
  });
  if (rc == CUDA_SUCCESS && exec) graph_memory().instantiated(*exec, bytes);
  return rc;
}

namespace {
template <typename Real>
CUresult instantiate_with_params(Path path, const char* api, Real real, CUgraphExec* exec, CUgraph graph,
                                 CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  const std::uint64_t bytes = allocation_bytes(graph);
  const CUresult rc = with_graph_memory(path, api, bytes, [&] {
    return real ? real(exec, graph, params) : CUDA_ERROR_NOT_INITIALIZED;
  });
  if (rc == CUDA_SUCCESS && exec) graph_memory().instantiated(*exec, bytes);
  return rc;
}

template <typename Real>
CUresult launch_or_upload(Path path, const char* api, Real real, CUgraphExec exec, CUstream stream, bool per_thread) {
  if (stream == CU_STREAM_PER_THREAD || (per_thread && stream == nullptr)) note_per_thread_stream_work();
  return with_graph_memory(path, api, graph_memory().bytes_of(exec),
                           [&] { return real ? real(exec, stream) : CUDA_ERROR_NOT_INITIALIZED; });
}
}  // namespace

CUresult cuGraphInstantiateWithParams(Path path, CUgraphExec* exec, CUgraph graph,
                                      CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  return instantiate_with_params(path, "cuGraphInstantiateWithParams", CUPOOL_REAL(cuGraphInstantiateWithParams),
                                 exec, graph, params);
}

CUresult cuGraphInstantiateWithParams_ptsz(Path path, CUgraphExec* exec, CUgraph graph,
                                           CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  return instantiate_with_params(path, "cuGraphInstantiateWithParams_ptsz",
                                 CUPOOL_REAL(cuGraphInstantiateWithParams_ptsz), exec, graph, params);
}

CUresult cuGraphLaunch(Path path, CUgraphExec exec, CUstream stream) {
  return launch_or_upload(path, "cuGraphLaunch", CUPOOL_REAL(cuGraphLaunch), exec, stream, false);
}

CUresult cuGraphLaunch_ptsz(Path path, CUgraphExec exec, CUstream stream) {
  return launch_or_upload(path, "cuGraphLaunch_ptsz", CUPOOL_REAL(cuGraphLaunch_ptsz), exec, stream, true);
}

CUresult cuGraphUpload(Path path, CUgraphExec exec, CUstream stream) {
  return launch_or_upload(path, "cuGraphUpload", CUPOOL_REAL(cuGraphUpload), exec, stream, false);
}

CUresult cuGraphUpload_ptsz(Path path, CUgraphExec exec, CUstream stream) {
  return launch_or_upload(path, "cuGraphUpload_ptsz", CUPOOL_REAL(cuGraphUpload_ptsz), exec, stream, true);
}

// The reservation outlives the graph (until a trim): only the graph's size is forgotten.
CUresult cuGraphExecDestroy(Path, CUgraphExec exec) {
  auto real = CUPOOL_REAL(cuGraphExecDestroy);
  graph_memory().destroyed(exec);
  return real ? real(exec) : CUDA_ERROR_NOT_INITIALIZED;
}

CUresult cuDeviceGraphMemTrim(Path path, CUdevice device) {
  auto real = CUPOOL_REAL(cuDeviceGraphMemTrim);
  HookScope scope;
  const CUresult rc = real ? real(device) : CUDA_ERROR_NOT_INITIALIZED;
  if (scope.outermost()) {
    initialize();
    ContextMemory* cp = this_context_pool();
    if (cp && cp->device == device) graph_memory().settle(cp, "cuDeviceGraphMemTrim", path, rc);
  }
  return rc;
}

}  // namespace impl
}  // namespace cupool::shim
