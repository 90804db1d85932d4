// `flashattn check`: run one configuration, compare with an fp64 reference (and, on
// CUDA, with the CPU backend and the other algorithm), print errors and PASS/FAIL.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <thread>

#include "args.hpp"
#include "cli.hpp"
#include "commands.hpp"
#include "device.hpp"
#include "problem.hpp"
#include "reference.hpp"
#include "tensor.hpp"

namespace facli {
namespace {

struct Inputs {
  HostTensor q, k, v, dout;
  HostTensor bias;                  // --bias-tensor: the stored (broadcast-reduced) tensor, see bias_tensor()
  std::vector<int32_t> cu_q, cu_k;  // --varlen: the cu_seqlens the library reads
};

// Q/O-side (queries) or K/V-side (keys) tensor with `heads` x `dim` per token: (batch,
// seqlen) in the chosen layout or, in varlen mode, one packed run of every token.
HostTensor token_tensor(const Problem& p, bool query_side, int64_t heads, int64_t dim) {
  if (p.varlen) return HostTensor(p.dtype, p.layout, 1, query_side ? p.total_q() : p.total_k(), heads, dim);
  return HostTensor(p.dtype, p.layout, p.batch, query_side ? p.seqlen_q : p.seqlen_k, heads, dim);
}

// The stored bias (and dBias) tensor: dims (batch, head, q, k) of Problem::bias_layout,
// contiguous; a HostTensor's BSHD order is exactly that row-major order.
HostTensor bias_tensor(const Problem& p) {
  int64_t dims[4], strides[4];
  p.bias_layout(dims, strides);
  return HostTensor(p.dtype, Layout::kBSHD, dims[0], dims[1], dims[2], dims[3]);
}

// Length of the library's LSE: [batch, heads_q, seqlen_q], or [heads_q, total_q] in varlen mode.
size_t lse_size(const Problem& p) {
  return static_cast<size_t>(p.heads_q * (p.varlen ? p.total_q() : p.batch * p.seqlen_q));
}

struct RunResult {
  std::string label;
  flashattn_backend_t backend = FLASHATTN_BACKEND_CPU;
  HostTensor o, dq, dk, dv, dbias;
  std::vector<float> lse;
  double fwd_ms = 0, bwd_ms = 0;
  size_t ws_fwd = 0, ws_bwd = 0;
};

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Runs the forward (and backward) pass once on `backend` with `alg`; outputs are
// poisoned first so an element the library does not write reads as NaN.
RunResult run_once(const Problem& p, flashattn_backend_t backend, flashattn_algorithm_t alg, const Inputs& in) {
  Plan plan(backend, p.device);
  RunResult r;
  r.backend = plan.backend();
  r.label = strf("%s %s", backend_name(r.backend), algorithm_name(alg));
  configure_plan(plan.get(), p, alg);
  lib_check(flashattn_plan_get_workspace_size(plan.get(), FLASHATTN_PASS_FORWARD, &r.ws_fwd),
            "flashattn_plan_get_workspace_size");
  if (p.bwd)
    lib_check(flashattn_plan_get_workspace_size(plan.get(), FLASHATTN_PASS_BACKWARD, &r.ws_bwd),
              "flashattn_plan_get_workspace_size");

  const bool on_dev = r.backend == FLASHATTN_BACKEND_CUDA;
  if (on_dev) dev::set_device(p.device);
  r.o = token_tensor(p, true, p.heads_q, p.head_dim_v);
  r.lse.assign(lse_size(p), 0.f);
  SpaceBuffer q(on_dev, in.q.bytes()), k(on_dev, in.k.bytes()), v(on_dev, in.v.bytes());
  SpaceBuffer o(on_dev, r.o.bytes()), lse(on_dev, r.lse.size() * sizeof(float));
  SpaceBuffer slopes(on_dev, p.alibi_slopes.size() * sizeof(float));
  SpaceBuffer bias(on_dev, in.bias.bytes());
  SpaceBuffer cu_q(on_dev, in.cu_q.size() * sizeof(int32_t)), cu_k(on_dev, in.cu_k.size() * sizeof(int32_t));
  q.upload(in.q.data(), in.q.bytes());
  k.upload(in.k.data(), in.k.bytes());
  v.upload(in.v.data(), in.v.bytes());
  if (!p.alibi_slopes.empty()) slopes.upload(p.alibi_slopes.data(), slopes.bytes());
  if (p.bias_tensor) bias.upload(in.bias.data(), in.bias.bytes());
  if (p.varlen) {
    cu_q.upload(in.cu_q.data(), cu_q.bytes());
    cu_k.upload(in.cu_k.data(), cu_k.bytes());
  }
  o.fill_bytes(0xFF);
  lse.fill_bytes(0xFF);
  const float* slopes_ptr = p.alibi_slopes.empty() ? nullptr : static_cast<const float*>(slopes.get());
  const void* bias_ptr = p.bias_tensor ? bias.get() : nullptr;
  const int32_t* cu_q_ptr = p.varlen ? static_cast<const int32_t*>(cu_q.get()) : nullptr;
  const int32_t* cu_k_ptr = p.varlen ? static_cast<const int32_t*>(cu_k.get()) : nullptr;
  {
    SpaceBuffer ws(on_dev, r.ws_fwd);
    flashattn_fwd_args_t fa = FLASHATTN_FWD_ARGS_INIT;
    fa.q = q.get();
    fa.k = k.get();
    fa.v = v.get();
    fa.o = o.get();
    fa.lse = static_cast<float*>(lse.get());
    fa.alibi_slopes = slopes_ptr;
    fa.bias = bias_ptr;
    fa.cu_seqlens_q = cu_q_ptr;
    fa.cu_seqlens_k = cu_k_ptr;
    if (on_dev) {
      dev::Timer t;
      t.start();
      lib_check(flashattn_fwd(plan.get(), &fa, ws.get(), r.ws_fwd, nullptr), "flashattn_fwd");
      r.fwd_ms = t.stop();
    } else {
      const double t0 = now_ms();
      lib_check(flashattn_fwd(plan.get(), &fa, ws.get(), r.ws_fwd, nullptr), "flashattn_fwd");
      r.fwd_ms = now_ms() - t0;
    }
  }
  o.download(r.o.data(), r.o.bytes());
  lse.download(r.lse.data(), r.lse.size() * sizeof(float));
  if (!p.bwd) return r;

  r.dq = token_tensor(p, true, p.heads_q, p.head_dim);
  r.dk = token_tensor(p, false, p.heads_kv, p.head_dim);
  r.dv = token_tensor(p, false, p.heads_kv, p.head_dim_v);
  if (p.bias_tensor) r.dbias = bias_tensor(p);
  SpaceBuffer dout(on_dev, in.dout.bytes()), dq(on_dev, r.dq.bytes()), dk(on_dev, r.dk.bytes()),
      dv(on_dev, r.dv.bytes()), dbias(on_dev, r.dbias.bytes()), ws(on_dev, r.ws_bwd);
  dout.upload(in.dout.data(), in.dout.bytes());
  dq.fill_bytes(0xFF);
  dk.fill_bytes(0xFF);
  dv.fill_bytes(0xFF);
  dbias.fill_bytes(0xFF);
  flashattn_bwd_args_t ba = FLASHATTN_BWD_ARGS_INIT;
  ba.q = q.get();
  ba.k = k.get();
  ba.v = v.get();
  ba.o = o.get();
  ba.lse = static_cast<const float*>(lse.get());
  ba.dout = dout.get();
  ba.dq = dq.get();
  ba.dk = dk.get();
  ba.dv = dv.get();
  ba.alibi_slopes = slopes_ptr;
  ba.bias = bias_ptr;
  ba.dbias = p.bias_tensor ? dbias.get() : nullptr;
  ba.cu_seqlens_q = cu_q_ptr;
  ba.cu_seqlens_k = cu_k_ptr;
  if (on_dev) {
    dev::Timer t;
    t.start();
    lib_check(flashattn_bwd(plan.get(), &ba, ws.get(), r.ws_bwd, nullptr), "flashattn_bwd");
    r.bwd_ms = t.stop();
  } else {
    const double t0 = now_ms();
    lib_check(flashattn_bwd(plan.get(), &ba, ws.get(), r.ws_bwd, nullptr), "flashattn_bwd");
    r.bwd_ms = now_ms() - t0;
  }
  dq.download(r.dq.data(), r.dq.bytes());
  dk.download(r.dk.data(), r.dk.bytes());
  dv.download(r.dv.data(), r.dv.bytes());
  if (p.bias_tensor) dbias.download(r.dbias.data(), r.dbias.bytes());
  return r;
}

// The fp64 reference's description of the run (reference/reference.hpp): packed
// tokens, the expanded bias, the same ALiBi slopes, dropout key and sparse layout.
fat::RefSpec ref_spec(const Problem& p, const Inputs& in) {
  fat::RefSpec s;
  s.batch = p.batch;
  s.heads_q = p.heads_q;
  s.heads_kv = p.heads_kv;
  s.head_dim_qk = p.head_dim;
  s.head_dim_v = p.head_dim_v;
  s.max_sq = p.seqlen_q;
  s.max_sk = p.seqlen_k;
  s.cu_q = p.cu_q;
  s.cu_k = p.cu_k;
  s.scale = p.scale();
  s.softcap = static_cast<double>(p.softcap);
  s.band = p.has_band;
  s.align = p.align == FLASHATTN_ALIGN_BOTTOM_RIGHT ? 1 : 0;
  s.window_left = p.window_left;
  s.window_right = p.window_right;
  if (p.bias_tensor) {
    s.bias_kind = 1;
    for (int d = 0; d < 4; ++d) s.bias_bcast[d] = p.bias_bcast[d];
    s.bias.resize(static_cast<size_t>(p.batch * p.heads_q * p.seqlen_q * p.seqlen_k));
    size_t n = 0;
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t i = 0; i < p.seqlen_q; ++i)
          for (int64_t j = 0; j < p.seqlen_k; ++j)
            s.bias[n++] = in.bias.get(p.bias_bcast[0] ? 0 : b, p.bias_bcast[1] ? 0 : h, p.bias_bcast[2] ? 0 : i,
                                      p.bias_bcast[3] ? 0 : j);
  } else if (p.alibi != FLASHATTN_BIAS_NONE) {
    s.bias_kind = p.alibi == FLASHATTN_BIAS_ALIBI ? 2 : 3;
    s.slopes.assign(p.alibi_slopes.begin(), p.alibi_slopes.end());
  }
  s.magnitudes = p.bias_tensor && p.bwd;  // only dBias's tolerance uses them
  s.p_drop = p.dropout;
  s.seed = p.seed;
  s.offset = 0;
  if (!p.layout_blocks.empty()) {
    s.layout = p.layout_blocks;
    s.layout_heads = p.heads_q;
    s.n_row_blocks = p.row_blocks();
    s.n_col_blocks = p.col_blocks();
    s.block_q = s.block_k = Problem::kSparseBlock;
  }
  return s;
}

// The reference's LSE ([total_q][heads_q]) in the library's layout.
std::vector<double> lse_library_layout(const Problem& p, const std::vector<double>& ref) {
  std::vector<double> out(lse_size(p));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t t = p.cu_q[b]; t < p.cu_q[b + 1]; ++t)
      for (int64_t h = 0; h < p.heads_q; ++h) {
        const size_t at = p.varlen ? static_cast<size_t>(h * p.total_q() + t)
                                   : static_cast<size_t>((b * p.heads_q + h) * p.seqlen_q + (t - p.cu_q[b]));
        out[at] = ref[static_cast<size_t>(t * p.heads_q + h)];
      }
  return out;
}

