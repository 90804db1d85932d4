// A KV-cache problem for the tests of flashattn_fwd_kvcache: random inputs in the plan's
// dtype, a contiguous or paged cache (NHD or HND pages, shuffled page order, NaN in every
// slot no run may read), the library run, and the dense equivalent (the keys each sequence
// attends to, materialized) for the fp64 reference and for the library's dense path.
#pragma once
#include <stdint.h>

#include <string>
#include <vector>

#include "flashattn.h"
#include "harness.hpp"

namespace fat {

struct KvCase {
  std::string name = "kvcache";
  int64_t batch = 2, sq = 1, cap = 40, hq = 2, hkv = 1, dqk = 16, dv = 16;
  flashattn_dtype_t dtype = FLASHATTN_DTYPE_FP16;
  std::vector<int> used;  // keys already cached per sequence (default: cap - seqlen_new for all)
  int64_t seqlen_new = 0;
  int64_t page_size = 0;     // 0 = contiguous
  bool heads_outer = false;  // HND cache layout
  bool batch_idx = false;    // contiguous only: cache rows permuted through cache_batch_idx
  flashattn_rotary_t rotary = FLASHATTN_ROTARY_NONE;
  int64_t rotary_dim = 0;
  bool causal = false;
  int64_t wl = -1, wr = -1;  // band mask (bottom-right) when causal or either is >= 0
  float softcap = 0.f;
  flashattn_bias_t bias = FLASHATTN_BIAS_NONE;  // NONE or ALiBi kinds
  int64_t alibi_batch_stride = 0;               // as Config::alibi_batch_stride
  int64_t num_splits = 0;
  bool with_lse = true;
  uint64_t seed = 1;
};

std::string describe(const KvCase& c);

// Host buffers of one run and what they must hold after it.
struct KvRun {
  KvCase c;
  std::vector<int32_t> used, batch_idx, block_table;
  int64_t num_rows = 0, max_pages = 0;
  int64_t kc_stride[4] = {0, 0, 0, 0}, vc_stride[4] = {0, 0, 0, 0};
  std::vector<uint8_t> q, k_cache, v_cache, k_new, v_new, cos, sin;
  std::vector<uint8_t> k_cache_after, v_cache_after;  // expected caches after the append
  // Dense equivalent: rotated q [batch*sq][hq][dqk], attended keys/values packed per sequence.
  RefSpec spec;
  RefInputs in;
  std::vector<uint8_t> q_rotated, k_dense, v_dense;  // the same, in the dtype (dense-path run)
  std::vector<float> slopes;
};

KvRun make_kv_run(const KvCase& c);

// The KV-cache configuration of r (its stride pointers point into r).
flashattn_kvcache_config_t kv_config(const KvRun& r);

// Plan for c (shape, dtype, options, KV-cache configuration) on `backend` (device 0);
// CHECKs every setter.
flashattn_plan_t make_kv_plan(const KvRun& r, flashattn_backend_t backend = FLASHATTN_BACKEND_CPU);

struct KvResult {
  flashattn_status_t status = FLASHATTN_STATUS_SUCCESS;
  std::string error;
  std::vector<uint8_t> o, k_cache, v_cache;
  std::vector<float> lse;
};

// flashattn_fwd_kvcache on a plan from make_kv_plan, outputs poisoned first; args (and
// the host tables they point to) may be edited by `edit` before the call (bad-input tests).
using KvEdit = void (*)(flashattn_kvcache_args_t&, const KvRun&);
KvResult run_kv(const KvRun& r, flashattn_plan_t plan, KvEdit edit = nullptr);

// Bytewise equality without printing the buffers when it fails.
inline bool same_bytes(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) { return a == b; }

// The library's O (and LSE) as a LibResult in the reference layout, and the Problem that
// check_against_reference compares it with.
Problem kv_problem(const KvRun& r);
LibResult kv_lib_result(const KvRun& r, const KvResult& k);

}  // namespace fat
