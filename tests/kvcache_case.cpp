#include "kvcache_case.hpp"

#include <math.h>
#include <string.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>

#include "catch_compat.hpp"
#include "dtype.hpp"

namespace fat {
namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Writer {
  flashattn_dtype_t t;
  std::vector<uint8_t>& buf;
  void put(int64_t off, double v) { store_elem(t, &buf[static_cast<size_t>(off) * dtype_size(t)], v); }
  double get(int64_t off) const { return load_elem(t, &buf[static_cast<size_t>(off) * dtype_size(t)]); }
};

int64_t off4(const int64_t* st, int64_t a, int64_t b, int64_t c, int64_t d) {
  return a * st[0] + b * st[1] + c * st[2] + d * st[3];
}

// Cache strides of rows of `tokens` tokens: NHD [row, token, head, dim] or HND.
void cache_strides(bool heads_outer, int64_t tokens, int64_t heads, int64_t dim, int64_t* st) {
  st[3] = 1;
  if (heads_outer) {
    st[1] = dim;
    st[2] = tokens * dim;
  } else {
    st[2] = dim;
    st[1] = heads * dim;
  }
  st[0] = tokens * heads * dim;
}

// The rotation the library documents, in fp32 (as the library computes it) and rounded
// to the dtype: bitwise what a caller rotating in that dtype would pass.
void rotate(const KvCase& c, std::vector<double>& x, const std::vector<double>& cs, const std::vector<double>& sn) {
  const int64_t half = c.rotary_dim / 2;
  for (int64_t k = 0; k < half; ++k) {
    const bool il = c.rotary == FLASHATTN_ROTARY_INTERLEAVED;
    const int64_t a = il ? 2 * k : k, b = il ? 2 * k + 1 : k + half;
    const float x1 = static_cast<float>(x[a]), x2 = static_cast<float>(x[b]);
    const float ck = static_cast<float>(cs[k]), sk = static_cast<float>(sn[k]);
    const float ra = x1 * ck - x2 * sk, rb = x2 * ck + x1 * sk;
    x[a] = round_to(c.dtype, ra);
    x[b] = round_to(c.dtype, rb);
  }
}

}  // namespace

std::string describe(const KvCase& c) {
  std::ostringstream o;
  o << c.name << ": b=" << c.batch << " sq=" << c.sq << " cap=" << c.cap << " hq=" << c.hq << " hkv=" << c.hkv
    << " d=" << c.dqk << "/" << c.dv << " " << dtype_name(c.dtype) << " new=" << c.seqlen_new << " page=" << c.page_size
    << (c.heads_outer ? " HND" : " NHD") << (c.batch_idx ? " batch_idx" : "")
    << " rotary=" << static_cast<int>(c.rotary) << "/" << c.rotary_dim << (c.causal ? " causal" : "") << " window=("
    << c.wl << "," << c.wr << ") softcap=" << c.softcap << " bias=" << static_cast<int>(c.bias)
    << " slopes batch stride=" << c.alibi_batch_stride << " splits=" << c.num_splits << " used={";
  for (int u : c.used) o << u << ",";
  o << "} seed=" << c.seed;
  return o.str();
}

