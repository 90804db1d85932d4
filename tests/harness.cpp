// Test harness; see harness.hpp.
#include "harness.hpp"

#include <math.h>
#include <string.h>

#include <stdio.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "catch_compat.hpp"

namespace fat {

namespace {

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 0x1234567ull) {}
  uint64_t next() {  // SplitMix64
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
  double normal() {
    const double u1 = std::max(uniform(), 1e-300), u2 = uniform();
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
  }
};

// Layout of one tensor (rows = tokens per batch, or all packed tokens in varlen mode).
TensorLayout make_layout(Layout L, int t, bool varlen, bool pad16, bool bogus_b, int64_t B, int64_t S, int64_t H,
                         int64_t D) {
  enum Kind { kDefault, kBshd, kBhsd, kPadded, kBcast };
  Kind k = kDefault;
  const bool is_output = t == FLASHATTN_TENSOR_O || t >= FLASHATTN_TENSOR_DQ;
  switch (L) {
    case Layout::BSHD: k = kDefault; break;
    case Layout::BHSD: k = kBhsd; break;
    case Layout::Padded: k = kPadded; break;
    case Layout::Mixed: {
      const Kind mix[8] = {kBhsd, kPadded, kBshd, kPadded, kBhsd, kPadded, kBhsd, kPadded};
      k = mix[t];
      break;
    }
    case Layout::BcastBatch: k = is_output ? kPadded : kBcast; break;
  }
  if (varlen) B = 1;
  TensorLayout r{};
  int64_t* st = r.strides;
  switch (k) {
    case kDefault:
    case kBshd:
      st[3] = 1;
      st[2] = D;
      st[1] = H * D;
      st[0] = S * H * D;
      break;
    case kBhsd:
      st[3] = 1;
      st[1] = D;
      st[2] = S * D;
      st[0] = H * S * D;
      break;
    case kPadded:  // gaps after every head row, token and batch (multiples of 8 elements with pad16)
      st[3] = 1;
      st[2] = D + (pad16 ? 8 : 3);
      st[1] = H * st[2] + (pad16 ? 8 : 5);
      st[0] = S * st[1] + (pad16 ? 16 : 7);
      break;
    case kBcast:
      st[3] = 1;
      st[2] = D;
      st[1] = H * D;
      st[0] = 0;
      break;
  }
  if (varlen && k != kDefault) st[0] = bogus_b ? (int64_t{1} << 40) : 0;  // ignored in varlen mode
  r.explicit_set = k != kDefault;
  const int64_t dims[4] = {B, S, H, D};
  int64_t last = 0;
  for (int d = 0; d < 4; ++d) last += (std::max<int64_t>(dims[d], 1) - 1) * st[d];
  r.elems = static_cast<size_t>(last + 1);
  return r;
}

int64_t elem_offset(const TensorLayout& l, int64_t b, int64_t s, int64_t h, int64_t d) {
  return b * l.strides[0] + s * l.strides[1] + h * l.strides[2] + d * l.strides[3];
}

}  // namespace

void make_alibi_slopes(int64_t batch, int64_t hq, int64_t batch_stride, std::vector<float>& buffer,
                       std::vector<double>& spec_slopes) {
  const int64_t rows = batch_stride == 0 ? 1 : batch;
  buffer.assign(static_cast<size_t>((rows - 1) * batch_stride + hq), std::numeric_limits<float>::quiet_NaN());
  for (int64_t b = 0; b < rows; ++b)  // sequence b's slopes grow with b: a mixed-up b shows
    for (int64_t h = 0; h < hq; ++h)
      buffer[static_cast<size_t>(b * batch_stride + h)] =
          static_cast<float>((1.0 + 0.75 * static_cast<double>(b)) *
                             pow(2.0, -8.0 * static_cast<double>(h + 1) / static_cast<double>(hq)));
  spec_slopes.clear();
  for (int64_t b = 0; b < rows; ++b)  // read back: overlapping rows hold the last values written
    for (int64_t h = 0; h < hq; ++h) spec_slopes.push_back(buffer[static_cast<size_t>(b * batch_stride + h)]);
}

std::string describe(const Config& c) {
  std::ostringstream o;
  o << (c.name.empty() ? "config" : c.name) << ": b=" << c.batch << " sq=" << c.sq << " sk=" << c.sk << " hq=" << c.hq
    << " hkv=" << c.hkv << " d=" << c.dqk << "/" << c.dv << " " << dtype_name(c.dtype);
  if (c.algorithm == FLASHATTN_ALGORITHM_STANDARD) o << " STANDARD";
  const char* lay[] = {"BSHD", "BHSD", "padded", "mixed", "bcast-batch"};
  o << " layout=" << lay[static_cast<int>(c.layout)];
  if (c.scale != 0) o << " scale=" << c.scale;
  if (c.softcap != 0) o << " softcap=" << c.softcap;
  if (c.band)
    o << " band(" << (c.align == FLASHATTN_ALIGN_TOP_LEFT ? "top-left" : "bottom-right") << "," << c.wl << "," << c.wr
      << ")";
  if (c.bias == FLASHATTN_BIAS_TENSOR)
    o << " bias[bcast " << c.bias_bcast[0] << c.bias_bcast[1] << c.bias_bcast[2] << c.bias_bcast[3] << "]"
      << (c.bias_inf_row >= 0 ? " -inf row" : "");
  if (c.bias == FLASHATTN_BIAS_ALIBI) o << " alibi";
  if (c.bias == FLASHATTN_BIAS_ALIBI_SYMMETRIC) o << " alibi-sym";
  if (c.alibi_batch_stride != 0) o << " slopes[batch stride " << c.alibi_batch_stride << "]";
  if (c.p_drop != 0) o << " dropout p=" << c.p_drop << " seed=" << c.seed << " offset=" << c.offset;
  if (c.sparse)
    o << " sparse(" << c.block_q << "x" << c.block_k << ", heads " << c.layout_heads << ", zero row "
      << c.zero_row_block << ")";
  if (!c.seqlens_q.empty()) {
    o << " varlen q={";
    for (int x : c.seqlens_q) o << x << ",";
    o << "} k={";
    for (int x : c.seqlens_k) o << x << ",";
    o << "}";
  }
  if (c.deterministic) o << " deterministic";
  if (c.grad_accumulate) o << " grad_accumulate";
  o << " data_seed=" << c.data_seed;
  return o.str();
}

