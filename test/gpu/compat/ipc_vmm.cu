// ipc_vmm: virtual-memory allocations shared with another process through a file descriptor.
// The parent makes physical memory with cuMemCreate (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
// reserves an address range, maps it and sets access (cuMemAddressReserve, cuMemMap,
// cuMemSetAccess), writes data into the first half, exports the handle
// (cuMemExportToShareableHandle -> fd). A child (fork + exec of this binary) gets the fd over a
// Unix socket (SCM_RIGHTS), imports it (cuMemImportFromShareableHandle), reserves, maps, sets
// access, sums the first half into a cudaMalloc'd buffer of its own, writes
// answer[i] = data[i] * 2 + 5 into the second half, unmaps and releases, and reports its return
// codes and sum. The parent checks both, then unmaps and releases its own mapping.
#include <cuda.h>

#include "ipc_util.h"

namespace {

constexpr size_t kWant = size_t{8} << 20;

struct Request {
  unsigned long long size;
  int n;  // ints in each half
};
struct Reply {
  char import_handle[48], reserve[48], map[48], set_access[48], unmap[48], release[48], address_free[48];
  long long sum;
  int ok;
};

const char* D(CUresult r) {
  const char* s = nullptr;
  if (cuGetErrorName(r, &s) != CUDA_SUCCESS || !s) return "unknown CUresult";
  return s;
}
void ckd(CUresult r, const char* what, int line) {
  if (r != CUDA_SUCCESS) compat::die("%s returned %s (line %d)", what, D(r), line);
}
#define CKD(x) ckd((x), #x, __LINE__)

__global__ void k_fill(int* p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = (i * 5 + 2) % 99991;
}
__global__ void k_child(const int* data, int* answer, int n, unsigned long long* sum) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    answer[i] = data[i] * 2 + 5;
    atomicAdd(sum, static_cast<unsigned long long>(data[i]));
  }
}