// Which elements of the stored dBias the library defines: a broadcast group that some
// (b, i, j) inside a sequence reaches (in varlen mode the others are unspecified).
std::vector<uint8_t> dbias_defined(const Problem& p) {
  int64_t dims[4], strides[4];
  p.bias_layout(dims, strides);
  std::vector<uint8_t> ok(static_cast<size_t>(dims[0] * dims[1] * dims[2] * dims[3]), 0);
  size_t n = 0;
  for (int64_t bb = 0; bb < dims[0]; ++bb)
    for (int64_t hh = 0; hh < dims[1]; ++hh)
      for (int64_t ii = 0; ii < dims[2]; ++ii)
        for (int64_t jj = 0; jj < dims[3]; ++jj, ++n)
          for (int64_t b = p.bias_bcast[0] ? 0 : bb; b < (p.bias_bcast[0] ? p.batch : bb + 1) && !ok[n]; ++b) {
            const int64_t lq = p.cu_q[b + 1] - p.cu_q[b], lk = p.cu_k[b + 1] - p.cu_k[b];
            ok[n] = (p.bias_bcast[2] ? lq > 0 : ii < lq) && (p.bias_bcast[3] ? lk > 0 : jj < lk);
          }
  return ok;
}

// The reference's dBias (expanded; every element of a group holds the group's sum) at the
// stored elements, 0 where the library's value is unspecified.
std::vector<double> dbias_stored(const Problem& p, const std::vector<double>& expanded,
                                 const std::vector<uint8_t>& defined) {
  int64_t dims[4], strides[4];
  p.bias_layout(dims, strides);
  std::vector<double> out(defined.size(), 0.0);
  size_t n = 0;
  for (int64_t bb = 0; bb < dims[0]; ++bb)
    for (int64_t hh = 0; hh < dims[1]; ++hh)
      for (int64_t ii = 0; ii < dims[2]; ++ii)
        for (int64_t jj = 0; jj < dims[3]; ++jj, ++n)
          if (defined[n])
            out[n] = expanded[static_cast<size_t>(((bb * p.heads_q + hh) * p.seqlen_q + ii) * p.seqlen_k + jj)];
  return out;
}