Problem make_problem(const Config& c0) {
  Problem p;
  p.cfg = c0;
  Config& c = p.cfg;
  p.varlen = !c.seqlens_q.empty();
  RefSpec& s = p.spec;
  s.batch = c.batch;
  s.cu_q.assign(1, 0);
  s.cu_k.assign(1, 0);
  if (p.varlen) {
    s.batch = c.batch = static_cast<int64_t>(c.seqlens_q.size());
    int64_t mq = 1, mk = 1;
    for (int64_t b = 0; b < c.batch; ++b) {
      s.cu_q.push_back(s.cu_q.back() + c.seqlens_q[b]);
      s.cu_k.push_back(s.cu_k.back() + c.seqlens_k[b]);
      mq = std::max<int64_t>(mq, c.seqlens_q[b]);
      mk = std::max<int64_t>(mk, c.seqlens_k[b]);
    }
    c.sq = std::max(c.sq, mq);
    c.sk = std::max(c.sk, mk);
  } else {
    for (int64_t b = 0; b < c.batch; ++b) {
      s.cu_q.push_back(s.cu_q.back() + c.sq);
      s.cu_k.push_back(s.cu_k.back() + c.sk);
    }
  }
  for (int64_t x : s.cu_q) p.cu_q.push_back(static_cast<int32_t>(x));
  for (int64_t x : s.cu_k) p.cu_k.push_back(static_cast<int32_t>(x));
  s.heads_q = c.hq;
  s.heads_kv = c.hkv;
  s.head_dim_qk = c.dqk;
  s.head_dim_v = c.dv;
  s.max_sq = c.sq;
  s.max_sk = c.sk;
  s.scale = c.scale != 0 ? static_cast<double>(c.scale)
                         : static_cast<double>(static_cast<float>(1.0 / sqrt(static_cast<double>(c.dqk))));
  s.softcap = c.softcap;
  s.band = c.band;
  s.align = c.align;
  s.window_left = c.wl;
  s.window_right = c.wr;
  s.bias_kind = c.bias;
  s.p_drop = c.p_drop;
  s.seed = c.seed;
  s.offset = c.offset;

  Rng rng(c.data_seed);
  const int64_t tq = s.total_q(), tk = s.total_k();
  auto gen = [&](std::vector<double>& x, size_t n) {
    x.resize(n);
    for (double& e : x) e = round_to(c.dtype, rng.normal() * c.input_scale);
  };
  gen(p.in.q, static_cast<size_t>(tq * c.hq * c.dqk));
  gen(p.in.k, static_cast<size_t>(tk * c.hkv * c.dqk));
  gen(p.in.v, static_cast<size_t>(tk * c.hkv * c.dv));
  gen(p.in.dout, static_cast<size_t>(tq * c.hq * c.dv));
  if (c.layout == Layout::BcastBatch && !p.varlen) {  // inputs shared by all batches
    auto share = [&](std::vector<double>& x, int64_t per_batch) {
      for (int64_t b = 1; b < c.batch; ++b) std::copy(x.begin(), x.begin() + per_batch, x.begin() + b * per_batch);
    };
    share(p.in.q, c.sq * c.hq * c.dqk);
    share(p.in.k, c.sk * c.hkv * c.dqk);
    share(p.in.v, c.sk * c.hkv * c.dv);
    share(p.in.dout, c.sq * c.hq * c.dv);
  }

  if (c.bias == FLASHATTN_BIAS_TENSOR) {
    for (int d = 0; d < 4; ++d) s.bias_bcast[d] = c.bias_bcast[d];
    const int64_t nb = c.bias_bcast[0] ? 1 : c.batch, nh = c.bias_bcast[1] ? 1 : c.hq;
    const int64_t ni = c.bias_bcast[2] ? 1 : c.sq, nj = c.bias_bcast[3] ? 1 : c.sk;
    p.bias_reduced.resize(static_cast<size_t>(nb * nh * ni * nj));
    for (double& e : p.bias_reduced) e = round_to(c.dtype, rng.normal());
    if (c.bias_inf_row >= 0 && !c.bias_bcast[2])
      for (int64_t b = 0; b < nb; ++b)
        for (int64_t h = 0; h < nh; ++h)
          for (int64_t j = 0; j < nj; ++j)
            p.bias_reduced[((b * nh + h) * ni + c.bias_inf_row) * nj + j] = -std::numeric_limits<double>::infinity();
    // Strides (batch, head, q, k): zero along broadcast dims, a gap after each row.
    int64_t* st = p.bias_strides;
    const int64_t row = nj + (c.pad16 ? 8 : 2);
    st[3] = c.bias_bcast[3] ? 0 : 1;
    st[2] = c.bias_bcast[2] ? 0 : row;
    st[1] = c.bias_bcast[1] ? 0 : ni * row;
    st[0] = c.bias_bcast[0] ? 0 : nh * ni * row;
    p.bias_elems =
        static_cast<size_t>((c.batch - 1) * st[0] + (c.hq - 1) * st[1] + (c.sq - 1) * st[2] + (c.sk - 1) * st[3] + 1);
    s.bias.resize(static_cast<size_t>(c.batch * c.hq * c.sq * c.sk));
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t h = 0; h < c.hq; ++h)
        for (int64_t i = 0; i < c.sq; ++i)
          for (int64_t j = 0; j < c.sk; ++j)
            s.bias[((b * c.hq + h) * c.sq + i) * c.sk + j] =
                p.bias_reduced[(((c.bias_bcast[0] ? 0 : b) * nh + (c.bias_bcast[1] ? 0 : h)) * ni +
                                (c.bias_bcast[2] ? 0 : i)) *
                                   nj +
                               (c.bias_bcast[3] ? 0 : j)];
  }
  if (c.bias == FLASHATTN_BIAS_ALIBI || c.bias == FLASHATTN_BIAS_ALIBI_SYMMETRIC)
    make_alibi_slopes(c.batch, c.hq, c.alibi_batch_stride, p.slopes, s.slopes);
  if (c.sparse) {
    s.layout_heads = c.layout_heads;
    s.block_q = c.block_q;
    s.block_k = c.block_k;
    s.n_row_blocks = (c.sq + c.block_q - 1) / c.block_q;
    s.n_col_blocks = (c.sk + c.block_k - 1) / c.block_k;
    s.layout.resize(static_cast<size_t>(s.layout_heads * s.n_row_blocks * s.n_col_blocks));
    for (int64_t lh = 0; lh < s.layout_heads; ++lh)
      for (int64_t r = 0; r < s.n_row_blocks; ++r)
        for (int64_t q = 0; q < s.n_col_blocks; ++q)
          s.layout[(lh * s.n_row_blocks + r) * s.n_col_blocks + q] =
              (r != c.zero_row_block && rng.uniform() < c.density) ? static_cast<uint8_t>(1 + rng.next() % 255) : 0;
  }
  // Tensor layouts.
  const int64_t SQ = p.varlen ? tq : c.sq, SK = p.varlen ? tk : c.sk;
  for (int t = 0; t < 8; ++t) {  // Q, K, V, O, dO, dQ, dK, dV: rows of q or k, dims of q/k or v
    const bool q_rows =
        t == FLASHATTN_TENSOR_Q || t == FLASHATTN_TENSOR_O || t == FLASHATTN_TENSOR_DO || t == FLASHATTN_TENSOR_DQ;
    const bool qk_dim =
        t == FLASHATTN_TENSOR_Q || t == FLASHATTN_TENSOR_K || t == FLASHATTN_TENSOR_DQ || t == FLASHATTN_TENSOR_DK;
    p.lay[t] = make_layout(c.layout, t, p.varlen, c.pad16, c.bogus_varlen_batch_stride, c.batch, q_rows ? SQ : SK,
                           q_rows ? c.hq : c.hkv, qk_dim ? c.dqk : c.dv);
  }
  if (c.grad_accumulate) {
    Rng grng(c.data_seed + 0x5eed);
    const int64_t n[3] = {tq * c.hq * c.dqk, tk * c.hkv * c.dqk, tk * c.hkv * c.dv};
    for (int g = 0; g < 3; ++g) {
      p.grad0[g].resize(static_cast<size_t>(n[g]));
      for (double& e : p.grad0[g]) e = round_to(c.dtype, grng.normal());
    }
  }
  return p;
}

