// libFuzzer target: random sequences of plan setters, workspace queries and forward/backward
// runs on the CPU backend. Shape fields are mostly small, sometimes drawn log-uniformly over
// the whole int64 range: huge shapes are only queried (their workspace size must be an
// error or at least an independently computed lower bound, never a wrapped number), small
// ones are also run with real buffers.
//
// A shadow copy of the documented plan semantics follows every setter that succeeded, so
// each run can be checked against the fp64 reference (reference/reference.hpp). Checked on
// every call:
//  - the status is a documented value, and the message is set exactly when it fails;
//  - a failing run writes nothing: every output buffer (padding included) keeps its poison;
//  - a successful run matches the reference within a dtype-dependent tolerance and leaves
//    the gaps of strided outputs untouched.
// Any violation calls abort(), which libFuzzer reports as a crash with the input saved.
#include <flashattn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <random>
#include <vector>

#include "dtype.hpp"
#include "reference.hpp"

namespace {

[[noreturn]] void violation(const char* what, flashattn_status_t st) {
  fprintf(stderr, "fuzz violation: %s (status %s, message '%s')\n", what, flashattn_status_string(st),
          flashattn_last_error());
  abort();
}

struct Reader {
  const uint8_t* data;
  size_t size;
  size_t pos = 0;
  uint8_t u8() { return pos < size ? data[pos++] : 0; }
  uint64_t u64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = (v << 8) | u8();
    return v;
  }
  bool done() const { return pos >= size; }
  // Log-uniform over the whole int64 range: a bit length of 0..63 (value 0 or in
  // [2^(len-1), 2^len)), random lower bits, negative one time in four.
  int64_t log_uniform() {
    const int len = u8() % 64;
    const uint64_t top = len == 0 ? 0 : uint64_t{1} << (len - 1);
    const int64_t x = static_cast<int64_t>(top | (u64() & (top == 0 ? 0 : top - 1)));
    return (u8() & 3) == 0 ? -x : x;
  }
  // Mostly small valid values, sometimes log-uniform ones, sometimes edge cases.
  int64_t dim(int64_t lo, int64_t hi) {
    const uint8_t c = u8();
    if (c < 200) return lo + c % (hi - lo + 1);
    if (c < 236) return log_uniform();
    static const int64_t edge[] = {0, -1, 257, 300, INT64_C(1) << 32, INT64_MIN, INT64_MAX, 4096, 17, 1};
    return edge[c % 10];
  }
  float real(const float* table, int n) { return table[u8() % n]; }
};

// The plan as the header documents it, updated only by setters that returned SUCCESS.
struct Shadow {
  bool has_shape = false;
  int64_t b = 0, sq = 0, sk = 0, hq = 0, hkv = 0, dqk = 0, dv = 0;
  flashattn_dtype_t dtype = FLASHATTN_DTYPE_FP16;
  int64_t strides[8][4] = {};
  float scale = 0.f;
  flashattn_algorithm_t algorithm = FLASHATTN_ALGORITHM_FLASH;
  bool varlen = false;
  int64_t tq = 0, tk = 0;
  int align = 0;
  int64_t wl = -1, wr = -1;
  float softcap = 0.f;
  flashattn_bias_t bias = FLASHATTN_BIAS_NONE;
  int64_t bias_strides[4] = {};
  float p = 0.f;
  uint64_t seed = 0, offset = 0;
  std::vector<uint8_t> layout;
  int64_t lh = 0, nrb = 0, ncb = 0, bq = 0, bk = 0;

  void extents(int t, int64_t e[4]) const {
    const bool qside =
        t == FLASHATTN_TENSOR_Q || t == FLASHATTN_TENSOR_O || t == FLASHATTN_TENSOR_DO || t == FLASHATTN_TENSOR_DQ;
    const bool vdim =
        t == FLASHATTN_TENSOR_V || t == FLASHATTN_TENSOR_O || t == FLASHATTN_TENSOR_DO || t == FLASHATTN_TENSOR_DV;
    e[0] = varlen ? 1 : b;
    e[1] = qside ? (varlen ? tq : sq) : (varlen ? tk : sk);
    e[2] = qside ? hq : hkv;
    e[3] = vdim ? dv : dqk;
  }
  void reset_strides() {  // contiguous BSHD of the fixed-length shape (documented for set_shape)
    Shadow fixed = *this;
    fixed.varlen = false;
    for (int t = 0; t < 8; ++t) {
      int64_t e[4];
      fixed.extents(t, e);
      strides[t][3] = 1;
      strides[t][2] = e[3];
      strides[t][1] = e[2] * e[3];
      strides[t][0] = e[1] * e[2] * e[3];
    }
  }
  // Elements a buffer needs for tensor t (max offset + 1), SIZE_MAX beyond 2^63 (strides
  // kept from a smaller shape or from fixed-length mode may reach that far).
  size_t elems(int t) const {
    int64_t e[4];
    extents(t, e);
    __int128 span = 0;
    for (int d = 0; d < 4; ++d) {
      if (e[d] == 0) return 0;
      span += static_cast<__int128>(strides[t][d]) * (e[d] - 1);
    }
    return span < INT64_MAX ? static_cast<size_t>(span + 1) : SIZE_MAX;
  }
};

constexpr size_t kMaxElems = 1 << 16;  // runs on larger shapes only exercise validation
constexpr size_t kUnwritten = 12345;   // out-parameter sentinel

