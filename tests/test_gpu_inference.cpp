// The CUDA inference path against the CPU backend and the fp64 reference: flashattn_fwd_kvcache
// (append, rotary, GQA packing, paged gather, split-KV) with awkward shapes -- pages of 1, 3,
// 16 and 256 tokens, NHD and HND, used lengths 0 and full, chunked prefill with causal and
// local masks, GQA 1..16, both rotary forms, odd head dims, splits forced to 1 and many --
// device values out of range (NaN rows, nothing written), and flashattn_combine: strided fp32
// parts with -inf (skipped, their O NaN) and all--inf rows, every output dtype. Outputs and
// workspaces are poisoned first; every cache slot no run may read is NaN.
#include <cuda_runtime_api.h>
#include <math.h>
#include <string.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "dtype.hpp"
#include "gpu_mem.hpp"
#include "kvcache_case.hpp"

using namespace fat;

// 5 parts: only the remainder of the kernel's loops unrolled by 16; 37: two unrolled steps
// and a remainder of 5, with a NaN part (split 20) in one row, which must come out NaN.
TEST_CASE("gpu: combine matches the CPU combine, skipping -inf parts", "[gpu][combine]") {
  REQUIRE_GPU();
  for (const int64_t S : {int64_t{5}, int64_t{37}}) {
    INFO("splits " << S);
    const int64_t B = 3, Q = 4, H = 6, D = 80;
    // Parts stored [batch, head, split, seq, dim + 3] (padded), LSE [split, batch, head, seq].
    const int64_t o_st[5] = {Q * (D + 3), H * S * Q * (D + 3), D + 3, S * Q * (D + 3), 1};
    const int64_t n_part = B * H * S * Q * (D + 3), n_lse = S * B * H * Q;
    std::vector<float> o_part(static_cast<size_t>(n_part)), lse_part(static_cast<size_t>(n_lse));
    uint64_t state = 11;
    auto rnd = [&] {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      return static_cast<float>(static_cast<double>(state >> 11) / 9007199254740992.0 * 6.0 - 3.0);
    };
    for (float& x : o_part) x = rnd();
    for (int64_t n = 0; n < n_lse; ++n) {
      const int64_t s = n / (B * H * Q), row = n % (B * H * Q);
      const bool empty = row % 7 == 3 || (s == 2 && row % 3 == 0);
      lse_part[static_cast<size_t>(n)] = empty ? -std::numeric_limits<float>::infinity() : rnd() * 4;
    }
    if (S > 20) lse_part[static_cast<size_t>(20 * B * H * Q + 5)] = std::numeric_limits<float>::quiet_NaN();
    for (flashattn_dtype_t t : {FLASHATTN_DTYPE_FP32, FLASHATTN_DTYPE_FP16, FLASHATTN_DTYPE_BF16}) {
      const size_t es = dtype_size(t), n_o = static_cast<size_t>(B * Q * H * D);
      DeviceMem mem;
      void* d_part = mem.alloc(o_part.size() * 4);
      void* d_lse_part = mem.alloc(lse_part.size() * 4);
      void* d_o = mem.alloc(n_o * es);
      void* d_lse = mem.alloc(static_cast<size_t>(B * H * Q) * 4);
      mem.upload(d_part, o_part.data(), o_part.size() * 4);
      mem.upload(d_lse_part, lse_part.data(), lse_part.size() * 4);
      REQUIRE(cudaMemset(d_o, 0xFF, n_o * es) == cudaSuccess);
      flashattn_combine_args_t a = FLASHATTN_COMBINE_ARGS_INIT;
      a.num_splits = S;
      a.batch = B;
      a.seqlen_q = Q;
      a.heads = H;
      a.head_dim = D;
      a.o_partial = static_cast<const float*>(d_part);
      a.o_partial_strides = o_st;
      a.lse_partial = static_cast<const float*>(d_lse_part);
      a.dtype = t;
      a.o = d_o;
      a.lse = static_cast<float*>(d_lse);
      INFO(dtype_name(t));
      REQUIRE(flashattn_combine(FLASHATTN_BACKEND_CUDA, 0, &a, nullptr) == FLASHATTN_STATUS_SUCCESS);
      mem.sync();
      std::vector<uint8_t> o_gpu(n_o * es), o_cpu(n_o * es);
      std::vector<float> lse_gpu(static_cast<size_t>(B * H * Q)), lse_cpu(lse_gpu.size());
      mem.download(o_gpu.data(), d_o, o_gpu.size());
      mem.download(lse_gpu.data(), d_lse, lse_gpu.size() * 4);
      a.o_partial = o_part.data();
      a.lse_partial = lse_part.data();
      a.o = o_cpu.data();
      a.lse = lse_cpu.data();
      REQUIRE(flashattn_combine(FLASHATTN_BACKEND_CPU, 0, &a, nullptr) == FLASHATTN_STATUS_SUCCESS);
      // Both compute in fp32; the GPU's exp may differ in the last bits (fast math).
      const double tol = t == FLASHATTN_DTYPE_FP32 ? 1e-5 : dtype_eps(t) * 2;
      size_t bad = 0;
      for (size_t n = 0; n < n_o; ++n) {
        const double g = load_elem(t, &o_gpu[n * es]), c = load_elem(t, &o_cpu[n * es]);
        bad += !(fabs(g - c) <= tol * (1 + fabs(c)) || (std::isnan(g) && std::isnan(c)));
      }
      CHECK(bad == 0);
      size_t bad_lse = 0;
      for (size_t n = 0; n < lse_cpu.size(); ++n)
        bad_lse += !(lse_gpu[n] == lse_cpu[n] || fabs(lse_gpu[n] - lse_cpu[n]) <= 1e-5 * (1 + fabs(lse_cpu[n])) ||
                     (std::isnan(lse_gpu[n]) && std::isnan(lse_cpu[n])));
      CHECK(bad_lse == 0);
      if (S > 20) {  // the NaN part's row: batch 0, head 1, query 1
        CHECK(std::isnan(lse_gpu[5]));
        size_t nan_o = 0;
        for (int64_t d = 0; d < D; ++d)
          nan_o += std::isnan(load_elem(t, &o_gpu[static_cast<size_t>(((0 * Q + 1) * H + 1) * D + d) * es]));
        CHECK(nan_o == static_cast<size_t>(D));
      }
      mem.release(d_part);
      mem.release(d_lse_part);
      mem.release(d_o);
      mem.release(d_lse);
    }
  }
}

