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
    else (void)cudaGetLastError();  // a failed lookup leaves nothing pending for the caller's checks
  });
  return fn;
}

// One tiled map in the given swizzle with unit element strides; elements of a box outside
// the tensor are skipped (reductions) or zero-filled (loads) by the engine. dims and box:
// rank entries, innermost first; strides: rank - 1 byte strides. Every extent must fit the
// kernels' signed 32-bit box coordinates.
bool encode(TensorMap128* map, CUtensorMapDataType type, int rank, void* base, const int64_t* dims,
            const uint64_t* strides, const uint32_t* box, CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B) {
  static_assert(sizeof(TensorMap128) == sizeof(CUtensorMap) && alignof(TensorMap128) >= 64, "CUtensorMap layout");
  const EncodeTiled enc = encoder();
  if (enc == nullptr) return false;
  cuuint64_t d[4], st[3];
  cuuint32_t bx[4], es[4];
  for (int i = 0; i < rank; ++i) {
    if (dims[i] <= 0 || dims[i] > INT32_MAX) return false;
    d[i] = static_cast<cuuint64_t>(dims[i]);
    bx[i] = box[i];
    es[i] = 1u;
  }
  for (int i = 0; i + 1 < rank; ++i) {
    if (strides[i] == 0 || strides[i] % 16 != 0 || strides[i] >= (uint64_t{1} << 40)) return false;
    st[i] = static_cast<cuuint64_t>(strides[i]);
  }
  CUtensorMap m;
  if (enc(&m, type, static_cast<cuuint32_t>(rank), base, d, st, bx, es, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
          CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
    return false;
  __builtin_memcpy(map->bytes, &m, sizeof(m));
  return true;
}

// The fp32 dQ accumulator [seqs][seqlen][heads][cols] (dense) as a tensor (cols, heads,
// seqlen, seqs) of `rank` 3 (the first three; seqs 1) or 4, boxes box_cols x 1 x box_rows (x 1).
bool encode_dq_accum(TensorMap128* map, float* base, int64_t cols, int64_t heads, int64_t seqlen, int64_t seqs,
                     int box_cols, int box_rows, int rank) {
  if (cols <= 0 || heads <= 0 || seqlen <= 0 || seqs <= 0) return false;
  const uint64_t row_bytes = static_cast<uint64_t>(cols) * sizeof(float);
  const int64_t dims[4] = {cols, heads, seqlen, seqs};
  const uint64_t strides[3] = {row_bytes, row_bytes * static_cast<uint64_t>(heads),
                               row_bytes * static_cast<uint64_t>(heads) * static_cast<uint64_t>(seqlen)};
  const uint32_t box[4] = {static_cast<uint32_t>(box_cols), 1u, static_cast<uint32_t>(box_rows), 1u};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, rank, base, dims, strides, box);
}

}  // namespace

bool encode_dq_accum_map(TensorMap128* map, float* base, int64_t cols, int64_t heads, int64_t rows, int box_cols,
                         int box_rows) {
  return encode_dq_accum(map, base, cols, heads, rows, 1, box_cols, box_rows, 3);
}

bool encode_dq_accum_map_seqs(TensorMap128* map, float* base, int64_t cols, int64_t heads, int64_t seqlen, int64_t seqs,
                              int box_cols, int box_rows) {
  return encode_dq_accum(map, base, cols, heads, seqlen, seqs, box_cols, box_rows, 4);
}

bool encode_rows_map_16bit(TensorMap128* map, const void* base, int64_t cols, int64_t rows, int64_t heads,
                           int64_t batch, int64_t stride_s, int64_t stride_h, int64_t stride_b, int box_rows,
                           int swizzle_bytes) {
  if (box_rows <= 0 || box_rows > 256 || (reinterpret_cast<uintptr_t>(base) & 15u) != 0) return false;
  if (swizzle_bytes != 128 && swizzle_bytes != 64) return false;
  const int64_t elem[3] = {stride_s, stride_h, stride_b};
  uint64_t strides[3];
  for (int i = 0; i < 3; ++i) {
    if (elem[i] <= 0 || elem[i] >= (int64_t{1} << 39)) return false;
    strides[i] = static_cast<uint64_t>(elem[i]) * 2;
  }
  const int64_t dims[4] = {cols, rows, heads, batch};
  const uint32_t box[4] = {static_cast<uint32_t>(swizzle_bytes / 2), static_cast<uint32_t>(box_rows), 1u, 1u};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 4, const_cast<void*>(base), dims, strides, box,
                swizzle_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B);
}

bool encode_rows_map_16bit(TensorMap128* map, const void* base, int64_t cols, int64_t rows, int64_t heads,
                           int64_t batch, const Strides4& s, int box_rows, int swizzle_bytes) {
  return encode_rows_map_16bit(map, base, cols, rows, heads, batch, s.s, heads == 1 ? s.s : s.h, batch == 1 ? s.s : s.b,
                               box_rows, swizzle_bytes);
}

}  // namespace flashattn
