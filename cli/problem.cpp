#include "problem.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "cli.hpp"

namespace facli {

std::vector<OptSpec> shape_options() {
  return {
      {"--batch", OptSpec::kValue, "N", "sequences per batch (default 2)"},
      {"--seqlen-q", OptSpec::kValue, "N", "query length (default 256)"},
      {"--seqlen-k", OptSpec::kValue, "N", "key/value length (default: --seqlen-q)"},
      {"--heads-q", OptSpec::kValue, "N", "query heads (default 8)"},
      {"--heads-kv", OptSpec::kValue, "N", "key/value heads, dividing --heads-q (default: --heads-q)"},
      {"--head-dim", OptSpec::kValue, "D", "head dim of Q and K (default 64)"},
      {"--head-dim-v", OptSpec::kValue, "D", "head dim of V and O (default: --head-dim)"},
      {"--dtype", OptSpec::kValue, "fp16|bf16|fp32", "element type (default fp16)"},
      {"--layout", OptSpec::kValue, "bshd|bhsd", "memory order of every tensor (default bshd)"},
  };
}

std::vector<OptSpec> feature_options() {
  return {
      {"--causal", OptSpec::kOptionalValue, "top-left|bottom-right", "causal mask (default alignment top-left)"},
      {"--align", OptSpec::kValue, "top-left|bottom-right", "alignment of --window and --alibi (default top-left)"},
      {"--window", OptSpec::kValue, "L,R", "sliding window: keys i'-L..i'+R (negative = unbounded side)"},
      {"--softcap", OptSpec::kValue, "C", "softcap C > 0: s = C*tanh(s/C) (default 0 = off)"},
      {"--alibi", OptSpec::kOptionalValue, "symmetric",
       "ALiBi bias slope[h]*(j-i') (=symmetric: -slope*|i'-j|); slope[h] = 2^(-8(h+1)/heads_q)"},
      {"--bias-tensor", OptSpec::kValue, "full|BCAST[,BCAST]",
       "bias tensor [batch,heads_q,seqlen_q,seqlen_k] of N(0,1) values: full, or stride 0 along each BCAST "
       "named (batch-broadcast, head-broadcast, query-broadcast, key-broadcast)"},
      {"--dropout", OptSpec::kValue, "P", "dropout probability in [0, 1) (default 0)"},
      {"--seed", OptSpec::kValue, "S",
       "seed of the inputs (bias tensor included), the dropout mask and the sparse layout (default 0)"},
      {"--block-sparse", OptSpec::kValue, "DENSITY",
       "random block-sparse layout, 128x128 blocks kept with probability DENSITY in (0, 1]"},
      {"--varlen", OptSpec::kValue, "LEN[:LEN_K],...",
       "packed varlen batch, one sequence per entry: LEN queries, LEN_K (default LEN) keys, 0 allowed; sets "
       "--batch; --seqlen-q/-k (default: the longest) are the plan's maxima"},
  };
}

std::vector<OptSpec> backend_options() {
  return {
      {"--backend", OptSpec::kValue, "cpu|cuda|auto", "backend (default auto: CUDA if usable, else CPU)"},
      {"--device", OptSpec::kValue, "N", "CUDA device ordinal (default 0)"},
      {"--algorithm", OptSpec::kValue, "flash|standard", "algorithm (default flash)"},
  };
}

flashattn_backend_t parse_backend(const Args& a, flashattn_backend_t def) {
  const std::string d = def == FLASHATTN_BACKEND_CPU ? "cpu" : def == FLASHATTN_BACKEND_CUDA ? "cuda" : "auto";
  const std::string s = a.get_choice("--backend", d, {"cpu", "cuda", "auto"});
  return s == "cpu" ? FLASHATTN_BACKEND_CPU : s == "cuda" ? FLASHATTN_BACKEND_CUDA : FLASHATTN_BACKEND_AUTO;
}

flashattn_dtype_t parse_dtype(const Args& a, flashattn_dtype_t def) {
  const std::string s = a.get_choice("--dtype", dtype_name(def), {"fp16", "bf16", "fp32"});
  return s == "fp16" ? FLASHATTN_DTYPE_FP16 : s == "bf16" ? FLASHATTN_DTYPE_BF16 : FLASHATTN_DTYPE_FP32;
}

static flashattn_mask_align_t parse_align_word(const std::string& flag, const std::string& s) {
  if (s == "top-left") return FLASHATTN_ALIGN_TOP_LEFT;
  if (s == "bottom-right") return FLASHATTN_ALIGN_BOTTOM_RIGHT;
  throw UsageError(flag + ": '" + s + "' is not one of top-left|bottom-right");
}

void parse_mask(const Args& a, Problem* p) {
  bool align_given = false;
  if (a.has("--align")) {
    p->align = parse_align_word("--align", a.raw("--align"));
    align_given = true;
  }
  if (a.has("--causal")) {
    p->causal = true;
    p->has_band = true;
    p->window_left = -1;
    p->window_right = 0;
    const std::string v = a.raw("--causal");
    if (!v.empty()) {
      const flashattn_mask_align_t al = parse_align_word("--causal", v);
      if (align_given && al != p->align) throw UsageError("--causal=" + v + " contradicts --align " + a.raw("--align"));
      p->align = al;
    }
  }
  if (a.has("--window")) {
    const std::string s = a.raw("--window");
    const size_t comma = s.find(',');
    int64_t l = 0, r = 0;
    if (comma == std::string::npos || !parse_int(s.substr(0, comma), &l) || !parse_int(s.substr(comma + 1), &r))
      throw UsageError("--window: '" + s + "' is not L,R (two integers, negative = unbounded)");
    if (l < 0 && r < 0 && !p->causal)
      throw UsageError("--window " + s + " has both sides unbounded: that is no mask (omit --window)");
    if (p->causal) {
      if (r > 0)
        throw UsageError("--window " + s + ": right window " + std::to_string(r) +
                         " contradicts --causal (right window 0)");
      r = 0;
    }
    p->has_band = true;
    p->window_left = l < 0 ? -1 : l;
    p->window_right = r < 0 ? -1 : r;
  }
}

void parse_lengths(const Args& a, Problem* p) {
  const int64_t kMax = int64_t(1) << 40;
  if (!a.has("--varlen")) {
    p->batch = a.get_int("--batch", 2, 1, kMax);
    p->seqlen_q = a.get_int("--seqlen-q", 256, 1, kMax);
    p->seqlen_k = a.get_int("--seqlen-k", p->seqlen_q, 1, kMax);
    return;
  }
  // Entries LEN or LEN_Q:LEN_K; cu_seqlens are int32, so the totals must fit one.
  const std::string s = a.raw("--varlen");
  const int64_t kMaxTokens = 0x7FFFFFFF;
  p->varlen = true;
  p->seqlens_q.clear();
  p->seqlens_k.clear();
  int64_t total_q = 0, total_k = 0, longest_q = 1, longest_k = 1;
  size_t pos = 0;
  while (true) {
    const size_t comma = s.find(',', pos);
    const std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    const size_t colon = item.find(':');
    int64_t lq = 0, lk = 0;
    const bool ok = colon == std::string::npos
                        ? parse_int(item, &lq) && (lk = lq, true)
                        : parse_int(item.substr(0, colon), &lq) && parse_int(item.substr(colon + 1), &lk);
    if (!ok) throw UsageError("--varlen: '" + item + "' in '" + s + "' is not LEN or LEN_Q:LEN_K (integers >= 0)");
    if (lq < 0 || lk < 0) throw UsageError("--varlen: '" + item + "' in '" + s + "' has a negative length");
    total_q += lq;
    total_k += lk;
    if (total_q > kMaxTokens || total_k > kMaxTokens)
      throw UsageError("--varlen " + s + ": more than 2^31-1 tokens (cu_seqlens are int32)");
    p->seqlens_q.push_back(lq);
    p->seqlens_k.push_back(lk);
    longest_q = std::max(longest_q, lq);
    longest_k = std::max(longest_k, lk);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  const int64_t n = static_cast<int64_t>(p->seqlens_q.size());
  p->batch = a.get_int("--batch", n, 1, kMax);
  if (p->batch != n)
    throw UsageError(
        strf("--batch=%lld contradicts --varlen %s (%lld sequences)", (long long)p->batch, s.c_str(), (long long)n));
  p->seqlen_q = a.get_int("--seqlen-q", longest_q, 1, kMax);
  p->seqlen_k = a.get_int("--seqlen-k", longest_k, 1, kMax);
  if (p->seqlen_q < longest_q)
    throw UsageError(strf("--seqlen-q=%lld is less than the longest --varlen query length %lld", (long long)p->seqlen_q,
                          (long long)longest_q));
  if (p->seqlen_k < longest_k)
    throw UsageError(strf("--seqlen-k=%lld is less than the longest --varlen key length %lld", (long long)p->seqlen_k,
                          (long long)longest_k));
}

void parse_bias(const Args& a, Problem* p) {
  if (a.has("--alibi")) {
    const std::string v = a.raw("--alibi");
    if (!v.empty() && v != "symmetric") throw UsageError("--alibi=" + v + ": the only value is 'symmetric'");
    p->alibi = v.empty() ? FLASHATTN_BIAS_ALIBI : FLASHATTN_BIAS_ALIBI_SYMMETRIC;
  }
  if (!a.has("--bias-tensor")) return;
  if (p->alibi != FLASHATTN_BIAS_NONE)
    throw UsageError("--bias-tensor cannot be combined with --alibi (a plan has one bias kind)");
  const std::string s = a.raw("--bias-tensor");
  p->bias_tensor = true;
  if (s == "full") return;
  static const char* const kDims[4] = {"batch-broadcast", "head-broadcast", "query-broadcast", "key-broadcast"};
  size_t pos = 0;
  while (true) {
    const size_t comma = s.find(',', pos);
    const std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    int d = 0;
    while (d < 4 && item != kDims[d]) ++d;
    if (d == 4)
      throw UsageError("--bias-tensor: '" + item + "' in '" + s +
                       "' is not one of full|batch-broadcast|head-broadcast|query-broadcast|key-broadcast");
    if (p->bias_bcast[d]) throw UsageError("--bias-tensor: '" + item + "' given twice in '" + s + "'");
    p->bias_bcast[d] = true;
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
}

const char* backend_name(flashattn_backend_t b) {
  switch (b) {
    case FLASHATTN_BACKEND_AUTO: return "auto";
    case FLASHATTN_BACKEND_CPU: return "cpu";
    case FLASHATTN_BACKEND_CUDA: return "cuda";
    default: break;
  }
  return "?";
}

const char* algorithm_name(flashattn_algorithm_t a) { return a == FLASHATTN_ALGORITHM_STANDARD ? "standard" : "flash"; }

double Problem::scale() const {
  return static_cast<double>(static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim))));
}