namespace {

// Device buffers of one run, freed together.
struct DeviceBuffers {
  DeviceMem mem;
  std::vector<void*> held;
  ~DeviceBuffers() {
    for (void* p : held) mem.release(p);
  }
  void* put(const void* src, size_t bytes) {
    void* d = mem.alloc(bytes);
    held.push_back(d);
    mem.upload(d, src, bytes);
    return d;
  }
  void* poisoned(size_t bytes) {
    void* d = mem.alloc(bytes);
    held.push_back(d);
    REQUIRE(cudaMemset(d, kPoison, std::max<size_t>(bytes, 16)) == cudaSuccess);
    return d;
  }
};

// Device values edited before the upload (out-of-range tests); nullptr keeps r's.
struct DeviceEdit {
  std::vector<int32_t> used, batch_idx, block_table;
};

// Runs the plan on the default stream, or (in_graph) captured into a CUDA graph on a stream of
// its own (global capture mode: nothing in the run may synchronize or allocate) and replayed.
flashattn_status_t launch_kv(flashattn_plan_t plan, const flashattn_kvcache_args_t& a, void* ws, size_t ws_bytes,
                             bool in_graph) {
  if (!in_graph) return flashattn_fwd_kvcache(plan, &a, ws, ws_bytes, nullptr);
  cudaStream_t st = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal) == cudaSuccess);
  const flashattn_status_t status = flashattn_fwd_kvcache(plan, &a, ws, ws_bytes, st);
  const std::string error = flashattn_last_error();
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(st, &graph);  // the stream leaves capture first
  INFO("captured run: " << flashattn_status_string(status) << ": " << error);
  REQUIRE(status == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(ended == cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  REQUIRE(cudaGraphLaunch(exec, st) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(st) == cudaSuccess);
  REQUIRE(cudaGraphExecDestroy(exec) == cudaSuccess);
  REQUIRE(cudaGraphDestroy(graph) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(st) == cudaSuccess);
  return status;
}

// flashattn_fwd_kvcache of r on a CUDA plan: every buffer in device memory, O, LSE and the
// workspace poisoned; the outputs and both caches downloaded afterwards.
KvResult run_kv_gpu(const KvRun& r, flashattn_plan_t plan, const DeviceEdit* edit = nullptr, bool in_graph = false) {
  const KvCase& c = r.c;
  DeviceBuffers d;
  KvResult k;
  const size_t o_bytes = static_cast<size_t>(c.batch * c.sq * c.hq * c.dv) * dtype_size(c.dtype);
  const size_t lse_n = static_cast<size_t>(c.batch * c.hq * c.sq);
  const std::vector<int32_t>& used = edit && !edit->used.empty() ? edit->used : r.used;
  const std::vector<int32_t>& idx = edit && !edit->batch_idx.empty() ? edit->batch_idx : r.batch_idx;
  const std::vector<int32_t>& table = edit && !edit->block_table.empty() ? edit->block_table : r.block_table;
  flashattn_kvcache_args_t a = FLASHATTN_KVCACHE_ARGS_INIT;
  a.q = d.put(r.q.data(), r.q.size());
  a.k_cache = d.put(r.k_cache.data(), r.k_cache.size());
  a.v_cache = d.put(r.v_cache.data(), r.v_cache.size());
  a.o = d.poisoned(o_bytes);
  a.lse = c.with_lse ? static_cast<float*>(d.poisoned(lse_n * 4)) : nullptr;
  a.cache_seqlens = static_cast<const int32_t*>(d.put(used.data(), used.size() * 4));
  if (c.batch_idx) a.cache_batch_idx = static_cast<const int32_t*>(d.put(idx.data(), idx.size() * 4));
  if (c.page_size > 0) a.block_table = static_cast<const int32_t*>(d.put(table.data(), table.size() * 4));
  if (c.seqlen_new > 0) {
    a.k_new = d.put(r.k_new.data(), r.k_new.size());
    a.v_new = d.put(r.v_new.data(), r.v_new.size());
  }
  if (c.rotary != FLASHATTN_ROTARY_NONE) {
    a.rotary_cos = d.put(r.cos.data(), r.cos.size());
    a.rotary_sin = d.put(r.sin.data(), r.sin.size());
  }
  if (c.bias != FLASHATTN_BIAS_NONE)
    a.alibi_slopes = static_cast<const float*>(d.put(r.slopes.data(), r.slopes.size() * 4));
  size_t ws_bytes = 0;
  REQUIRE(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_FORWARD_KVCACHE, &ws_bytes) ==
          FLASHATTN_STATUS_SUCCESS);
  void* ws = ws_bytes > 0 ? d.poisoned(ws_bytes) : nullptr;
  k.status = launch_kv(plan, a, ws, ws_bytes, in_graph);
  k.error = flashattn_last_error();
  d.mem.sync();
  k.o.resize(o_bytes);
  d.mem.download(k.o.data(), a.o, o_bytes);
  k.lse.assign(lse_n, std::numeric_limits<float>::quiet_NaN());
  if (a.lse) d.mem.download(k.lse.data(), a.lse, lse_n * 4);
  k.k_cache.resize(r.k_cache.size());
  k.v_cache.resize(r.v_cache.size());
  d.mem.download(k.k_cache.data(), a.k_cache, k.k_cache.size());
  d.mem.download(k.v_cache.data(), a.v_cache, k.v_cache.size());
  return k;
}

