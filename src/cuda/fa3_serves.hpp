// What the FA3-design forward and backward (kernels/fa3) have in common in deciding whether
// they serve a run: the device, the dtype and the options neither implements, the tables of
// their kernel lists, the served head dims as refusals name them, and the TMA maps of their
// 16-bit tensors.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include <array>
#include <utility>

#include "backends.hpp"
#include "fa3/launchers.h"

namespace flashattn {

// Writes the reason into why (printf format, why_size bytes) and returns false.
__attribute__((format(printf, 3, 4))) bool fa3_refuse(char* why, size_t why_size, const char* fmt, ...);

// Whether the current device and p's dtype and options allow an fa3 kernel: a compute
// capability 9.0 device, a build with sm_90a kernels, fp16 or bf16, a dense batch without KV
// cache, bias, ALiBi, softcap, dropout or block-sparse layout, no band mask but the causal
// one (window right 0, left unbounded) in either alignment. If not, `why` says why.
bool fa3_serves_options(const AttnParams& p, char* why, size_t why_size);

// The host's table of an fa3 kernel list (fa3::kFwdDims, fa3::kBwdDims): Entry<I>::value for
// each instance I of the list, at the list's index; `I...` is std::make_index_sequence of
// the list's length.
template <template <size_t> class Entry, size_t... I>
constexpr auto fa3_table(std::index_sequence<I...>) {
  return std::array{Entry<I>::value...};
}

// The head dims of a query/key and of a value row.
struct Fa3HeadDims {
  int qk, v;
};

// Whether an fa3 instance of head dim `inst`, whose tiles hold column blocks of `block`
// columns, serves a tensor of head dim d: d at most inst, past inst - block (every column
// block of a tile holds columns of the tensor: the copy engine zero-fills those past d on
// loads and clips them on stores, and no box lies wholly outside the tensor), and a
// multiple of 8 (16-byte rows for the copy engine; fa2 runs the others on zero-padded
// copies, fa2_staged_dim).
constexpr bool fa3_serves_dim(int64_t d, int inst, int block) { return d <= inst && d > inst - block && d % 8 == 0; }

// The head dims (qk/v) of the n instances of an fa3 kernel list as a refusal names them,
// "64/64, 96/96 and 192/128", into text (size bytes); dims(i) gives instance i's.
void fa3_dims_text(char* text, size_t size, int n, Fa3HeadDims (*dims)(int));

// One 16-bit tensor of a run as an fa3 kernel moves it through a TMA map
// (encode_rows_map_16bit over p.batch sequences).
struct Fa3Map {
  const char* name;  // the tensor, as the refusal names it
  TensorMap128* map;
  const void* base;
  Strides4 strides;
  int64_t cols, rows, heads;
  int box_rows;
};

// Encodes the n maps in the swizzle of swizzle_bytes. False and the refusal if the driver has
// no tensor-map encoder (with the failed lookup) or for the first tensor the copy engine
// cannot address or the driver refuses (its name, pointer, strides and extents).
bool fa3_encode_maps(const AttnParams& p, const Fa3Map* maps, int n, int swizzle_bytes, char* why, size_t why_size);

}  // namespace flashattn