void Problem::bias_layout(int64_t dims[4], int64_t strides[4]) const {
  const int64_t full[4] = {batch, heads_q, seqlen_q, seqlen_k};
  int64_t next = 1;
  for (int d = 3; d >= 0; --d) {
    dims[d] = bias_bcast[d] ? 1 : full[d];
    strides[d] = bias_bcast[d] ? 0 : next;
    next *= dims[d];
  }
}

int64_t Problem::total_q() const { return std::accumulate(seqlens_q.begin(), seqlens_q.end(), int64_t{0}); }
int64_t Problem::total_k() const { return std::accumulate(seqlens_k.begin(), seqlens_k.end(), int64_t{0}); }

void Problem::make_derived() {
  alibi_slopes.clear();
  if (alibi != FLASHATTN_BIAS_NONE) {
    // The geometric sequence of the ALiBi paper, 2^(-8(h+1)/H), used for any H.
    for (int64_t h = 0; h < heads_q; ++h)
      alibi_slopes.push_back(static_cast<float>(std::exp2(-8.0 * static_cast<double>(h + 1) / heads_q)));
  }
  cu_q.assign(1, 0);
  cu_k.assign(1, 0);
  for (int64_t b = 0; b < batch; ++b) {
    cu_q.push_back(cu_q.back() + (varlen ? seqlens_q[static_cast<size_t>(b)] : seqlen_q));
    cu_k.push_back(cu_k.back() + (varlen ? seqlens_k[static_cast<size_t>(b)] : seqlen_k));
  }
  layout_blocks.clear();
  if (block_sparse > 0.0) {
    const size_t n = static_cast<size_t>(heads_q * row_blocks() * col_blocks());
    layout_blocks.resize(n);
    for (size_t i = 0; i < n; ++i) layout_blocks[i] = random_uniform(seed, 0xB10C, i) < block_sparse ? 1 : 0;
  }
}

