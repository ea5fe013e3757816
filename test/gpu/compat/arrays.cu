// arrays: CUDA arrays through the runtime (they never pass through cuMemAlloc), beside ordinary
// device buffers that do.
//
//   - cudaMallocArray 1000x700 float: cudaMemcpy2DToArray in, cudaMemcpy2DFromArray out, and
//     every texel read through a texture object in a kernel into a cudaMalloc'd buffer;
//   - cudaMalloc3DArray 64x48x32 float: cudaMemcpy3D in and out, tex3D read;
//   - cudaMalloc3DArray 8192x8192 float (256 MiB): copied in and out whole, 8192 texels sampled
//     through a texture;
//   - cudaMallocMipmappedArray 256x128, 9 levels: cudaGetMipmappedArrayLevel + cudaArrayGetInfo
//     (extents printed), each level copied in and out;
//   - a layered array (cudaArrayLayered) 128x64 x 6 layers: cudaMemcpy3D in and out,
//     tex2DLayered read.
// Every value is an exactly representable float, so checks are exact.
#include "common.h"

namespace {

int g_checks = 0, g_failures = 0;

void report(const char* what, bool ok) {
  ++g_checks;
  g_failures += !ok;
  std::printf("%s %s\n", what, ok ? "ok" : "WRONG");
}

float v2(int x, int y, int salt) { return static_cast<float>((x * 7 + y * 13 + salt) & 0xFFFF); }

cudaTextureObject_t make_texture(cudaArray_t a) {
  cudaResourceDesc rd;
  std::memset(&rd, 0, sizeof rd);
  rd.resType = cudaResourceTypeArray;
  rd.res.array.array = a;
  cudaTextureDesc td;
  std::memset(&td, 0, sizeof td);
  td.addressMode[0] = td.addressMode[1] = td.addressMode[2] = cudaAddressModeClamp;
  td.filterMode = cudaFilterModePoint;
  td.readMode = cudaReadModeElementType;
  td.normalizedCoords = 0;
  cudaTextureObject_t t = 0;
  CK(cudaCreateTextureObject(&t, &rd, &td, nullptr));
  return t;
}

__global__ void k_read2d(cudaTextureObject_t t, float* out, int w, int h) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
  if (x < w && y < h) out[y * w + x] = tex2D<float>(t, x + 0.5f, y + 0.5f);
}
__global__ void k_read3d(cudaTextureObject_t t, float* out, int w, int h, int d) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y, z = blockIdx.z;
  if (x < w && y < h && z < d) out[(static_cast<size_t>(z) * h + y) * w + x] = tex3D<float>(t, x + 0.5f, y + 0.5f, z + 0.5f);
}
__global__ void k_read_layered(cudaTextureObject_t t, float* out, int w, int h, int layers) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y, l = blockIdx.z;
  if (x < w && y < h && l < layers)
    out[(static_cast<size_t>(l) * h + y) * w + x] = tex2DLayered<float>(t, x + 0.5f, y + 0.5f, l);
}
// Samples texel (i*37 % w, i*101 % h) for i in [0, n).
__global__ void k_sample2d(cudaTextureObject_t t, float* out, int w, int h, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    int x = static_cast<int>((static_cast<long long>(i) * 37) % w), y = static_cast<int>((static_cast<long long>(i) * 101) % h);
    out[i] = tex2D<float>(t, x + 0.5f, y + 0.5f);
  }
}

void array_2d() {
  const int w = 1000, h = 700;
  cudaChannelFormatDesc desc = cudaCreateChannelDesc<float>();
  cudaArray_t a;
  CK(cudaMallocArray(&a, &desc, w, h));
  std::vector<float> in(static_cast<size_t>(w) * h), back(in.size(), -1.f), tex(in.size(), -1.f);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) in[static_cast<size_t>(y) * w + x] = v2(x, y, 1);
  CK(cudaMemcpy2DToArray(a, 0, 0, in.data(), w * sizeof(float), w * sizeof(float), h, cudaMemcpyHostToDevice));
  CK(cudaMemcpy2DFromArray(back.data(), w * sizeof(float), a, 0, 0, w * sizeof(float), h, cudaMemcpyDeviceToHost));
  report("array2d 1000x700 copy_in_out", back == in);
  float* out = nullptr;
  CK(cudaMalloc(&out, in.size() * sizeof(float)));
  cudaTextureObject_t t = make_texture(a);
  k_read2d<<<dim3((w + 127) / 128, h), 128>>>(t, out, w, h);
  CK_LAUNCH();
  CK(cudaMemcpy(tex.data(), out, in.size() * sizeof(float), cudaMemcpyDeviceToHost));
  report("array2d 1000x700 texture_read", tex == in);
  CK(cudaDestroyTextureObject(t));
  CK(cudaFree(out));
  CK(cudaFreeArray(a));
}