// ---- memory -------------------------------------------------------------------------------
void* HostMem::alloc(size_t bytes) { return std::malloc(std::max<size_t>(bytes, 1)); }
void HostMem::release(void* p) { std::free(p); }
void HostMem::upload(void* dst, const void* src, size_t bytes) { memcpy(dst, src, bytes); }
void HostMem::download(void* dst, const void* src, size_t bytes) { memcpy(dst, src, bytes); }

namespace {

// A buffer of the run, host shadow plus backend memory.
struct Buf {
  MemOps* mem = nullptr;
  void* dev = nullptr;
  std::vector<uint8_t> host;
  Buf() = default;
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  ~Buf() {
    if (dev) mem->release(dev);
  }
  void init(MemOps& m, size_t bytes, bool poison) {
    mem = &m;
    host.assign(std::max<size_t>(bytes, 1), poison ? kPoison : 0);
    dev = m.alloc(host.size());
  }
  void push() { mem->upload(dev, host.data(), host.size()); }
  void pull() { mem->download(host.data(), dev, host.size()); }
};

// Writes logical tensor x ([tokens][H][D] packed) into a strided buffer.
void scatter(const Problem& p, int t, const std::vector<double>& x, int64_t H, int64_t D, Buf& buf) {
  const TensorLayout& l = p.lay[t];
  const size_t es = dtype_size(p.cfg.dtype);
  const bool q_side =
      t == FLASHATTN_TENSOR_Q || t == FLASHATTN_TENSOR_O || t == FLASHATTN_TENSOR_DO || t == FLASHATTN_TENSOR_DQ;
  const std::vector<int64_t>& cu = q_side ? p.spec.cu_q : p.spec.cu_k;
  for (int64_t b = 0; b < p.spec.batch; ++b)
    for (int64_t s = 0; s < cu[b + 1] - cu[b]; ++s) {
      const int64_t tok = cu[b] + s;
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) {
          const int64_t off = p.varlen ? elem_offset(l, 0, tok, h, d) : elem_offset(l, b, s, h, d);
          store_elem(p.cfg.dtype, &buf.host[static_cast<size_t>(off) * es], x[(tok * H + h) * D + d]);
        }
    }
}