std::string Problem::describe() const {
  std::string s = strf(
      "shape: batch=%lld seqlen_q=%lld seqlen_k=%lld heads_q=%lld heads_kv=%lld head_dim=%lld head_dim_v=%lld dtype=%s "
      "layout=%s\n",
      (long long)batch, (long long)seqlen_q, (long long)seqlen_k, (long long)heads_q, (long long)heads_kv,
      (long long)head_dim, (long long)head_dim_v, dtype_name(dtype), layout_name(layout));
  const char* al = align == FLASHATTN_ALIGN_TOP_LEFT ? "top-left" : "bottom-right";
  std::string mask = "none";
  if (has_band) {
    auto w = [](int64_t x) { return x < 0 ? std::string("inf") : std::to_string(x); };
    mask = causal && window_left < 0
               ? strf("causal(%s)", al)
               : strf("window(left=%s,right=%s,%s)", w(window_left).c_str(), w(window_right).c_str(), al);
  }
  s += strf("options: scale=%.6g mask=%s softcap=%g alibi=%s dropout=%g seed=%llu block-sparse=%s", scale(),
            mask.c_str(), static_cast<double>(softcap),
            alibi == FLASHATTN_BIAS_NONE    ? "off"
            : alibi == FLASHATTN_BIAS_ALIBI ? "on"
                                            : "symmetric",
            static_cast<double>(dropout), static_cast<unsigned long long>(seed),
            block_sparse > 0 ? strf("%g(block %lld)", block_sparse, (long long)kSparseBlock).c_str() : "off");
  if (alibi != FLASHATTN_BIAS_NONE && !has_band) s += strf(" align=%s", al);
  if (bias_tensor) {
    static const char* const kDims[4] = {"batch", "head", "query", "key"};
    std::string bc;
    for (int d = 0; d < 4; ++d)
      if (bias_bcast[d]) bc += std::string(bc.empty() ? "" : ",") + kDims[d];
    s += strf(" bias-tensor=%s", bc.empty() ? "full" : ("broadcast(" + bc + ")").c_str());
  }
  if (varlen) {
    std::string lens;
    for (size_t b = 0; b < seqlens_q.size(); ++b)
      lens += strf("%s%lld:%lld", b ? "," : "", (long long)seqlens_q[b], (long long)seqlens_k[b]);
    s += strf("\nvarlen: %s (total_q=%lld total_k=%lld; seqlen_q/k above are the maxima)", lens.c_str(),
              (long long)total_q(), (long long)total_k());
  }
  return s;
}