std::vector<double> masked(std::vector<double> x, const std::vector<uint8_t>& defined) {
  for (size_t n = 0; n < x.size() && n < defined.size(); ++n)
    if (!defined[n]) x[n] = 0.0;
  return x;
}

// Normwise error of `got` against `ref`. Equal infinities (LSE = -inf of a fully
// masked row) agree; any other non-finite value on either side is a mismatch.
struct Err {
  double max_abs = 0, sum_abs = 0, max_ref = 0, sum_ref = 0;
  int64_t n = 0, mismatches = 0;
  double max_rel() const { return max_ref > 0 ? max_abs / max_ref : (max_abs > 0 ? INFINITY : 0.0); }
  double mean_abs() const { return n ? sum_abs / n : 0.0; }
  double mean_rel() const { return sum_ref > 0 ? sum_abs / sum_ref : (sum_abs > 0 ? INFINITY : 0.0); }
};

Err compare(const std::vector<double>& got, const std::vector<double>& ref) {
  Err e;
  for (size_t i = 0; i < got.size() && i < ref.size(); ++i) {
    const double g = got[i], r = ref[i];
    ++e.n;
    if (!std::isfinite(g) || !std::isfinite(r)) {
      if (!(g == r)) ++e.mismatches;  // NaN never equals; +-inf must match exactly
      continue;
    }
    const double d = std::fabs(g - r);
    e.max_abs = std::max(e.max_abs, d);
    e.sum_abs += d;
    e.max_ref = std::max(e.max_ref, std::fabs(r));
    e.sum_ref += std::fabs(r);
  }
  if (got.size() != ref.size()) e.mismatches += 1;
  return e;
}