// Caches equal to the expected ones: bytewise, or within one rounding of the dtype (the
// rotated keys are computed in fp32 on both sides and rounded once).
size_t cache_mismatches(flashattn_dtype_t t, const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
  const size_t es = dtype_size(t);
  size_t bad = 0;
  for (size_t n = 0; n + es <= want.size(); n += es) {
    if (memcmp(&got[n], &want[n], es) == 0) continue;
    const double g = load_elem(t, &got[n]), w = load_elem(t, &want[n]);
    bad += !(fabs(g - w) <= 2 * dtype_eps(t) * fabs(w));
  }
  return bad;
}

// x and y agree: both NaN, or equal (infinities), or within tol * (1 + |y|). Both backends
// accumulate in fp32 in different orders and round O once, so O may differ by an ulp.
bool agree(double x, double y, double tol) {
  if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && std::isnan(y);
  return x == y || fabs(x - y) <= tol * (1 + fabs(y));
}

// The CPU backend's run of r; CHECKs that the GPU's O and LSE (g) agree with it.
void check_against_cpu(const KvRun& r, const KvResult& g) {
  const KvCase& c = r.c;
  flashattn_plan_t cpu_plan = make_kv_plan(r);
  const KvResult h = run_kv(r, cpu_plan);
  flashattn_plan_destroy(cpu_plan);
  REQUIRE(h.status == FLASHATTN_STATUS_SUCCESS);
  const size_t es = dtype_size(c.dtype);
  size_t bad_o = 0, bad_lse = 0;
  for (size_t n = 0; n < g.o.size(); n += es)
    bad_o += !agree(load_elem(c.dtype, &g.o[n]), load_elem(c.dtype, &h.o[n]), 4 * dtype_eps(c.dtype));
  if (c.with_lse)
    for (size_t n = 0; n < h.lse.size(); ++n) bad_lse += !agree(g.lse[n], h.lse[n], 1e-4);
  CHECK(bad_o == 0);
  CHECK(bad_lse == 0);
}

