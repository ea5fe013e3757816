// graph_memory: graph memory nodes and stream-ordered allocations.
//
// 0. cudaMallocAsync / kernel / cudaFreeAsync on a stream (no graph), 3 times, check.
// 1. Capture cudaMallocAsync + two kernels + cudaFreeAsync into a graph: the allocation must become
//    a memory node (the graph's node types are printed), launch 5 times with new input, check.
// 2. The same graph built by hand: cudaGraphAddMemAllocNode, two kernel nodes,
//    cudaGraphAddMemFreeNode; launch 3 times, check.
// 3. A graph whose allocation outlives the launch (alloc node, no free node): after the launch
//    the program allocates and writes an ordinary buffer (it must not overlap the graph's
//    memory), checks the graph's data, frees it with cudaFreeAsync outside the graph, launches
//    again, checks, frees again.
// 4. cudaDeviceGraphMemTrim at the end.
// cudaGraphMemAttrUsedMemCurrent is printed where the driver's answer is fixed: 0 at the start,
// after the first graph's launches (its allocation stays associated with the executable graph),
// and 0 after every graph is destroyed and the memory trimmed. Reserved sizes are not printed.
#include <map>
#include <string>

#include "common.h"

namespace {

constexpr int kN = 1 << 20;  // ints: 4 MiB per buffer
constexpr size_t kBytes = kN * sizeof(int);
constexpr int kGrid = (kN + 255) / 256;

__global__ void k_scale(const int* in, int* p, int n, int k) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = in[i] * 3 + k;
}
__global__ void k_finish(const int* p, int* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = p[i] + 1;
}

unsigned long long used_now() {
  unsigned long long v = 0;
  CK(cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemCurrent, &v));
  return v;
}