void check_status(flashattn_status_t st) {
  if (strcmp(flashattn_status_string(st), "FLASHATTN_STATUS_UNKNOWN") == 0) violation("undocumented status", st);
  const bool has_msg = flashattn_last_error()[0] != '\0';
  if ((st == FLASHATTN_STATUS_SUCCESS) == has_msg) violation("message set iff failure", st);
}

// A lower bound on the CPU workspace of a pass, independent of the library's layout:
// STANDARD materializes the fp32 scores of one (sequence, head), and dP too in the
// backward; the flash path needs no more than its tiles.
__int128 workspace_lower_bound(const Shadow& s, bool backward) {
  if (!s.has_shape || s.algorithm != FLASHATTN_ALGORITHM_STANDARD) return 0;
  return static_cast<__int128>(4) * s.sq * s.sk * (backward ? 2 : 1);
}

// A workspace query (pass 0..2: 2 is invalid) and what its answer must satisfy: a size is
// at least the lower bound and at most 2^63-1 (no object is larger), so a wrapped size is
// caught; a bound beyond 2^63-1 must be refused; a failure leaves *bytes alone.
flashattn_status_t query_workspace(flashattn_plan_t plan, const Shadow& s, int pass, size_t* bytes) {
  *bytes = kUnwritten;
  const flashattn_status_t st = flashattn_plan_get_workspace_size(plan, static_cast<flashattn_pass_t>(pass), bytes);
  check_status(st);
  if (st != FLASHATTN_STATUS_SUCCESS) {
    if (*bytes != kUnwritten) violation("workspace query wrote on failure", st);
    return st;
  }
  if (pass > 1) violation("workspace query accepted an invalid pass", st);
  const __int128 bound = workspace_lower_bound(s, pass == 1);
  if (static_cast<__int128>(*bytes) < bound || *bytes > static_cast<size_t>(INT64_MAX)) {
    fprintf(stderr, "workspace %zu bytes, lower bound %.6g (sq=%lld sk=%lld algorithm=%d)\n", *bytes,
            static_cast<double>(bound), (long long)s.sq, (long long)s.sk, (int)s.algorithm);
    violation("workspace size below the lower bound or beyond 2^63-1 (wrapped)", st);
  }
  return st;
}

struct Buffer {
  std::vector<uint8_t> bytes;
  void poison(size_t n) { bytes.assign(n + 64, 0xA5); }
  uint8_t* ptr(size_t misalign = 0) {  // +16 leaves room to misalign; unsized runs get a small buffer
    if (bytes.size() < 64) bytes.resize(64, 0xA5);
    return bytes.data() + 16 + misalign;
  }
  bool untouched() const {
    return std::all_of(bytes.begin(), bytes.end(), [](uint8_t x) { return x == 0xA5; });
  }
};

// Random tensor values, stored in the plan's dtype at every logical element; gaps stay 0.
void fill(const Shadow& s, int t, Buffer& buf, std::mt19937_64& rng, double magnitude) {
  const size_t es = fat::dtype_size(s.dtype);
  buf.bytes.assign(s.elems(t) * es + 64, 0);
  int64_t e[4];
  s.extents(t, e);
  std::normal_distribution<double> nd(0.0, magnitude);
  for (int64_t b = 0; b < e[0]; ++b)
    for (int64_t i = 0; i < e[1]; ++i)
      for (int64_t h = 0; h < e[2]; ++h)
        for (int64_t d = 0; d < e[3]; ++d) {
          const int64_t off = b * s.strides[t][0] + i * s.strides[t][1] + h * s.strides[t][2] + d;
          fat::store_elem(s.dtype, buf.ptr() + off * es, nd(rng));
        }
}

// Logical element (token, head, dim) of tensor t as double (token = b*seqlen + i without varlen).
double element(const Shadow& s, int t, const Buffer& buf, int64_t token, int64_t h, int64_t d) {
  int64_t e[4];
  s.extents(t, e);
  const int64_t b = s.varlen ? 0 : token / e[1], i = s.varlen ? token : token % e[1];
  const int64_t off = b * s.strides[t][0] + i * s.strides[t][1] + h * s.strides[t][2] + d;
  return fat::load_elem(s.dtype, buf.bytes.data() + 16 + off * fat::dtype_size(s.dtype));
}

void gather(const Shadow& s, int t, const Buffer& buf, std::vector<double>& out) {
  int64_t e[4];
  s.extents(t, e);
  const int64_t tokens = e[0] * e[1];
  out.resize(static_cast<size_t>(tokens * e[2] * e[3]));
  for (int64_t tok = 0; tok < tokens; ++tok)
    for (int64_t h = 0; h < e[2]; ++h)
      for (int64_t d = 0; d < e[3]; ++d) out[(tok * e[2] + h) * e[3] + d] = element(s, t, buf, tok, h, d);
}