// Runs r on the GPU and CHECKs it: status, caches after the append, O and LSE against the
// fp64 reference and against the CPU backend's run of the same case.
void gpu_check(const KvRun& r) {
  const KvCase& c = r.c;
  flashattn_plan_t plan = make_kv_plan(r, FLASHATTN_BACKEND_CUDA);
  const KvResult g = run_kv_gpu(r, plan);
  flashattn_plan_destroy(plan);
  INFO(describe(r.c) << " | status " << flashattn_status_string(g.status) << ": " << g.error);
  REQUIRE(g.status == FLASHATTN_STATUS_SUCCESS);
  CHECK(cache_mismatches(c.dtype, g.k_cache, r.k_cache_after) == 0);
  CHECK(cache_mismatches(c.dtype, g.v_cache, r.v_cache_after) == 0);
  check_against_reference(kv_problem(r), kv_lib_result(r, g), kGpuTolerance);
  check_against_cpu(r, g);
}

void gpu_check(const KvCase& c) { gpu_check(make_kv_run(c)); }

KvCase gpu_decode_case(const char* name, int64_t page, int64_t d, uint64_t seed) {
  KvCase c;
  c.name = name;
  c.batch = 3;
  c.cap = 300;
  c.hq = 8;
  c.hkv = 2;
  c.dqk = c.dv = d;
  c.page_size = page;
  c.used = {0, 300, 137};
  c.seed = seed;
  return c;
}

// c appending n tokens to sequences holding 0 keys, all but n, and `mid`, rotated (rot) over dim dims.
void append_to(KvCase& c, int64_t n, int mid, flashattn_rotary_t rot, int64_t dim) {
  c.seqlen_new = n;
  c.used = {0, static_cast<int>(c.cap - n), mid};
  c.rotary = rot;
  c.rotary_dim = dim;
}

}  // namespace

// On an H100/H200, pages of 16, 32 and 64k keys and contiguous caches take the copy-engine
// kernel (boxes of 16, 32 and 64 keys), pages of 1 and 3 the gathering one.
TEST_CASE("gpu kvcache: decode over contiguous and paged caches with used lengths 0 and full", "[gpu][kvcache]") {
  REQUIRE_GPU();
  for (int64_t page : {0, 1, 3, 16, 32, 64, 256})
    for (bool hnd : {false, true})
      for (flashattn_dtype_t t : {FLASHATTN_DTYPE_FP16, FLASHATTN_DTYPE_BF16}) {
        KvCase c = gpu_decode_case("decode", page, 128, static_cast<uint64_t>(page) * 4 + (hnd ? 2 : 0) + t);
        c.heads_outer = hnd;
        c.dtype = t;
        gpu_check(c);
      }
}

TEST_CASE("gpu kvcache: head dims 64 to 256 with dqk unlike dv and dims off the 16-byte grid", "[gpu][kvcache]") {
  REQUIRE_GPU();
  const int64_t dims[][2] = {{64, 64}, {96, 96}, {128, 128}, {200, 200}, {256, 256}, {40, 24}, {13, 7}, {256, 72}};
  for (const auto& dd : dims) {
    KvCase c = gpu_decode_case("head dims", 16, dd[0], static_cast<uint64_t>(dd[0] * 7 + dd[1]));
    c.dv = dd[1];
    c.batch_idx = false;
    gpu_check(c);
    c.page_size = 0;
    c.batch_idx = true;
    gpu_check(c);
  }
}