// Reads a strided output back into the packed layout, and records which bytes are logical.
std::vector<double> gather(const Problem& p, int t, int64_t H, int64_t D, const Buf& buf,
                           std::vector<uint8_t>* touched) {
  const TensorLayout& l = p.lay[t];
  const size_t es = dtype_size(p.cfg.dtype);
  const bool q_side =
      t == FLASHATTN_TENSOR_Q || t == FLASHATTN_TENSOR_O || t == FLASHATTN_TENSOR_DO || t == FLASHATTN_TENSOR_DQ;
  const std::vector<int64_t>& cu = q_side ? p.spec.cu_q : p.spec.cu_k;
  std::vector<double> x(static_cast<size_t>(cu.back() * H * D));
  if (touched) touched->assign(buf.host.size(), 0);
  for (int64_t b = 0; b < p.spec.batch; ++b)
    for (int64_t s = 0; s < cu[b + 1] - cu[b]; ++s) {
      const int64_t tok = cu[b] + s;
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) {
          const int64_t off = p.varlen ? elem_offset(l, 0, tok, h, d) : elem_offset(l, b, s, h, d);
          x[(tok * H + h) * D + d] = load_elem(p.cfg.dtype, &buf.host[static_cast<size_t>(off) * es]);
          if (touched) std::fill_n(touched->begin() + static_cast<long>(off * es), es, 1);
        }
    }
  return x;
}

bool all_poison(const Buf& buf) {
  for (uint8_t x : buf.host)
    if (x != kPoison) return false;
  return true;
}

bool padding_ok(const Buf& buf, const std::vector<uint8_t>& touched, size_t bytes) {
  for (size_t n = 0; n < bytes; ++n)
    if (!touched[n] && buf.host[n] != kPoison) return false;
  return true;
}

}  // namespace

flashattn_status_t configure_plan(flashattn_plan_t plan, const Problem& p) {
  const Config& c = p.cfg;
  flashattn_status_t st;
#define FA_TRY(call)                               \
  do {                                             \
    st = (call);                                   \
    if (st != FLASHATTN_STATUS_SUCCESS) return st; \
  } while (0)
  const int64_t batch = p.varlen ? c.batch - c.unannounced_tail : c.batch;
  FA_TRY(flashattn_plan_set_shape(plan, batch, c.sq, c.sk, c.hq, c.hkv, c.dqk, c.dv));
  FA_TRY(flashattn_plan_set_dtype(plan, c.dtype));
  if (p.varlen) FA_TRY(flashattn_plan_set_varlen(plan, 1, p.spec.total_q(), p.spec.total_k()));
  for (int t = 0; t < 8; ++t)
    if (p.lay[t].explicit_set)
      FA_TRY(flashattn_plan_set_strides(plan, static_cast<flashattn_tensor_t>(t), p.lay[t].strides));
  if (c.scale != 0) FA_TRY(flashattn_plan_set_softmax_scale(plan, c.scale));
  if (c.algorithm != FLASHATTN_ALGORITHM_FLASH) FA_TRY(flashattn_plan_set_algorithm(plan, c.algorithm));
  if (c.deterministic) FA_TRY(flashattn_plan_set_deterministic(plan, 1));
  if (c.grad_accumulate) FA_TRY(flashattn_plan_set_grad_accumulate(plan, 1));
  if (c.band) FA_TRY(flashattn_plan_set_band_mask(plan, c.align, c.wl, c.wr));
  else if (c.align != FLASHATTN_ALIGN_TOP_LEFT)  // alignment for ALiBi only: both windows unbounded
    FA_TRY(flashattn_plan_set_band_mask(plan, c.align, -1, -1));
  if (c.softcap != 0) FA_TRY(flashattn_plan_set_softcap(plan, c.softcap));
  if (c.bias != FLASHATTN_BIAS_NONE)
    FA_TRY(flashattn_plan_set_bias(plan, c.bias, c.bias == FLASHATTN_BIAS_TENSOR ? p.bias_strides : nullptr));
  if (c.alibi_batch_stride != 0) FA_TRY(flashattn_plan_set_alibi_batch_stride(plan, c.alibi_batch_stride));
  if (c.p_drop != 0) FA_TRY(flashattn_plan_set_dropout(plan, c.p_drop, c.seed, c.offset));
  if (c.sparse)
    FA_TRY(flashattn_plan_set_block_sparse(plan, p.spec.layout.data(), p.spec.layout_heads, p.spec.n_row_blocks,
                                           p.spec.n_col_blocks, p.spec.block_q, p.spec.block_k));
#undef FA_TRY
  return FLASHATTN_STATUS_SUCCESS;
}

LibResult run_library(const Problem& p, MemOps& mem, int device) {
  flashattn_plan_t plan = nullptr;
  const flashattn_status_t st = flashattn_plan_create(&plan, mem.backend(), device);
  if (st != FLASHATTN_STATUS_SUCCESS) {
    LibResult r;
    r.create = st;
    r.error = flashattn_last_error();
    return r;
  }
  struct PlanGuard {
    flashattn_plan_t p;
    ~PlanGuard() { flashattn_plan_destroy(p); }
  } guard{plan};
  const flashattn_status_t cs = configure_plan(plan, p);
  if (cs != FLASHATTN_STATUS_SUCCESS) {
    LibResult r;
    r.setup = cs;
    r.error = flashattn_last_error();
    return r;
  }
  return run_on_plan(plan, p, mem);
}