CUmemAllocationProp device_prop() {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

int child_main(int sock) {
  compat::program_name() = "ipc_vmm(child)";
  dup2(2, 1);  // the parent's stdout is compared: the child reports through the socket only
  Request req;
  int fd = -1;
  if (!compat::recv_msg(sock, &req, sizeof req, &fd) || fd < 0) compat::die("child: no request or no descriptor");
  Reply rep{};
  rep.sum = -1;
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));  // the runtime's primary context is current from here on
  CUmemGenericAllocationHandle h = 0;
  CUresult ri = cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  compat::put(rep.import_handle, D(ri));
  CUdeviceptr va = 0;
  CUresult rr = CUDA_ERROR_UNKNOWN, rm = CUDA_ERROR_UNKNOWN, ra = CUDA_ERROR_UNKNOWN;
  if (ri == CUDA_SUCCESS) {
    rr = cuMemAddressReserve(&va, req.size, 0, 0, 0);
    if (rr == CUDA_SUCCESS) rm = cuMemMap(va, req.size, 0, h, 0);
    if (rm == CUDA_SUCCESS) {
      CUmemAccessDesc acc{};
      acc.location = device_prop().location;
      acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      ra = cuMemSetAccess(va, req.size, &acc, 1);
    }
  }
  compat::put(rep.reserve, D(rr));
  compat::put(rep.map, D(rm));
  compat::put(rep.set_access, D(ra));
  if (ra == CUDA_SUCCESS) {
    unsigned long long* dsum = nullptr;
    CK(cudaMalloc(&dsum, sizeof *dsum));
    CK(cudaMemset(dsum, 0, sizeof *dsum));
    const int* data = reinterpret_cast<const int*>(va);
    int* answer = reinterpret_cast<int*>(va) + req.n;
    k_child<<<(req.n + 255) / 256, 256>>>(data, answer, req.n, dsum);
    CK_LAUNCH();
    CK(cudaDeviceSynchronize());
    unsigned long long s = 0;
    CK(cudaMemcpy(&s, dsum, sizeof s, cudaMemcpyDeviceToHost));
    rep.sum = static_cast<long long>(s);
    CK(cudaFree(dsum));
  }
  compat::put(rep.unmap, rm == CUDA_SUCCESS ? D(cuMemUnmap(va, req.size)) : "not_mapped");
  compat::put(rep.release, ri == CUDA_SUCCESS ? D(cuMemRelease(h)) : "not_imported");
  compat::put(rep.address_free, rr == CUDA_SUCCESS ? D(cuMemAddressFree(va, req.size)) : "not_reserved");
  close(fd);
  rep.ok = ri == CUDA_SUCCESS && rr == CUDA_SUCCESS && rm == CUDA_SUCCESS && ra == CUDA_SUCCESS;
  compat::send_msg(sock, &rep, sizeof rep, -1);
  close(sock);
  return rep.ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "child") == 0) return child_main(std::atoi(argv[2]));
  compat::Verdict verdict("ipc_vmm");
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));
  CUdevice dev;
  CKD(cuDeviceGet(&dev, 0));
  int vmm = 0, fd_ok = 0;
  CKD(cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev));
  CKD(cuDeviceGetAttribute(&fd_ok, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev));
  std::printf("vmm_supported=%d posix_fd_supported=%d\n", vmm, fd_ok);

  CUmemAllocationProp prop = device_prop();
  size_t gran = 0;
  CKD(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  const size_t size = (kWant + gran - 1) / gran * gran;
  const int n = static_cast<int>(size / 2 / sizeof(int));
  CUmemGenericAllocationHandle h;
  CKD(cuMemCreate(&h, size, &prop, 0));
  CUdeviceptr va = 0;
  CKD(cuMemAddressReserve(&va, size, 0, 0, 0));
  CKD(cuMemMap(va, size, 0, h, 0));
  CUmemAccessDesc acc{};
  acc.location = prop.location;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CKD(cuMemSetAccess(va, size, &acc, 1));
  int* data = reinterpret_cast<int*>(va);
  int* answer = data + n;
  k_fill<<<(n + 255) / 256, 256>>>(data, n);
  CK_LAUNCH();
  CK(cudaMemset(answer, 0xFF, n * sizeof(int)));
  CK(cudaDeviceSynchronize());
  int fd = -1;
  CKD(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));

  compat::Child child = compat::spawn_self("child");
  Request req{size, n};
  compat::send_msg(child.sock, &req, sizeof req, fd);
  Reply rep{};
  const bool got_reply = compat::recv_msg(child.sock, &rep, sizeof rep, nullptr);
  const int child_exit = compat::wait_child(child);
  close(fd);
  if (!got_reply) compat::put(rep.import_handle, "no reply");
  std::printf("child import=%s reserve=%s map=%s set_access=%s unmap=%s release=%s address_free=%s exit=%d\n",
              rep.import_handle, rep.reserve, rep.map, rep.set_access, rep.unmap, rep.release, rep.address_free, child_exit);
  long long expect = 0;
  for (int i = 0; i < n; ++i) expect += (i * 5 + 2) % 99991;
  const bool sum_ok = got_reply && rep.sum == expect;
  std::vector<int> hbuf(n);
  CK(cudaMemcpy(hbuf.data(), answer, n * sizeof(int), cudaMemcpyDeviceToHost));
  bool answer_ok = true;
  for (int i = 0; i < n && answer_ok; ++i) answer_ok = hbuf[i] == ((i * 5 + 2) % 99991) * 2 + 5;
  std::printf("child_read_parent_data=%s parent_read_child_answer=%s\n", sum_ok ? "ok" : "WRONG", answer_ok ? "ok" : "WRONG");
  CKD(cuMemUnmap(va, size));
  CKD(cuMemRelease(h));
  CKD(cuMemAddressFree(va, size));
  const bool ok = got_reply && rep.ok && child_exit == 0 && sum_ok && answer_ok;
  verdict.add("child_exit", child_exit);
  verdict.add("checks", 2);
  verdict.add("failed_checks", !sum_ok + !answer_ok);
  return verdict.finish(ok);
}
