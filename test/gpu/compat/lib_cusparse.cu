// lib_cusparse: cuSPARSE's generic API with the external buffers the program allocates after
// asking for their size, and the library's own allocations (handle, descriptors).
//   1. SpMV: y = A x with a 3000x2000 CSR matrix (a fixed pattern of about 9 nonzeros a row,
//      small integer values), cusparseSpMV_bufferSize + cusparseSpMV.
//   2. SpMM: C = A B with B dense 2000x16 (column-major), cusparseSpMM_bufferSize +
//      cusparseSpMM.
// Every value is a small integer, so the float results are exact and compared bit for bit
// with a host reference; integer checksums are printed.
#include <cusparse.h>

#include <algorithm>

#include "common.h"

namespace {

void cksp(cusparseStatus_t s, const char* what, int line) {
  if (s != CUSPARSE_STATUS_SUCCESS) compat::die("%s returned cuSPARSE status %d (line %d)", what, static_cast<int>(s), line);
}
#define CKSP(x) cksp((x), #x, __LINE__)

template <typename T>
T* to_device(const std::vector<T>& h) {
  T* d = nullptr;
  CK(cudaMalloc(&d, h.size() * sizeof(T)));
  CK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

}  // namespace

int main() {
  compat::Verdict verdict("lib_cusparse");
  CK(cudaSetDevice(0));
  int checks = 0, failures = 0;
  const int rows = 3000, cols = 2000, k = 16;
  std::vector<int> row_ptr(rows + 1, 0), col_idx;
  std::vector<float> vals;
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < 9; ++j) {
      int c = (r * 7 + j * 223 + (r % 5) * j) % cols;
      bool dup = false;
      for (int q = row_ptr[r]; q < static_cast<int>(col_idx.size()); ++q) dup = dup || col_idx[q] == c;
      if (dup) continue;
      col_idx.push_back(c);
      vals.push_back(static_cast<float>((r + 3 * j) % 7 - 3));
    }
    // CSR wants the columns of a row in order
    std::vector<std::pair<int, float>> row;
    for (int q = row_ptr[r]; q < static_cast<int>(col_idx.size()); ++q) row.emplace_back(col_idx[q], vals[q]);
    std::sort(row.begin(), row.end());
    for (size_t q = 0; q < row.size(); ++q) {
      col_idx[row_ptr[r] + q] = row[q].first;
      vals[row_ptr[r] + q] = row[q].second;
    }
    row_ptr[r + 1] = static_cast<int>(col_idx.size());
  }
  const int nnz = static_cast<int>(vals.size());
  std::vector<float> x(cols), bmat(static_cast<size_t>(cols) * k);
  for (int i = 0; i < cols; ++i) x[i] = static_cast<float>(i % 9 - 4);
  // Small integers (exact in float whatever the order of the sums); the remainder is taken as an
  // int, or the unsigned subtraction would wrap to 1.8e19.
  for (size_t i = 0; i < bmat.size(); ++i) bmat[i] = static_cast<float>(static_cast<int>((i * 13) % 11) - 5);

  int* d_rp = to_device(row_ptr);
  int* d_ci = to_device(col_idx);
  float* d_v = to_device(vals);
  float* d_x = to_device(x);
  float* d_b = to_device(bmat);
  float *d_y = nullptr, *d_c = nullptr;
  CK(cudaMalloc(&d_y, sizeof(float) * rows));
  CK(cudaMalloc(&d_c, sizeof(float) * rows * k));
  CK(cudaMemset(d_y, 0xFF, sizeof(float) * rows));
  CK(cudaMemset(d_c, 0xFF, sizeof(float) * rows * k));

  cusparseHandle_t h;
  CKSP(cusparseCreate(&h));
  cusparseSpMatDescr_t A;
  cusparseDnVecDescr_t X, Y;
  cusparseDnMatDescr_t B, C;
  CKSP(cusparseCreateCsr(&A, rows, cols, nnz, d_rp, d_ci, d_v, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                         CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F));
  CKSP(cusparseCreateDnVec(&X, cols, d_x, CUDA_R_32F));
  CKSP(cusparseCreateDnVec(&Y, rows, d_y, CUDA_R_32F));
  CKSP(cusparseCreateDnMat(&B, cols, k, cols, d_b, CUDA_R_32F, CUSPARSE_ORDER_COL));
  CKSP(cusparseCreateDnMat(&C, rows, k, rows, d_c, CUDA_R_32F, CUSPARSE_ORDER_COL));
  const float one = 1.f, zero = 0.f;

  // SpMV
  size_t bytes = 0;
  CKSP(cusparseSpMV_bufferSize(h, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, A, X, &zero, Y, CUDA_R_32F,
                               CUSPARSE_SPMV_ALG_DEFAULT, &bytes));
  void* buf = nullptr;
  CK(cudaMalloc(&buf, bytes ? bytes : 256));
  CKSP(cusparseSpMV(h, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, A, X, &zero, Y, CUDA_R_32F, CUSPARSE_SPMV_ALG_DEFAULT, buf));
  std::vector<float> y(rows);
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(y.data(), d_y, sizeof(float) * rows, cudaMemcpyDeviceToHost));
  {
    bool ok = true;
    long long sum = 0;
    for (int r = 0; r < rows; ++r) {
      float ref = 0;
      for (int q = row_ptr[r]; q < row_ptr[r + 1]; ++q) ref += vals[q] * x[col_idx[q]];
      ok = ok && y[r] == ref;
      sum += static_cast<long long>(y[r]) * (r % 101 + 1);
    }
    std::printf("spmv csr %dx%d nnz=%d checksum=%lld %s\n", rows, cols, nnz, sum, ok ? "ok" : "WRONG");
    ++checks;
    failures += !ok;
  }
  CK(cudaFree(buf));

  // SpMM
  bytes = 0;
  CKSP(cusparseSpMM_bufferSize(h, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, A, B, &zero, C,
                               CUDA_R_32F, CUSPARSE_SPMM_ALG_DEFAULT, &bytes));
  CK(cudaMalloc(&buf, bytes ? bytes : 256));
  CKSP(cusparseSpMM(h, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, A, B, &zero, C, CUDA_R_32F,
                    CUSPARSE_SPMM_ALG_DEFAULT, buf));
  std::vector<float> c(static_cast<size_t>(rows) * k);
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(c.data(), d_c, sizeof(float) * rows * k, cudaMemcpyDeviceToHost));
  {
    bool ok = true;
    long long sum = 0;
    for (int j = 0; j < k; ++j)
      for (int r = 0; r < rows; ++r) {
        float ref = 0;
        for (int q = row_ptr[r]; q < row_ptr[r + 1]; ++q) ref += vals[q] * bmat[col_idx[q] + static_cast<size_t>(j) * cols];
        const float got = c[r + static_cast<size_t>(j) * rows];
        ok = ok && got == ref;
        sum += static_cast<long long>(got) * ((r + j) % 97 + 1);
      }
    std::printf("spmm csr %dx%d x dense %dx%d checksum=%lld %s\n", rows, cols, cols, k, sum, ok ? "ok" : "WRONG");
    ++checks;
    failures += !ok;
  }
  CK(cudaFree(buf));

  CKSP(cusparseDestroySpMat(A));
  CKSP(cusparseDestroyDnVec(X));
  CKSP(cusparseDestroyDnVec(Y));
  CKSP(cusparseDestroyDnMat(B));
  CKSP(cusparseDestroyDnMat(C));
  CKSP(cusparseDestroy(h));
  for (void* p : {static_cast<void*>(d_rp), static_cast<void*>(d_ci), static_cast<void*>(d_v), static_cast<void*>(d_x),
                  static_cast<void*>(d_b), static_cast<void*>(d_y), static_cast<void*>(d_c)})
    CK(cudaFree(p));
  verdict.add("nnz", nnz);
  verdict.add("checks", checks);
  verdict.add("failed_checks", failures);
  return verdict.finish(failures == 0);
}
