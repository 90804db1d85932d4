// `flashattn bench`: forward (and backward) timings over a sweep of sequence lengths.
//
// FLOP convention (the one FlashAttention papers and peers use): forward
// 4 * batch * heads * seqlen_q * seqlen_k * head_dim, halved for causal; backward 2.5x
// the forward. Timing: warm-up runs first, then the median of --repeats runs; CPU with
// std::chrono::steady_clock around each (synchronous) call, CUDA with events on the
// default stream. Inputs are N(0,1) random numbers, never zeros.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <new>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "args.hpp"
#include "cli.hpp"
#include "commands.hpp"
#include "device.hpp"
#include "problem.hpp"
#include "tensor.hpp"

namespace facli {
namespace {

struct Config {
  flashattn_backend_t backend = FLASHATTN_BACKEND_CPU;  // resolved
  int device = 0;
  flashattn_algorithm_t algorithm = FLASHATTN_ALGORITHM_FLASH;
  flashattn_dtype_t dtype = FLASHATTN_DTYPE_FP32;
  int64_t seqlen = 0, batch = 0, heads = 0, heads_kv = 0, head_dim = 0;
  bool causal = false;
  flashattn_mask_align_t align = FLASHATTN_ALIGN_TOP_LEFT;
  int warmup = 1, repeats = 3;
};

struct Row {
  Config c;
  std::string pass;  // "fwd" or "bwd"
  double ms_median = 0, ms_min = 0, ms_max = 0;
  double flops = 0;
  size_t workspace = 0, io_bytes = 0;
  double rss_peak = -1, rss_extra = -1;  // bytes; measured with --isolate only
  std::string error;                     // non-empty: the row did not run
  int error_exit = 0;                    // exit code class of the error
};

double fwd_flops(const Config& c) {
  const double f = 4.0 * double(c.batch) * double(c.heads) * double(c.seqlen) * double(c.seqlen) * double(c.head_dim);
  return c.causal ? f / 2 : f;
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Host staging of random inputs for CUDA runs, reused across configs of equal size
// (with a fixed token count every seqlen has the same tensor sizes).
const std::vector<unsigned char>& random_host(flashattn_dtype_t dt, size_t count, uint64_t stream) {
  static std::map<std::tuple<int, size_t, uint64_t>, std::vector<unsigned char>> cache;
  auto key = std::make_tuple(int(dt), count, stream);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  // Keep only buffers of the size asked now: a sweep with a fixed batch changes sizes.
  for (auto e = cache.begin(); e != cache.end();) {
    if (std::get<1>(e->first) != count) e = cache.erase(e);
    else ++e;
  }
  std::vector<unsigned char>& v = cache[key];
  v.resize(count * dtype_size(dt));
  fill_random_raw(v.data(), dt, count, 0x5EED, stream);
  return v;
}

void fill_input(SpaceBuffer& b, bool on_dev, flashattn_dtype_t dt, size_t count, uint64_t stream) {
  if (on_dev) b.upload(random_host(dt, count, stream).data(), count * dtype_size(dt));
  else fill_random_raw(b.get(), dt, count, 0x5EED, stream);
}

bool all_finite(SpaceBuffer& b, flashattn_dtype_t dt, size_t count) {
  std::vector<unsigned char> h(count * dtype_size(dt));
  b.download(h.data(), h.size());
  for (size_t i = 0; i < count; ++i) {
    float x;
    if (dt == FLASHATTN_DTYPE_FP32) std::memcpy(&x, &h[i * 4], 4);
    else {
      uint16_t u;
      std::memcpy(&u, &h[i * 2], 2);
      x = dt == FLASHATTN_DTYPE_FP16 ? half_to_float(u) : bf16_to_float(u);
    }
    if (!std::isfinite(x)) return false;
  }
  return true;
}

// Times `call` (one library call): warm-up, then the median of the repeats.
template <class Call>
void time_calls(const Config& c, Row* row, Call call) {
  std::vector<double> ms;
  const bool on_dev = c.backend == FLASHATTN_BACKEND_CUDA;
  for (int i = 0; i < c.warmup; ++i) call();
  if (on_dev) {
    dev::Timer t;
    for (int i = 0; i < c.repeats; ++i) {
      t.start();
      call();
      ms.push_back(t.stop());
    }
  } else {
    for (int i = 0; i < c.repeats; ++i) {
      const double t0 = now_ms();
      call();
      ms.push_back(now_ms() - t0);
    }
  }
  std::sort(ms.begin(), ms.end());
  const size_t n = ms.size();
  row->ms_median = n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
  row->ms_min = ms.front();
  row->ms_max = ms.back();
}

// Runs one configuration and returns the rows of the passes asked for. Library and
// runtime errors become a row's error, so a sweep goes on past one failing config.
std::vector<Row> run_config(const Config& c, bool want_fwd, bool want_bwd) {
  std::vector<Row> rows;
  Row fwd, bwd;
  fwd.c = bwd.c = c;
  fwd.pass = "fwd";
  bwd.pass = "bwd";
  fwd.flops = fwd_flops(c);
  bwd.flops = 2.5 * fwd.flops;
  Row* current = want_fwd ? &fwd : &bwd;
  try {
    Problem p;
    p.batch = c.batch;
    p.seqlen_q = p.seqlen_k = c.seqlen;
    p.heads_q = c.heads;
    p.heads_kv = c.heads_kv;
    p.head_dim = p.head_dim_v = c.head_dim;
    p.dtype = c.dtype;
    if (c.causal) {
      p.has_band = p.causal = true;
      p.window_right = 0;
      p.align = c.align;
    }
    Plan plan(c.backend, c.device);
    configure_plan(plan.get(), p, c.algorithm);
    lib_check(flashattn_plan_get_workspace_size(plan.get(), FLASHATTN_PASS_FORWARD, &fwd.workspace),
              "flashattn_plan_get_workspace_size");
    if (want_bwd)
      lib_check(flashattn_plan_get_workspace_size(plan.get(), FLASHATTN_PASS_BACKWARD, &bwd.workspace),
                "flashattn_plan_get_workspace_size");
    const bool on_dev = c.backend == FLASHATTN_BACKEND_CUDA;
    if (on_dev) dev::set_device(c.device);
    const size_t es = dtype_size(c.dtype);
    const size_t nq = size_t(c.batch * c.seqlen * c.heads * c.head_dim);
    const size_t nk = size_t(c.batch * c.seqlen * c.heads_kv * c.head_dim);
    const size_t nlse = size_t(c.batch * c.heads * c.seqlen);
    fwd.io_bytes = (2 * nq + 2 * nk) * es + nlse * 4;      // Q, K, V, O, LSE
    bwd.io_bytes = fwd.io_bytes + (3 * nq + 2 * nk) * es;  // + dO, dQ, dK, dV
    SpaceBuffer q(on_dev, nq * es), k(on_dev, nk * es), v(on_dev, nk * es), o(on_dev, nq * es), lse(on_dev, nlse * 4);
    fill_input(q, on_dev, c.dtype, nq, 1);
    fill_input(k, on_dev, c.dtype, nk, 2);
    fill_input(v, on_dev, c.dtype, nk, 3);
    {
      SpaceBuffer ws(on_dev, fwd.workspace);
      flashattn_fwd_args_t fa = FLASHATTN_FWD_ARGS_INIT;
      fa.q = q.get();
      fa.k = k.get();
      fa.v = v.get();
      fa.o = o.get();
      fa.lse = static_cast<float*>(lse.get());
      auto call = [&] { lib_check(flashattn_fwd(plan.get(), &fa, ws.get(), fwd.workspace, nullptr), "flashattn_fwd"); };
      if (want_fwd) time_calls(c, &fwd, call);
      else call();  // O and LSE for the backward
      if (on_dev) dev::synchronize();
      if (!all_finite(o, c.dtype, nq)) throw RuntimeError("forward output O has NaN/inf values");
    }
    if (want_fwd) rows.push_back(fwd);
    if (!want_bwd) return rows;
    current = &bwd;
    SpaceBuffer dout(on_dev, nq * es), dq(on_dev, nq * es), dk(on_dev, nk * es), dv(on_dev, nk * es);
    SpaceBuffer ws(on_dev, bwd.workspace);
    fill_input(dout, on_dev, c.dtype, nq, 4);
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
    time_calls(c, &bwd,
               [&] { lib_check(flashattn_bwd(plan.get(), &ba, ws.get(), bwd.workspace, nullptr), "flashattn_bwd"); });
    if (on_dev) dev::synchronize();
    if (!all_finite(dq, c.dtype, nq) || !all_finite(dv, c.dtype, nk))
      throw RuntimeError("backward output dQ or dV has NaN/inf values");
    rows.push_back(bwd);
  } catch (const LibraryError& e) {
    current->error = e.what();
    current->error_exit = kExitLibrary;
    rows.push_back(*current);
  } catch (const RuntimeError& e) {
    current->error = e.what();
    current->error_exit = kExitRuntime;
    rows.push_back(*current);
  } catch (const std::bad_alloc&) {
    current->error = "host out of memory";
    current->error_exit = kExitRuntime;
    rows.push_back(*current);
  }
  // A failed forward leaves the backward unmeasured: say so rather than drop it.
  if (want_fwd && want_bwd && rows.size() == 1 && !rows[0].error.empty() && rows[0].pass == "fwd") {
    bwd.error = "not run (forward failed)";
    bwd.error_exit = rows[0].error_exit;
    rows.push_back(bwd);
  }
  return rows;
}

// "model name" of /proc/cpuinfo and the hardware thread count, e.g. "AMD EPYC 9454 (2 threads)".
std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line, name = "host CPU";
  while (std::getline(f, line)) {
    if (line.compare(0, 10, "model name") == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos && colon + 2 <= line.size()) name = line.substr(colon + 2);
      break;
    }
  }
  return strf("%s, %u threads", name.c_str(), std::thread::hardware_concurrency());
}

// ---- --isolate: each (config, pass) in a forked child; its peak RSS from wait4 ----

double current_rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.compare(0, 6, "VmRSS:") == 0) return 1024.0 * std::atof(line.c_str() + 6);
  return 0;
}