// With large scores the backward's P = exp(S - LSE) also carries the rounding of S itself,
// which it recomputes in fp32: up to (dqk + 2) u scale sum_d |q_d k_d| (a dot product of dqk
// terms, then the scale), more than |LSE| u where the products cancel. That bound over every
// (query row, key row) pair of a head group (sequence boundaries ignored: a larger set), as a
// relative error of every P and so of dV = P^T dO.
double score_rounding(const Shadow& s, const fat::RefInputs& in, double scale) {
  if (s.hq <= 0 || s.hkv <= 0 || s.dqk <= 0) return 0.0;
  const int64_t group = s.hq / s.hkv;
  const int64_t nq = static_cast<int64_t>(in.q.size()) / (s.hq * s.dqk);
  const int64_t nk = static_cast<int64_t>(in.k.size()) / (s.hkv * s.dqk);
  double worst = 0.0;
  for (int64_t i = 0; i < nq; ++i)
    for (int64_t h = 0; h < s.hq; ++h) {
      const double* q = &in.q[(i * s.hq + h) * s.dqk];
      for (int64_t j = 0; j < nk; ++j) {
        const double* k = &in.k[(j * s.hkv + h / group) * s.dqk];
        double acc = 0.0;
        for (int64_t d = 0; d < s.dqk; ++d) acc += fabs(q[d] * k[d]);
        worst = std::max(worst, acc);
      }
    }
  return static_cast<double>(s.dqk + 2) * 5.96e-8 * fabs(scale) * worst;
}

double tolerance(flashattn_dtype_t t) {
  return t == FLASHATTN_DTYPE_FP32 ? 2e-4 : t == FLASHATTN_DTYPE_FP16 ? 4e-3 : 3e-2;
}

// |got - want| <= tol * max(1, max|want|) + slack for every element.
void compare(const char* what, const std::vector<double>& got, const std::vector<double>& want, double tol,
             double slack = 0.0) {
  // Varlen: tokens past the last sequence belong to no sequence and are not compared here.
  if (got.size() < want.size()) violation("reference size mismatch", FLASHATTN_STATUS_SUCCESS);
  double scale = 1.0;
  for (double w : want)
    if (isfinite(w)) scale = std::max(scale, fabs(w));
  for (size_t i = 0; i < want.size(); ++i) {
    if (isinf(want[i]) && got[i] == want[i]) continue;
    if (!(fabs(got[i] - want[i]) <= tol * scale + slack)) {
      fprintf(stderr, "%s[%zu]: got %.9g want %.9g (tol %.3g)\n", what, i, got[i], want[i], tol * scale + slack);
      violation("result differs from the fp64 reference", FLASHATTN_STATUS_SUCCESS);
    }
  }
}

// Scatter a reference tensor ([token][head][dim]) into a strided buffer of tensor t.
void scatter(const Shadow& s, int t, const std::vector<double>& src, Buffer& buf) {
  int64_t e[4];
  s.extents(t, e);
  const size_t es = fat::dtype_size(s.dtype);
  buf.bytes.assign(s.elems(t) * es + 64, 0);
  const int64_t tokens = static_cast<int64_t>(src.size()) / (e[2] * e[3]);
  for (int64_t tok = 0; tok < tokens; ++tok) {
    const int64_t b = s.varlen ? 0 : tok / e[1], i = s.varlen ? tok : tok % e[1];
    for (int64_t h = 0; h < e[2]; ++h)
      for (int64_t d = 0; d < e[3]; ++d) {
        const int64_t off = b * s.strides[t][0] + i * s.strides[t][1] + h * s.strides[t][2] + d;
        fat::store_elem(s.dtype, buf.ptr() + off * es, src[(tok * e[2] + h) * e[3] + d]);
      }
  }
}

// Index of LSE element (token, head) in the library's layout.
int64_t lse_index(const Shadow& s, int64_t tok, int64_t h) {
  return s.varlen ? h * s.tq + tok : (tok / s.sq * s.hq + h) * s.sq + tok % s.sq;
}

// Offsets valid by the documented rules (so the reference can index them safely).
bool offsets_valid(const Shadow& s, const std::vector<int32_t>& cu, int64_t max_len, int64_t total) {
  if (cu.empty() || cu[0] != 0) return false;
  for (size_t b = 1; b < cu.size(); ++b)
    if (cu[b] < cu[b - 1] || cu[b] - cu[b - 1] > max_len) return false;
  (void)s;
  return cu.back() <= total;
}

struct Run {
  const Shadow& s;
  Reader& r;
  flashattn_plan_t plan;
  std::mt19937_64 rng;

  fat::RefSpec make_spec(const std::vector<int32_t>& cu_q, const std::vector<int32_t>& cu_k, const Buffer& bias,
                         const std::vector<float>& slopes) const {
    fat::RefSpec spec;
    spec.batch = s.b;
    spec.heads_q = s.hq;
    spec.heads_kv = s.hkv;
    spec.head_dim_qk = s.dqk;
    spec.head_dim_v = s.dv;
    spec.max_sq = s.sq;
    spec.max_sk = s.sk;
    for (int64_t b = 0; b <= s.b; ++b) {
      spec.cu_q.push_back(s.varlen ? cu_q[b] : b * s.sq);
      spec.cu_k.push_back(s.varlen ? cu_k[b] : b * s.sk);
    }
    spec.scale = s.scale > 0.f ? s.scale : 1.0 / sqrt(static_cast<double>(s.dqk));
    spec.softcap = s.softcap;
    spec.band = s.wl >= 0 || s.wr >= 0;
    spec.align = s.align;
    spec.window_left = s.wl;
    spec.window_right = s.wr;
    spec.bias_kind = static_cast<int>(s.bias);
    if (s.bias == FLASHATTN_BIAS_TENSOR) {
      spec.bias.resize(static_cast<size_t>(s.b * s.hq * s.sq * s.sk));
      for (int64_t b = 0; b < s.b; ++b)
        for (int64_t h = 0; h < s.hq; ++h)
          for (int64_t i = 0; i < s.sq; ++i)
            for (int64_t j = 0; j < s.sk; ++j) {
              const int64_t off =
                  b * s.bias_strides[0] + h * s.bias_strides[1] + i * s.bias_strides[2] + j * s.bias_strides[3];
              spec.bias[((b * s.hq + h) * s.sq + i) * s.sk + j] =
                  fat::load_elem(s.dtype, bias.bytes.data() + 16 + off * fat::dtype_size(s.dtype));
            }
      for (int d = 0; d < 4; ++d) spec.bias_bcast[d] = s.bias_strides[d] == 0;
    }
    for (float x : slopes) spec.slopes.push_back(x);
    spec.p_drop = s.p;
    spec.seed = s.seed;
    spec.offset = s.offset;
    if (!s.layout.empty()) {
      spec.layout = s.layout;
      spec.layout_heads = s.lh;
      spec.n_row_blocks = s.nrb;
      spec.n_col_blocks = s.ncb;
      spec.block_q = s.bq;
      spec.block_k = s.bk;
    }
    return spec;
  }