enum Kind { kO, kLse, kGrad };

// Tolerances on max_abs / max(max|ref|, floor) against the fp64 reference, per dtype.
// fp16/bf16: a few units of the output rounding (2^-11, 2^-8) plus the 16-bit P/dS
// that fast kernels feed to their matmuls; fp32: fp32 accumulation over long rows.
// LSE is fp32 in every dtype. Between two implementations of the same dtype the
// tolerance doubles (both carry their own error).
double tolerance(flashattn_dtype_t dt, Kind k) {
  switch (dt) {
    case FLASHATTN_DTYPE_FP16: return k == kO ? 3e-3 : k == kLse ? 1e-4 : 1e-2;
    case FLASHATTN_DTYPE_BF16: return k == kO ? 2e-2 : k == kLse ? 1e-4 : 5e-2;
    case FLASHATTN_DTYPE_FP32: return k == kO ? 1e-4 : k == kLse ? 2e-5 : 5e-4;
    default: break;
  }
  return 0;
}
double floor_of(Kind k) { return k == kLse ? 1.0 : 1e-3; }

std::vector<double> lse_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

const char* kHelp =
    "usage: flashattn check [options]\n"
    "\n"
    "Runs one attention configuration on a backend and compares O and LSE (with --bwd\n"
    "also dQ, dK, dV, and dBias of a --bias-tensor) with a reference:\n"
    "  * always: the project's fp64 reference (reference/, linked into this tool)\n"
    "    computed from the same (rounded) inputs;\n"
    "  * the other algorithm (flash <-> standard) on the same backend;\n"
    "  * on CUDA also the CPU backend's result for the same inputs.\n"
    "Inputs are N(0,1) random numbers (from --seed) rounded to the dtype; outputs are\n"
    "poisoned with NaN before each run, so an unwritten element fails. Dropout uses\n"
    "philox offset 0 and key --seed; --block-sparse draws one layout per query head\n"
    "(layout_heads = heads_q) from --seed. --bias-tensor stores only the non-broadcast\n"
    "dims (stride 0 along the others) and, with --bwd, checks dBias (the sum over the\n"
    "broadcast dims); with --varlen the elements no sequence reaches are not compared.\n"
    "--varlen packs the sequences' tokens (Q/O [total_q, heads, dim], LSE [heads_q,\n"
    "total_q]); masks, bias, ALiBi, dropout and the sparse layout use positions within\n"
    "each sequence, and --align bottom-right aligns each sequence's own ends.\n"
    "\n"
    "Errors, per tensor: max_abs = max |x - ref|, mean_abs = mean |x - ref|,\n"
    "max_rel = max_abs / max|ref|, mean_rel = sum|x - ref| / sum|ref|. Equal infinities\n"
    "(LSE = -inf of a fully masked row) agree; any other NaN/inf is a mismatch.\n"
    "PASS iff no mismatch and max_abs <= tol * max(max|ref|, floor) (floor 1 for LSE,\n"
    "1e-3 otherwise; for dBias max|ref| is at least the largest sum of |terms| of one\n"
    "element, since a sum over broadcast dims may cancel: over keys it is exactly 0)\n"
    "for every comparison of the run under test:\n"
    "              O        LSE      dQ/dK/dV/dBias\n"
    "  fp16      3e-3     1e-4     1e-2\n"
    "  bf16      2e-2     1e-4     5e-2\n"
    "  fp32      1e-4     2e-5     5e-4\n"
    "against the fp64 reference, and twice that against another implementation in the\n"
    "same dtype. Rows marked 'info' (the other implementations against fp64) show the\n"
    "baseline error of a same-precision implementation and do not decide PASS/FAIL.\n"
    "\n"
    "Exit status: 0 PASS, 1 FAIL, 2 usage error, 3 libflashattn returned an error\n"
    "(status name and message printed), 4 other runtime error.\n"
    "\n"
    "options:\n";

