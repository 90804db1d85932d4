// cuTensorMapEncodeTiled through the runtime's driver entry point (see tensor_map.hpp).
#include "cuda/tensor_map.hpp"

#include <cuda.h>  // types and enums only; the function comes from the runtime below
#include <cuda_runtime.h>

#include <stdint.h>

#include <mutex>

namespace flashattn {
namespace {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver's encoder, looked up once (NULL if this driver has none: it then stays NULL).
EncodeTiled encoder() {
  static EncodeTiled fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<EncodeTiled>(p);
    else
      (void)cudaGetLastError();  // a failed lookup leaves nothing pending for the caller's checks
  });
  return fn;
}

}  // namespace

bool encode_dq_accum_map(TensorMap128* map, float* base, int64_t cols, int64_t heads, int64_t rows, int box_cols,
                         int box_rows) {
  static_assert(sizeof(TensorMap128) == sizeof(CUtensorMap) && alignof(TensorMap128) >= 64, "CUtensorMap layout");
  const EncodeTiled enc = encoder();
  if (enc == nullptr || cols <= 0 || heads <= 0 || rows <= 0) return false;
  // Engine limits: dims <= 2^32, byte strides multiples of 16 below 2^40.
  const uint64_t row_bytes = static_cast<uint64_t>(cols) * sizeof(float);
  const uint64_t token_bytes = row_bytes * static_cast<uint64_t>(heads);
  if (rows > (int64_t{1} << 32) || heads > (int64_t{1} << 32) || row_bytes % 16 != 0 ||
      token_bytes >= (uint64_t{1} << 40))
    return false;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[2] = {row_bytes, token_bytes};  // bytes, dims 1 and 2
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(box_cols), 1u, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[3] = {1u, 1u, 1u};
  CUtensorMap m;
  if (enc(&m, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, base, dims, strides, box, elem_strides,
          CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
    return false;
  static_assert(sizeof(m) == sizeof(map->bytes), "CUtensorMap size");
  __builtin_memcpy(map->bytes, &m, sizeof(m));
  return true;
}

bool encode_rows_map_16bit(TensorMap128* map, const void* base, int64_t cols, int64_t rows, int64_t heads,
                           int64_t batch, int64_t stride_s, int64_t stride_h, int64_t stride_b, int box_rows) {
  const EncodeTiled enc = encoder();
  if (enc == nullptr || cols <= 0 || rows <= 0 || heads <= 0 || batch <= 0 || box_rows <= 0 || box_rows > 256 ||
      (reinterpret_cast<uintptr_t>(base) & 15u) != 0)
    return false;
  const int64_t st[3] = {stride_s, stride_h, stride_b};
  cuuint64_t strides[3];
  for (int i = 0; i < 3; ++i) {
    if (st[i] <= 0 || st[i] >= (int64_t{1} << 39) || (st[i] * 2) % 16 != 0) return false;
    strides[i] = static_cast<cuuint64_t>(st[i] * 2);
  }
  const int64_t dim[4] = {cols, rows, heads, batch};
  cuuint64_t dims[4];
  for (int i = 0; i < 4; ++i) {
    if (dim[i] > INT32_MAX) return false;  // the kernels' box coordinates are signed 32-bit
    dims[i] = static_cast<cuuint64_t>(dim[i]);
  }
  const cuuint32_t box[4] = {64u, static_cast<cuuint32_t>(box_rows), 1u, 1u};
  const cuuint32_t elem_strides[4] = {1u, 1u, 1u, 1u};
  CUtensorMap m;
  if (enc(&m, CU_TENSOR_MAP_DATA_TYPE_UINT16, 4, const_cast<void*>(base), dims, strides, box, elem_strides,
          CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
    return false;
  __builtin_memcpy(map->bytes, &m, sizeof(m));
  return true;
}

}  // namespace flashattn