KvRun make_kv_run(const KvCase& c0) {
  KvRun r;
  r.c = c0;
  KvCase& c = r.c;
  if (c.used.empty()) c.used.assign(static_cast<size_t>(c.batch), static_cast<int>(c.cap - c.seqlen_new));
  std::mt19937_64 rng(c.seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  const flashattn_dtype_t t = c.dtype;
  const size_t es = dtype_size(t);
  const int64_t B = c.batch;
  r.used.assign(c.used.begin(), c.used.end());

  // Logical per-sequence keys/values (positions 0..cap), new rows, queries.
  auto rnd = [&](size_t n) {
    std::vector<double> x(n);
    for (double& v : x) v = round_to(t, normal(rng));
    return x;
  };
  const std::vector<double> k_old = rnd(static_cast<size_t>(B * c.cap * c.hkv * c.dqk));
  const std::vector<double> v_old = rnd(static_cast<size_t>(B * c.cap * c.hkv * c.dv));
  std::vector<double> k_new = rnd(static_cast<size_t>(B * c.seqlen_new * c.hkv * c.dqk));
  const std::vector<double> v_new = rnd(static_cast<size_t>(B * c.seqlen_new * c.hkv * c.dv));
  std::vector<double> q = rnd(static_cast<size_t>(B * c.sq * c.hq * c.dqk));
  auto put_all = [&](std::vector<uint8_t>& buf, const std::vector<double>& x) {
    buf.assign(std::max<size_t>(x.size(), 1) * es, 0);
    Writer w{t, buf};
    for (size_t i = 0; i < x.size(); ++i) w.put(static_cast<int64_t>(i), x[i]);
  };
  put_all(r.q, q);
  put_all(r.k_new, k_new);
  put_all(r.v_new, v_new);

  // Rotary tables: rotary_rows = cap + 3 positions, frequencies 10000^(-2k/rotary_dim).
  const int64_t half = c.rotary_dim / 2, rows = c.rotary != FLASHATTN_ROTARY_NONE ? c.cap + 3 : 0;
  std::vector<double> cs(static_cast<size_t>(rows * half)), sn(cs.size());
  for (int64_t pos = 0; pos < rows; ++pos)
    for (int64_t k = 0; k < half; ++k) {
      const double th = static_cast<double>(pos) * pow(10000.0, -2.0 * static_cast<double>(k) / c.rotary_dim);
      cs[pos * half + k] = round_to(t, cos(th));
      sn[pos * half + k] = round_to(t, sin(th));
    }
  put_all(r.cos, cs);
  put_all(r.sin, sn);
  auto row_of = [&](const std::vector<double>& tab, int64_t pos) {
    return std::vector<double>(tab.begin() + pos * half, tab.begin() + (pos + 1) * half);
  };
  const bool band = c.causal || c.wl >= 0 || c.wr >= 0;

  // Physical cache: contiguous rows (optionally permuted) or shuffled pages.
  const bool paged = c.page_size > 0;
  const int64_t tokens = paged ? c.page_size : c.cap;
  std::vector<std::vector<int64_t>> place(static_cast<size_t>(B));  // per sequence: row or page per logical page
  if (paged) {
    r.max_pages = (c.cap + c.page_size - 1) / c.page_size + 1;  // one spare column, never read
    r.num_rows = B * r.max_pages + 1;
    std::vector<int64_t> perm(static_cast<size_t>(r.num_rows));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    r.block_table.assign(static_cast<size_t>(B * r.max_pages), 1 << 30);  // garbage where not needed
    size_t next = 0;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t n_pages = (r.used[b] + c.seqlen_new + c.page_size - 1) / c.page_size;
      for (int64_t lp = 0; lp < n_pages; ++lp) {
        r.block_table[b * r.max_pages + lp] = static_cast<int32_t>(perm[next]);
        place[b].push_back(perm[next++]);
      }
    }
  } else {
    r.num_rows = B + (c.batch_idx ? 2 : 0);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t row = c.batch_idx ? r.num_rows - 1 - b : b;
      if (c.batch_idx) r.batch_idx.push_back(static_cast<int32_t>(row));
      place[b].push_back(row);
    }
  }
  cache_strides(c.heads_outer, tokens, c.hkv, c.dqk, r.kc_stride);
  cache_strides(c.heads_outer, tokens, c.hkv, c.dv, r.vc_stride);
  // NaN everywhere first: any slot a run reads without the plan saying so poisons O.
  const size_t kc_elems = static_cast<size_t>(r.num_rows * tokens * c.hkv * c.dqk);
  const size_t vc_elems = static_cast<size_t>(r.num_rows * tokens * c.hkv * c.dv);
  put_all(r.k_cache, std::vector<double>(kc_elems, kNaN));
  put_all(r.v_cache, std::vector<double>(vc_elems, kNaN));
  auto slot = [&](int64_t b, int64_t j, int64_t* row, int64_t* tok) {
    if (paged) {
      *row = place[b][j / c.page_size];
      *tok = j % c.page_size;
    } else {
      *row = place[b][0];
      *tok = j;
    }
  };
  Writer kc{t, r.k_cache}, vc{t, r.v_cache};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < r.used[b]; ++j) {
      int64_t row, tok;
      slot(b, j, &row, &tok);
      for (int64_t h = 0; h < c.hkv; ++h) {
        for (int64_t d = 0; d < c.dqk; ++d)
          kc.put(off4(r.kc_stride, row, tok, h, d), k_old[((b * c.cap + j) * c.hkv + h) * c.dqk + d]);
        for (int64_t d = 0; d < c.dv; ++d)
          vc.put(off4(r.vc_stride, row, tok, h, d), v_old[((b * c.cap + j) * c.hkv + h) * c.dv + d]);
      }
    }

  // The append as documented: rotated new keys and new values at the used length.
  if (c.rotary != FLASHATTN_ROTARY_NONE)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < c.seqlen_new; ++i)
        for (int64_t h = 0; h < c.hkv; ++h) {
          std::vector<double> x(&k_new[((b * c.seqlen_new + i) * c.hkv + h) * c.dqk],
                                &k_new[((b * c.seqlen_new + i) * c.hkv + h) * c.dqk] + c.dqk);
          rotate(c, x, row_of(cs, r.used[b] + i), row_of(sn, r.used[b] + i));
          std::copy(x.begin(), x.end(), &k_new[((b * c.seqlen_new + i) * c.hkv + h) * c.dqk]);
        }
  r.k_cache_after = r.k_cache;
  r.v_cache_after = r.v_cache;
  Writer ka{t, r.k_cache_after}, va{t, r.v_cache_after};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < c.seqlen_new; ++i) {
      int64_t row, tok;
      slot(b, r.used[b] + i, &row, &tok);
      for (int64_t h = 0; h < c.hkv; ++h) {
        for (int64_t d = 0; d < c.dqk; ++d)
          ka.put(off4(r.kc_stride, row, tok, h, d), k_new[((b * c.seqlen_new + i) * c.hkv + h) * c.dqk + d]);
        for (int64_t d = 0; d < c.dv; ++d)
          va.put(off4(r.vc_stride, row, tok, h, d), v_new[((b * c.seqlen_new + i) * c.hkv + h) * c.dv + d]);
      }
    }

  // Dense equivalent, read back from the expected cache (so it is what a correct run reads).
  RefSpec& s = r.spec;
  s.batch = B;
  s.heads_q = c.hq;
  s.heads_kv = c.hkv;
  s.head_dim_qk = c.dqk;
  s.head_dim_v = c.dv;
  s.max_sq = c.sq;
  s.max_sk = c.cap;
  s.cu_q.assign(1, 0);
  s.cu_k.assign(1, 0);
  for (int64_t b = 0; b < B; ++b) {
    s.cu_q.push_back(s.cu_q.back() + c.sq);
    s.cu_k.push_back(s.cu_k.back() + r.used[b] + c.seqlen_new);
  }
  s.scale = 1.0 / sqrt(static_cast<double>(c.dqk));
  s.softcap = c.softcap;
  s.band = band;
  s.align = 1;
  s.window_left = c.causal ? -1 : c.wl;
  s.window_right = c.causal ? 0 : c.wr;
  s.bias_kind = c.bias == FLASHATTN_BIAS_ALIBI ? 2 : c.bias == FLASHATTN_BIAS_ALIBI_SYMMETRIC ? 3 : 0;
  make_alibi_slopes(c.batch, c.hq, c.alibi_batch_stride, r.slopes, s.slopes);
  if (c.rotary != FLASHATTN_ROTARY_NONE)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < c.sq; ++i)
        for (int64_t h = 0; h < c.hq; ++h) {
          double* row = &q[((b * c.sq + i) * c.hq + h) * c.dqk];
          std::vector<double> x(row, row + c.dqk);
          const int64_t pos = r.used[b] + (band ? i : 0);
          rotate(c, x, row_of(cs, pos), row_of(sn, pos));
          std::copy(x.begin(), x.end(), row);
        }
  r.in.q = q;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < r.used[b] + c.seqlen_new; ++j) {
      int64_t row, tok;
      slot(b, j, &row, &tok);
      for (int64_t h = 0; h < c.hkv; ++h) {
        for (int64_t d = 0; d < c.dqk; ++d) r.in.k.push_back(ka.get(off4(r.kc_stride, row, tok, h, d)));
        for (int64_t d = 0; d < c.dv; ++d) r.in.v.push_back(va.get(off4(r.vc_stride, row, tok, h, d)));
      }
    }
  put_all(r.q_rotated, r.in.q);
  put_all(r.k_dense, r.in.k);
  put_all(r.v_dense, r.in.v);
  return r;
}