void array_3d() {
  const int w = 64, h = 48, d = 32;
  cudaChannelFormatDesc desc = cudaCreateChannelDesc<float>();
  cudaArray_t a;
  CK(cudaMalloc3DArray(&a, &desc, make_cudaExtent(w, h, d)));
  const size_t n = static_cast<size_t>(w) * h * d;
  std::vector<float> in(n), back(n, -1.f), tex(n, -1.f);
  for (size_t i = 0; i < n; ++i) in[i] = static_cast<float>((i * 5 + 3) % 65521);
  cudaMemcpy3DParms p;
  std::memset(&p, 0, sizeof p);
  p.srcPtr = make_cudaPitchedPtr(in.data(), w * sizeof(float), w, h);
  p.dstArray = a;
  p.extent = make_cudaExtent(w, h, d);
  p.kind = cudaMemcpyHostToDevice;
  CK(cudaMemcpy3D(&p));
  std::memset(&p, 0, sizeof p);
  p.srcArray = a;
  p.dstPtr = make_cudaPitchedPtr(back.data(), w * sizeof(float), w, h);
  p.extent = make_cudaExtent(w, h, d);
  p.kind = cudaMemcpyDeviceToHost;
  CK(cudaMemcpy3D(&p));
  report("array3d 64x48x32 copy_in_out", back == in);
  float* out = nullptr;
  CK(cudaMalloc(&out, n * sizeof(float)));
  cudaTextureObject_t t = make_texture(a);
  k_read3d<<<dim3(1, h, d), 64>>>(t, out, w, h, d);
  CK_LAUNCH();
  CK(cudaMemcpy(tex.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost));
  report("array3d 64x48x32 texture_read", tex == in);
  CK(cudaDestroyTextureObject(t));
  CK(cudaFree(out));
  CK(cudaFreeArray(a));
}

void array_big() {
  const int w = 8192, h = 8192;
  cudaChannelFormatDesc desc = cudaCreateChannelDesc<float>();
  cudaArray_t a;
  CK(cudaMalloc3DArray(&a, &desc, make_cudaExtent(w, h, 0)));
  const size_t n = static_cast<size_t>(w) * h;
  std::vector<float> in(n), back(n, -1.f);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) in[static_cast<size_t>(y) * w + x] = v2(x, y, 3);
  CK(cudaMemcpy2DToArray(a, 0, 0, in.data(), w * sizeof(float), w * sizeof(float), h, cudaMemcpyHostToDevice));
  const int samples = 8192;
  float* out = nullptr;
  CK(cudaMalloc(&out, samples * sizeof(float)));
  cudaTextureObject_t t = make_texture(a);
  k_sample2d<<<samples / 256, 256>>>(t, out, w, h, samples);
  CK_LAUNCH();
  std::vector<float> got(samples);
  CK(cudaMemcpy(got.data(), out, samples * sizeof(float), cudaMemcpyDeviceToHost));
  bool ok = true;
  for (int i = 0; i < samples; ++i) {
    int x = static_cast<int>((static_cast<long long>(i) * 37) % w), y = static_cast<int>((static_cast<long long>(i) * 101) % h);
    ok = ok && got[i] == in[static_cast<size_t>(y) * w + x];
  }
  report("array3d 8192x8192 texture_samples", ok);
  CK(cudaMemcpy2DFromArray(back.data(), w * sizeof(float), a, 0, 0, w * sizeof(float), h, cudaMemcpyDeviceToHost));
  report("array3d 8192x8192 copy_in_out", back == in);
  CK(cudaDestroyTextureObject(t));
  CK(cudaFree(out));
  CK(cudaFreeArray(a));
}