std::string escape_field(std::string s) {
  for (char& ch : s)
    if (ch == '\t' || ch == '\n') ch = ' ';
  return s;
}

std::vector<Row> run_isolated(const Config& c, bool want_fwd, bool want_bwd) {
  Row failed;
  failed.c = c;
  failed.pass = want_fwd ? "fwd" : "bwd";
  failed.flops = want_fwd ? fwd_flops(c) : 2.5 * fwd_flops(c);
  failed.error_exit = kExitRuntime;
  int fds[2];
  if (pipe(fds) != 0) throw RuntimeError(strf("pipe: %s", std::strerror(errno)));
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) throw RuntimeError(strf("fork: %s", std::strerror(errno)));
  if (pid == 0) {
    close(fds[0]);
    const double base = current_rss_bytes();
    std::vector<Row> rows;
    try {
      rows = run_config(c, want_fwd, want_bwd);
    } catch (const std::exception& e) {  // never let the child return into the parent's loop
      failed.error = e.what();
      rows = {failed};
    } catch (...) {
      failed.error = "unknown exception";
      rows = {failed};
    }
    std::ostringstream os;
    os.precision(17);
    for (const Row& r : rows)
      os << r.pass << '\t' << r.ms_median << '\t' << r.ms_min << '\t' << r.ms_max << '\t' << r.workspace << '\t'
         << r.io_bytes << '\t' << base << '\t' << r.error_exit << '\t' << escape_field(r.error) << '\n';
    const std::string s = os.str();
    size_t off = 0;
    while (off < s.size()) {
      const ssize_t w = write(fds[1], s.data() + off, s.size() - off);
      if (w <= 0) break;
      off += size_t(w);
    }
    close(fds[1]);
    _exit(0);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) out.append(buf, size_t(n));
  close(fds[0]);
  int status = 0;
  struct rusage ru;
  std::memset(&ru, 0, sizeof ru);
  if (wait4(pid, &status, 0, &ru) < 0) throw RuntimeError(strf("wait4: %s", std::strerror(errno)));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    failed.error = WIFSIGNALED(status)
                       ? strf("benchmark child killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)))
                       : strf("benchmark child exited with status %d", WEXITSTATUS(status));
    return {failed};
  }
  std::vector<Row> rows;
  std::istringstream is(out);
  std::string line;
  while (std::getline(is, line)) {
    std::istringstream ls(line);
    Row r;
    r.c = c;
    double base = 0;
    std::string f[9];
    for (int i = 0; i < 9; ++i) std::getline(ls, f[i], i < 8 ? '\t' : '\n');
    r.pass = f[0];
    r.ms_median = std::atof(f[1].c_str());
    r.ms_min = std::atof(f[2].c_str());
    r.ms_max = std::atof(f[3].c_str());
    r.workspace = size_t(std::atof(f[4].c_str()));
    r.io_bytes = size_t(std::atof(f[5].c_str()));
    base = std::atof(f[6].c_str());
    r.error_exit = std::atoi(f[7].c_str());
    r.error = f[8];
    r.flops = r.pass == "fwd" ? fwd_flops(c) : 2.5 * fwd_flops(c);
    r.rss_peak = 1024.0 * double(ru.ru_maxrss);  // KiB on Linux
    r.rss_extra = r.rss_peak - base;
    rows.push_back(r);
  }
  if (rows.empty()) {
    failed.error = "benchmark child produced no result";
    rows.push_back(failed);
  }
  return rows;
}