TEST_CASE("gpu kvcache: any stride of a cache dim of extent 1", "[gpu][kvcache]") {
  REQUIRE_GPU();
  // One KV head: its head stride never multiplies a nonzero index, so an odd one (here 1)
  // still lets the tiles load with 16-byte copies; pages of one token likewise for the
  // token stride. Both caches are given (HND), with append.
  for (int64_t page : {0, 1, 16}) {
    KvCase c = gpu_decode_case("extent-1 strides", page, 64, static_cast<uint64_t>(80 + page));
    c.hkv = 1;
    c.hq = 4;
    c.heads_outer = true;
    append_to(c, 1, 137, FLASHATTN_ROTARY_NONE, 0);
    KvRun r = make_kv_run(c);
    r.kc_stride[2] = r.vc_stride[2] = 1;
    if (page == 1) r.kc_stride[1] = r.vc_stride[1] = 3;
    gpu_check(r);
  }
}

TEST_CASE("gpu kvcache: GQA ratios 1 to 16 and query chunks of several tiles", "[gpu][kvcache]") {
  REQUIRE_GPU();
  for (int64_t ratio : {1, 2, 3, 4, 8, 16})
    for (int64_t sq : {1, 2, 5}) {
      KvCase c = gpu_decode_case("gqa", 16, 64, static_cast<uint64_t>(ratio * 10 + sq));
      c.hkv = 2;
      c.hq = 2 * ratio;
      c.sq = sq;
      c.causal = sq > 1;
      gpu_check(c);
    }
}

TEST_CASE("gpu kvcache: splits forced to 1 and many, and chosen by the library", "[gpu][kvcache]") {
  REQUIRE_GPU();
  for (int64_t splits : {1, 2, 7, 64, 0})
    for (int64_t page : {0, 3}) {
      KvCase c = gpu_decode_case("splits", page, 128, static_cast<uint64_t>(splits + page));
      c.cap = 1000;
      c.used = {1000, 0, 517};
      c.num_splits = splits;
      gpu_check(c);
      c.with_lse = false;
      gpu_check(c);
    }
}

// The same logical cache through the copy-engine kernel (on an H100/H200: contiguous, pages
// of 16 and 64) and the gathering one (pages of 3) at the same split count: the same tiles
// reach shared memory and the arithmetic is the same, so O and LSE agree bit for bit (on
// other devices every layout gathers, and must agree all the same). With 3 and 16 splits
// the copy-engine kernel merges them in clusters (16: beyond the portable size; most of
// them empty), the gathering one through the combine kernel.
TEST_CASE("gpu kvcache: copy-engine and gathered tiles give bitwise equal results", "[gpu][kvcache]") {
  REQUIRE_GPU();
  for (int64_t d : {64, 128, 256})
    for (int64_t splits : {1, 3, 16}) {
      KvCase c = gpu_decode_case("copy engine vs gather", 3, d, static_cast<uint64_t>(900 + d + splits));
      c.dtype = FLASHATTN_DTYPE_BF16;
      c.num_splits = splits;
      const KvRun gathered = make_kv_run(c);
      flashattn_plan_t plan = make_kv_plan(gathered, FLASHATTN_BACKEND_CUDA);
      const KvResult want = run_kv_gpu(gathered, plan);
      flashattn_plan_destroy(plan);
      REQUIRE(want.status == FLASHATTN_STATUS_SUCCESS);
      for (int64_t page : {0, 16, 64}) {
        c.page_size = page;
        const KvRun r = make_kv_run(c);
        plan = make_kv_plan(r, FLASHATTN_BACKEND_CUDA);
        const KvResult got = run_kv_gpu(r, plan);
        flashattn_plan_destroy(plan);
        INFO("d=" << d << " splits=" << splits << " page=" << page << ": " << got.error);
        REQUIRE(got.status == FLASHATTN_STATUS_SUCCESS);
        CHECK(got.o == want.o);
        CHECK(memcmp(got.lse.data(), want.lse.data(), want.lse.size() * sizeof(float)) == 0);
      }
    }
}