Plan::Plan(flashattn_backend_t backend, int device) {
  lib_check(flashattn_plan_create(&plan_, backend, device), "flashattn_plan_create");
}

flashattn_backend_t Plan::backend() const {
  flashattn_backend_t b = FLASHATTN_BACKEND_AUTO;
  lib_check(flashattn_plan_get_backend(plan_, &b), "flashattn_plan_get_backend");
  return b;
}

void configure_plan(flashattn_plan_t plan, const Problem& p, flashattn_algorithm_t algorithm) {
  lib_check(
      flashattn_plan_set_shape(plan, p.batch, p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_kv, p.head_dim, p.head_dim_v),
      "flashattn_plan_set_shape");
  lib_check(flashattn_plan_set_dtype(plan, p.dtype), "flashattn_plan_set_dtype");
  if (p.varlen) lib_check(flashattn_plan_set_varlen(plan, 1, p.total_q(), p.total_k()), "flashattn_plan_set_varlen");
  if (p.layout != Layout::kBSHD) {
    // Varlen tensors are one packed "sequence" of all tokens (the batch stride is ignored).
    const int64_t dq = p.head_dim, dv = p.head_dim_v, nb = p.varlen ? 1 : p.batch;
    const int64_t sq = p.varlen ? p.total_q() : p.seqlen_q, sk = p.varlen ? p.total_k() : p.seqlen_k;
    struct {
      flashattn_tensor_t t;
      int64_t s, h, d;
    } tensors[] = {{FLASHATTN_TENSOR_Q, sq, p.heads_q, dq},   {FLASHATTN_TENSOR_K, sk, p.heads_kv, dq},
                   {FLASHATTN_TENSOR_V, sk, p.heads_kv, dv},  {FLASHATTN_TENSOR_O, sq, p.heads_q, dv},
                   {FLASHATTN_TENSOR_DO, sq, p.heads_q, dv},  {FLASHATTN_TENSOR_DQ, sq, p.heads_q, dq},
                   {FLASHATTN_TENSOR_DK, sk, p.heads_kv, dq}, {FLASHATTN_TENSOR_DV, sk, p.heads_kv, dv}};
    for (const auto& t : tensors) {
      int64_t st[4];
      layout_strides(p.layout, nb, t.s, t.h, t.d, st);
      lib_check(flashattn_plan_set_strides(plan, t.t, st), "flashattn_plan_set_strides");
    }
  }
  lib_check(flashattn_plan_set_algorithm(plan, algorithm), "flashattn_plan_set_algorithm");
  if (p.has_band || p.alibi != FLASHATTN_BIAS_NONE)
    lib_check(
        flashattn_plan_set_band_mask(plan, p.align, p.has_band ? p.window_left : -1, p.has_band ? p.window_right : -1),
        "flashattn_plan_set_band_mask");
  if (p.softcap > 0.f) lib_check(flashattn_plan_set_softcap(plan, p.softcap), "flashattn_plan_set_softcap");
  if (p.alibi != FLASHATTN_BIAS_NONE)
    lib_check(flashattn_plan_set_bias(plan, p.alibi, nullptr), "flashattn_plan_set_bias");
  if (p.bias_tensor) {
    int64_t dims[4], strides[4];
    p.bias_layout(dims, strides);
    lib_check(flashattn_plan_set_bias(plan, FLASHATTN_BIAS_TENSOR, strides), "flashattn_plan_set_bias");
  }
  if (p.dropout > 0.f) lib_check(flashattn_plan_set_dropout(plan, p.dropout, p.seed, 0), "flashattn_plan_set_dropout");
  if (!p.layout_blocks.empty())
    lib_check(flashattn_plan_set_block_sparse(plan, p.layout_blocks.data(), p.heads_q, p.row_blocks(), p.col_blocks(),
                                              Problem::kSparseBlock, Problem::kSparseBlock),
              "flashattn_plan_set_block_sparse");
}

}  // namespace facli