LibResult run_on_plan(flashattn_plan_t plan, const Problem& p, MemOps& mem) {
  LibResult r;
  const Config& c = p.cfg;
  const size_t es = dtype_size(c.dtype);
  r.setup = flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_FORWARD, &r.ws_fwd);
  if (r.setup == FLASHATTN_STATUS_SUCCESS && c.backward)
    r.setup = flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_BACKWARD, &r.ws_bwd);
  if (r.setup != FLASHATTN_STATUS_SUCCESS) {
    r.error = flashattn_last_error();
    return r;
  }
  const int64_t tq = p.spec.total_q(), HQ = c.hq, HKV = c.hkv;
  Buf q, k, v, o, lse, bias, slopes, cuq, cuk, ws;
  q.init(mem, p.lay[0].elems * es, true);
  k.init(mem, p.lay[1].elems * es, true);
  v.init(mem, p.lay[2].elems * es, true);
  o.init(mem, p.lay[3].elems * es, true);
  scatter(p, 0, p.in.q, HQ, c.dqk, q);
  scatter(p, 1, p.in.k, HKV, c.dqk, k);
  scatter(p, 2, p.in.v, HKV, c.dv, v);
  q.push();
  k.push();
  v.push();
  o.push();
  const size_t lse_elems = static_cast<size_t>(tq * HQ);
  lse.init(mem, lse_elems * 4, true);
  lse.push();
  flashattn_fwd_args_t fa = FLASHATTN_FWD_ARGS_INIT;
  fa.q = q.dev;
  fa.k = k.dev;
  fa.v = v.dev;
  fa.o = o.dev;
  fa.lse = c.with_lse ? static_cast<float*>(lse.dev) : nullptr;
  if (c.bias == FLASHATTN_BIAS_TENSOR) {
    bias.init(mem, p.bias_elems * es, true);
    const int64_t* st = p.bias_strides;
    const int64_t nh = c.bias_bcast[1] ? 1 : c.hq, ni = c.bias_bcast[2] ? 1 : c.sq, nj = c.bias_bcast[3] ? 1 : c.sk;
    const int64_t nb = c.bias_bcast[0] ? 1 : c.batch;
    for (int64_t b = 0; b < nb; ++b)
      for (int64_t h = 0; h < nh; ++h)
        for (int64_t i = 0; i < ni; ++i)
          for (int64_t j = 0; j < nj; ++j)
            store_elem(c.dtype, &bias.host[static_cast<size_t>(b * st[0] + h * st[1] + i * st[2] + j * st[3]) * es],
                       p.bias_reduced[((b * nh + h) * ni + i) * nj + j]);
    bias.push();
    fa.bias = bias.dev;
  }
  if (!p.slopes.empty()) {
    slopes.init(mem, p.slopes.size() * 4, false);
    memcpy(slopes.host.data(), p.slopes.data(), p.slopes.size() * 4);
    slopes.push();
    fa.alibi_slopes = static_cast<const float*>(slopes.dev);
  }
  if (p.varlen) {
    cuq.init(mem, p.cu_q.size() * 4, false);
    cuk.init(mem, p.cu_k.size() * 4, false);
    memcpy(cuq.host.data(), p.cu_q.data(), p.cu_q.size() * 4);
    memcpy(cuk.host.data(), p.cu_k.data(), p.cu_k.size() * 4);
    cuq.push();
    cuk.push();
    fa.cu_seqlens_q = static_cast<const int32_t*>(cuq.dev);
    fa.cu_seqlens_k = static_cast<const int32_t*>(cuk.dev);
  }
  const size_t ws_bytes = std::max(r.ws_fwd, r.ws_bwd);
  if (ws_bytes > 0) {
    ws.init(mem, ws_bytes, true);
    ws.push();
  }
  r.fwd = flashattn_fwd(plan, &fa, r.ws_fwd ? ws.dev : nullptr, r.ws_fwd, nullptr);
  if (r.fwd != FLASHATTN_STATUS_SUCCESS) {
    r.error = flashattn_last_error();
    mem.sync();
    o.pull();
    lse.pull();
    r.outputs_untouched = all_poison(o) && all_poison(lse);
    return r;
  }
  mem.sync();
  o.pull();
  lse.pull();
  std::vector<uint8_t> touched;
  r.o = gather(p, 3, HQ, c.dv, o, &touched);
  if (!padding_ok(o, touched, o.host.size())) {
    r.padding_intact = false;
    r.padding_report += "O written outside its elements; ";
  }
  r.raw_o = o.host;
  if (c.with_lse) {
    r.lse.assign(lse_elems, 0.0);
    std::vector<float> l(lse_elems);
    if (lse_elems) memcpy(l.data(), lse.host.data(), lse_elems * 4);
    for (int64_t b = 0; b < p.spec.batch; ++b)
      for (int64_t h = 0; h < HQ; ++h)
        for (int64_t i = 0; i < p.spec.len_q(b); ++i) {
          const int64_t tok = p.spec.cu_q[b] + i;
          const int64_t idx = p.varlen ? h * tq + tok : (b * HQ + h) * c.sq + i;
          r.lse[tok * HQ + h] = l[idx];
        }
    r.raw_lse = lse.host;
  }
  if (!c.backward) return r;

  Buf dout, dq, dk, dv, dbias;
  dout.init(mem, p.lay[4].elems * es, true);
  scatter(p, 4, p.in.dout, HQ, c.dv, dout);
  dout.push();
  dq.init(mem, p.lay[5].elems * es, true);
  dk.init(mem, p.lay[6].elems * es, true);
  dv.init(mem, p.lay[7].elems * es, true);
  if (c.grad_accumulate) {
    scatter(p, 5, p.grad0[0], HQ, c.dqk, dq);
    scatter(p, 6, p.grad0[1], HKV, c.dqk, dk);
    scatter(p, 7, p.grad0[2], HKV, c.dv, dv);
  }
  dq.push();
  dk.push();
  dv.push();
  flashattn_bwd_args_t ba = FLASHATTN_BWD_ARGS_INIT;
  ba.q = q.dev;
  ba.k = k.dev;
  ba.v = v.dev;
  ba.o = o.dev;
  ba.lse = static_cast<const float*>(lse.dev);
  ba.dout = dout.dev;
  ba.dq = dq.dev;
  ba.dk = dk.dev;
  ba.dv = dv.dev;
  ba.bias = fa.bias;
  ba.alibi_slopes = fa.alibi_slopes;
  ba.cu_seqlens_q = fa.cu_seqlens_q;
  ba.cu_seqlens_k = fa.cu_seqlens_k;
  const bool want_dbias = c.bias == FLASHATTN_BIAS_TENSOR && c.want_dbias;
  if (want_dbias) {
    dbias.init(mem, p.bias_elems * es, true);
    dbias.push();
    ba.dbias = dbias.dev;
  }
  if (ws_bytes > 0) ws.push();  // re-poison the scratch
  // The gradients as they start (poison, or grad0): a failed run must leave them so.
  const std::vector<uint8_t> dq_before = dq.host, dk_before = dk.host, dv_before = dv.host;
  r.bwd = flashattn_bwd(plan, &ba, r.ws_bwd ? ws.dev : nullptr, r.ws_bwd, nullptr);
  if (r.bwd != FLASHATTN_STATUS_SUCCESS) {
    r.error = flashattn_last_error();
    mem.sync();
    dq.pull();
    dk.pull();
    dv.pull();
    r.outputs_untouched = dq.host == dq_before && dk.host == dk_before && dv.host == dv_before;
    if (want_dbias) {
      dbias.pull();
      r.outputs_untouched = r.outputs_untouched && all_poison(dbias);
    }
    return r;
  }
  mem.sync();
  dq.pull();
  dk.pull();
  dv.pull();
  r.dq = gather(p, 5, HQ, c.dqk, dq, &touched);
  if (!padding_ok(dq, touched, dq.host.size())) r.padding_intact = false, r.padding_report += "dQ padding written; ";
  r.dk = gather(p, 6, HKV, c.dqk, dk, &touched);
  if (!padding_ok(dk, touched, dk.host.size())) r.padding_intact = false, r.padding_report += "dK padding written; ";
  r.dv = gather(p, 7, HKV, c.dv, dv, &touched);
  if (!padding_ok(dv, touched, dv.host.size())) r.padding_intact = false, r.padding_report += "dV padding written; ";
  r.raw_dq = dq.host;
  r.raw_dk = dk.host;
  r.raw_dv = dv.host;
  if (want_dbias) {
    dbias.pull();
    r.raw_dbias = dbias.host;
    const int64_t* st = p.bias_strides;
    std::vector<uint8_t> tb(dbias.host.size(), 0);
    r.dbias.assign(static_cast<size_t>(c.batch * c.hq * c.sq * c.sk), 0.0);
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t h = 0; h < c.hq; ++h)
        for (int64_t i = 0; i < c.sq; ++i)
          for (int64_t j = 0; j < c.sk; ++j) {
            const size_t off = static_cast<size_t>(b * st[0] + h * st[1] + i * st[2] + j * st[3]) * es;
            r.dbias[((b * c.hq + h) * c.sq + i) * c.sk + j] = load_elem(c.dtype, &dbias.host[off]);
            std::fill_n(tb.begin() + static_cast<long>(off), es, 1);
          }
    if (!padding_ok(dbias, tb, dbias.host.size()))
      r.padding_intact = false, r.padding_report += "dBias padding written; ";
  }
  return r;
}

