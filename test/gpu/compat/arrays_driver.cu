// arrays_driver: CUDA arrays through the driver API only (linked with -lcuda; no runtime call):
// cuArrayCreate 1000x700 (host -> array -> a cuMemAlloc'd buffer -> host), cuArray3DCreate
// 64x48x32, 8192x8192 and a layered 128x64x6 (cuMemcpy3D in and out), cuMipmappedArrayCreate
// 256x128 with 9 levels (cuMipmappedArrayGetLevel + cuArray3DGetDescriptor, extents printed,
// each level copied in and out), then cuArrayDestroy / cuMipmappedArrayDestroy.
// Every return code that must be CUDA_SUCCESS is checked; values are exact.
#include <cuda.h>

#include "common.h"

namespace {

void ckd(CUresult r, const char* what, int line) {
  if (r != CUDA_SUCCESS) {
    const char* name = nullptr;
    cuGetErrorName(r, &name);
    compat::die("%s returned %s (line %d)", what, name ? name : "?", line);
  }
}
#define CKD(x) ckd((x), #x, __LINE__)

int g_checks = 0, g_failures = 0;
void report(const char* what, bool ok) {
  ++g_checks;
  g_failures += !ok;
  std::printf("%s %s\n", what, ok ? "ok" : "WRONG");
}

float v2(int x, int y, int salt) { return static_cast<float>((x * 7 + y * 13 + salt) & 0xFFFF); }

void array_2d() {
  const int w = 1000, h = 700;
  CUDA_ARRAY_DESCRIPTOR d;
  std::memset(&d, 0, sizeof d);
  d.Width = w;
  d.Height = h;
  d.Format = CU_AD_FORMAT_FLOAT;
  d.NumChannels = 1;
  CUarray a;
  CKD(cuArrayCreate(&a, &d));
  std::vector<float> in(static_cast<size_t>(w) * h), back(in.size(), -1.f);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) in[static_cast<size_t>(y) * w + x] = v2(x, y, 1);
  CUDA_MEMCPY2D c;
  std::memset(&c, 0, sizeof c);
  c.srcMemoryType = CU_MEMORYTYPE_HOST;
  c.srcHost = in.data();
  c.srcPitch = w * sizeof(float);
  c.dstMemoryType = CU_MEMORYTYPE_ARRAY;
  c.dstArray = a;
  c.WidthInBytes = w * sizeof(float);
  c.Height = h;
  CKD(cuMemcpy2D(&c));
  // array -> device buffer -> host
  CUdeviceptr buf = 0;
  size_t pitch = 0;
  CKD(cuMemAllocPitch(&buf, &pitch, w * sizeof(float), h, 4));
  std::memset(&c, 0, sizeof c);
  c.srcMemoryType = CU_MEMORYTYPE_ARRAY;
  c.srcArray = a;
  c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  c.dstDevice = buf;
  c.dstPitch = pitch;
  c.WidthInBytes = w * sizeof(float);
  c.Height = h;
  CKD(cuMemcpy2D(&c));
  std::memset(&c, 0, sizeof c);
  c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  c.srcDevice = buf;
  c.srcPitch = pitch;
  c.dstMemoryType = CU_MEMORYTYPE_HOST;
  c.dstHost = back.data();
  c.dstPitch = w * sizeof(float);
  c.WidthInBytes = w * sizeof(float);
  c.Height = h;
  CKD(cuMemcpy2D(&c));
  report("cuArrayCreate 1000x700 host_array_device_host", back == in);
  CKD(cuMemFree(buf));
  CKD(cuArrayDestroy(a));
}

void array_3d(int w, int h, int depth, unsigned flags, const char* label) {
  CUDA_ARRAY3D_DESCRIPTOR d;
  std::memset(&d, 0, sizeof d);
  d.Width = w;
  d.Height = h;
  d.Depth = depth;
  d.Format = CU_AD_FORMAT_FLOAT;
  d.NumChannels = 1;
  d.Flags = flags;
  CUarray a;
  CKD(cuArray3DCreate(&a, &d));
  const int dd = depth ? depth : 1;
  const size_t n = static_cast<size_t>(w) * h * dd;
  std::vector<float> in(n), back(n, -1.f);
  for (size_t i = 0; i < n; ++i) in[i] = static_cast<float>((i * 5 + 3) % 65521);
  CUDA_MEMCPY3D c;
  std::memset(&c, 0, sizeof c);
  c.srcMemoryType = CU_MEMORYTYPE_HOST;
  c.srcHost = in.data();
  c.srcPitch = w * sizeof(float);
  c.srcHeight = h;
  c.dstMemoryType = CU_MEMORYTYPE_ARRAY;
  c.dstArray = a;
  c.WidthInBytes = w * sizeof(float);
  c.Height = h;
  c.Depth = dd;
  CKD(cuMemcpy3D(&c));
  std::memset(&c, 0, sizeof c);
  c.srcMemoryType = CU_MEMORYTYPE_ARRAY;
  c.srcArray = a;
  c.dstMemoryType = CU_MEMORYTYPE_HOST;
  c.dstHost = back.data();
  c.dstPitch = w * sizeof(float);
  c.dstHeight = h;
  c.WidthInBytes = w * sizeof(float);
  c.Height = h;
  c.Depth = dd;
  CKD(cuMemcpy3D(&c));
  report(label, back == in);
  CUDA_ARRAY3D_DESCRIPTOR got;
  CKD(cuArray3DGetDescriptor(&got, a));
  std::printf("  descriptor %zux%zux%zu flags=%u\n", got.Width, got.Height, got.Depth, got.Flags);
  CKD(cuArrayDestroy(a));
}