// A decode of a 1000-row cache (three sequences using 1000, 0 and 517 rows) split `splits`
// ways, run on one plan captured into a CUDA graph and replayed, and eagerly: the graph
// first where graph_first (the split count's first run is then the captured one).
struct GraphAndEager {
  KvResult graph, eager;
};
GraphAndEager graph_and_eager(const char* name, int64_t page, int64_t d, uint64_t seed, flashattn_dtype_t t,
                              int64_t splits, bool graph_first) {
  KvCase c = gpu_decode_case(name, page, d, seed);
  c.dtype = t;
  c.cap = 1000;
  c.used = {1000, 0, 517};
  c.num_splits = splits;
  const KvRun r = make_kv_run(c);
  flashattn_plan_t plan = make_kv_plan(r, FLASHATTN_BACKEND_CUDA);
  GraphAndEager out;
  if (graph_first) out.graph = run_kv_gpu(r, plan, nullptr, true);
  out.eager = run_kv_gpu(r, plan);
  if (!graph_first) out.graph = run_kv_gpu(r, plan, nullptr, true);
  flashattn_plan_destroy(plan);
  return out;
}

// A split decode (its combine launched as a programmatic dependent on Hopper) captured into a
// CUDA graph and replayed gives the eager run's bits.
TEST_CASE("gpu kvcache: a split decode captured in a CUDA graph gives the eager bits", "[gpu][kvcache]") {
  REQUIRE_GPU();
  for (int64_t d : {64, 128})
    for (int64_t page : {0, 16})
      for (int64_t splits : {3, 7}) {
        const auto [graph, eager] = graph_and_eager("graph", page, d, static_cast<uint64_t>(40 + d + page + splits),
                                                    FLASHATTN_DTYPE_BF16, splits, false);
        INFO("d=" << d << " page=" << page << " splits=" << splits << ": " << graph.error);
        REQUIRE(eager.status == FLASHATTN_STATUS_SUCCESS);
        REQUIRE(graph.status == FLASHATTN_STATUS_SUCCESS);
        CHECK(graph.o == eager.o);
        CHECK(memcmp(graph.lse.data(), eager.lse.data(), eager.lse.size() * sizeof(float)) == 0);
      }
}

// The first run of a split count captured into a CUDA graph before any eager run of it in the
// process (each test case runs in a process of its own): the library does not ask the
// device about clusters while the stream is being captured, so the captured run merges
// through the combine kernel and the eager run after it (on an H100/H200, the splits
// merging in a cluster) must give the same bits, in both half-precision dtypes.
TEST_CASE("gpu kvcache: a split count first run inside a CUDA graph capture", "[gpu][kvcache]") {
  REQUIRE_GPU();
  for (int64_t d : {64, 128})
    for (flashattn_dtype_t t : {FLASHATTN_DTYPE_FP16, FLASHATTN_DTYPE_BF16})
      for (int64_t splits : {5, 11}) {
        const auto [graph, eager] =
            graph_and_eager("graph first", 0, d, static_cast<uint64_t>(70 + d + splits + t), t, splits, true);
        INFO("d=" << d << " dtype=" << t << " splits=" << splits << ": " << graph.error << eager.error);
        REQUIRE(graph.status == FLASHATTN_STATUS_SUCCESS);
        REQUIRE(eager.status == FLASHATTN_STATUS_SUCCESS);
        CHECK(graph.o == eager.o);
        CHECK(memcmp(graph.lse.data(), eager.lse.data(), eager.lse.size() * sizeof(float)) == 0);
      }
}

TEST_CASE("gpu kvcache: append with both rotary forms and causal or local chunked prefill", "[gpu][kvcache]") {
  REQUIRE_GPU();
  for (flashattn_rotary_t rot : {FLASHATTN_ROTARY_NONE, FLASHATTN_ROTARY_HALF, FLASHATTN_ROTARY_INTERLEAVED})
    for (int64_t page : {0, 1, 16})
      for (int64_t sq : {1, 4, 40}) {
        KvCase c = gpu_decode_case("append", page, 64, static_cast<uint64_t>(rot * 100 + page * 3 + sq));
        c.sq = sq;
        append_to(c, sq, 90, rot, rot == FLASHATTN_ROTARY_NONE ? 0 : 48);
        c.causal = sq > 1;
        c.batch_idx = page == 0;
        c.num_splits = sq == 4 ? 5 : 0;
        gpu_check(c);
        if (sq == 40) {
          c.causal = false;
          c.wl = 17;
          c.wr = 3;
          gpu_check(c);
        }
      }
}

