// The project's naive attention references, written from the semantics in
// include/flashattn.h and docs/, independent of the library's code (only
// kernels/common/philox.h is shared, for the dropout keep decision that the header defines
// through Philox; tests/test_reference.cpp checks it against published Philox vectors).
// There is one C++ fp64 reference: the Catch2 tests (tests/harness.*), the fuzz target
// (tests/reliability) and the `flashattn check` tool (cli/) all use this one. It is the
// internal static library fa_reference (reference/CMakeLists.txt): never installed,
// never part of libflashattn.so. Its Python twin (reference.py, for the binding's tests
// and the benchmark) is held to it by bindings/python/tests/test_reference_sync.py
// (docs/internals/references.md).
//
//  * reference_fp64 (reference.cpp): materialized S and P in double; forward O, LSE and
//    backward dQ, dK, dV, dBias with every option. This is the "truth" the library is
//    compared with.
//  * reference_lowp (reference_lowp.cpp): a same-precision standard attention in the style
//    of a naive PyTorch implementation: S, P and every intermediate rounded to the input
//    dtype, fp32 accumulation in matmuls and softmax. Its error against reference_fp64 is
//    the tests' yardstick for the library's error (see tests/harness.hpp for the factor).
//
// Options: GQA/MQA (heads_q a multiple of heads_kv), head_dim_v != head_dim_qk, band masks
// (causal, sliding window) in both alignments, softcap, bias tensors with broadcast
// dimensions (and -inf entries), ALiBi (both kinds; slopes per head or per (sequence, head)), dropout (the documented
// Philox keep rule), block-sparse layouts (any block size, one or heads_q layouts), packed variable-length batches
// (empty sequences included), fully masked rows.
//
// Layouts (all dense, "packed tokens", which covers varlen and fixed length alike; without
// varlen token t = b * seqlen_q + i):
//   q, dq     [total_q][heads_q][head_dim_qk]     k, dk [total_k][heads_kv][head_dim_qk]
//   v, dv     [total_k][heads_kv][head_dim_v]     o, do [total_q][heads_q][head_dim_v]
//   lse       [total_q][heads_q]
//   bias      [batch][heads_q][max_sq][max_sk], broadcast already expanded
//   dbias     same shape; along broadcast dims every element holds the group's sum, i.e.
//             exactly what a strided read of the library's dBias (zero strides) returns.
//             A group that no (b, h, i, j) of any sequence reaches (varlen: i >= len_q(b)
//             or j >= len_k(b) for all of it) is 0; the library leaves those unspecified.
#pragma once
#include <stdint.h>

#include <vector>

namespace fat {

struct RefSpec {
  int64_t batch = 1, heads_q = 1, heads_kv = 1, head_dim_qk = 1, head_dim_v = 1;
  int64_t max_sq = 1, max_sk = 1;   // plan seqlen_q / seqlen_k
  std::vector<int64_t> cu_q, cu_k;  // batch + 1 token offsets
  double scale = 1.0;
  double softcap = 0.0;  // 0 = off
  bool band = false;
  int align = 0;  // 0 top-left, 1 bottom-right (also for ALiBi)
  int64_t window_left = -1, window_right = -1;
  int bias_kind = 0;                                  // 0 none, 1 tensor, 2 ALiBi, 3 symmetric ALiBi
  std::vector<double> bias;                           // kind 1, expanded
  bool bias_bcast[4] = {false, false, false, false};  // (batch, head, q, k) broadcast flags
  std::vector<double> slopes;                         // kinds 2, 3: [heads_q] or [batch][heads_q]
  float p_drop = 0.f;                                 // dropout (float, as passed to the library)
  uint64_t seed = 0, offset = 0;
  std::vector<uint8_t> layout;  // block-sparse, empty = dense
  int64_t layout_heads = 1, n_row_blocks = 0, n_col_blocks = 0, block_q = 1, block_k = 1;
  bool magnitudes = true;  // reference_fp64 also computes the *_mag outputs (off: faster)

  int64_t total_q() const { return cu_q.back(); }
  int64_t total_k() const { return cu_k.back(); }
  int64_t len_q(int64_t b) const { return cu_q[b + 1] - cu_q[b]; }
  int64_t len_k(int64_t b) const { return cu_k[b + 1] - cu_k[b]; }
};

struct RefInputs {
  std::vector<double> q, k, v, dout;
};

struct RefOutputs {
  std::vector<double> o, lse, dq, dk, dv, dbias;
  std::vector<uint8_t> row_masked;  // [total_q][heads_q]: 1 if every key of the row is masked
  // reference_fp64 with RefSpec::magnitudes only (else empty): the same sums taken over
  // absolute values of their terms (P_d |V| for O; for dS P (|dP| + |D|) with dP and D
  // expanded into their absolute terms, and onward), the classic condition magnitude that
  // bounds the rounding error of any evaluation order. Used for the error floor.
  std::vector<double> o_mag, dq_mag, dk_mag, dv_mag, dbias_mag;
};

// Keep decision of the dropout mask for (b, h, i, j), as documented at flashattn_plan_set_dropout.
bool ref_dropout_keep(const RefSpec& s, int64_t b, int64_t h, int64_t i, int64_t j);

// Whether (b, h, i, j) takes part at all (band mask, block-sparse layout, -inf bias).
bool ref_allowed(const RefSpec& s, int64_t b, int64_t h, int64_t i, int64_t j);

// threads > 1 spreads the (sequence, kv head) pairs over that many threads; each output
// element is computed in the same order as with one thread, so O, LSE, dQ, dK and dV are
// bitwise the same (dBias too unless the bias broadcasts over batch or heads, where
// per-thread partial sums are added at the end).
RefOutputs reference_fp64(const RefSpec& s, const RefInputs& in, bool backward, int threads = 1);

// Same-precision standard attention; rd rounds a value to the input dtype.
using Rounder = double (*)(double);
RefOutputs reference_lowp(const RefSpec& s, const RefInputs& in, Rounder rd, bool backward);

// sum(O * dO) of reference_fp64's forward: the loss whose gradient the backward returns.
double reference_loss(const RefSpec& s, const RefInputs& in);

}  // namespace fat
