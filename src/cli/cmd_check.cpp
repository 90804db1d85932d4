// `flashattn check`: run one configuration, compare with an fp64 reference (and, on
// CUDA, with the CPU backend and the other algorithm), print errors and PASS/FAIL.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>

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
};

struct RunResult {
  std::string label;
  flashattn_backend_t backend = FLASHATTN_BACKEND_CPU;
  HostTensor o, dq, dk, dv;
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
  r.o = HostTensor(p.dtype, p.layout, p.batch, p.seqlen_q, p.heads_q, p.head_dim_v);
  r.lse.assign(static_cast<size_t>(p.batch * p.heads_q * p.seqlen_q), 0.f);
  SpaceBuffer q(on_dev, in.q.bytes()), k(on_dev, in.k.bytes()), v(on_dev, in.v.bytes());
  SpaceBuffer o(on_dev, r.o.bytes()), lse(on_dev, r.lse.size() * sizeof(float));
  SpaceBuffer slopes(on_dev, p.alibi_slopes.size() * sizeof(float));
  q.upload(in.q.data(), in.q.bytes());
  k.upload(in.k.data(), in.k.bytes());
  v.upload(in.v.data(), in.v.bytes());
  if (!p.alibi_slopes.empty()) slopes.upload(p.alibi_slopes.data(), slopes.bytes());
  o.fill_bytes(0xFF);
  lse.fill_bytes(0xFF);
  const float* slopes_ptr = p.alibi_slopes.empty() ? nullptr : static_cast<const float*>(slopes.get());
  {
    SpaceBuffer ws(on_dev, r.ws_fwd);
    flashattn_fwd_args_t fa = FLASHATTN_FWD_ARGS_INIT;
    fa.q = q.get();
    fa.k = k.get();
    fa.v = v.get();
    fa.o = o.get();
    fa.lse = static_cast<float*>(lse.get());
    fa.alibi_slopes = slopes_ptr;
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

  r.dq = HostTensor(p.dtype, p.layout, p.batch, p.seqlen_q, p.heads_q, p.head_dim);
  r.dk = HostTensor(p.dtype, p.layout, p.batch, p.seqlen_k, p.heads_kv, p.head_dim);
  r.dv = HostTensor(p.dtype, p.layout, p.batch, p.seqlen_k, p.heads_kv, p.head_dim_v);
  SpaceBuffer dout(on_dev, in.dout.bytes()), dq(on_dev, r.dq.bytes()), dk(on_dev, r.dk.bytes()),
      dv(on_dev, r.dv.bytes()), ws(on_dev, r.ws_bwd);
  dout.upload(in.dout.data(), in.dout.bytes());
  dq.fill_bytes(0xFF);
  dk.fill_bytes(0xFF);
  dv.fill_bytes(0xFF);
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
  return r;
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
    "Runs one attention configuration on a backend and compares O, LSE (and dQ, dK, dV\n"
    "with --bwd) with a reference:\n"
    "  * always: an fp64 reference computed by this tool from the same (rounded) inputs;\n"
    "  * the other algorithm (flash <-> standard) on the same backend;\n"
    "  * on CUDA also the CPU backend's result for the same inputs.\n"
    "Inputs are N(0,1) random numbers (from --seed) rounded to the dtype; outputs are\n"
    "poisoned with NaN before each run, so an unwritten element fails. Dropout uses\n"
    "philox offset 0 and key --seed; --block-sparse draws one layout per query head\n"
    "(layout_heads = heads_q) from --seed.\n"
    "\n"
    "Errors, per tensor: max_abs = max |x - ref|, mean_abs = mean |x - ref|,\n"
    "max_rel = max_abs / max|ref|, mean_rel = sum|x - ref| / sum|ref|. Equal infinities\n"
    "(LSE = -inf of a fully masked row) agree; any other NaN/inf is a mismatch.\n"
    "PASS iff no mismatch and max_abs <= tol * max(max|ref|, floor) (floor 1 for LSE,\n"
    "1e-3 otherwise) for every comparison of the run under test:\n"
    "              O        LSE      dQ/dK/dV\n"
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
  s.push_back({"--bwd", OptSpec::kFlag, nullptr, "also run and check the backward pass (dQ, dK, dV)"});
  s.push_back({"--help", OptSpec::kFlag, nullptr, "show this help"});
  return s;
}

void print_row(const std::string& who, const char* tensor, const Err& e, double tol, Kind kind, bool decides,
               bool* all_pass) {
  const double bound = tol * std::max(e.max_ref, floor_of(kind));
  const bool ok = e.mismatches == 0 && e.max_abs <= bound;
  if (decides && !ok) *all_pass = false;
  std::string mism = e.mismatches ? strf("  (%lld non-finite mismatches of %lld)", (long long)e.mismatches, (long long)e.n) : "";
  std::printf("%-36s %-4s %10.3e %10.3e %10.3e %10.3e %9.1e  %s%s\n", who.c_str(), tensor, e.max_abs, e.mean_abs(),
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
  p.batch = a.get_int("--batch", 2, 1, kMax);
  p.seqlen_q = a.get_int("--seqlen-q", 256, 1, kMax);
  p.seqlen_k = a.get_int("--seqlen-k", p.seqlen_q, 1, kMax);
  p.heads_q = a.get_int("--heads-q", 8, 1, kMax);
  p.heads_kv = a.get_int("--heads-kv", p.heads_q, 1, kMax);
  p.head_dim = a.get_int("--head-dim", 64, 1, kMax);
  p.head_dim_v = a.get_int("--head-dim-v", p.head_dim, 1, kMax);
  p.dtype = parse_dtype(a, FLASHATTN_DTYPE_FP16);
  p.layout = a.get_choice("--layout", "bshd", {"bshd", "bhsd"}) == "bshd" ? Layout::kBSHD : Layout::kBHSD;
  parse_mask(a, &p);
  p.softcap = static_cast<float>(a.get_double("--softcap", 0.0, 0.0, 1e30));
  if (a.has("--alibi")) {
    const std::string v = a.raw("--alibi");
    if (!v.empty() && v != "symmetric") throw UsageError("--alibi=" + v + ": the only value is 'symmetric'");
    p.alibi = v.empty() ? FLASHATTN_BIAS_ALIBI : FLASHATTN_BIAS_ALIBI_SYMMETRIC;
  }
  p.dropout = static_cast<float>(a.get_double("--dropout", 0.0, 0.0, 1.0, false, true));
  p.seed = a.get_u64("--seed", 0);
  p.block_sparse = a.get_double("--block-sparse", 0.0, 0.0, 1.0, true, false);
  p.backend = parse_backend(a, FLASHATTN_BACKEND_AUTO);
  p.device = static_cast<int>(a.get_int("--device", 0, 0, 1 << 20));
  p.algorithm = a.get_choice("--algorithm", "flash", {"flash", "standard"}) == "flash" ? FLASHATTN_ALGORITHM_FLASH
                                                                                       : FLASHATTN_ALGORITHM_STANDARD;
  p.bwd = a.has("--bwd");
  // heads_q % heads_kv and the shape limits are the library's to judge (exit 3 with its
  // message); the reference only needs the group size to be exact, which it then is.
  p.make_derived();

  // Validate the configuration with the library before allocating anything large.
  flashattn_backend_t resolved = FLASHATTN_BACKEND_AUTO;
  {
    Plan plan(p.backend, p.device);
    resolved = plan.backend();
    configure_plan(plan.get(), p, p.algorithm);
  }
  std::printf("flashattn check: backend=%s%s algorithm=%s passes=%s\n", backend_name(resolved),
              p.backend == FLASHATTN_BACKEND_AUTO ? " (auto)" : "", algorithm_name(p.algorithm),
              p.bwd ? "forward+backward" : "forward");
  std::printf("%s\n", p.describe().c_str());
  std::fflush(stdout);

  Inputs in;
  in.q = HostTensor(p.dtype, p.layout, p.batch, p.seqlen_q, p.heads_q, p.head_dim);
  in.k = HostTensor(p.dtype, p.layout, p.batch, p.seqlen_k, p.heads_kv, p.head_dim);
  in.v = HostTensor(p.dtype, p.layout, p.batch, p.seqlen_k, p.heads_kv, p.head_dim_v);
  in.q.fill_random(p.seed, 1);
  in.k.fill_random(p.seed, 2);
  in.v.fill_random(p.seed, 3);
  if (p.bwd) {
    in.dout = HostTensor(p.dtype, p.layout, p.batch, p.seqlen_q, p.heads_q, p.head_dim_v);
    in.dout.fill_random(p.seed, 4);
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
  const double ref_macs = double(p.batch) * double(p.heads_q) * double(p.seqlen_q) * double(p.seqlen_k) *
                          double(p.head_dim + p.head_dim_v) * (p.bwd ? 3.0 : 1.0);
  if (ref_macs > 2e9)
    std::fprintf(stderr, "computing the fp64 reference (%.1f G multiply-adds; about a second per 0.5 G per core)...\n",
                 ref_macs / 1e9);
  const double t0 = now_ms();
  RefOutputs ref;
  const std::vector<double> q = in.q.to_double(), k = in.k.to_double(), v = in.v.to_double();
  reference_forward(p, q, k, v, &ref);
  if (p.bwd) reference_backward(p, q, k, v, in.dout.to_double(), &ref);
  const double ref_ms = now_ms() - t0;

  std::printf("\ntimings (single run, first use included):\n");
  auto timing = [&](const RunResult& r) {
    std::printf("  %-16s forward %9.3f ms (workspace %s)", r.label.c_str(), r.fwd_ms, human_bytes(double(r.ws_fwd)).c_str());
    if (p.bwd) std::printf("   backward %9.3f ms (workspace %s)", r.bwd_ms, human_bytes(double(r.ws_bwd)).c_str());
    std::printf("\n");
  };
  timing(primary);
  for (const RunResult& r : others) timing(r);
  std::printf("  %-16s %9.3f ms (forward%s)\n", "fp64 reference", ref_ms, p.bwd ? "+backward" : "");
  for (const std::string& s : skipped) std::printf("  skipped %s\n", s.c_str());

  std::printf("\n%-36s %-4s %10s %10s %10s %10s %9s  %s\n", "comparison", "", "max_abs", "mean_abs", "max_rel",
              "mean_rel", "tol", "result");
  bool all_pass = true;
  auto compare_all = [&](const RunResult& x, const std::string& who, bool vs_ref, const RunResult* y, double tol_mult,
                         bool decides) {
    struct Item {
      const char* name;
      Kind kind;
      std::vector<double> got, want;
    };
    std::vector<Item> items;
    items.push_back({"O", kO, x.o.to_double(), vs_ref ? ref.o : y->o.to_double()});
    items.push_back({"LSE", kLse, lse_double(x.lse), vs_ref ? ref.lse : lse_double(y->lse)});
    if (p.bwd) {
      items.push_back({"dQ", kGrad, x.dq.to_double(), vs_ref ? ref.dq : y->dq.to_double()});
      items.push_back({"dK", kGrad, x.dk.to_double(), vs_ref ? ref.dk : y->dk.to_double()});
      items.push_back({"dV", kGrad, x.dv.to_double(), vs_ref ? ref.dv : y->dv.to_double()});
    }
    for (const Item& it : items)
      print_row(who, it.name, compare(it.got, it.want), tol_mult * tolerance(p.dtype, it.kind), it.kind, decides,
                &all_pass);
  };
  compare_all(primary, primary.label + " vs fp64 reference", true, nullptr, 1.0, true);
  for (const RunResult& r : others) compare_all(primary, primary.label + " vs " + r.label, false, &r, 2.0, true);
  for (const RunResult& r : others) compare_all(r, r.label + " vs fp64 reference", true, nullptr, 1.0, false);

  std::printf("\n%s\n", all_pass ? "PASS" : "FAIL");
  return all_pass ? kExitOk : kExitFail;
}

}  // namespace facli