void mipmapped() {
  const int w = 256, h = 128, levels = 9;
  cudaChannelFormatDesc desc = cudaCreateChannelDesc<float>();
  cudaMipmappedArray_t mm;
  CK(cudaMallocMipmappedArray(&mm, &desc, make_cudaExtent(w, h, 0), levels));
  bool all_ok = true;
  for (int l = 0; l < levels; ++l) {
    cudaArray_t level;
    CK(cudaGetMipmappedArrayLevel(&level, mm, l));
    cudaChannelFormatDesc ld;
    cudaExtent ext;
    unsigned flags = 0;
    CK(cudaArrayGetInfo(&ld, &ext, &flags, level));
    const int lw = static_cast<int>(ext.width), lh = static_cast<int>(ext.height ? ext.height : 1);
    std::vector<float> in(static_cast<size_t>(lw) * lh), back(in.size(), -1.f);
    for (int y = 0; y < lh; ++y)
      for (int x = 0; x < lw; ++x) in[static_cast<size_t>(y) * lw + x] = v2(x, y, 100 + l);
    CK(cudaMemcpy2DToArray(level, 0, 0, in.data(), lw * sizeof(float), lw * sizeof(float), lh, cudaMemcpyHostToDevice));
    CK(cudaMemcpy2DFromArray(back.data(), lw * sizeof(float), level, 0, 0, lw * sizeof(float), lh, cudaMemcpyDeviceToHost));
    const bool ok = back == in;
    all_ok = all_ok && ok;
    std::printf("mipmap level=%d extent=%zux%zux%zu copy_in_out %s\n", l, ext.width, ext.height, ext.depth, ok ? "ok" : "WRONG");
  }
  report("mipmap all_levels", all_ok);
  CK(cudaFreeMipmappedArray(mm));
}

void layered() {
  const int w = 128, h = 64, layers = 6;
  cudaChannelFormatDesc desc = cudaCreateChannelDesc<float>();
  cudaArray_t a;
  CK(cudaMalloc3DArray(&a, &desc, make_cudaExtent(w, h, layers), cudaArrayLayered));
  const size_t n = static_cast<size_t>(w) * h * layers;
  std::vector<float> in(n), back(n, -1.f), tex(n, -1.f);
  for (size_t i = 0; i < n; ++i) in[i] = static_cast<float>((i * 11 + 1) % 65519);
  cudaMemcpy3DParms p;
  std::memset(&p, 0, sizeof p);
  p.srcPtr = make_cudaPitchedPtr(in.data(), w * sizeof(float), w, h);
  p.dstArray = a;
  p.extent = make_cudaExtent(w, h, layers);
  p.kind = cudaMemcpyHostToDevice;
  CK(cudaMemcpy3D(&p));
  std::memset(&p, 0, sizeof p);
  p.srcArray = a;
  p.dstPtr = make_cudaPitchedPtr(back.data(), w * sizeof(float), w, h);
  p.extent = make_cudaExtent(w, h, layers);
  p.kind = cudaMemcpyDeviceToHost;
  CK(cudaMemcpy3D(&p));
  report("layered 128x64x6 copy_in_out", back == in);
  float* out = nullptr;
  CK(cudaMalloc(&out, n * sizeof(float)));
  cudaTextureObject_t t = make_texture(a);
  k_read_layered<<<dim3(1, h, layers), 128>>>(t, out, w, h, layers);
  CK_LAUNCH();
  CK(cudaMemcpy(tex.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost));
  report("layered 128x64x6 texture_read", tex == in);
  CK(cudaDestroyTextureObject(t));
  CK(cudaFree(out));
  CK(cudaFreeArray(a));
}

}  // namespace

int main() {
  compat::Verdict verdict("arrays");
  CK(cudaSetDevice(0));
  array_2d();
  array_3d();
  array_big();
  mipmapped();
  layered();
  verdict.add("checks", g_checks);
  verdict.add("failed_checks", g_failures);
  return verdict.finish(g_failures == 0);
}