Masks recover_dropout_masks(const Config& c, MemOps& mem, const Tolerance& tol) {
  Masks m;
  Problem p = make_problem(c);
  const int64_t H = c.hq, DV = c.dv, SK = p.cfg.sk;
  if (p.cfg.sk > DV || p.cfg.sq > DV || c.hq != c.hkv) {
    m.error = "mask recovery needs seqlen_q, seqlen_k <= head_dim_v and heads_q == heads_kv";
    return m;
  }
  for (int64_t b = 0; b < p.spec.batch; ++b) {
    for (int64_t j = 0; j < p.spec.len_k(b); ++j)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < DV; ++d) p.in.v[((p.spec.cu_k[b] + j) * H + h) * DV + d] = d == j ? 1.0 : 0.0;
    for (int64_t i = 0; i < p.spec.len_q(b); ++i)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < DV; ++d) p.in.dout[((p.spec.cu_q[b] + i) * H + h) * DV + d] = d == i ? 1.0 : 0.0;
  }
  const LibResult r = run_library(p, mem, 0);
  m.ok = r.ok();
  m.error = r.error;
  if (!m.ok) return m;
  check_against_reference(p, r, tol);
  const int64_t tq = p.spec.total_q();
  m.fwd.assign(static_cast<size_t>(tq * H * SK), 0);
  m.bwd.assign(m.fwd.size(), 0);
  m.fwd_p.assign(m.fwd.size(), 0.0);
  for (int64_t b = 0; b < p.spec.batch; ++b)
    for (int64_t i = 0; i < p.spec.len_q(b); ++i)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t j = 0; j < p.spec.len_k(b); ++j) {
          const int64_t row = (p.spec.cu_q[b] + i) * H + h;
          m.fwd_p[row * SK + j] = r.o[row * DV + j];
          m.fwd[row * SK + j] = r.o[row * DV + j] != 0.0;
          m.bwd[row * SK + j] = r.dv[((p.spec.cu_k[b] + j) * H + h) * DV + i] != 0.0;
        }
  return m;
}

