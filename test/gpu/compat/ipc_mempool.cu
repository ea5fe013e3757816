// ipc_mempool: a stream-ordered memory pool shared with another process.
// The parent creates a pool with cudaMemHandleTypePosixFileDescriptor, allocates two buffers
// from it (cudaMallocFromPoolAsync), fills the first from an ordinary cudaMalloc'd buffer,
// exports the pool (cudaMemPoolExportToShareableHandle -> a file descriptor) and both pointers
// (cudaMemPoolExportPointer). A child (fork + exec of this binary, so CUDA starts afresh in it)
// receives the descriptor over a Unix socket (SCM_RIGHTS) with the export data, imports the pool
// and the pointers, sums the first buffer into a buffer of its own (cudaMalloc), writes
// answer[i] = data[i] * 2 + 5 into the second, frees the imported pointers with cudaFree and
// reports its return codes and sum. The parent checks the sum and the answer.
#include "ipc_util.h"

namespace {

constexpr int kN = 1 << 20;

struct Request {
  cudaMemPoolPtrExportData data, answer;
  int n;
};
struct Reply {
  char import_pool[48], import_data[48], import_answer[48], free_data[48], free_answer[48], pool_destroy[48];
  long long sum;
  int ok;
};

__global__ void k_fill(int* p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = (i * 3 + 1) % 100000;
}
__global__ void k_child(const int* data, int* answer, int n, unsigned long long* sum) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    answer[i] = data[i] * 2 + 5;
    atomicAdd(sum, static_cast<unsigned long long>(data[i]));
  }
}

long long expected_sum() {
  long long s = 0;
  for (int i = 0; i < kN; ++i) s += (i * 3 + 1) % 100000;
  return s;
}

int child_main(int sock) {
  compat::program_name() = "ipc_mempool(child)";
  dup2(2, 1);  // the parent's stdout is compared: the child reports through the socket only
  Request req;
  int fd = -1;
  if (!compat::recv_msg(sock, &req, sizeof req, &fd) || fd < 0) compat::die("child: no request or no descriptor");
  Reply rep{};
  CK(cudaSetDevice(0));
  cudaMemPool_t pool = nullptr;
  cudaError_t e = cudaMemPoolImportFromShareableHandle(&pool, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                                       cudaMemHandleTypePosixFileDescriptor, 0);
  compat::put(rep.import_pool, cudaGetErrorName(e));
  int *data = nullptr, *answer = nullptr;
  cudaError_t ed = cudaErrorUnknown, ea = cudaErrorUnknown;
  if (e == cudaSuccess) {
    ed = cudaMemPoolImportPointer(reinterpret_cast<void**>(&data), pool, &req.data);
    ea = cudaMemPoolImportPointer(reinterpret_cast<void**>(&answer), pool, &req.answer);
  }
  compat::put(rep.import_data, cudaGetErrorName(ed));
  compat::put(rep.import_answer, cudaGetErrorName(ea));
  rep.sum = -1;
  if (ed == cudaSuccess && ea == cudaSuccess) {
    unsigned long long* dsum = nullptr;
    CK(cudaMalloc(&dsum, sizeof *dsum));
    CK(cudaMemset(dsum, 0, sizeof *dsum));
    k_child<<<(req.n + 255) / 256, 256>>>(data, answer, req.n, dsum);
    CK_LAUNCH();
    CK(cudaDeviceSynchronize());
    unsigned long long s = 0;
    CK(cudaMemcpy(&s, dsum, sizeof s, cudaMemcpyDeviceToHost));
    rep.sum = static_cast<long long>(s);
    CK(cudaFree(dsum));
  }
  compat::put(rep.free_data, data ? cudaGetErrorName(cudaFree(data)) : "not_imported");
  compat::put(rep.free_answer, answer ? cudaGetErrorName(cudaFree(answer)) : "not_imported");
  compat::put(rep.pool_destroy, pool ? cudaGetErrorName(cudaMemPoolDestroy(pool)) : "not_imported");
  close(fd);
  rep.ok = e == cudaSuccess && ed == cudaSuccess && ea == cudaSuccess;
  compat::send_msg(sock, &rep, sizeof rep, -1);
  close(sock);
  return rep.ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "child") == 0) return child_main(std::atoi(argv[2]));
  compat::Verdict verdict("ipc_mempool");
  CK(cudaSetDevice(0));
  int supported = 0;
  CK(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolSupportedHandleTypes, 0));
  std::printf("pool_handle_types_include_posix_fd=%d\n", (supported & cudaMemHandleTypePosixFileDescriptor) ? 1 : 0);

  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypePosixFileDescriptor;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = 0;
  cudaMemPool_t pool;
  CK(cudaMemPoolCreate(&pool, &props));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int *src = nullptr, *data = nullptr, *answer = nullptr;
  CK(cudaMalloc(&src, kN * sizeof(int)));
  CK(cudaMallocFromPoolAsync(reinterpret_cast<void**>(&data), kN * sizeof(int), pool, s));
  CK(cudaMallocFromPoolAsync(reinterpret_cast<void**>(&answer), kN * sizeof(int), pool, s));
  k_fill<<<(kN + 255) / 256, 256, 0, s>>>(src, kN);
  CK_LAUNCH();
  CK(cudaMemcpyAsync(data, src, kN * sizeof(int), cudaMemcpyDeviceToDevice, s));
  CK(cudaMemsetAsync(answer, 0xFF, kN * sizeof(int), s));
  CK(cudaStreamSynchronize(s));

  int fd = -1;
  CK(cudaMemPoolExportToShareableHandle(&fd, pool, cudaMemHandleTypePosixFileDescriptor, 0));
  Request req{};
  CK(cudaMemPoolExportPointer(&req.data, data));
  CK(cudaMemPoolExportPointer(&req.answer, answer));
  req.n = kN;

  compat::Child child = compat::spawn_self("child");
  compat::send_msg(child.sock, &req, sizeof req, fd);
  Reply rep{};
  const bool got_reply = compat::recv_msg(child.sock, &rep, sizeof rep, nullptr);
  const int child_exit = compat::wait_child(child);
  close(fd);
  if (!got_reply) compat::put(rep.import_pool, "no reply");
  std::printf("child import_pool=%s import_data=%s import_answer=%s free_data=%s free_answer=%s pool_destroy=%s exit=%d\n",
              rep.import_pool, rep.import_data, rep.import_answer, rep.free_data, rep.free_answer, rep.pool_destroy,
              child_exit);
  const bool sum_ok = got_reply && rep.sum == expected_sum();
  std::vector<int> h(kN);
  CK(cudaMemcpyAsync(h.data(), answer, kN * sizeof(int), cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  bool answer_ok = true;
  for (int i = 0; i < kN && answer_ok; ++i) answer_ok = h[i] == ((i * 3 + 1) % 100000) * 2 + 5;
  std::printf("child_read_parent_data=%s parent_read_child_answer=%s\n", sum_ok ? "ok" : "WRONG", answer_ok ? "ok" : "WRONG");
  CK(cudaFreeAsync(data, s));
  CK(cudaFreeAsync(answer, s));
  CK(cudaStreamSynchronize(s));
  CK(cudaMemPoolDestroy(pool));
  CK(cudaFree(src));
  CK(cudaStreamDestroy(s));
  const bool ok = got_reply && rep.ok && child_exit == 0 && sum_ok && answer_ok;
  verdict.add("child_exit", child_exit);
  verdict.add("checks", 2);
  verdict.add("failed_checks", !sum_ok + !answer_ok);
  return verdict.finish(ok);
}
