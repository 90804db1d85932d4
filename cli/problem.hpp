// One attention configuration as the CLI describes it, the options that set it, and
// how it becomes a libflashattn plan (through the public setters only).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "args.hpp"
#include "flashattn.h"
#include "tensor.hpp"

namespace facli {

struct Problem {
  int64_t batch = 2, seqlen_q = 256, seqlen_k = 256, heads_q = 8, heads_kv = 8;
  int64_t head_dim = 64, head_dim_v = 64;
  flashattn_dtype_t dtype = FLASHATTN_DTYPE_FP16;
  Layout layout = Layout::kBSHD;
  flashattn_algorithm_t algorithm = FLASHATTN_ALGORITHM_FLASH;
  flashattn_backend_t backend = FLASHATTN_BACKEND_AUTO;
  int device = 0;

  // Band mask (has_band): keep j in [i' - window_left, i' + window_right], negative = unbounded.
  bool has_band = false;
  bool causal = false;
  flashattn_mask_align_t align = FLASHATTN_ALIGN_TOP_LEFT;
  int64_t window_left = -1, window_right = -1;

  float softcap = 0.f;
  flashattn_bias_t alibi = FLASHATTN_BIAS_NONE;  // NONE, ALIBI or ALIBI_SYMMETRIC
  // Bias tensor (--bias-tensor): bias[b, h, i, j] over [batch, heads_q, seqlen_q, seqlen_k],
  // stored with stride 0 along the broadcast dims bias_bcast = (batch, head, query, key).
  bool bias_tensor = false;
  bool bias_bcast[4] = {false, false, false, false};
  // Packed variable-length batch (--varlen): sequence b has seqlens_q[b] queries and
  // seqlens_k[b] keys (0 allowed); seqlen_q/seqlen_k are then the plan's maximum lengths.
  bool varlen = false;
  std::vector<int64_t> seqlens_q, seqlens_k;
  float dropout = 0.f;
  uint64_t seed = 0;          // inputs, dropout key, block-sparse layout
  double block_sparse = 0.0;  // density of the random layout in (0, 1]; 0 = dense
  static constexpr int64_t kSparseBlock = 128;
  bool bwd = false;

  // Derived data the run needs (make_derived fills them).
  std::vector<float> alibi_slopes;     // [heads_q]
  std::vector<uint8_t> layout_blocks;  // [heads_q, ceil(sq/128), ceil(sk/128)]
  std::vector<int64_t> cu_q, cu_k;     // [batch + 1] token offsets (also without varlen)

  void make_derived();
  // Tokens of a --varlen batch (the sums of its lengths); known before make_derived.
  int64_t total_q() const;
  int64_t total_k() const;
  // The stored bias tensor: its dims (1 along broadcast dims) and element strides
  // (batch, head, q, k), contiguous over the stored dims and 0 along broadcast ones.
  void bias_layout(int64_t dims[4], int64_t strides[4]) const;
  int64_t row_blocks() const { return (seqlen_q + kSparseBlock - 1) / kSparseBlock; }
  int64_t col_blocks() const { return (seqlen_k + kSparseBlock - 1) / kSparseBlock; }
  double scale() const;          // the library default 1/sqrt(head_dim), rounded to fp32 as the plan holds it
  std::string describe() const;  // two lines for the check/bench header
};

// Option specs shared by check (and partly by bench).
std::vector<OptSpec> shape_options();    // --batch .. --head-dim-v, --dtype, --layout
std::vector<OptSpec> feature_options();  // --causal, --align, --window, --softcap, --alibi, --bias-tensor, --dropout,
                                         // --seed, --block-sparse, --varlen
std::vector<OptSpec> backend_options();  // --backend, --device, --algorithm

flashattn_backend_t parse_backend(const Args& a, flashattn_backend_t def);
flashattn_dtype_t parse_dtype(const Args& a, flashattn_dtype_t def);
// --causal[=top-left|bottom-right], --align, --window L,R into p.
void parse_mask(const Args& a, Problem* p);
// --batch, --seqlen-q, --seqlen-k, and --varlen (which sets batch and the lengths) into p.
void parse_lengths(const Args& a, Problem* p);
// --alibi[=symmetric] and --bias-tensor SHAPE into p.
void parse_bias(const Args& a, Problem* p);

const char* backend_name(flashattn_backend_t b);
const char* algorithm_name(flashattn_algorithm_t a);

// Plan owner (destroys on scope exit).
class Plan {
 public:
  Plan(flashattn_backend_t backend, int device);  // throws LibraryError
  ~Plan() { flashattn_plan_destroy(plan_); }
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  flashattn_plan_t get() const { return plan_; }
  flashattn_backend_t backend() const;  // resolved (never AUTO)

 private:
  flashattn_plan_t plan_ = nullptr;
};

// Applies every setting of p to the plan with the public setters (LibraryError on failure).
void configure_plan(flashattn_plan_t plan, const Problem& p, flashattn_algorithm_t algorithm);

}  // namespace facli