std::vector<OptSpec> check_specs() {
  std::vector<OptSpec> s = shape_options();
  for (const OptSpec& o : feature_options()) s.push_back(o);
  for (const OptSpec& o : backend_options()) s.push_back(o);
  s.push_back({"--bwd", OptSpec::kFlag, nullptr, "also run and check the backward pass (dQ, dK, dV; dBias)"});
  s.push_back({"--help", OptSpec::kFlag, nullptr, "show this help"});
  return s;
}

// `magnitude` raises the reference scale where a sum may cancel (dBias, see the help).
void print_row(const std::string& who, const char* tensor, const Err& e, double tol, Kind kind, double magnitude,
               bool decides, bool* all_pass) {
  const double bound = tol * std::max({e.max_ref, magnitude, floor_of(kind)});
  const bool ok = e.mismatches == 0 && e.max_abs <= bound;
  if (decides && !ok) *all_pass = false;
  std::string mism =
      e.mismatches ? strf("  (%lld non-finite mismatches of %lld)", (long long)e.mismatches, (long long)e.n) : "";
  std::printf("%-36s %-5s %10.3e %10.3e %10.3e %10.3e %9.1e  %s%s\n", who.c_str(), tensor, e.max_abs, e.mean_abs(),
              e.max_rel(), e.mean_rel(), tol, decides ? (ok ? "PASS" : "FAIL") : (ok ? "info" : "info (over tol)"),
              mism.c_str());
}

}  // namespace

