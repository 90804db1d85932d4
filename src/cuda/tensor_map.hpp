// TMA tensor maps (the descriptors of the Hopper copy engine) for the kernels' bulk
// tensor operations, encoded on the host through the driver's cuTensorMapEncodeTiled,
// which the CUDA runtime hands out (cudaGetDriverEntryPointByVersion): the library keeps
// no link-time dependency on libcuda.
#pragma once
#include <stdint.h>

#include "common/params.h"
#include "common/tensor_map.h"

namespace flashattn {

// Map of the backward's fp32 dQ accumulator [rows][heads][cols] (row-major, dense) as a
// 3-D tensor (cols, heads, rows) with boxes of box_cols x 1 x box_rows, shared-memory side
// in the 128-byte swizzle (16-byte chunk c of box row r at chunk c ^ (r % 8)). Elements of
// a box outside the tensor are skipped by the engine. Returns false (map untouched) when
// the driver has no encoder, for byte strides the engine cannot take (multiples of 16 below
// 2^40), for extents past the kernel's signed 32-bit box coordinates, or when the driver
// refuses the shape; the caller then keeps its other path.
bool encode_dq_accum_map(TensorMap128* map, float* base, int64_t cols, int64_t heads, int64_t rows, int box_cols,
                         int box_rows);
// The same accumulator's rows as seqs sequences of seqlen rows: a 4-D tensor (cols, heads,
// seqlen, seqs) with boxes of box_cols x 1 x box_rows x 1, so that the engine skips the rows
// of a box past its sequence instead of adding them into the next one's. Returns false as
// encode_dq_accum_map does.
bool encode_dq_accum_map_seqs(TensorMap128* map, float* base, int64_t cols, int64_t heads, int64_t seqlen, int64_t seqs,
                              int box_cols, int box_rows);

// Map of a 16-bit [batch][rows][heads][cols] tensor with element strides (b, s, h) and
// contiguous columns, as a 4-D tensor (cols, rows, heads, batch) with boxes of
// swizzle_bytes / 2 x box_rows x 1 x 1 in the swizzle of that many bytes (128: boxes of 64
// columns, 64: of 32); elements of a box outside the tensor are zero-filled. Returns false
// (map untouched) without an encoder, for another swizzle, for strides or pointers the engine
// cannot take (byte strides must be positive multiples of 16 below 2^40), or for extents
// past the kernels' signed 32-bit box coordinates.
bool encode_rows_map_16bit(TensorMap128* map, const void* base, int64_t cols, int64_t rows, int64_t heads,
                           int64_t batch, int64_t stride_s, int64_t stride_h, int64_t stride_b, int box_rows,
                           int swizzle_bytes = 128);

// encode_rows_map_16bit with a plan's strides. The stride of a dimension of extent 1 is never
// applied: the row stride stands in for it, so that e.g. a 0 there does not cost the
// copy-engine path.
bool encode_rows_map_16bit(TensorMap128* map, const void* base, int64_t cols, int64_t rows, int64_t heads,
                           int64_t batch, const Strides4& s, int box_rows, int swizzle_bytes = 128);

}  // namespace flashattn