void mipmapped() {
  const int w = 256, h = 128, levels = 9;
  CUDA_ARRAY3D_DESCRIPTOR d;
  std::memset(&d, 0, sizeof d);
  d.Width = w;
  d.Height = h;
  d.Depth = 0;
  d.Format = CU_AD_FORMAT_FLOAT;
  d.NumChannels = 1;
  CUmipmappedArray mm;
  CKD(cuMipmappedArrayCreate(&mm, &d, levels));
  bool all_ok = true;
  for (int l = 0; l < levels; ++l) {
    CUarray level;
    CKD(cuMipmappedArrayGetLevel(&level, mm, l));
    CUDA_ARRAY3D_DESCRIPTOR ld;
    CKD(cuArray3DGetDescriptor(&ld, level));
    const int lw = static_cast<int>(ld.Width), lh = static_cast<int>(ld.Height ? ld.Height : 1);
    std::vector<float> in(static_cast<size_t>(lw) * lh), back(in.size(), -1.f);
    for (int y = 0; y < lh; ++y)
      for (int x = 0; x < lw; ++x) in[static_cast<size_t>(y) * lw + x] = v2(x, y, 100 + l);
    CUDA_MEMCPY2D c;
    std::memset(&c, 0, sizeof c);
    c.srcMemoryType = CU_MEMORYTYPE_HOST;
    c.srcHost = in.data();
    c.srcPitch = lw * sizeof(float);
    c.dstMemoryType = CU_MEMORYTYPE_ARRAY;
    c.dstArray = level;
    c.WidthInBytes = lw * sizeof(float);
    c.Height = lh;
    CKD(cuMemcpy2D(&c));
    std::memset(&c, 0, sizeof c);
    c.srcMemoryType = CU_MEMORYTYPE_ARRAY;
    c.srcArray = level;
    c.dstMemoryType = CU_MEMORYTYPE_HOST;
    c.dstHost = back.data();
    c.dstPitch = lw * sizeof(float);
    c.WidthInBytes = lw * sizeof(float);
    c.Height = lh;
    CKD(cuMemcpy2D(&c));
    const bool ok = back == in;
    all_ok = all_ok && ok;
    std::printf("mipmap level=%d extent=%zux%zux%zu copy_in_out %s\n", l, ld.Width, ld.Height, ld.Depth, ok ? "ok" : "WRONG");
  }
  report("cuMipmappedArrayCreate all_levels", all_ok);
  CKD(cuMipmappedArrayDestroy(mm));
}

}  // namespace

int main() {
  compat::Verdict verdict("arrays_driver");
  CKD(cuInit(0));
  CUdevice dev;
  CKD(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CKD(cuDevicePrimaryCtxRetain(&ctx, dev));
  CKD(cuCtxSetCurrent(ctx));
  // An ordinary allocation first, written and read back.
  {
    CUdeviceptr p = 0;
    CKD(cuMemAlloc(&p, 1 << 20));
    CKD(cuMemsetD32(p, 0xC0FFEEu, (1 << 20) / 4));
    std::vector<unsigned> h((1 << 20) / 4);
    CKD(cuMemcpyDtoH(h.data(), p, 1 << 20));
    bool ok = true;
    for (unsigned v : h) ok = ok && v == 0xC0FFEEu;
    report("cuMemAlloc 1MiB memset_read", ok);
    CKD(cuMemFree(p));
  }
  array_2d();
  array_3d(64, 48, 32, 0, "cuArray3DCreate 64x48x32 copy_in_out");
  array_3d(8192, 8192, 0, 0, "cuArray3DCreate 8192x8192 copy_in_out");
  array_3d(128, 64, 6, CUDA_ARRAY3D_LAYERED, "cuArray3DCreate layered 128x64x6 copy_in_out");
  mipmapped();
  CKD(cuCtxSynchronize());
  CKD(cuDevicePrimaryCtxRelease(dev));
  verdict.add("checks", g_checks);
  verdict.add("failed_checks", g_failures);
  return verdict.finish(g_failures == 0);
}