  void go(bool backward) {
    const bool sized = s.has_shape;
    size_t ws_query = 0;
    query_workspace(plan, s, backward ? 1 : 0, &ws_query);  // huge shapes stop here
    for (int t = 0; sized && t < 8; ++t)
      if (s.elems(t) > kMaxElems) return;
    if (sized && s.b * s.hq * s.sq * s.sk > static_cast<int64_t>(kMaxElems)) return;
    const double magnitude = (r.u8() & 7) == 0 ? 30.0 : 1.0;
    const size_t es = fat::dtype_size(s.dtype);
    const size_t lse_elems = sized ? static_cast<size_t>(s.varlen ? s.hq * s.tq : s.b * s.hq * s.sq) : 1;

    // Inputs.
    Buffer q, k, v, o_in, lse_in, dout, bias;
    std::vector<float> slopes;
    std::vector<int32_t> cu_q, cu_k;
    bool have_ref = false;
    fat::RefSpec spec;
    fat::RefInputs in;
    fat::RefOutputs ref;
    if (sized) {
      fill(s, FLASHATTN_TENSOR_Q, q, rng, magnitude);
      fill(s, FLASHATTN_TENSOR_K, k, rng, magnitude);
      fill(s, FLASHATTN_TENSOR_V, v, rng, 1.0);
      fill(s, FLASHATTN_TENSOR_DO, dout, rng, 1.0);
      // Bias strides may come from an earlier, larger shape: the span they reach is valid for
      // the library (the caller owns the memory) but too large to allocate here, so such runs
      // only exercise validation.
      int64_t bias_span = 0;
      const int64_t be[4] = {s.b, s.hq, s.sq, s.sk};
      for (int d = 0; d < 4; ++d) {
        int64_t term = 0;
        if (__builtin_mul_overflow(s.bias_strides[d], be[d] - 1, &term) ||
            __builtin_add_overflow(bias_span, term, &bias_span))
          return;
      }
      if (bias_span > static_cast<int64_t>(kMaxElems) * 4) return;
      bias.bytes.assign((bias_span + 1) * es + 64, 0);
      std::normal_distribution<double> nd;
      for (int64_t i = 0; i <= bias_span; ++i) fat::store_elem(s.dtype, bias.ptr() + i * es, nd(rng));
      for (int64_t h = 0; h < s.hq; ++h) slopes.push_back(0.05f * static_cast<float>(1 + (r.u8() % 16)));
      if (s.varlen) {
        // Random lengths within the maxima; sometimes deliberately broken offsets.
        cu_q.push_back(0);
        cu_k.push_back(0);
        for (int64_t b = 0; b < s.b; ++b) {
          cu_q.push_back(cu_q.back() + static_cast<int32_t>(r.u8() % (s.sq + 1)));
          cu_k.push_back(cu_k.back() + static_cast<int32_t>(r.u8() % (s.sk + 1)));
        }
        if (r.u8() < 16) cu_q[r.u8() % cu_q.size()] += static_cast<int32_t>(r.u8()) - 128;
      }
      have_ref = !s.varlen || (offsets_valid(s, cu_q, s.sq, s.tq) && offsets_valid(s, cu_k, s.sk, s.tk));
      if (have_ref) {
        spec = make_spec(cu_q, cu_k, bias, slopes);
        gather(s, FLASHATTN_TENSOR_Q, q, in.q);
        gather(s, FLASHATTN_TENSOR_K, k, in.k);
        gather(s, FLASHATTN_TENSOR_V, v, in.v);
        gather(s, FLASHATTN_TENSOR_DO, dout, in.dout);
        const size_t nq = static_cast<size_t>(spec.total_q()), nk = static_cast<size_t>(spec.total_k());
        in.q.resize(nq * s.hq * s.dqk);
        in.k.resize(nk * s.hkv * s.dqk);
        in.v.resize(nk * s.hkv * s.dv);
        in.dout.resize(nq * s.hq * s.dv);
        ref = fat::reference_fp64(spec, in, backward);
      }
    }
    // The backward's O and LSE: the reference forward's, so gradients can be compared.
    lse_in.bytes.assign(lse_elems * 4 + 64, 0);
    if (backward && sized) {
      if (have_ref) {
        scatter(s, FLASHATTN_TENSOR_O, ref.o, o_in);
        for (int64_t tok = 0; tok < spec.total_q(); ++tok)
          for (int64_t h = 0; h < s.hq; ++h) {
            const float x = static_cast<float>(ref.lse[tok * s.hq + h]);
            memcpy(lse_in.ptr() + lse_index(s, tok, h) * 4, &x, 4);
          }
      } else {
        fill(s, FLASHATTN_TENSOR_O, o_in, rng, 1.0);
      }
    }

    // Outputs, poisoned.
    Buffer o, lse, dq, dk, dv, dbias;
    o.poison(sized ? s.elems(FLASHATTN_TENSOR_O) * es : 8);
    lse.poison(lse_elems * 4);
    dq.poison(sized ? s.elems(FLASHATTN_TENSOR_DQ) * es : 8);
    dk.poison(sized ? s.elems(FLASHATTN_TENSOR_DK) * es : 8);
    dv.poison(sized ? s.elems(FLASHATTN_TENSOR_DV) * es : 8);
    dbias.poison(bias.bytes.size());

    // Faults injected on purpose (each must be rejected without writing anything).
    const uint8_t fault = r.u8();
    const size_t misalign = (fault == 1) ? 1 : 0;
    size_t ws_need = 0;
    if (query_workspace(plan, s, backward ? 1 : 0, &ws_need) != FLASHATTN_STATUS_SUCCESS) ws_need = 0;
    if (ws_need > (size_t(1) << 28)) return;
    std::vector<uint8_t> ws(ws_need + 16);  // malloc'd: 16-byte aligned, as the CPU backend requires
    uint8_t* const ws_ptr = ws.data() + (fault == 11 ? 8 : 0);
    size_t ws_bytes = ws_need;
    if (fault == 2 && ws_need > 0) ws_bytes = ws_need - 1;
    struct CUstream_st* stream = fault == 3 ? reinterpret_cast<struct CUstream_st*>(0x1000) : nullptr;
    const bool want_dbias = s.bias == FLASHATTN_BIAS_TENSOR ? (r.u8() & 1) : (fault == 4);
    const bool with_lse = (r.u8() & 3) != 0;
    const bool need_bias = s.bias == FLASHATTN_BIAS_TENSOR ? fault != 5 : fault == 5;
    const bool need_alibi = (s.bias == FLASHATTN_BIAS_ALIBI || s.bias == FLASHATTN_BIAS_ALIBI_SYMMETRIC);
    static const int32_t dummy_cu[2] = {0, 0};
    const int32_t* cuq = s.varlen != (fault == 9) ? (s.varlen ? cu_q.data() : dummy_cu) : nullptr;
    const int32_t* cuk = s.varlen ? cu_k.data() : nullptr;

    flashattn_status_t st;
    if (!backward) {
      flashattn_fwd_args_t a = FLASHATTN_FWD_ARGS_INIT;
      if (fault == 6) a.struct_size = sizeof(a) - 8;
      a.q = fault == 7 ? nullptr : q.ptr(misalign);
      a.k = k.ptr();
      a.v = v.ptr();
      a.o = fault == 10 ? k.ptr() : o.ptr();  // 10: the output on an input's bytes
      a.lse = with_lse ? reinterpret_cast<float*>(lse.ptr()) : nullptr;
      a.bias = need_bias ? bias.ptr() : nullptr;
      a.alibi_slopes = need_alibi != (fault == 8) ? slopes.data() : nullptr;
      a.cu_seqlens_q = cuq;
      a.cu_seqlens_k = cuk;
      st = flashattn_fwd(plan, &a, ws_ptr, ws_bytes, stream);
    } else {
      flashattn_bwd_args_t a = FLASHATTN_BWD_ARGS_INIT;
      if (fault == 6) a.struct_size = 8;
      a.q = q.ptr(misalign);
      a.k = k.ptr();
      a.v = v.ptr();
      a.o = o_in.ptr();
      a.lse = reinterpret_cast<const float*>(lse_in.ptr());
      a.dout = fault == 7 ? nullptr : dout.ptr();
      a.dq = fault == 10 ? q.ptr() : dq.ptr();
      a.dk = dk.ptr();
      a.dv = dv.ptr();
      a.bias = need_bias ? bias.ptr() : nullptr;
      a.dbias = want_dbias ? dbias.ptr() : nullptr;
      a.alibi_slopes = need_alibi != (fault == 8) ? slopes.data() : nullptr;
      a.cu_seqlens_q = cuq;
      a.cu_seqlens_k = cuk;
      st = flashattn_bwd(plan, &a, ws_ptr, ws_bytes, stream);
    }
    check_status(st);
    if (st != FLASHATTN_STATUS_SUCCESS) {
      if (!o.untouched() || !lse.untouched() || !dq.untouched() || !dk.untouched() || !dv.untouched() ||
          !dbias.untouched())
        violation("a failing run wrote to an output", st);
      return;
    }
    if (!sized) violation("run succeeded without a shape", st);
    // Faults that must always be rejected (4, dbias without a bias tensor, only exists in the backward;
    // 10 overlaps nothing when the tensors involved are empty).
    const bool overlap_empty = backward ? (s.elems(FLASHATTN_TENSOR_Q) == 0 || s.elems(FLASHATTN_TENSOR_DQ) == 0)
                                        : (s.elems(FLASHATTN_TENSOR_K) == 0 || s.elems(FLASHATTN_TENSOR_O) == 0);
    if (fault >= 1 && fault <= 11 && !(fault == 4 && (s.bias == FLASHATTN_BIAS_TENSOR || !backward)) &&
        !(fault == 2 && ws_need == 0) && !(fault == 10 && overlap_empty))
      violation("a run with an injected fault succeeded", st);
    if (fault == 10) return;  // the run wrote into an input buffer: nothing to compare
    if (!have_ref) violation("a run with invalid cu_seqlens succeeded", st);

    const double tol = tolerance(s.dtype) * (s.p > 0.f ? 1.0 / (1.0 - s.p) : 1.0) * (magnitude > 1.0 ? 4.0 : 1.0);
    std::vector<double> got;
    if (!backward) {
      gather(s, FLASHATTN_TENSOR_O, o, got);
      compare("O", got, ref.o, tol);
      if (with_lse) {
        std::vector<double> l(static_cast<size_t>(spec.total_q() * s.hq));
        for (int64_t tok = 0; tok < spec.total_q(); ++tok)
          for (int64_t h = 0; h < s.hq; ++h) {
            float x;
            memcpy(&x, lse.bytes.data() + 16 + lse_index(s, tok, h) * 4, 4);
            l[tok * s.hq + h] = x;
          }
        compare("LSE", l, ref.lse, tolerance(FLASHATTN_DTYPE_FP32) * magnitude * magnitude * 10);
      }
      return;
    }
    // Gradients: the library starts from O rounded to the dtype, so allow a few dtype ulps more.
    // dQ and dK go through Delta = rowsum(dO * O) with that rounded O; with large scores
    // (magnitude 30) the rounding error of Delta is multiplied by |K| or |Q| ~ 30 and P is
    // nearly one-hot, so the difference to the exact-O reference is rounding, not a bug:
    // there only finiteness is checked (the unit tests bound these errors properly).
    // The backward recomputes P = exp(S - LSE) from the reference LSE rounded to fp32: a
    // relative error of up to ~|LSE| * 2^-24 in every P (1% when |LSE| ~ 1e5 with huge
    // scores), on top of the dtype tolerance.
    double max_lse = 0.0;
    for (double x : ref.lse)
      if (isfinite(x)) max_lse = std::max(max_lse, fabs(x));
    const double gtol = 4 * tol + 4.0 * max_lse * 5.96e-8;
    const bool large_scores = magnitude > 1.0;
    // The library's Delta_i = rowsum(dO * O) uses O rounded to the dtype: an error of up to
    // eps * sum_d |dO_id O_id| per row, which dS = P (dP - Delta) passes on and dQ = scale dS K
    // (dK = scale dS^T Q, summed over up to seqlen_q rows) multiplies. With peaked P (a large
    // softmax scale, say) that is most of the small true gradient, so it is added as slack.
    double max_delta_err = 0.0, max_q = 0.0, max_k = 0.0;
    for (int64_t tok = 0; tok < spec.total_q(); ++tok)
      for (int64_t h = 0; h < s.hq; ++h) {
        double acc = 0.0;
        for (int64_t d = 0; d < s.dv; ++d)
          acc += fabs(in.dout[(tok * s.hq + h) * s.dv + d] * ref.o[(tok * s.hq + h) * s.dv + d]);
        max_delta_err = std::max(max_delta_err, acc);
      }
    max_delta_err *= 2.0 * fat::dtype_eps(s.dtype) * (s.p > 0.f ? 1.0 / (1.0 - s.p) : 1.0);
    for (double x : in.q) max_q = std::max(max_q, fabs(x));
    for (double x : in.k) max_k = std::max(max_k, fabs(x));
    const double dq_slack = 2.0 * spec.scale * max_delta_err * max_k;
    const double dk_slack = 2.0 * spec.scale * max_delta_err * max_q * static_cast<double>(s.sq);
    gather(s, FLASHATTN_TENSOR_DQ, dq, got);
    if (large_scores) {
      for (double x : got)
        if (!isfinite(x)) violation("non-finite dQ from finite inputs", st);
    } else {
      compare("dQ", got, ref.dq, gtol, dq_slack);
    }
    gather(s, FLASHATTN_TENSOR_DK, dk, got);
    if (large_scores) {
      for (double x : got)
        if (!isfinite(x)) violation("non-finite dK from finite inputs", st);
    } else {
      compare("dK", got, ref.dk, gtol, dk_slack);
    }
    gather(s, FLASHATTN_TENSOR_DV, dv, got);
    compare("dV", got, ref.dv, gtol + (large_scores ? score_rounding(s, in, spec.scale) : 0.0));
    if (want_dbias && !ref.dbias.empty() && !large_scores) {  // dBias = dS: Delta-dependent too
      got.assign(ref.dbias.size(), 0.0);
      for (int64_t b = 0; b < s.b; ++b)
        for (int64_t h = 0; h < s.hq; ++h)
          for (int64_t i = 0; i < s.sq; ++i)
            for (int64_t j = 0; j < s.sk; ++j) {
              const int64_t off =
                  b * s.bias_strides[0] + h * s.bias_strides[1] + i * s.bias_strides[2] + j * s.bias_strides[3];
              got[((b * s.hq + h) * s.sq + i) * s.sk + j] = fat::load_elem(s.dtype, dbias.bytes.data() + 16 + off * es);
            }
      // dBias = dS, summed over the broadcast dimensions: the same Delta slack per summand.
      double summands = 1.0;
      const int64_t be[4] = {s.b, s.hq, s.sq, s.sk};
      for (int d = 0; d < 4; ++d)
        if (s.bias_strides[d] == 0) summands *= static_cast<double>(be[d]);
      compare("dBias", got, ref.dbias, gtol, 2.0 * max_delta_err * summands);
    }
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Reader r{data, size};
  flashattn_plan_t plan = nullptr;
  const flashattn_backend_t backend = (r.u8() & 15) == 0 ? static_cast<flashattn_backend_t>(7) : FLASHATTN_BACKEND_CPU;
  flashattn_status_t st = flashattn_plan_create(&plan, backend, 0);
  check_status(st);
  if (st != FLASHATTN_STATUS_SUCCESS) {
    if (plan != nullptr) violation("plan_create wrote *plan on failure", st);
    return 0;
  }
  Shadow s;
  static const bool trace = getenv("FUZZ_TRACE") != nullptr;  // print every op (reproducing a crash)
  std::mt19937_64 rng(r.u64());
  static const float reals[] = {0.f, 0.125f, 0.5f, 1.f, 3.f, 30.f, -1.f, NAN, INFINITY, 1e-30f};
  static const float probs[] = {0.f, 0.1f, 0.5f, 0.9f, 0.999f, 1.f, -0.1f, NAN};
  for (int op = 0; op < 24 && !r.done(); ++op) {
    const uint8_t kind = r.u8() % 15;
    switch (kind) {
      case 0: {
        const int64_t b = r.dim(1, 3), sq = r.dim(1, 40), sk = r.dim(1, 40), hkv = r.dim(1, 2), g = r.dim(1, 2);
        const int64_t hq = (hkv >= 1 && hkv <= 4 && g >= 1 && g <= 4) ? hkv * g + ((r.u8() & 15) == 0 ? 1 : 0) : g;
        const int64_t dqk = r.dim(1, 40), dv = r.dim(1, 40);
        st = flashattn_plan_set_shape(plan, b, sq, sk, hq, hkv, dqk, dv);
        if (st == FLASHATTN_STATUS_SUCCESS) {
          s.has_shape = true;
          s.b = b, s.sq = sq, s.sk = sk, s.hq = hq, s.hkv = hkv, s.dqk = dqk, s.dv = dv;
          s.reset_strides();
        }
        break;
      }
      case 1: {
        const int d = static_cast<int>(r.u8() % 4);
        st = flashattn_plan_set_dtype(plan, static_cast<flashattn_dtype_t>(d));
        if (st == FLASHATTN_STATUS_SUCCESS) s.dtype = static_cast<flashattn_dtype_t>(d);
        break;
      }
      case 2: {
        const int t = static_cast<int>(r.u8() % 9);
        int64_t e[4] = {1, 1, 1, 1};
        if (t < 8) s.extents(t, e);
        int64_t st4[4];
        // Unsigned (wrapping) arithmetic: on huge shapes these strides may wrap, and the
        // library must refuse whatever they become.
        uint64_t u[4];
        for (int d = 0; d < 4; ++d) u[d] = static_cast<uint64_t>(e[d]);
        switch (r.u8() % 4) {
          case 0:  // BHSD
            st4[3] = 1, st4[1] = e[3], st4[2] = static_cast<int64_t>(u[1] * u[3]);
            st4[0] = static_cast<int64_t>(u[1] * u[2] * u[3]);
            break;
          case 1:  // padded BSHD
            st4[3] = 1, st4[2] = e[3] + 3, st4[1] = static_cast<int64_t>(u[2] * (u[3] + 3) + 5);
            st4[0] = static_cast<int64_t>(u[1] * static_cast<uint64_t>(st4[1]) + 7);
            break;
          default:  // raw, usually invalid or aliasing
            for (auto& x : st4) x = static_cast<int64_t>(r.u8() % 70) - 3;
        }
        st = flashattn_plan_set_strides(plan, static_cast<flashattn_tensor_t>(t), st4);
        if (st == FLASHATTN_STATUS_SUCCESS) memcpy(s.strides[t], st4, sizeof st4);
        break;
      }
      case 3: {
        const float x = r.real(reals, 10);
        st = flashattn_plan_set_softmax_scale(plan, x);
        if (st == FLASHATTN_STATUS_SUCCESS) s.scale = x;
        break;
      }
      case 4: {
        const int a = static_cast<int>(r.u8() % 3);
        const int64_t wl = static_cast<int64_t>(r.u8() % 48) - 8, wr = static_cast<int64_t>(r.u8() % 48) - 8;
        st = flashattn_plan_set_band_mask(plan, static_cast<flashattn_mask_align_t>(a), wl, wr);
        if (st == FLASHATTN_STATUS_SUCCESS) s.align = a, s.wl = wl < 0 ? -1 : wl, s.wr = wr < 0 ? -1 : wr;
        break;
      }
      case 5: {
        const float x = r.real(reals, 10);
        st = flashattn_plan_set_softcap(plan, x);
        if (st == FLASHATTN_STATUS_SUCCESS) s.softcap = x;
        break;
      }
      case 6: {
        const int kind_v = static_cast<int>(r.u8() % 5);
        int64_t bs[4];
        const bool with = (r.u8() & 3) != 0;
        for (int d = 0; d < 4; ++d) bs[d] = 0;
        if (s.has_shape) {  // dense (b, h, i, j) strides with random broadcast dims
          const uint8_t m = r.u8();
          const int64_t e[4] = {s.b, s.hq, s.sq, s.sk};
          int64_t acc = 1;
          for (int d = 3; d >= 0; --d) {
            bs[d] = (m >> d) & 1 ? 0 : acc;
            if (bs[d]) acc *= e[d];
          }
        } else {
          bs[3] = 1;
        }
        st = flashattn_plan_set_bias(plan, static_cast<flashattn_bias_t>(kind_v), with ? bs : nullptr);
        if (st == FLASHATTN_STATUS_SUCCESS) {
          s.bias = static_cast<flashattn_bias_t>(kind_v);
          for (int d = 0; d < 4; ++d) s.bias_strides[d] = kind_v == FLASHATTN_BIAS_TENSOR ? bs[d] : 0;
        }
        break;
      }
      case 7: {
        const float p = r.real(probs, 8);
        const uint64_t seed = r.u64(), off = r.u64();
        st = flashattn_plan_set_dropout(plan, p, seed, off);
        if (st == FLASHATTN_STATUS_SUCCESS) s.p = p, s.seed = seed, s.offset = off;
        break;
      }
      case 8: {
        const int64_t bq = r.dim(1, 20), bk = r.dim(1, 20);
        int64_t lh = (r.u8() & 1) ? 1 : s.hq;
        int64_t nrb = (bq > 0 && bq < 4096) ? (s.sq + bq - 1) / bq : 1;
        int64_t ncb = (bk > 0 && bk < 4096) ? (s.sk + bk - 1) / bk : 1;
        if ((r.u8() & 15) == 0) nrb += 1;
        if ((r.u8() & 15) == 0) lh += 1;
        const bool clear = (r.u8() & 7) == 0;
        // A layout the library must reject gets a one-byte buffer, so accepting it would be
        // caught. A valid layout too large to allocate here (a huge shape) is not tried.
        const bool fits =
            lh > 0 && nrb > 0 && ncb > 0 && lh <= 4096 && nrb <= 4096 && ncb <= 4096 && lh * nrb * ncb <= (1 << 24);
        const bool valid = s.has_shape && bq >= 1 && bk >= 1 && (lh == 1 || lh == s.hq) &&
                           nrb == s.sq / bq + (s.sq % bq != 0) && ncb == s.sk / bk + (s.sk % bk != 0);
        if (valid && !fits && !clear) continue;
        const size_t n = fits ? static_cast<size_t>(lh * nrb * ncb) : 0;
        std::vector<uint8_t> layout(n + 1);
        for (auto& x : layout) x = (r.u8() & 3) != 0;
        if (clear || n == 0) {
          st = flashattn_plan_set_block_sparse(plan, clear ? nullptr : layout.data(), lh, nrb, ncb, bq, bk);
          if (clear && st == FLASHATTN_STATUS_SUCCESS) s.layout.clear();
          if (!clear && st == FLASHATTN_STATUS_SUCCESS) violation("oversized layout accepted", st);
        } else {
          st = flashattn_plan_set_block_sparse(plan, layout.data(), lh, nrb, ncb, bq, bk);
          if (st == FLASHATTN_STATUS_SUCCESS) {
            s.layout.assign(layout.begin(), layout.begin() + n);
            s.lh = lh, s.nrb = nrb, s.ncb = ncb, s.bq = bq, s.bk = bk;
          }
        }
        break;
      }
      case 9: {
        const bool en = r.u8() & 1;
        const bool huge = (r.u8() & 7) == 7;  // totals over the whole int64 range
        const int64_t tq = huge ? r.log_uniform() : s.b * s.sq + (r.u8() % 4);
        const int64_t tk = huge ? r.log_uniform() : s.b * s.sk + (r.u8() % 4);
        st = flashattn_plan_set_varlen(plan, en, tq, tk);
        if (st == FLASHATTN_STATUS_SUCCESS) s.varlen = en, s.tq = en ? tq : 0, s.tk = en ? tk : 0;
        break;
      }
      case 10: st = flashattn_plan_set_deterministic(plan, r.u8() & 1); break;
      case 11: {
        const int a = static_cast<int>(r.u8() % 3);
        st = flashattn_plan_set_algorithm(plan, static_cast<flashattn_algorithm_t>(a));
        if (st == FLASHATTN_STATUS_SUCCESS) s.algorithm = static_cast<flashattn_algorithm_t>(a);
        break;
      }
      case 12:
      case 13: {
        Run run{s, r, plan, std::mt19937_64(rng())};
        if (trace) fprintf(stderr, "op %d: %s run\n", kind, kind == 13 ? "backward" : "forward");
        run.go(kind == 13);
        continue;
      }
      default: {
        size_t bytes = 0;
        st = query_workspace(plan, s, r.u8() % 3, &bytes);
        break;
      }
    }
    check_status(st);
    if (trace)
      fprintf(stderr,
              "op %d -> %s | shape b=%lld sq=%lld sk=%lld hq=%lld hkv=%lld d=%lld/%lld dtype=%d varlen=%d "
              "scale=%g align=%d wl=%lld wr=%lld softcap=%g bias=%d (%lld,%lld,%lld,%lld) p=%g layout=%zu "
              "(bq=%lld bk=%lld lh=%lld) algo=%d\n",
              kind, flashattn_status_string(st), (long long)s.b, (long long)s.sq, (long long)s.sk, (long long)s.hq,
              (long long)s.hkv, (long long)s.dqk, (long long)s.dv, (int)s.dtype, (int)s.varlen, (double)s.scale,
              s.align, (long long)s.wl, (long long)s.wr, (double)s.softcap, (int)s.bias, (long long)s.bias_strides[0],
              (long long)s.bias_strides[1], (long long)s.bias_strides[2], (long long)s.bias_strides[3], (double)s.p,
              s.layout.size(), (long long)s.bq, (long long)s.bk, (long long)s.lh, (int)s.algorithm);
  }
  flashattn_plan_destroy(plan);
  return 0;
}