flashattn_plan_t make_kv_plan(const KvRun& r, flashattn_backend_t backend) {
  const KvCase& c = r.c;
  flashattn_plan_t plan = nullptr;
  REQUIRE(flashattn_plan_create(&plan, backend, 0) == FLASHATTN_STATUS_SUCCESS);
  CHECK(flashattn_plan_set_shape(plan, c.batch, c.sq, c.cap, c.hq, c.hkv, c.dqk, c.dv) == FLASHATTN_STATUS_SUCCESS);
  CHECK(flashattn_plan_set_dtype(plan, c.dtype) == FLASHATTN_STATUS_SUCCESS);
  if (r.spec.band)
    CHECK(flashattn_plan_set_band_mask(plan, FLASHATTN_ALIGN_BOTTOM_RIGHT, r.spec.window_left, r.spec.window_right) ==
          FLASHATTN_STATUS_SUCCESS);
  if (c.softcap > 0) CHECK(flashattn_plan_set_softcap(plan, c.softcap) == FLASHATTN_STATUS_SUCCESS);
  if (c.bias != FLASHATTN_BIAS_NONE) {
    CHECK(flashattn_plan_set_bias(plan, c.bias, nullptr) == FLASHATTN_STATUS_SUCCESS);
    if (c.alibi_batch_stride != 0)
      CHECK(flashattn_plan_set_alibi_batch_stride(plan, c.alibi_batch_stride) == FLASHATTN_STATUS_SUCCESS);
    if (!r.spec.band)  // ALiBi's i' is aligned like the band mask: bottom-right
      CHECK(flashattn_plan_set_band_mask(plan, FLASHATTN_ALIGN_BOTTOM_RIGHT, -1, -1) == FLASHATTN_STATUS_SUCCESS);
  }
  const flashattn_kvcache_config_t kv = kv_config(r);
  INFO(flashattn_last_error());
  CHECK(flashattn_plan_set_kvcache(plan, &kv) == FLASHATTN_STATUS_SUCCESS);
  return plan;
}

