// The fully validated description of one run, handed from the API layer to a backend.
//
// Built by src/validate.cpp from a plan and a run's args once every check passed; the
// CPU backend reads it directly and the CUDA host code copies what its kernels need.
// Plain data only, so it can also be passed by value to a kernel.
#pragma once
#include <stdint.h>

#include "common/hostdevice.h"

namespace flashattn {

enum DtypeId : int32_t { kFp16 = 0, kBf16 = 1, kFp32 = 2 };
enum BiasKind : int32_t { kBiasNone = 0, kBiasTensor = 1, kBiasAlibi = 2, kBiasAlibiSymmetric = 3 };
enum Direction : int32_t { kForward = 0, kBackward = 1 };

// Strides in elements, order (batch, seq, head, dim); dim is always 1.
struct Strides4 {
  int64_t b, s, h, d;
};

struct AttnParams {
  // ---- problem shape ----
  int64_t batch;     // number of sequences
  int64_t seqlen_q;  // max query length (per-sequence length without varlen)
  int64_t seqlen_k;  // max key length
  int64_t heads_q, heads_kv;
  int64_t head_dim_qk, head_dim_v;
  int32_t dtype;      // DtypeId
  int32_t algorithm;  // flashattn_algorithm_t value
  int32_t direction;  // Direction
  int32_t deterministic;

  // ---- variable length (varlen != 0): token offsets per sequence, batch+1 entries ----
  int32_t varlen;
  int64_t total_q, total_k;
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;

  // ---- tensors (dtype above unless stated) ----
  const void* q;
  const void* k;
  const void* v;
  const void* o_in;     // backward: forward output
  void* o;              // forward: output
  float* lse;           // forward: output, may be null; contiguous [batch, heads_q, seqlen_q] or [heads_q, total_q]
  const float* lse_in;  // backward: forward LSE, same layout
  const void* dout;
  void* dq;
  void* dk;
  void* dv;
  Strides4 q_stride, k_stride, v_stride, o_stride, do_stride, dq_stride, dk_stride, dv_stride;

  // ---- scores ----
  float scale;    // softmax scale
  float softcap;  // 0 = off

  // ---- band mask: keep (i, j) iff j <= i' + window_right (if >= 0) and j >= i' - window_left (if >= 0) ----
  int32_t has_band;  // 0 when both windows are unbounded
  int32_t align;     // flashattn_mask_align_t: 0 top-left, 1 bottom-right
  int64_t window_left, window_right;

  // ---- bias ----
  int32_t bias_kind;  // BiasKind
  const void* bias;   // kBiasTensor: strides (batch, head, q, k); k stride is 0 or 1
  void* dbias;        // backward, optional: same strides, summed over zero-stride dims
  int64_t bias_stride[4];
  const float* alibi_slopes;  // [heads_q], or [batch, heads_q] rows alibi_batch_stride apart (below)

  // ---- dropout ----
  float p_drop;             // as the plan holds it; dropout is off where dropout_active(drop_threshold) is not
  float rp_keep;            // dropout_keep_scale(drop_threshold)
  uint32_t drop_threshold;  // dropout_threshold(p_drop), < 2^16
  uint64_t seed, offset;

  // ---- block-sparse (layout != null): [layout_heads, n_row_blocks, n_col_blocks] ----
  const uint8_t* layout;  // host copy for CPU, device copy for CUDA
  int64_t layout_heads, n_row_blocks, n_col_blocks, block_q, block_k;

  // ---- KV cache (kv_enabled != 0; flashattn_fwd_kvcache): K/V rows come from the cache ----
  // Sequence b attends to its first kv_seqused[b] + kv_seqlen_new keys. Contiguous cache
  // (kv_page_size 0): row kv_batch_idx[b] (or b) at batch stride of k/v_stride. Paged: key
  // j lives in page kv_block_table[b * kv_max_pages + j / kv_page_size] at slot
  // j % kv_page_size (the page index steps k/v_stride.b, the slot k/v_stride.s).
  int32_t kv_enabled;
  const int32_t* kv_seqused;      // [batch]: keys in the cache before the append
  const int32_t* kv_batch_idx;    // [batch] or null
  const int32_t* kv_block_table;  // [batch, kv_max_pages] or null (contiguous)
  int64_t kv_page_size, kv_max_pages, kv_num_rows;
  int64_t kv_seqlen_new;  // rows appended per sequence (0 = none)
  const void* k_new;
  const void* v_new;
  Strides4 k_new_stride, v_new_stride;
  int32_t rotary;  // flashattn_rotary_t value (0 = none)
  int64_t rotary_dim, rotary_rows;
  const void* rotary_cos;  // [rotary_rows, rotary_dim / 2], plan dtype
  const void* rotary_sin;
  int64_t kv_num_splits;  // key splits per (sequence, query head, query block), >= 1; CUDA: 0, each run's choice

  // ---- added later, kept last: earlier fields keep their offsets in the kernels' parameters ----
  int64_t alibi_batch_stride;  // ALiBi: 0 = one slope per head, shared by every sequence
  int32_t grad_accumulate;     // backward: dX = round(float(dX) + gradient) for dQ, dK, dV
};

// Rows of the LSE layout (and of the backward's Delta vector): batch x heads_q x seqlen_q,
// or heads_q x total_q with varlen.
FA_HD int64_t lse_row_count(const AttnParams& p) {
  return p.varlen ? p.heads_q * p.total_q : p.batch * p.heads_q * p.seqlen_q;
}

}  // namespace flashattn

namespace flashattn {

// A validated flashattn_combine call (strides in elements, contiguous ones filled in).
struct CombineParams {
  int64_t num_splits, batch, seqlen_q, heads, head_dim;
  const float* o_partial;
  int64_t o_partial_stride[5];  // (split, batch, seq, head, dim)
  const float* lse_partial;
  int64_t lse_partial_stride[4];  // (split, batch, head, seq)
  int32_t dtype;                  // DtypeId of o
  void* o;
  Strides4 o_stride;
  float* lse;  // [batch, heads, seqlen_q] or null
};

}  // namespace flashattn
