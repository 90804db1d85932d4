// Append of a KV-cache run (flashattn_fwd_kvcache with seqlen_new >= 1): new key i of
// sequence b, rotated at position cache_seqlens[b] + i, and new value i are written into
// the cache slot cache_seqlens[b] + i, before the decode kernel reads the cache.
//
// One warp per (sequence, new token, kv head) row. A sequence whose device values are out
// of range (kernels/decode/cache.cuh) appends nothing, and a slot whose page entry is
// outside the pool is not written; the decode kernel reports both as NaN rows.
#pragma once
#include "decode/cache.cuh"

namespace flashattn {
namespace decode {

constexpr int kAppendWarps = 4;

template <typename T>
__global__ void __launch_bounds__(kAppendWarps * 32) append_kernel(const AttnParams p) {
  const int lane = threadIdx.x % 32;
  const int64_t task = static_cast<int64_t>(blockIdx.x) * kAppendWarps + threadIdx.x / 32;
  if (task >= p.batch * p.kv_seqlen_new * p.heads_kv) return;
  const int64_t hk = task % p.heads_kv, i = (task / p.heads_kv) % p.kv_seqlen_new;
  const int64_t b = task / (p.heads_kv * p.kv_seqlen_new);
  const Sequence s = sequence(p, b);
  if (!s.ok) return;
  const int64_t j = s.used + i;
  const KeyOffsets off = key_offsets(p, s, b, hk, j);
  if (off.k < 0) return;
  const T* k_src = static_cast<const T*>(p.k_new) + b * p.k_new_stride.b + i * p.k_new_stride.s + hk * p.k_new_stride.h;
  const T* v_src = static_cast<const T*>(p.v_new) + b * p.v_new_stride.b + i * p.v_new_stride.s + hk * p.v_new_stride.h;
  T* k_dst = static_cast<T*>(const_cast<void*>(p.k)) + off.k;
  T* v_dst = static_cast<T*>(const_cast<void*>(p.v)) + off.v;
  const int64_t rotated = p.rotary != 0 ? p.rotary_dim : 0;
  for (int64_t k = lane; k < rotated / 2; k += 32) {
    int64_t da, db;
    rotary_dims(p, k, &da, &db);
    float xa = to_float(k_src[da]), xb = to_float(k_src[db]);
    rotate_pair<T>(p, j, k, &xa, &xb);
    k_dst[da] = from_float<T>(xa);
    k_dst[db] = from_float<T>(xb);
  }
  for (int64_t d = rotated + lane; d < p.head_dim_qk; d += 32) k_dst[d] = k_src[d];
  for (int64_t d = lane; d < p.head_dim_v; d += 32) v_dst[d] = v_src[d];
}

}  // namespace decode
}  // namespace flashattn