flashattn_kvcache_config_t kv_config(const KvRun& r) {
  const KvCase& c = r.c;
  flashattn_kvcache_config_t kv = FLASHATTN_KVCACHE_CONFIG_INIT;
  kv.page_size = c.page_size;
  kv.num_rows = r.num_rows;
  kv.max_pages_per_seq = c.page_size > 0 ? r.max_pages : 0;
  kv.k_cache_strides = r.kc_stride;
  kv.v_cache_strides = c.heads_outer ? r.vc_stride : nullptr;  // NULL: contiguous NHD, the same strides
  kv.seqlen_new = c.seqlen_new;
  kv.rotary = c.rotary;
  kv.rotary_dim = c.rotary_dim;
  kv.rotary_rows = c.rotary != FLASHATTN_ROTARY_NONE ? c.cap + 3 : 0;
  kv.num_splits = c.num_splits;
  return kv;
}

KvResult run_kv(const KvRun& r, flashattn_plan_t plan, KvEdit edit) {
  const KvCase& c = r.c;
  KvResult k;
  k.o.assign(static_cast<size_t>(c.batch * c.sq * c.hq * c.dv) * dtype_size(c.dtype), kPoison);
  k.lse.assign(static_cast<size_t>(c.batch * c.hq * c.sq), std::numeric_limits<float>::quiet_NaN());
  k.k_cache = r.k_cache;
  k.v_cache = r.v_cache;
  std::vector<uint8_t> q = r.q, kn = r.k_new, vn = r.v_new, cs = r.cos, sn = r.sin;
  std::vector<int32_t> used = r.used, idx = r.batch_idx, table = r.block_table;
  std::vector<float> slopes = r.slopes;
  flashattn_kvcache_args_t a = FLASHATTN_KVCACHE_ARGS_INIT;
  a.q = q.data();
  a.k_cache = k.k_cache.data();
  a.v_cache = k.v_cache.data();
  a.o = k.o.data();
  a.lse = c.with_lse ? k.lse.data() : nullptr;
  a.cache_seqlens = used.data();
  a.cache_batch_idx = c.batch_idx ? idx.data() : nullptr;
  a.block_table = c.page_size > 0 ? table.data() : nullptr;
  a.k_new = c.seqlen_new > 0 ? kn.data() : nullptr;
  a.v_new = c.seqlen_new > 0 ? vn.data() : nullptr;
  a.rotary_cos = c.rotary != FLASHATTN_ROTARY_NONE ? cs.data() : nullptr;
  a.rotary_sin = c.rotary != FLASHATTN_ROTARY_NONE ? sn.data() : nullptr;
  a.alibi_slopes = c.bias != FLASHATTN_BIAS_NONE ? slopes.data() : nullptr;
  if (edit) edit(a, r);
  size_t ws_bytes = 0;
  REQUIRE(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_FORWARD_KVCACHE, &ws_bytes) ==
          FLASHATTN_STATUS_SUCCESS);
  std::vector<uint8_t> ws(std::max<size_t>(ws_bytes, 1), kPoison);
  k.status = flashattn_fwd_kvcache(plan, &a, ws.data(), ws_bytes, nullptr);
  k.error = flashattn_last_error();
  return k;
}