// ---- output ----

const double kMiB = 1024.0 * 1024.0;

struct Table {
  bool isolate = false;
  bool cuda = false;  // TFLOP/s instead of GFLOP/s
  void header() const {
    std::printf("%-7s %-9s %-5s %7s %6s %6s %5s %-13s %-4s %11s %9s %11s %10s", "backend", "algorithm", "dtype",
                "seqlen", "batch", "heads", "d", "causal", "pass", "ms(median)", cuda ? "TFLOP/s" : "GFLOP/s",
                "mem(MiB)", "ws(MiB)");
    if (isolate) std::printf(" %12s %13s", "rss_peak(MiB)", "rss_extra(MiB)");
    std::printf("\n");
  }
  void row(const Row& r) const {
    const Config& c = r.c;
    const std::string causal = !c.causal ? "no" : c.align == FLASHATTN_ALIGN_TOP_LEFT ? "top-left" : "bottom-right";
    std::printf("%-7s %-9s %-5s %7lld %6lld %6lld %5lld %-13s %-4s ", backend_name(c.backend),
                algorithm_name(c.algorithm), dtype_name(c.dtype), (long long)c.seqlen, (long long)c.batch,
                (long long)c.heads, (long long)c.head_dim, causal.c_str(), r.pass.c_str());
    if (!r.error.empty()) {
      std::printf("ERROR: %s\n", r.error.c_str());
      return;
    }
    const double rate = r.flops / (r.ms_median * 1e-3) / (cuda ? 1e12 : 1e9);
    std::printf("%11.3f %9.2f %11.1f %10.1f", r.ms_median, rate, double(r.workspace + r.io_bytes) / kMiB,
                double(r.workspace) / kMiB);
    if (isolate) std::printf(" %12.1f %13.1f", r.rss_peak / kMiB, r.rss_extra / kMiB);
    std::printf("\n");
  }
};