TEST_CASE("gpu kvcache: softcap, ALiBi and rotary without a band mask", "[gpu][kvcache]") {
  REQUIRE_GPU();
  for (flashattn_bias_t bias : {FLASHATTN_BIAS_NONE, FLASHATTN_BIAS_ALIBI, FLASHATTN_BIAS_ALIBI_SYMMETRIC}) {
    KvCase c = gpu_decode_case("options", 3, 128, static_cast<uint64_t>(bias + 40));
    c.sq = 3;
    c.softcap = bias == FLASHATTN_BIAS_NONE ? 5.f : 0.f;
    c.bias = bias;
    append_to(c, 2, 41, FLASHATTN_ROTARY_HALF, 128);
    c.num_splits = 3;
    gpu_check(c);
  }
}

TEST_CASE("gpu kvcache: ALiBi slopes per (batch, head), rows apart or overlapping", "[gpu][kvcache]") {
  REQUIRE_GPU();
  // Rows hq + 3 apart (NaN between them, never read) over a contiguous cache whose rows are
  // permuted (the slopes follow the batch entry, not the cache row), and overlapping rows
  // (stride 1) over a paged cache with forced splits.
  uint64_t seed = 60;
  for (flashattn_bias_t bias : {FLASHATTN_BIAS_ALIBI, FLASHATTN_BIAS_ALIBI_SYMMETRIC})
    for (int64_t page : {0, 16}) {
      KvCase c = gpu_decode_case("alibi per (batch, head)", page, 64, ++seed);
      c.bias = bias;
      c.alibi_batch_stride = page == 0 ? c.hq + 3 : 1;
      c.batch_idx = page == 0;
      c.sq = 2;
      c.causal = bias == FLASHATTN_BIAS_ALIBI;
      append_to(c, 2, 41, FLASHATTN_ROTARY_NONE, 0);
      c.num_splits = page == 0 ? 0 : 4;
      gpu_check(c);
    }
}

TEST_CASE("gpu kvcache: device values out of range give NaN rows and write nothing", "[gpu][kvcache]") {
  REQUIRE_GPU();
  for (int what = 0; what < 4; ++what)
    for (int64_t splits : {1, 4}) {
      // 0: used length past the capacity, 1: negative, 2: a page outside the pool, 3: a cache row outside.
      KvCase c = gpu_decode_case("device values", what == 3 ? 0 : 16, 64, static_cast<uint64_t>(what + 90));
      c.batch_idx = what == 3;
      append_to(c, 1, 137, FLASHATTN_ROTARY_NONE, 0);
      c.num_splits = splits;
      const KvRun r = make_kv_run(c);
      DeviceEdit e;
      e.used = r.used;
      if (what == 0) e.used[1] = 300;
      if (what == 1) e.used[1] = -3;
      if (what == 2) {
        e.block_table = r.block_table;
        e.block_table[static_cast<size_t>(r.max_pages + 4)] = static_cast<int32_t>(r.num_rows + 1000);
      }
      if (what == 3) {
        e.batch_idx = r.batch_idx;
        e.batch_idx[1] = static_cast<int32_t>(r.num_rows);
      }
      flashattn_plan_t plan = make_kv_plan(r, FLASHATTN_BACKEND_CUDA);
      const KvResult g = run_kv_gpu(r, plan, &e);
      const KvResult good = run_kv_gpu(r, plan);
      flashattn_plan_destroy(plan);
      INFO("case " << what << ", splits " << splits << ": " << g.error);
      REQUIRE(g.status == FLASHATTN_STATUS_SUCCESS);
      const size_t es = dtype_size(c.dtype), row = static_cast<size_t>(c.sq * c.hq * c.dv) * es;
      size_t not_nan = 0, changed = 0;
      for (size_t n = 0; n < g.o.size(); n += es) {
        const bool seq1 = n / row == 1;
        const double x = load_elem(c.dtype, &g.o[n]);
        if (seq1) not_nan += !std::isnan(x);
        else changed += memcmp(&g.o[n], &good.o[n], es) != 0;
      }
      CHECK(not_nan == 0);
      CHECK(changed == 0);
      for (int64_t h = 0; h < c.hq; ++h) CHECK(std::isnan(g.lse[static_cast<size_t>(c.hq + h)]));
      // Every cache element holds its old or its appended value. Sequence 1 appended
      // nothing for a bad length or row; a bad page entry (not the appended page) only
      // spoils the reads, so the append happened.
      const std::vector<uint8_t>* caches[2][3] = {{&g.k_cache, &r.k_cache, &r.k_cache_after},
                                                  {&g.v_cache, &r.v_cache, &r.v_cache_after}};
      for (const auto& cc : caches) {
        const std::vector<uint8_t>&got = *cc[0], &before = *cc[1], &after = *cc[2];
        size_t written = 0, appended = 0, stray = 0;
        for (size_t n = 0; n < got.size(); n += es) {
          const bool old_value = memcmp(&got[n], &before[n], es) == 0;
          const bool new_value =
              memcmp(&got[n], &after[n], es) == 0 || cache_mismatches(c.dtype, {got.begin() + n, got.begin() + n + es},
                                                                      {after.begin() + n, after.begin() + n + es}) == 0;
          stray += !old_value && !new_value;
          written += !old_value;
          appended += memcmp(&before[n], &after[n], es) != 0;
        }
        CHECK(stray == 0);
        if (what == 2) CHECK(written == appended);
        else CHECK(written < appended);
      }
    }
}

