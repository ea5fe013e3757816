// Peer access on two real GPUs (kind nvidia-h200-x2), as prog_peer does it on the simulated CUDA
// but with kernels: device 1 enables access to device 0, then a kernel on device 1 adds to two
// blocks of device 0 (one allocated before the enabling, one after), and device 0 reads them
// back. cuMemAlloc memory is reachable by the enabling alone; the vmm policy's cuMemCreate
// granules only if cupool named device 1 in cuMemSetAccess, or the kernel faults. Prints one JSON
// line; exit 0 only if both blocks hold what device 1 wrote. "mappings": how many of the two
// blocks were virtual-memory mappings (2 under the vmm policy: the check exercised it).
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

__global__ void add(unsigned char* p, size_t n, unsigned char v) {
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x)
        p[i] = static_cast<unsigned char>(p[i] + v);
}

static bool holds(const void* dev, size_t n, unsigned char v) {
    std::vector<unsigned char> host(n);
    if (cudaMemcpy(host.data(), dev, n, cudaMemcpyDeviceToHost) != cudaSuccess) return false;
    for (unsigned char c : host)
        if (c != v) return false;
    return true;
}

static int is_mapping(const void* p) {
    CUmemLocation loc{};
    loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
    loc.id = 1;
    unsigned long long flags = 0;
    return cuMemGetAccess(&flags, &loc, reinterpret_cast<CUdeviceptr>(p)) == CUDA_SUCCESS ? 1 : 0;
}

int main() {
    int n = 0;
    cudaGetDeviceCount(&n);
    if (n < 2) {
        std::printf("{\"ok\": false, \"why\": \"%d device(s): this check needs two\"}\n", n);
        return 2;
    }
    int can = 0;
    cudaDeviceCanAccessPeer(&can, 1, 0);
    const size_t a_bytes = 8u << 20, b_bytes = 24u << 20;
    void *a = nullptr, *b = nullptr;
    cudaSetDevice(0);
    cudaError_t e = cudaMalloc(&a, a_bytes);
    if (e == cudaSuccess) e = cudaMemset(a, 1, a_bytes);
    cudaSetDevice(1);
    cudaError_t enable = cudaDeviceEnablePeerAccess(0, 0);
    cudaSetDevice(0);
    if (e == cudaSuccess) e = cudaMalloc(&b, b_bytes);
    if (e == cudaSuccess) e = cudaMemset(b, 2, b_bytes);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    cudaSetDevice(1);
    cudaError_t kernel = cudaSuccess;
    if (e == cudaSuccess) {
        add<<<264, 256>>>(static_cast<unsigned char*>(a), a_bytes, 10);
        add<<<264, 256>>>(static_cast<unsigned char*>(b), b_bytes, 20);
        kernel = cudaDeviceSynchronize();
    }
    cudaSetDevice(0);
    const bool a_ok = kernel == cudaSuccess && e == cudaSuccess && holds(a, a_bytes, 11);
    const bool b_ok = kernel == cudaSuccess && e == cudaSuccess && holds(b, b_bytes, 22);
    const int mappings = (a ? is_mapping(a) : 0) + (b ? is_mapping(b) : 0);
    const bool ok = can == 1 && enable == cudaSuccess && a_ok && b_ok;
    std::printf("{\"ok\": %s, \"can_access_peer\": %d, \"enable\": \"%s\", \"alloc\": \"%s\", \"kernel\": \"%s\", "
                "\"before_ok\": %s, \"after_ok\": %s, \"mappings\": %d}\n",
                ok ? "true" : "false", can, cudaGetErrorName(enable), cudaGetErrorName(e), cudaGetErrorName(kernel),
                a_ok ? "true" : "false", b_ok ? "true" : "false", mappings);
    return ok ? 0 : 1;
}