std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (unsigned char ch : s) {
    if (ch == '"' || ch == '\\') o += '\\', o += char(ch);
    else if (ch < 0x20) o += strf("\\u%04x", ch);
    else o += char(ch);
  }
  return o + "\"";
}

std::string csv_str(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string o = "\"";
  for (char ch : s) o += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return o + "\"";
}

void write_csv(const std::string& path, const std::vector<Row>& rows) {
  std::ofstream f(path);
  if (!f) throw RuntimeError("--csv " + path + ": cannot open for writing: " + std::strerror(errno));
  f << "backend,algorithm,dtype,seqlen,batch,heads,heads_kv,head_dim,causal,pass,ms_median,ms_min,ms_max,flops,"
       "gflops_per_s,workspace_bytes,io_bytes,peak_extra_bytes,rss_peak_bytes,rss_extra_bytes,error\n";
  for (const Row& r : rows) {
    const Config& c = r.c;
    const bool ok = r.error.empty();
    f << backend_name(c.backend) << ',' << algorithm_name(c.algorithm) << ',' << dtype_name(c.dtype) << ',' << c.seqlen
      << ',' << c.batch << ',' << c.heads << ',' << c.heads_kv << ',' << c.head_dim << ','
      << (!c.causal                             ? "no"
          : c.align == FLASHATTN_ALIGN_TOP_LEFT ? "top-left"
                                                : "bottom-right")
      << ',' << r.pass << ',';
    if (ok)
      f << strf("%.6f,%.6f,%.6f,%.0f,%.4f,%zu,%zu,%zu,", r.ms_median, r.ms_min, r.ms_max, r.flops,
                r.flops / (r.ms_median * 1e-3) / 1e9, r.workspace, r.io_bytes, r.workspace + r.io_bytes);
    else f << ",,," << strf("%.0f", r.flops) << ",," << r.workspace << ',' << r.io_bytes << ",,";
    if (r.rss_peak >= 0 && ok) f << strf("%.0f,%.0f,", r.rss_peak, r.rss_extra);
    else f << ",,";
    f << csv_str(r.error) << '\n';
  }
  if (!f) throw RuntimeError("--csv " + path + ": write failed");
}