TEST_CASE("gpu kvcache: an inf in q makes its rows NaN, as on the CPU", "[gpu][kvcache]") {
  REQUIRE_GPU();
  // q of sequence 2, token 1, head 5 holds +inf in dim 3: its scores are +-inf or NaN, so
  // the row sum l is NaN (not 0: the row is not empty) and O and LSE of that row are NaN
  // on both backends; every other row is unaffected.
  for (int64_t splits : {1, 3}) {
    KvCase c = gpu_decode_case("inf in q", 16, 64, static_cast<uint64_t>(60 + splits));
    c.sq = 2;
    c.causal = true;
    c.num_splits = splits;
    KvRun r = make_kv_run(c);
    const size_t es = dtype_size(c.dtype);
    const int64_t b = 2, i = 1, h = 5;
    store_elem(c.dtype, &r.q[static_cast<size_t>((((b * c.sq + i) * c.hq + h) * c.dqk + 3)) * es],
               std::numeric_limits<double>::infinity());
    flashattn_plan_t plan = make_kv_plan(r, FLASHATTN_BACKEND_CUDA);
    const KvResult g = run_kv_gpu(r, plan);
    flashattn_plan_destroy(plan);
    INFO(describe(r.c) << " | " << g.error);
    REQUIRE(g.status == FLASHATTN_STATUS_SUCCESS);
    size_t nan_o = 0;
    for (int64_t d = 0; d < c.dv; ++d)
      nan_o += std::isnan(load_elem(c.dtype, &g.o[static_cast<size_t>(((b * c.sq + i) * c.hq + h) * c.dv + d) * es]));
    CHECK(nan_o == static_cast<size_t>(c.dv));
    CHECK(std::isnan(g.lse[static_cast<size_t>((b * c.hq + h) * c.sq + i)]));
    check_against_cpu(r, g);
  }
}

TEST_CASE("gpu kvcache: fp32 plans are refused before anything is written", "[gpu][kvcache]") {
  REQUIRE_GPU();
  KvCase c = gpu_decode_case("fp32", 16, 64, 5);
  c.dtype = FLASHATTN_DTYPE_FP32;
  append_to(c, 1, 137, FLASHATTN_ROTARY_NONE, 0);
  const KvRun r = make_kv_run(c);
  flashattn_plan_t plan = make_kv_plan(r, FLASHATTN_BACKEND_CUDA);
  const KvResult g = run_kv_gpu(r, plan);
  flashattn_plan_destroy(plan);
  INFO(g.error);
  CHECK(g.status == FLASHATTN_STATUS_DTYPE_NOT_SUPPORTED);
  CHECK(g.error.find("FP32") != std::string::npos);
  CHECK(same_bytes(g.k_cache, r.k_cache));
  CHECK(same_bytes(g.v_cache, r.v_cache));
  CHECK(std::count(g.o.begin(), g.o.end(), kPoison) == static_cast<std::ptrdiff_t>(g.o.size()));
}