int cmd_check(int argc, char** argv) {
  Args a("check", check_specs());
  a.parse(argc, argv, 2);
  if (a.has("--help")) {
    std::printf("%s%s", kHelp, a.options_help().c_str());
    return kExitOk;
  }
  const int64_t kMax = int64_t(1) << 40;
  Problem p;
  parse_lengths(a, &p);
  p.heads_q = a.get_int("--heads-q", 8, 1, kMax);
  p.heads_kv = a.get_int("--heads-kv", p.heads_q, 1, kMax);
  p.head_dim = a.get_int("--head-dim", 64, 1, kMax);
  p.head_dim_v = a.get_int("--head-dim-v", p.head_dim, 1, kMax);
  p.dtype = parse_dtype(a, FLASHATTN_DTYPE_FP16);
  p.layout = a.get_choice("--layout", "bshd", {"bshd", "bhsd"}) == "bshd" ? Layout::kBSHD : Layout::kBHSD;
  parse_mask(a, &p);
  p.softcap = static_cast<float>(a.get_double("--softcap", 0.0, 0.0, 1e30));
  parse_bias(a, &p);
  p.dropout = static_cast<float>(a.get_double("--dropout", 0.0, 0.0, 1.0, false, true));
  p.seed = a.get_u64("--seed", 0);
  p.block_sparse = a.get_double("--block-sparse", 0.0, 0.0, 1.0, true, false);
  p.backend = parse_backend(a, FLASHATTN_BACKEND_AUTO);
  p.device = static_cast<int>(a.get_int("--device", 0, 0, 1 << 20));
  p.algorithm = a.get_choice("--algorithm", "flash", {"flash", "standard"}) == "flash" ? FLASHATTN_ALGORITHM_FLASH
                                                                                       : FLASHATTN_ALGORITHM_STANDARD;
  p.bwd = a.has("--bwd");
  // Validate the configuration with the library before allocating anything it sizes:
  // the shape limits and heads_q % heads_kv are the library's to judge (exit 3 with its
  // message), and the per-sequence offsets, ALiBi slopes and block-sparse layout
  // (make_derived) and the tensors are built only once it has accepted the shape, the
  // options and the workspace size of every pass. The block-sparse layout itself, whose
  // dimensions follow from the shape, is checked when the runs set it.
  flashattn_backend_t resolved = FLASHATTN_BACKEND_AUTO;
  {
    Plan plan(p.backend, p.device);
    resolved = plan.backend();
    configure_plan(plan.get(), p, p.algorithm);
    size_t bytes = 0;
    lib_check(flashattn_plan_get_workspace_size(plan.get(), FLASHATTN_PASS_FORWARD, &bytes),
              "flashattn_plan_get_workspace_size");
    if (p.bwd)
      lib_check(flashattn_plan_get_workspace_size(plan.get(), FLASHATTN_PASS_BACKWARD, &bytes),
                "flashattn_plan_get_workspace_size");
  }
  p.make_derived();
  std::printf("flashattn check: backend=%s%s algorithm=%s passes=%s\n", backend_name(resolved),
              p.backend == FLASHATTN_BACKEND_AUTO ? " (auto)" : "", algorithm_name(p.algorithm),
              p.bwd ? "forward+backward" : "forward");
  std::printf("%s\n", p.describe().c_str());
  std::fflush(stdout);

  Inputs in;
  in.q = token_tensor(p, true, p.heads_q, p.head_dim);
  in.k = token_tensor(p, false, p.heads_kv, p.head_dim);
  in.v = token_tensor(p, false, p.heads_kv, p.head_dim_v);
  in.q.fill_random(p.seed, 1);
  in.k.fill_random(p.seed, 2);
  in.v.fill_random(p.seed, 3);
  if (p.bwd) {
    in.dout = token_tensor(p, true, p.heads_q, p.head_dim_v);
    in.dout.fill_random(p.seed, 4);
  }
  if (p.bias_tensor) {
    in.bias = bias_tensor(p);
    in.bias.fill_random(p.seed, 5);
  }
  if (p.varlen) {
    in.cu_q.assign(p.cu_q.begin(), p.cu_q.end());  // totals checked to fit int32 by parse_lengths
    in.cu_k.assign(p.cu_k.begin(), p.cu_k.end());
  }

  RunResult primary = run_once(p, resolved, p.algorithm, in);

  // Other implementations: the CPU backend (when the run is on CUDA) and the other
  // algorithm on the same backend. "Not supported" (2xx) skips one; other errors abort.
  std::vector<RunResult> others;
  std::vector<std::string> skipped;
  const flashattn_algorithm_t other_alg =
      p.algorithm == FLASHATTN_ALGORITHM_FLASH ? FLASHATTN_ALGORITHM_STANDARD : FLASHATTN_ALGORITHM_FLASH;
  std::vector<std::pair<flashattn_backend_t, flashattn_algorithm_t>> plan_list;
  if (primary.backend == FLASHATTN_BACKEND_CUDA) plan_list.push_back({FLASHATTN_BACKEND_CPU, p.algorithm});
  plan_list.push_back({primary.backend, other_alg});
  for (const auto& pa : plan_list) {
    try {
      others.push_back(run_once(p, pa.first, pa.second, in));
    } catch (const LibraryError& e) {
      if (e.status < 200 || e.status >= 300) throw;
      skipped.push_back(strf("%s %s: %s", backend_name(pa.first), algorithm_name(pa.second), e.what()));
    }
  }

  // The fp64 reference is a plain O(N^2) loop nest: warn when it will take a while.
  double pairs = 0;  // (query, key) pairs of all sequences
  for (int64_t b = 0; b < p.batch; ++b) pairs += double(p.cu_q[b + 1] - p.cu_q[b]) * double(p.cu_k[b + 1] - p.cu_k[b]);
  const double ref_macs = pairs * double(p.heads_q) * double(p.head_dim + p.head_dim_v) * (p.bwd ? 3.0 : 1.0);
  if (ref_macs > 2e9)
    std::fprintf(stderr, "computing the fp64 reference (%.1f G multiply-adds; about a second per 0.5 G per core)...\n",
                 ref_macs / 1e9);
  const double t0 = now_ms();
  fat::RefInputs ref_in;
  ref_in.q = in.q.to_double();
  ref_in.k = in.k.to_double();
  ref_in.v = in.v.to_double();
  if (p.bwd) ref_in.dout = in.dout.to_double();
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const fat::RefOutputs ref = fat::reference_fp64(ref_spec(p, in), ref_in, p.bwd, threads);
  const std::vector<double> ref_lse = lse_library_layout(p, ref.lse);
  std::vector<uint8_t> dbias_ok;
  std::vector<double> ref_dbias;
  double dbias_magnitude = 0;  // largest sum of |terms| of a dBias element
  if (p.bwd && p.bias_tensor) {
    dbias_ok = dbias_defined(p);
    ref_dbias = dbias_stored(p, ref.dbias, dbias_ok);
    for (double m : dbias_stored(p, ref.dbias_mag, dbias_ok)) dbias_magnitude = std::max(dbias_magnitude, m);
  }
  const double ref_ms = now_ms() - t0;

  std::printf("\ntimings (single run, first use included):\n");
  auto timing = [&](const RunResult& r) {
    std::printf("  %-16s forward %9.3f ms (workspace %s)", r.label.c_str(), r.fwd_ms,
                human_bytes(double(r.ws_fwd)).c_str());
    if (p.bwd) std::printf("   backward %9.3f ms (workspace %s)", r.bwd_ms, human_bytes(double(r.ws_bwd)).c_str());
    std::printf("\n");
  };
  timing(primary);
  for (const RunResult& r : others) timing(r);
  std::printf("  %-16s %9.3f ms (forward%s)\n", "fp64 reference", ref_ms, p.bwd ? "+backward" : "");
  for (const std::string& s : skipped) std::printf("  skipped %s\n", s.c_str());

  std::printf("\n%-36s %-5s %10s %10s %10s %10s %9s  %s\n", "comparison", "", "max_abs", "mean_abs", "max_rel",
              "mean_rel", "tol", "result");
  bool all_pass = true;
  auto compare_all = [&](const RunResult& x, const std::string& who, bool vs_ref, const RunResult* y, double tol_mult,
                         bool decides) {
    struct Item {
      const char* name;
      Kind kind;
      std::vector<double> got, want;
      double magnitude;
    };
    std::vector<Item> items;
    items.push_back({"O", kO, x.o.to_double(), vs_ref ? ref.o : y->o.to_double(), 0.0});
    items.push_back({"LSE", kLse, lse_double(x.lse), vs_ref ? ref_lse : lse_double(y->lse), 0.0});
    if (p.bwd) {
      items.push_back({"dQ", kGrad, x.dq.to_double(), vs_ref ? ref.dq : y->dq.to_double(), 0.0});
      items.push_back({"dK", kGrad, x.dk.to_double(), vs_ref ? ref.dk : y->dk.to_double(), 0.0});
      items.push_back({"dV", kGrad, x.dv.to_double(), vs_ref ? ref.dv : y->dv.to_double(), 0.0});
      if (p.bias_tensor)
        items.push_back({"dBias", kGrad, masked(x.dbias.to_double(), dbias_ok),
                         vs_ref ? ref_dbias : masked(y->dbias.to_double(), dbias_ok), dbias_magnitude});
    }
    for (const Item& it : items)
      print_row(who, it.name, compare(it.got, it.want), tol_mult * tolerance(p.dtype, it.kind), it.kind, it.magnitude,
                decides, &all_pass);
  };
  compare_all(primary, primary.label + " vs fp64 reference", true, nullptr, 1.0, true);
  for (const RunResult& r : others) compare_all(primary, primary.label + " vs " + r.label, false, &r, 2.0, true);
  for (const RunResult& r : others) compare_all(r, r.label + " vs fp64 reference", true, nullptr, 1.0, false);

  std::printf("\n%s\n", all_pass ? "PASS" : "FAIL");
  return all_pass ? kExitOk : kExitFail;
}

}  // namespace facli