void write_json(const std::string& path, const std::vector<Row>& rows, const std::string& device_name) {
  std::ofstream f(path);
  if (!f) throw RuntimeError("--json " + path + ": cannot open for writing: " + std::strerror(errno));
  int ma, mi, pa;
  flashattn_get_version(&ma, &mi, &pa);
  f << "{\n  \"tool\": \"flashattn bench\",\n  \"library_version\": \"" << ma << '.' << mi << '.' << pa << "\",\n";
  f << "  \"device\": " << json_str(device_name) << ",\n";
  f << "  \"flop_convention\": \"fwd 4*batch*heads*seqlen^2*head_dim, halved for causal; bwd 2.5x fwd\",\n";
  f << "  \"rows\": [\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const Config& c = r.c;
    const bool ok = r.error.empty();
    f << "    {\"backend\": \"" << backend_name(c.backend) << "\", \"algorithm\": \"" << algorithm_name(c.algorithm)
      << "\", \"dtype\": \"" << dtype_name(c.dtype) << "\", \"seqlen\": " << c.seqlen << ", \"batch\": " << c.batch
      << ", \"heads\": " << c.heads << ", \"heads_kv\": " << c.heads_kv << ", \"head_dim\": " << c.head_dim
      << ", \"causal\": "
      << json_str(!c.causal                             ? "no"
                  : c.align == FLASHATTN_ALIGN_TOP_LEFT ? "top-left"
                                                        : "bottom-right")
      << ", \"pass\": \"" << r.pass << "\", \"warmup\": " << c.warmup << ", \"repeats\": " << c.repeats
      << strf(", \"flops\": %.0f", r.flops);
    if (ok)
      f << strf(", \"ms_median\": %.6f, \"ms_min\": %.6f, \"ms_max\": %.6f, \"gflops_per_s\": %.4f", r.ms_median,
                r.ms_min, r.ms_max, r.flops / (r.ms_median * 1e-3) / 1e9);
    f << ", \"workspace_bytes\": " << r.workspace << ", \"io_bytes\": " << r.io_bytes
      << ", \"peak_extra_bytes\": " << (r.workspace + r.io_bytes);
    if (ok && r.rss_peak >= 0)
      f << strf(", \"rss_peak_bytes\": %.0f, \"rss_extra_bytes\": %.0f", r.rss_peak, r.rss_extra);
    f << ", \"error\": " << (ok ? std::string("null") : json_str(r.error)) << "}" << (i + 1 < rows.size() ? "," : "")
      << "\n";
  }
  f << "  ]\n}\n";
  if (!f) throw RuntimeError("--json " + path + ": write failed");
}

const char* kHelp =
    "usage: flashattn bench [options]\n"
    "\n"
    "Times the forward pass (and the backward pass with --bwd) over a sweep of sequence\n"
    "lengths (seqlen_q = seqlen_k), with a fixed number of tokens per batch: batch =\n"
    "max(1, tokens / seqlen). Prints one row per (seqlen, algorithm, pass):\n"
    "  ms(median)  median of --repeats timed runs after --warmup runs (CPU: steady_clock\n"
    "              around the synchronous call; CUDA: events on the default stream)\n"
    "  GFLOP/s     (TFLOP/s on CUDA) with FLOPs = 4*batch*heads*seqlen^2*head_dim for the\n"
    "              forward, halved for causal, and 2.5x that for the backward\n"
    "  mem(MiB)    peak extra memory the pass needs: its workspace (the standard\n"
    "              algorithm's O(N^2) S/P matrices live there) + inputs and outputs\n"
    "  ws(MiB)     the workspace alone\n"
    "  rss_*       (--isolate) the measured peak resident set of a child process that runs\n"
    "              only that row, and its growth over the child's size at start\n"
    "Inputs are N(0,1) random numbers; outputs are checked to be finite.\n"
    "Exit status: 0 when every row ran, 2 usage error, 3 if a row got a library error,\n"
    "4 other runtime errors (rows with errors are printed as ERROR and the sweep goes on).\n"
    "\n"
    "Defaults per backend:     cpu                        cuda\n"
    "  --seqlens               512,1024,2048,4096,8192    512,1024,2048,4096,8192,16384\n"
    "  --tokens                8192                       16384\n"
    "  --heads                 4                          2048 / head_dim\n"
    "  --head-dim              64                         128\n"
    "  --dtype                 fp32                       bf16\n"
    "  --repeats / --warmup    3 / 1                      20 / 5\n"
    "\n"
    "options:\n";