std::string node_types(cudaGraph_t g) {
  size_t n = 0;
  CK(cudaGraphGetNodes(g, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  CK(cudaGraphGetNodes(g, nodes.data(), &n));
  std::map<std::string, int> counts;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType t;
    CK(cudaGraphNodeGetType(node, &t));
    const char* name = t == cudaGraphNodeTypeKernel ? "kernel"
                       : t == cudaGraphNodeTypeMemAlloc ? "mem_alloc"
                       : t == cudaGraphNodeTypeMemFree ? "mem_free"
                       : t == cudaGraphNodeTypeMemset ? "memset"
                       : t == cudaGraphNodeTypeMemcpy ? "memcpy"
                       : t == cudaGraphNodeTypeEventRecord ? "event_record"
                       : t == cudaGraphNodeTypeWaitEvent ? "event_wait"
                       : t == cudaGraphNodeTypeEmpty ? "empty"
                       : "other";
    ++counts[name];
  }
  std::string s;
  for (const auto& kv : counts) s += (s.empty() ? "" : ",") + kv.first + ":" + std::to_string(kv.second);
  return s;
}

int* g_host_in = nullptr;   // pinned
int* g_host_out = nullptr;  // pinned

void set_input(int* d_in, cudaStream_t s, int seed) {
  for (int i = 0; i < kN; ++i) g_host_in[i] = (i * 7 + seed * 131) % 100003;
  CK(cudaMemcpyAsync(d_in, g_host_in, kBytes, cudaMemcpyHostToDevice, s));
}

// Copies out back and checks out[i] == in[i]*3 + k + 1 (the input still in g_host_in).
bool check_output(const int* d_out, cudaStream_t s, int k) {
  CK(cudaMemcpyAsync(g_host_out, d_out, kBytes, cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  for (int i = 0; i < kN; ++i)
    if (g_host_out[i] != g_host_in[i] * 3 + k + 1) return false;
  return true;
}

}  // namespace

int main() {
  compat::Verdict verdict("graph_memory");
  CK(cudaSetDevice(0));
  int failures = 0, checks = 0;
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaMallocHost(&g_host_in, kBytes));
  CK(cudaMallocHost(&g_host_out, kBytes));
  int *d_in = nullptr, *d_out = nullptr;
  CK(cudaMalloc(&d_in, kBytes));
  CK(cudaMalloc(&d_out, kBytes));
  k_scale<<<1, 32>>>(d_in, d_out, 32, 0);  // load the kernels before any capture
  k_finish<<<1, 32>>>(d_in, d_out, 32);
  CK_LAUNCH();
  CK(cudaDeviceSynchronize());
  std::printf("used_mem_current at_start=%llu\n", used_now());

  // 0. Stream-ordered allocation without a graph.
  for (int r = 0; r < 3; ++r) {
    set_input(d_in, s, 10 + r);
    int* p = nullptr;
    CK(cudaMallocAsync(&p, kBytes, s));
    k_scale<<<kGrid, 256, 0, s>>>(d_in, p, kN, r);
    k_finish<<<kGrid, 256, 0, s>>>(p, d_out, kN);
    CK_LAUNCH();
    CK(cudaFreeAsync(p, s));
    bool ok = check_output(d_out, s, r);
    ++checks;
    failures += !ok;
    std::printf("stream_ordered round=%d data=%s\n", r, ok ? "ok" : "WRONG");
  }

  // 1. Captured cudaMallocAsync / cudaFreeAsync.
  {
    const int k = 5;
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    int* p = nullptr;
    cudaError_t ma = cudaMallocAsync(&p, kBytes, s);
    k_scale<<<kGrid, 256, 0, s>>>(d_in, p, kN, k);
    k_finish<<<kGrid, 256, 0, s>>>(p, d_out, kN);
    cudaError_t fa = cudaFreeAsync(p, s);
    CK(cudaStreamEndCapture(s, &g));
    std::printf("captured malloc_async=%s free_async=%s nodes=%s\n", cudaGetErrorName(ma), cudaGetErrorName(fa),
                node_types(g).c_str());
    cudaGraphExec_t ge;
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int l = 0; l < 5; ++l) {
      set_input(d_in, s, 20 + l);
      CK(cudaGraphLaunch(ge, s));
      bool ok = check_output(d_out, s, k);
      ++checks;
      failures += !ok;
      std::printf("captured launch=%d data=%s\n", l, ok ? "ok" : "WRONG");
    }
    CK(cudaStreamSynchronize(s));
    std::printf("used_mem_current after_captured_graph_launches=%llu\n", used_now());
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
  }

  // 2. Built by hand.
  {
    const int k = 7;
    cudaGraph_t g;
    CK(cudaGraphCreate(&g, 0));
    cudaMemAllocNodeParams ap{};
    ap.poolProps.allocType = cudaMemAllocationTypePinned;
    ap.poolProps.location.type = cudaMemLocationTypeDevice;
    ap.poolProps.location.id = 0;
    ap.bytesize = kBytes;
    cudaGraphNode_t n_alloc, n_scale, n_finish, n_free;
    CK(cudaGraphAddMemAllocNode(&n_alloc, g, nullptr, 0, &ap));
    int* p = static_cast<int*>(ap.dptr);
    int n = kN, kk = k;
    void* scale_args[] = {&d_in, &p, &n, &kk};
    cudaKernelNodeParams kp{};
    kp.func = reinterpret_cast<void*>(k_scale);
    kp.gridDim = dim3(kGrid);
    kp.blockDim = dim3(256);
    kp.kernelParams = scale_args;
    CK(cudaGraphAddKernelNode(&n_scale, g, &n_alloc, 1, &kp));
    void* finish_args[] = {&p, &d_out, &n};
    kp.func = reinterpret_cast<void*>(k_finish);
    kp.kernelParams = finish_args;
    CK(cudaGraphAddKernelNode(&n_finish, g, &n_scale, 1, &kp));
    CK(cudaGraphAddMemFreeNode(&n_free, g, &n_finish, 1, p));
    std::printf("by_hand nodes=%s\n", node_types(g).c_str());
    cudaGraphExec_t ge;
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int l = 0; l < 3; ++l) {
      set_input(d_in, s, 30 + l);
      CK(cudaGraphLaunch(ge, s));
      bool ok = check_output(d_out, s, k);
      ++checks;
      failures += !ok;
      std::printf("by_hand launch=%d data=%s\n", l, ok ? "ok" : "WRONG");
    }
    CK(cudaStreamSynchronize(s));
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
  }

  // 3. An allocation that outlives the launch, freed outside the graph.
  {
    const int k = 11;
    cudaGraph_t g;
    CK(cudaGraphCreate(&g, 0));
    cudaMemAllocNodeParams ap{};
    ap.poolProps.allocType = cudaMemAllocationTypePinned;
    ap.poolProps.location.type = cudaMemLocationTypeDevice;
    ap.poolProps.location.id = 0;
    ap.bytesize = kBytes;
    cudaGraphNode_t n_alloc, n_scale;
    CK(cudaGraphAddMemAllocNode(&n_alloc, g, nullptr, 0, &ap));
    int* p = static_cast<int*>(ap.dptr);
    int n = kN, kk = k;
    void* scale_args[] = {&d_in, &p, &n, &kk};
    cudaKernelNodeParams kp{};
    kp.func = reinterpret_cast<void*>(k_scale);
    kp.gridDim = dim3(kGrid);
    kp.blockDim = dim3(256);
    kp.kernelParams = scale_args;
    CK(cudaGraphAddKernelNode(&n_scale, g, &n_alloc, 1, &kp));
    std::printf("outliving nodes=%s\n", node_types(g).c_str());
    cudaGraphExec_t ge;
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int l = 0; l < 2; ++l) {
      set_input(d_in, s, 40 + l);
      CK(cudaGraphLaunch(ge, s));
      CK(cudaStreamSynchronize(s));
      // Ordinary allocations while the graph's memory is live: they must not overlap it.
      int* other = nullptr;
      CK(cudaMalloc(&other, kBytes));
      CK(cudaMemset(other, 0x77, kBytes));
      int* other2 = nullptr;
      CK(cudaMalloc(&other2, 3 * kBytes));
      CK(cudaMemset(other2, 0x66, 3 * kBytes));
      CK(cudaDeviceSynchronize());
      k_finish<<<kGrid, 256, 0, s>>>(p, d_out, kN);
      CK_LAUNCH();
      bool ok = check_output(d_out, s, k);
      ++checks;
      failures += !ok;
      CK(cudaFreeAsync(p, s));
      CK(cudaStreamSynchronize(s));
      CK(cudaFree(other));
      CK(cudaFree(other2));
      std::printf("outliving launch=%d data_after_other_allocations=%s freed_outside=ok\n", l, ok ? "ok" : "WRONG");
    }
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
  }

  // 4. Trim.
  CK(cudaDeviceSynchronize());
  cudaError_t trim = cudaDeviceGraphMemTrim(0);
  std::printf("trim=%s used_mem_current after_trim=%llu\n", cudaGetErrorName(trim), used_now());
  if (trim != cudaSuccess) ++failures;
  CK(cudaFree(d_in));
  CK(cudaFree(d_out));
  CK(cudaFreeHost(g_host_in));
  CK(cudaFreeHost(g_host_out));
  CK(cudaStreamDestroy(s));
  verdict.add("checks", checks);
  verdict.add("failed_checks", failures);
  return verdict.finish(failures == 0);
}