LibResult run_cpu(const Problem& p) {
  HostMem mem;
  return run_library(p, mem, 0);
}

// ---- comparisons --------------------------------------------------------------------------
ErrStats error_stats(const std::vector<double>& got, const std::vector<double>& ref) {
  ErrStats s;
  if (got.size() != ref.size()) {
    s.nonfinite_mismatch = std::max<size_t>(1, got.size() + ref.size());
    return s;
  }
  double sum = 0;
  for (size_t n = 0; n < got.size(); ++n) {
    const double g = got[n], r = ref[n];
    if (!std::isfinite(g) || !std::isfinite(r)) {
      if (!(g == r)) ++s.nonfinite_mismatch;  // -inf == -inf is fine, NaN never
      continue;
    }
    const double e = fabs(g - r);
    s.max_abs = std::max(s.max_abs, e);
    s.max_ref = std::max(s.max_ref, fabs(r));
    sum += e;
    ++s.n;
  }
  s.mean_abs = s.n ? sum / static_cast<double>(s.n) : 0.0;
  return s;
}

namespace {
double rd_fp16(double x) { return round_to(FLASHATTN_DTYPE_FP16, x); }
double rd_bf16(double x) { return round_to(FLASHATTN_DTYPE_BF16, x); }
double rd_fp32(double x) { return static_cast<double>(static_cast<float>(x)); }

// Zeroes dBias entries outside every sequence (i >= len_q(b) or j >= len_k(b)): their value
// is unspecified unless another batch shares the address, which the valid entries cover.
void mask_dbias(const RefSpec& s, std::vector<double>& x) {
  if (x.empty()) return;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads_q; ++h)
      for (int64_t i = 0; i < s.max_sq; ++i)
        for (int64_t j = 0; j < s.max_sk; ++j)
          if (i >= s.len_q(b) || j >= s.len_k(b)) x[((b * s.heads_q + h) * s.max_sq + i) * s.max_sk + j] = 0;
}
}  // namespace

Rounder rounder_for(flashattn_dtype_t t) {
  return t == FLASHATTN_DTYPE_FP16 ? rd_fp16 : t == FLASHATTN_DTYPE_BF16 ? rd_bf16 : rd_fp32;
}

void check_against_reference(const Problem& p, const LibResult& lib, const Tolerance& tol) {
  const bool bwd = p.cfg.backward;
  const RefOutputs exact = reference_fp64(p.spec, p.in, bwd);
  const RefOutputs lowp = reference_lowp(p.spec, p.in, rounder_for(p.cfg.dtype), bwd);
  check_against_reference(p, lib, exact, lowp, tol);
}