std::vector<OptSpec> bench_specs() {
  return {
      {"--backend", OptSpec::kValue, "cpu|cuda|auto", "backend (default auto)"},
      {"--device", OptSpec::kValue, "N", "CUDA device ordinal (default 0)"},
      {"--algorithm", OptSpec::kValue, "flash|standard|both", "algorithm(s) to time (default flash)"},
      {"--seqlens", OptSpec::kValue, "N,N,...", "sequence lengths (seqlen_q = seqlen_k)"},
      {"--tokens", OptSpec::kValue, "N", "tokens per batch: batch = max(1, N / seqlen)"},
      {"--batch", OptSpec::kValue, "N", "fixed batch instead of --tokens"},
      {"--heads", OptSpec::kValue, "N", "query heads"},
      {"--heads-kv", OptSpec::kValue, "N", "key/value heads (default: --heads)"},
      {"--head-dim", OptSpec::kValue, "D", "head dim (Q, K and V)"},
      {"--dtype", OptSpec::kValue, "fp16|bf16|fp32", "element type"},
      {"--causal", OptSpec::kOptionalValue, "top-left|bottom-right", "causal mask (FLOPs halved)"},
      {"--bwd", OptSpec::kFlag, nullptr, "also time the backward pass"},
      {"--repeats", OptSpec::kValue, "N", "timed runs per row (median reported)"},
      {"--warmup", OptSpec::kValue, "N", "untimed runs before them"},
      {"--csv", OptSpec::kValue, "FILE", "also write the rows as CSV"},
      {"--json", OptSpec::kValue, "FILE", "also write the rows as JSON"},
      {"--isolate", OptSpec::kFlag, nullptr, "CPU only: run each row in a child process and report its peak RSS"},
      {"--help", OptSpec::kFlag, nullptr, "show this help"},
  };
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  Args a("bench", bench_specs());
  a.parse(argc, argv, 2);
  if (a.has("--help")) {
    std::printf("%s%s", kHelp, a.options_help().c_str());
    return kExitOk;
  }
  const flashattn_backend_t requested = parse_backend(a, FLASHATTN_BACKEND_AUTO);
  const int device = static_cast<int>(a.get_int("--device", 0, 0, 1 << 20));
  const bool isolate = a.has("--isolate");
  if (isolate && requested != FLASHATTN_BACKEND_CPU)
    throw UsageError("--isolate measures host memory and needs --backend cpu (CUDA state cannot cross fork())");
  const std::string alg = a.get_choice("--algorithm", "flash", {"flash", "standard", "both"});
  Problem mask;
  parse_mask(a, &mask);  // only --causal is declared for bench

  // Resolve the backend now (a plan says where AUTO landed, and an unusable backend
  // fails here, once, with exit 3). --isolate is CPU-only, so the parent never touches
  // CUDA before forking.
  const flashattn_backend_t backend = Plan(requested, device).backend();
  const bool cuda = backend == FLASHATTN_BACKEND_CUDA;

  const int64_t kMax = int64_t(1) << 40;
  const std::vector<int64_t> seqlens = a.get_int_list("--seqlens",
                                                      cuda ? std::vector<int64_t>{512, 1024, 2048, 4096, 8192, 16384}
                                                           : std::vector<int64_t>{512, 1024, 2048, 4096, 8192},
                                                      1, kMax);
  if (a.has("--batch") && a.has("--tokens")) throw UsageError("--batch and --tokens exclude each other");
  const int64_t tokens = a.get_int("--tokens", cuda ? 16384 : 8192, 1, kMax);
  const int64_t fixed_batch = a.get_int("--batch", 0, 1, kMax);
  const int64_t head_dim = a.get_int("--head-dim", cuda ? 128 : 64, 1, kMax);
  const int64_t heads = a.get_int("--heads", cuda ? std::max<int64_t>(1, 2048 / head_dim) : 4, 1, kMax);
  const int64_t heads_kv = a.get_int("--heads-kv", heads, 1, kMax);
  const flashattn_dtype_t dtype = parse_dtype(a, cuda ? FLASHATTN_DTYPE_BF16 : FLASHATTN_DTYPE_FP32);
  const int repeats = static_cast<int>(a.get_int("--repeats", cuda ? 20 : 3, 1, 1000000));
  const int warmup = static_cast<int>(a.get_int("--warmup", cuda ? 5 : 1, 0, 1000000));
  const bool bwd = a.has("--bwd");
  const std::string csv = a.raw("--csv"), json = a.raw("--json");

  std::string device_name = cpu_model();
  if (cuda) {
    std::string why;
    const std::vector<dev::Props> props = dev::query(&why);
    device_name = size_t(device) < props.size() ? props[size_t(device)].name : "CUDA device " + std::to_string(device);
  }

  std::vector<flashattn_algorithm_t> algs;
  if (alg != "standard") algs.push_back(FLASHATTN_ALGORITHM_FLASH);
  if (alg != "flash") algs.push_back(FLASHATTN_ALGORITHM_STANDARD);

  struct Unit {
    Config c;
    bool fwd, bwd;
  };
  std::vector<Unit> units;
  for (int64_t s : seqlens)
    for (flashattn_algorithm_t al : algs) {
      Config c;
      c.backend = backend;
      c.device = device;
      c.algorithm = al;
      c.dtype = dtype;
      c.seqlen = s;
      c.batch = fixed_batch > 0 ? fixed_batch : std::max<int64_t>(1, tokens / s);
      c.heads = heads;
      c.heads_kv = heads_kv;
      c.head_dim = head_dim;
      c.causal = mask.causal;
      c.align = mask.align;
      c.warmup = warmup;
      c.repeats = repeats;
      // With --isolate each pass gets its own child, so its peak RSS is its own.
      if (isolate && bwd) {
        units.push_back({c, true, false});
        units.push_back({c, false, true});
      } else {
        units.push_back({c, true, bwd});
      }
    }

  std::printf("flashattn bench: %s (%s), dtype=%s, head_dim=%lld, heads=%lld/%lld, %s, warmup %d, median of %d\n",
              backend_name(backend), device_name.c_str(), dtype_name(dtype), (long long)head_dim, (long long)heads,
              (long long)heads_kv,
              fixed_batch > 0 ? strf("batch=%lld", (long long)fixed_batch).c_str()
                              : strf("%lld tokens per batch", (long long)tokens).c_str(),
              warmup, repeats);
  Table table;
  table.isolate = isolate;
  table.cuda = cuda;
  table.header();
  std::fflush(stdout);

  const bool tty = isatty(STDERR_FILENO) != 0;
  std::vector<Row> all;
  int exit_code = kExitOk;
  for (size_t u = 0; u < units.size(); ++u) {
    const Unit& un = units[u];
    const std::string progress = strf("[%zu/%zu] %s seqlen=%lld batch=%lld %s", u + 1, units.size(),
                                      algorithm_name(un.c.algorithm), (long long)un.c.seqlen, (long long)un.c.batch,
                                      un.fwd && un.bwd ? "fwd+bwd"
                                      : un.fwd         ? "fwd"
                                                       : "bwd");
    if (tty) std::fprintf(stderr, "\r\x1b[K%s ...", progress.c_str());
    else std::fprintf(stderr, "%s\n", progress.c_str());
    std::fflush(stderr);
    const std::vector<Row> rows = isolate ? run_isolated(un.c, un.fwd, un.bwd) : run_config(un.c, un.fwd, un.bwd);
    if (tty) std::fprintf(stderr, "\r\x1b[K");
    for (const Row& r : rows) {
      table.row(r);
      if (!r.error.empty() && exit_code == kExitOk) exit_code = r.error_exit ? r.error_exit : kExitRuntime;
      all.push_back(r);
    }
    std::fflush(stdout);
  }
  if (!csv.empty()) write_csv(csv, all);
  if (!json.empty()) write_json(json, all, device_name);
  return exit_code;
}

}  // namespace facli
