// What the driver does with legacy CUDA IPC handles, which docs/design.md ("CUDA IPC of pool
// blocks") builds on. Run as: ipc_probe export & sleep 3; ipc_probe import
//   export: two allocations; prints the handles of the first at its base and 1 MiB inside, and
//           of the second; keeps them alive 8 s
//   import: opens the first handle twice and the inside one, reads through them, and tries
//           handles with one byte changed (which bytes the driver checks)
//   sizes:  one allocation of each of several sizes at a time; prints bytes 48..63 of its handle
//           (cupool writes into 56..63, which the driver left zero for small allocations)
#include <cuda.h>

#include <cstdio>
#include <cstring>
#include <unistd.h>

static void hex(const char* label, const CUipcMemHandle& h) {
  std::printf("%s ", label);
  for (int i = 0; i < 64; ++i) std::printf("%02x", static_cast<unsigned char>(h.reserved[i]));
  std::printf("\n");
}

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  cuInit(0);
  CUdevice d;
  cuDeviceGet(&d, 0);
  CUcontext c;
  cuDevicePrimaryCtxRetain(&c, d);
  cuCtxSetCurrent(c);
  if (!std::strcmp(argv[1], "sizes")) {
    const unsigned long long mib = 1ull << 20;
    for (unsigned long long size : {2 * mib, 64 * mib, 1024 * mib, 4096 * mib, 8192 * mib, 16384 * mib, 28672 * mib,
                                    43008 * mib}) {
      CUdeviceptr p = 0;
      if (int r = cuMemAlloc(&p, size)) {
        std::printf("%llu MiB: cuMemAlloc rc %d\n", size / mib, r);
        continue;
      }
      CUipcMemHandle h;
      const int r = cuIpcGetMemHandle(&h, p);
      std::printf("%6llu MiB at 0x%llx: rc %d, bytes 48..63 ", size / mib, static_cast<unsigned long long>(p), r);
      for (int i = 48; i < 64; ++i) std::printf("%02x", static_cast<unsigned char>(h.reserved[i]));
      std::printf("\n");
      cuMemFree(p);
    }
    return 0;
  }
  if (!std::strcmp(argv[1], "export")) {
    CUdeviceptr a, b;
    cuMemAlloc(&a, 64 << 20);
    cuMemAlloc(&b, 2 << 20);
    cuMemsetD8(a, 7, 64 << 20);
    cuMemsetD8(a + (1 << 20), 9, 4096);
    cuCtxSynchronize();
    CUipcMemHandle h1, h2, h3;
    const int r1 = cuIpcGetMemHandle(&h1, a), r2 = cuIpcGetMemHandle(&h2, a + (1 << 20)), r3 = cuIpcGetMemHandle(&h3, b);
    std::printf("get rc %d %d %d\n", r1, r2, r3);
    hex("base  ", h1);
    hex("inside", h2);
    hex("other ", h3);
    FILE* f = std::fopen("/tmp/cupool-ipc-probe.bin", "wb");
    if (!f || std::fwrite(&h1, 64, 1, f) != 1 || std::fwrite(&h2, 64, 1, f) != 1) return 1;
    std::fclose(f);
    sleep(8);
    return 0;
  }
  CUipcMemHandle h1, h2;
  FILE* f = std::fopen("/tmp/cupool-ipc-probe.bin", "rb");
  if (!f || std::fread(&h1, 64, 1, f) != 1 || std::fread(&h2, 64, 1, f) != 1) return 1;
  std::fclose(f);
  const unsigned flags = CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS;
  CUdeviceptr p1 = 0, p2 = 0, p3 = 0;
  const int r1 = cuIpcOpenMemHandle(&p1, h1, flags), r2 = cuIpcOpenMemHandle(&p2, h1, flags);
  const int r3 = cuIpcOpenMemHandle(&p3, h2, flags);
  unsigned char at_base = 0, at_1mib = 0, inside_at_open = 0;
  cuMemcpyDtoH(&at_base, p1, 1);
  cuMemcpyDtoH(&at_1mib, p1 + (1 << 20), 1);
  if (r3 == 0) cuMemcpyDtoH(&inside_at_open, p3, 1);
  std::printf("same handle twice: rc %d %d, same address %d\n", r1, r2, p1 == p2);
  std::printf("handle taken 1 MiB inside: rc %d, opens at the base %d (byte there %d; base %d, 1 MiB in %d)\n", r3,
              p3 == p1, inside_at_open, at_base, at_1mib);
  std::printf("closes: %d %d %d\n", cuIpcCloseMemHandle(p1), cuIpcCloseMemHandle(p2),
              r3 == 0 ? cuIpcCloseMemHandle(p3) : -1);
  for (int k = 0; k < 64; k += 8) {
    CUipcMemHandle u = h1;
    u.reserved[k] ^= 0x5a;
    CUdeviceptr q = 0;
    const int r = cuIpcOpenMemHandle(&q, u, flags);
    std::printf("byte %2d changed: rc %d\n", k, r);
    if (r == 0) cuIpcCloseMemHandle(q);
  }
  return 0;
}