Problem kv_problem(const KvRun& r) {
  Problem p;
  p.cfg.name = describe(r.c);
  p.cfg.batch = r.c.batch;
  p.cfg.sq = r.c.sq;
  p.cfg.sk = r.c.cap;
  p.cfg.hq = r.c.hq;
  p.cfg.hkv = r.c.hkv;
  p.cfg.dqk = r.c.dqk;
  p.cfg.dv = r.c.dv;
  p.cfg.dtype = r.c.dtype;
  p.cfg.bias = r.c.bias;
  p.cfg.backward = false;
  p.cfg.with_lse = r.c.with_lse;
  p.spec = r.spec;
  p.in = r.in;
  p.varlen = true;
  return p;
}

LibResult kv_lib_result(const KvRun& r, const KvResult& k) {
  const KvCase& c = r.c;
  LibResult lib;
  lib.fwd = k.status;
  lib.error = k.error;
  const size_t es = dtype_size(c.dtype);
  for (size_t i = 0; i < k.o.size() / es; ++i) lib.o.push_back(load_elem(c.dtype, &k.o[i * es]));
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t i = 0; i < c.sq; ++i)
      for (int64_t h = 0; h < c.hq; ++h) lib.lse.push_back(k.lse[(b * c.hq + h) * c.sq + i]);
  return lib;
}

}  // namespace fat