void check_against_reference(const Problem& p, const LibResult& lib, const RefOutputs& exact, const RefOutputs& lowp,
                             const Tolerance& tol) {
  INFO(describe(p.cfg));
  REQUIRE(lib.ok());
  INFO("padding: " << (lib.padding_intact ? "intact" : lib.padding_report));
  CHECK(lib.padding_intact);
  const double eps = dtype_eps(p.cfg.dtype);
  struct Item {
    const char* name;
    const std::vector<double>* got;
    std::vector<double> ref, low, mag;
  };
  std::vector<Item> items;
  items.push_back({"O", &lib.o, exact.o, lowp.o, exact.o_mag});
  if (p.cfg.with_lse) items.push_back({"LSE", &lib.lse, exact.lse, lowp.lse, exact.lse});
  if (p.cfg.backward) {
    items.push_back({"dQ", &lib.dq, exact.dq, lowp.dq, exact.dq_mag});
    items.push_back({"dK", &lib.dk, exact.dk, lowp.dk, exact.dk_mag});
    items.push_back({"dV", &lib.dv, exact.dv, lowp.dv, exact.dv_mag});
    if (p.cfg.bias == FLASHATTN_BIAS_TENSOR && p.cfg.want_dbias)
      items.push_back({"dBias", &lib.dbias, exact.dbias, lowp.dbias, exact.dbias_mag});
  }
  const bool fp32 = p.cfg.dtype == FLASHATTN_DTYPE_FP32;
  const double factor = fp32 ? tol.factor_fp32 : tol.factor_lowp;
  for (Item& it : items) {
    std::vector<double> got = *it.got;
    if (std::string(it.name) == "dBias") {
      mask_dbias(p.spec, got);
      mask_dbias(p.spec, it.ref);
      mask_dbias(p.spec, it.low);
      mask_dbias(p.spec, it.mag);
    }
    const ErrStats e = error_stats(got, it.ref);
    const ErrStats l = error_stats(it.low, it.ref);
    double cond = 0;
    for (double m : it.mag)
      if (std::isfinite(m)) cond = std::max(cond, fabs(m));
    const double floor = (fp32 ? tol.floor_u_fp32 : tol.floor_u_lowp) * eps * (1.0 + cond);
    std::ostringstream msg;
    msg << it.name << ": library max " << e.max_abs << " mean " << e.mean_abs << " | same-precision standard max "
        << l.max_abs << " mean " << l.mean_abs << " | factor " << factor << " floor " << floor << " | max |ref| "
        << e.max_ref << " condition magnitude " << cond << " | non-finite mismatches " << e.nonfinite_mismatch;
    INFO(msg.str());
    if (const char* log = std::getenv("FA_TEST_ERROR_LOG")) {  // optional error census
      if (FILE* f = fopen(log, "a")) {
        fprintf(f, "%s\t%s\t%.4g\t%.4g\t%.4g\t%.4g\t%.4g\t%s\n", dtype_name(p.cfg.dtype), it.name, e.max_abs, l.max_abs,
                e.mean_abs, l.mean_abs, floor, describe(p.cfg).c_str());
        fclose(f);
      }
    }
    CHECK(e.nonfinite_mismatch == 0);
    // The yardstick itself must agree with the fp64 reference to a few dozen unit roundoffs
    // of C (measured: at most 14); otherwise the two references disagree on semantics and
    // the bound below would be vacuous.
    CHECK(l.max_abs <= 64.0 * eps * (1.0 + cond));
    CHECK(e.max_abs <= factor * l.max_abs + floor);
    CHECK(e.mean_abs <= factor * l.mean_abs + floor);
  }
  // Fully masked rows: exactly O = 0, LSE = -inf, dQ = 0.
  const int64_t HQ = p.cfg.hq;
  size_t masked_rows = 0, bad_rows = 0;
  for (size_t row = 0; row < exact.row_masked.size(); ++row) {
    if (!exact.row_masked[row]) continue;
    ++masked_rows;
    bool good = true;
    for (int64_t d = 0; d < p.cfg.dv; ++d) good = good && lib.o[row * p.cfg.dv + d] == 0.0;
    if (p.cfg.with_lse) good = good && lib.lse[row] == -std::numeric_limits<double>::infinity();
    if (p.cfg.backward)
      for (int64_t d = 0; d < p.cfg.dqk; ++d) good = good && lib.dq[row * p.cfg.dqk + d] == 0.0;
    bad_rows += !good;
  }
  (void)HQ;
  INFO("fully masked rows " << masked_rows << ", of which not exactly O=0/LSE=-inf/dQ=0: " << bad_rows);
  CHECK(bad_rows == 0);
}

void run_and_check_cpu(const Config& c) {
  const Problem p = make_problem(c);
  const LibResult r = run_cpu(p);
  INFO(describe(p.cfg));
  INFO("status create/setup/fwd/bwd = " << r.create << "/" << r.setup << "/" << r.fwd << "/" << r.bwd
                                        << " error: " << r.error);
  REQUIRE(r.ok());
  check_against_reference(p, r);
}

void require_same_bits(const LibResult& a, const LibResult& b) {
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a.raw_o == b.raw_o);
  CHECK(a.raw_lse == b.raw_lse);
  CHECK(a.raw_dq == b.raw_dq);
  CHECK(a.raw_dk == b.raw_dk);
  CHECK(a.raw_dv == b.raw_dv);
  CHECK(a.raw_dbias == b.raw_dbias);
}

void check_dropout_below_threshold_is_off(const Config& c, MemOps& mem) {
  Config off = c;
  off.p_drop = 0.f;
  const LibResult base = run_library(make_problem(off), mem);
  for (float p : kDropBelowThreshold) {
    Config on = c;
    on.p_drop = p;
    on.seed = 0x5eed;
    INFO(describe(on) << ": " << base.error);
    require_same_bits(base, run_library(make_problem(on), mem));
  }
}

bool cpu_isa_usable(const char* isa) {
  REQUIRE(setenv("FLASHATTN_CPU_ISA", isa, 1) == 0);
  flashattn_plan_t p = nullptr;
  const flashattn_status_t st = flashattn_plan_create(&p, FLASHATTN_BACKEND_CPU, 0);
  flashattn_plan_destroy(p);
  REQUIRE(unsetenv("FLASHATTN_CPU_ISA") == 0);
  return st == FLASHATTN_STATUS_SUCCESS;
}

Config base_config(const char* name, int64_t sq, int64_t sk, int64_t d, flashattn_dtype_t t, uint64_t seed) {
  Config c;
  c.name = name;
  c.sq = sq;
  c.sk = sk;
  c.dqk = c.dv = d;
  c.hq = 2;
  c.hkv = 1;
  c.dtype = t;
  c.data_seed = seed;
  return c;
}

flashattn_fwd_args_t fwd_args(void* q, void* k, void* v, void* o, void* lse) {
  flashattn_fwd_args_t a = FLASHATTN_FWD_ARGS_INIT;
  a.q = q;
  a.k = k;
  a.v = v;
  a.o = o;
  a.lse = static_cast<float*>(lse);
  return a;
}

flashattn_bwd_args_t bwd_args(void* q, void* k, void* v, void* o, void* lse, void* dout, void* dq, void* dk, void* dv) {
  flashattn_bwd_args_t a = FLASHATTN_BWD_ARGS_INIT;
  a.q = q;
  a.k = k;
  a.v = v;
  a.o = o;
  a.lse = static_cast<const float*>(lse);
  a.dout = dout;
  a.dq = dq;
  a.dk = dk;
  a.dv = dv;
  return a;
}

}  // namespace fat
