// last_error: the return codes of refused allocations and the runtime's last-error state after
// them (cudaPeekAtLastError / cudaGetLastError), which a library that answers allocations itself
// must reproduce.
//
// For cudaMalloc, cudaMallocManaged, cudaMallocAsync, cudaMallocPitch, cudaMalloc3DArray and
// cudaMallocHost: a request that cannot fit (2^50 bytes; for pitch and 3D arrays dimensions of
// that order), then the code's name, cudaPeekAtLastError, cudaGetLastError and cudaGetLastError
// again. Then a refused cudaMalloc followed by a successful one: the last error still holds the
// refusal until cudaGetLastError clears it (checked). The driver API: cuMemAlloc, cuMemAllocManaged,
// cuMemAllocPitch, cuMemAllocAsync with impossible sizes (CUresult names), after which the
// runtime's last error is still clear.
// `last_error --versions` prints the runtime's and the driver's CUDA versions and exits.
#include <cuda.h>

#include "common.h"

namespace {

const size_t kHuge = size_t{1} << 50;
int g_checks = 0, g_failures = 0;

const char* E(cudaError_t e) { return cudaGetErrorName(e); }
const char* D(CUresult r) {
  const char* s = nullptr;
  if (cuGetErrorName(r, &s) != CUDA_SUCCESS || !s) return "unknown CUresult";
  return s;
}

// Prints the call's code and the last-error state after it; the call must have failed and the
// two reads of cudaGetLastError must leave the state clear.
void show(const char* what, cudaError_t rc) {
  cudaError_t peek = cudaPeekAtLastError();
  cudaError_t get = cudaGetLastError();
  cudaError_t get2 = cudaGetLastError();
  std::printf("%s rc=%s peek=%s get=%s get_again=%s\n", what, E(rc), E(peek), E(get), E(get2));
  ++g_checks;
  if (rc == cudaSuccess || get2 != cudaSuccess) {
    ++g_failures;
    std::printf("ERROR: %s: %s\n", what, rc == cudaSuccess ? "an impossible request succeeded" : "the last error did not clear");
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--versions") == 0) {
    int rt = 0, drv = 0;
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv);
    std::printf("cuda_runtime=%d cuda_driver=%d\n", rt, drv);
    return 0;
  }
  compat::Verdict verdict("last_error");
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));
  CK(cudaGetLastError());

  {
    void* p = nullptr;
    cudaError_t rc = cudaMalloc(&p, kHuge);
    show("cudaMalloc(2^50)", rc);
    if (rc == cudaSuccess) cudaFree(p);
  }
  {
    void* p = nullptr;
    cudaError_t rc = cudaMallocManaged(&p, kHuge);
    show("cudaMallocManaged(2^50)", rc);
    if (rc == cudaSuccess) cudaFree(p);
  }
  {
    void* p = nullptr;
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaError_t rc = cudaMallocAsync(&p, kHuge, s);
    cudaError_t sync = cudaStreamSynchronize(s);
    show("cudaMallocAsync(2^50)", rc);
    std::printf("  stream_synchronize_after=%s\n", E(sync));
    if (rc == cudaSuccess) cudaFreeAsync(p, s);
    CK(cudaStreamDestroy(s));
    cudaGetLastError();
  }
  {
    void* p = nullptr;
    size_t pitch = 0;
    cudaError_t rc = cudaMallocPitch(&p, &pitch, size_t{1} << 25, size_t{1} << 25);
    show("cudaMallocPitch(2^25 x 2^25)", rc);
    if (rc == cudaSuccess) cudaFree(p);
  }
  {
    cudaArray_t a = nullptr;
    cudaChannelFormatDesc d = cudaCreateChannelDesc<float>();
    cudaError_t rc = cudaMalloc3DArray(&a, &d, make_cudaExtent(16384, 16384, 2048));
    show("cudaMalloc3DArray(16384x16384x2048 float)", rc);
    if (rc == cudaSuccess) cudaFreeArray(a);
  }
  {
    void* p = nullptr;
    cudaError_t rc = cudaMallocHost(&p, kHuge);
    show("cudaMallocHost(2^50)", rc);
    if (rc == cudaSuccess) cudaFreeHost(p);
  }
  // A refusal, then a success: the last error keeps the refusal until it is read.
  {
    void* p = nullptr;
    void* q = nullptr;
    cudaError_t fail = cudaMalloc(&p, kHuge);
    cudaError_t ok = cudaMalloc(&q, 1 << 20);
    cudaError_t peek = cudaPeekAtLastError();
    cudaError_t get = cudaGetLastError();
    cudaError_t peek_after = cudaPeekAtLastError();
    std::printf("refused_then_ok refused=%s ok=%s peek=%s get=%s peek_after_get=%s\n", E(fail), E(ok), E(peek), E(get),
                E(peek_after));
    ++g_checks;
    if (fail == cudaSuccess || ok != cudaSuccess || peek_after != cudaSuccess) {
      ++g_failures;
      std::printf("ERROR: refused_then_ok: the refusal, the success or the clearing was not as required\n");
    }
    // The memory of the success is usable.
    if (ok == cudaSuccess) {
      CK(cudaMemset(q, 0x3C, 1 << 20));
      std::vector<unsigned char> h(1 << 20);
      CK(cudaMemcpy(h.data(), q, h.size(), cudaMemcpyDeviceToHost));
      bool good = true;
      for (unsigned char c : h) good = good && c == 0x3C;
      std::printf("refused_then_ok buffer_usable=%d\n", good ? 1 : 0);
      ++g_checks;
      g_failures += !good;
      CK(cudaFree(q));
    }
    if (fail == cudaSuccess) cudaFree(p);
  }
  // Successful calls after a cleared error leave it clear.
  {
    void* q = nullptr;
    CK(cudaMalloc(&q, 4096));
    CK(cudaFree(q));
    cudaError_t peek = cudaPeekAtLastError();
    std::printf("after_successes peek=%s\n", E(peek));
    ++g_checks;
    g_failures += peek != cudaSuccess;
  }
  // The driver API.
  {
    CUdeviceptr d = 0;
    size_t pitch = 0;
    CUresult r1 = cuMemAlloc(&d, kHuge);
    if (r1 == CUDA_SUCCESS) cuMemFree(d);
    CUresult r2 = cuMemAllocManaged(&d, kHuge, CU_MEM_ATTACH_GLOBAL);
    if (r2 == CUDA_SUCCESS) cuMemFree(d);
    CUresult r3 = cuMemAllocPitch(&d, &pitch, size_t{1} << 25, size_t{1} << 25, 4);
    if (r3 == CUDA_SUCCESS) cuMemFree(d);
    CUstream cs;
    if (cuStreamCreate(&cs, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) compat::die("cuStreamCreate failed");
    CUresult r4 = cuMemAllocAsync(&d, kHuge, cs);
    if (r4 == CUDA_SUCCESS) cuMemFreeAsync(d, cs);
    CUresult r4s = cuStreamSynchronize(cs);
    cuStreamDestroy(cs);
    CUdeviceptr small = 0;
    CUresult r5 = cuMemAlloc(&small, 1 << 20);
    CUresult r6 = r5 == CUDA_SUCCESS ? cuMemFree(small) : CUDA_ERROR_NOT_PERMITTED;
    cudaError_t peek = cudaPeekAtLastError();
    std::printf("driver cuMemAlloc(2^50)=%s cuMemAllocManaged(2^50)=%s cuMemAllocPitch(2^25 x 2^25)=%s "
                "cuMemAllocAsync(2^50)=%s stream_synchronize_after=%s cuMemAlloc(1MiB)=%s cuMemFree=%s runtime_peek_after=%s\n",
                D(r1), D(r2), D(r3), D(r4), D(r4s), D(r5), D(r6), E(peek));
    g_checks += 5;
    g_failures += (r1 == CUDA_SUCCESS) + (r2 == CUDA_SUCCESS) + (r3 == CUDA_SUCCESS) + (r4 == CUDA_SUCCESS) +
                  (r5 != CUDA_SUCCESS || r6 != CUDA_SUCCESS);
    cudaGetLastError();
  }
  CK(cudaDeviceSynchronize());
  verdict.add("checks", g_checks);
  verdict.add("failed_checks", g_failures);
  return verdict.finish(g_failures == 0);
}
