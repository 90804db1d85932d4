// CUDA backend tests, tagged [gpu] and labelled `gpu` in ctest. Every test first checks for
// a device; without one it prints the skip marker (ctest reports "skipped", never "passed").
// Tensors live in device memory (cudaMalloc); results are compared with the fp64 reference
// under the GPU tolerance (harness.hpp: at most the same-precision standard attention's
// error, plus a floor of 1/8 unit roundoff of the condition magnitude) and with the CPU backend: dropout masks, fully
// masked rows and unsupported-configuration statuses must agree exactly.
#include <cuda_runtime_api.h>
#include <math.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "gpu_check.hpp"
#include "gpu_mem.hpp"
#include "grad_accumulate_check.hpp"
#include "harness.hpp"

using namespace fat;

namespace {

// Causal masks in both alignments on square, wide and tall problems and two sliding windows
// (one with GQA), at head dim d over several q- and k-blocks.
void masks_over_tiles(int64_t d, uint64_t seed) {
  const int64_t shapes[][2] = {{300, 300}, {200, 333}, {333, 200}};
  for (const auto& s : shapes)
    for (auto align : {FLASHATTN_ALIGN_TOP_LEFT, FLASHATTN_ALIGN_BOTTOM_RIGHT}) {
      ++seed;
      Config c = gbase("gpu tiles causal", s[0], s[1], d, kGpuDtypes[seed % 3], seed);
      c.band = true;
      c.align = align;
      c.wr = 0;
      gpu_check(c);
    }
  Config c = gbase("gpu tiles window (70, 13) bottom-right GQA", 400, 450, d, FLASHATTN_DTYPE_BF16, ++seed);
  c.hq = 4;
  c.hkv = 2;
  c.band = true;
  c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
  c.wl = 70;
  c.wr = 13;
  gpu_check(c);
  c = gbase("gpu tiles window (100, -1)", 400, 450, d, FLASHATTN_DTYPE_FP16, ++seed);
  c.band = true;
  c.wl = 100;
  gpu_check(c);
}

// Softcap, a bias tensor whose rows the forward stages in shared memory (seqlen_k a multiple
// of 8), ALiBi in both forms and dropout, at head dim d over several tiles.
void options_over_tiles(int64_t d, uint64_t seed) {
  Config c = gbase("gpu tiles softcap", 260, 300, d, FLASHATTN_DTYPE_BF16, ++seed);
  c.softcap = 5.f;
  c.scale = 0.3f;
  gpu_check(c);
  c = gbase("gpu tiles bias causal", 150, 192, d, FLASHATTN_DTYPE_FP16, ++seed);
  c.bias = FLASHATTN_BIAS_TENSOR;
  c.band = true;
  c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
  c.wr = 0;
  gpu_check(c);
  c = gbase("gpu tiles alibi causal GQA", 300, 280, d, FLASHATTN_DTYPE_BF16, ++seed);
  c.hq = 4;
  c.hkv = 2;
  c.bias = FLASHATTN_BIAS_ALIBI;
  c.band = true;
  c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
  c.wr = 0;
  gpu_check(c);
  c = gbase("gpu tiles alibi symmetric", 130, 200, d, FLASHATTN_DTYPE_FP16, ++seed);
  c.bias = FLASHATTN_BIAS_ALIBI_SYMMETRIC;
  gpu_check(c);
  c.name = "gpu tiles alibi symmetric per (batch, head)";
  c.batch = 2;
  c.alibi_batch_stride = c.hq + 5;
  gpu_check(c);
  c = gbase("gpu tiles dropout causal GQA", 257, 383, d, FLASHATTN_DTYPE_FP16, ++seed);
  c.hq = 4;
  c.hkv = 2;
  c.p_drop = 0.17f;
  c.seed = 21;
  c.band = true;
  c.wr = 0;
  gpu_check(c);
}

}  // namespace

TEST_CASE("gpu: dense attention on awkward lengths", "[gpu][fwd][bwd]") {
  REQUIRE_GPU();
  const int64_t pairs[][2] = {{1, 1},     {1, 17},    {17, 1},    {63, 65}, {65, 63},
                              {127, 129}, {129, 127}, {200, 200}, {1, 300}};
  uint64_t seed = 3000;
  for (const auto& pr : pairs)
    for (flashattn_dtype_t t : kGpuDtypes) gpu_check(gbase("gpu dense", pr[0], pr[1], 64, t, ++seed));
}

TEST_CASE("gpu: head dims 32 to 256 and non-tile ones and dqk != dv", "[gpu][fwd][bwd]") {
  REQUIRE_GPU();
  const int64_t dims[][2] = {{32, 32},
                             {64, 64},
                             {96, 96},
                             {128, 128},
                             {192, 192},
                             {256, 256},
                             {40, 40},
                             {72, 72},
                             {200, 200},
                             {192, 128},
                             {8, 8},
                             {40, 24},
                             // the d=128 kernel with a whole 64-column Q or dO box outside the
                             // tensor (its copy-engine prefetch zero-fills such boxes)
                             {64, 128},
                             {128, 40}};
  uint64_t seed = 3100;
  for (const auto& d : dims)
    for (flashattn_dtype_t t : kGpuDtypes) {
      Config c = gbase("gpu head dim", 77, 93, d[0], t, ++seed);
      c.dv = d[1];
      c.hq = 4;
      c.hkv = 2;
      gpu_check(c);
    }
}

// Head dims that are not a multiple of 8 run the kernels of the next multiple on zero-padded
// workspace copies (src/cuda/fa2_staging.cu), whose tensors need only element alignment:
// contiguous rows of odd length (BSHD), and padded layouts whose gaps break 16-byte
// alignment where every tensor is copied; the other tensors keep 16-byte aligned rows.
TEST_CASE("gpu: every head dim 1..256, dqk and dv independent, with the other options", "[gpu][fwd][bwd]") {
  REQUIRE_GPU();
  const int64_t dims[][2] = {{1, 1},     {8, 8},     {59, 59},   {72, 72},   {100, 100},
                             {111, 111}, {120, 120}, {200, 200}, {256, 256}, {100, 64},
                             {64, 128},  {256, 32},  {59, 111},  {3, 5},     {250, 17}};
  uint64_t seed = 3900;
  for (const auto& d : dims) {
    const bool all_copied = d[0] % 8 != 0 && d[1] % 8 != 0;
    for (flashattn_dtype_t t : kGpuDtypes) {
      Config c = base_config("gpu any head dim", 77, 93, d[0], t, ++seed);
      c.dv = d[1];
      c.hq = 4;
      c.hkv = 2;
      gpu_check(c);  // contiguous BSHD
      c.name = "gpu any head dim, padded layout";
      c.layout = Layout::Padded;
      c.pad16 = !all_copied;
      gpu_check(c);
    }
    ++seed;
    Config c = base_config("gpu any head dim, causal, softcap, ALiBi per batch, dropout", 150, 130, d[0],
                           kGpuDtypes[seed % 3], seed);
    c.dv = d[1];
    c.batch = 2;
    c.hq = 4;
    c.hkv = 2;
    c.band = true;
    c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
    c.wr = 0;
    c.softcap = 10.f;
    c.bias = FLASHATTN_BIAS_ALIBI;
    c.alibi_batch_stride = 5;
    c.p_drop = 0.1f;
    c.seed = seed;
    gpu_check(c);
    c.name = "gpu any head dim, varlen, bias tensor, block-sparse, window";
    c.softcap = 0.f;
    c.p_drop = 0.f;
    c.alibi_batch_stride = 0;
    c.bias = FLASHATTN_BIAS_TENSOR;
    c.bias_bcast[1] = true;
    c.wl = 33;
    c.wr = 9;
    c.batch = 3;
    c.seqlens_q = {150, 0, 61};
    c.seqlens_k = {130, 17, 99};
    c.sparse = true;
    c.block_q = 128;
    c.block_k = 64;
    gpu_check(c);
    c.name = "gpu any head dim, deterministic MQA";
    c.bias = FLASHATTN_BIAS_NONE;
    c.sparse = false;
    c.seqlens_q.clear();
    c.seqlens_k.clear();
    c.hkv = 1;
    gpu_check_deterministic(c);
  }
}

// The O(N) memory of the flash path in every dtype: the workspace of a 16k x 16k problem
// (the standard algorithm's S alone would be 16 GiB) is at most the backward's per-row
// vectors, and the run is right.
TEST_CASE("gpu: flash workspaces are O(seqlen) in every dtype", "[gpu][fwd][bwd]") {
  REQUIRE_GPU();
  for (flashattn_dtype_t t : kGpuDtypes) {
    flashattn_plan_t plan = nullptr;
    REQUIRE(flashattn_plan_create(&plan, FLASHATTN_BACKEND_CUDA, 0) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(flashattn_plan_set_shape(plan, 2, 16384, 16384, 4, 4, 128, 128) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(flashattn_plan_set_dtype(plan, t) == FLASHATTN_STATUS_SUCCESS);
    size_t fwd = 0, bwd = 0;
    REQUIRE(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_FORWARD, &fwd) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_BACKWARD, &bwd) == FLASHATTN_STATUS_SUCCESS);
    flashattn_plan_destroy(plan);
    const size_t rows = size_t{2} * 4 * 16384;  // batch x heads x seqlen_q
    INFO("dtype " << t << ": forward " << fwd << " bytes, backward " << bwd << " bytes");
    CHECK(fwd <= 256);
    CHECK(bwd <= rows * (4 + 4 * 128) + 4096);  // Delta, and the fp16/bf16 kernels' fp32 dQ
  }
  Config c = gbase("gpu fp32 flash", 77, 1100, 64, FLASHATTN_DTYPE_FP32, 3150);
  c.hq = 2;
  gpu_check(c);
}

TEST_CASE("gpu: GQA and MQA", "[gpu][fwd][bwd]") {
  REQUIRE_GPU();
  const int64_t heads[][2] = {{8, 2}, {6, 1}, {4, 4}, {16, 1}};
  uint64_t seed = 3200;
  for (const auto& h : heads)
    for (flashattn_dtype_t t : kGpuDtypes) {
      Config c = gbase("gpu gqa", 100, 130, 64, t, ++seed);
      c.batch = 2;
      c.hq = h[0];
      c.hkv = h[1];
      gpu_check(c);
    }
}

TEST_CASE("gpu: causal and sliding windows in both alignments", "[gpu][fwd][bwd]") {
  REQUIRE_GPU();
  const int64_t shapes[][2] = {{17, 200}, {200, 17}, {1, 129}, {129, 1}, {128, 128}, {257, 255}};
  const int64_t windows[][2] = {{-1, 0}, {32, 0}, {16, 16}, {0, 0}};
  uint64_t seed = 3300;
  for (const auto& s : shapes)
    for (const auto& w : windows)
      for (auto align : {FLASHATTN_ALIGN_TOP_LEFT, FLASHATTN_ALIGN_BOTTOM_RIGHT}) {
        ++seed;
        Config c = gbase("gpu band", s[0], s[1], 64, kGpuDtypes[seed % 3], seed);
        c.band = true;
        c.align = align;
        c.wl = w[0];
        c.wr = w[1];
        gpu_check(c);
      }
}

TEST_CASE("gpu: softcap and bias tensors and ALiBi", "[gpu][fwd][bwd]") {
  REQUIRE_GPU();
  uint64_t seed = 3400;
  for (float cap : {5.f, 30.f})
    for (flashattn_dtype_t t : kGpuDtypes) {
      Config c = gbase("gpu softcap", 70, 150, 64, t, ++seed);
      c.softcap = cap;
      c.scale = 0.3f;
      gpu_check(c);
    }
  const bool patterns[][4] = {{false, false, false, false},
                              {true, false, false, false},
                              {true, true, false, false},
                              {true, true, true, false},
                              {false, false, false, true}};
  // seqlen_k 136: the forward stages bias tiles in shared memory (16-byte copies);
  // 130 (not a multiple of 8): it reads the bias directly (see fwd_launch.cuh).
  for (int sk : {130, 136})
    for (const auto& pat : patterns)
      for (flashattn_dtype_t t : kGpuDtypes) {
        Config c = gbase("gpu bias", 65, sk, 64, t, ++seed);
        c.batch = 2;
        c.hq = 4;
        c.hkv = 2;
        c.bias = FLASHATTN_BIAS_TENSOR;
        for (int d = 0; d < 4; ++d) c.bias_bcast[d] = pat[d];
        c.bias_inf_row = pat[2] ? -1 : 3;
        gpu_check(c);
      }
  for (auto kind : {FLASHATTN_BIAS_ALIBI, FLASHATTN_BIAS_ALIBI_SYMMETRIC})
    for (auto align : {FLASHATTN_ALIGN_TOP_LEFT, FLASHATTN_ALIGN_BOTTOM_RIGHT}) {
      ++seed;
      Config c = gbase("gpu alibi", 90, 60, 64, kGpuDtypes[seed % 3], seed);
      c.hq = 8;
      c.hkv = 2;
      c.bias = kind;
      c.align = align;
      gpu_check(c);
    }
}

TEST_CASE("gpu: ALiBi slopes per (batch, head) with the other options", "[gpu][fwd][bwd]") {
  REQUIRE_GPU();
  uint64_t seed = 3450;
  // Rows with NaN gaps, and overlapping rows (stride below heads_q), on both algorithms.
  for (int64_t stride : {11, 3})
    for (auto alg : {FLASHATTN_ALGORITHM_FLASH, FLASHATTN_ALGORITHM_STANDARD}) {
      ++seed;
      Config c = gbase("gpu alibi per batch, causal GQA", 150, 210, 64, kGpuDtypes[seed % 3], seed);
      c.batch = 3;
      c.hq = 8;
      c.hkv = 2;
      c.bias = FLASHATTN_BIAS_ALIBI;
      c.alibi_batch_stride = stride;
      c.algorithm = alg;
      c.band = true;
      c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
      c.wr = 0;
      gpu_check(c);
      c.name = "gpu alibi symmetric per batch, softcap, dropout, window";
      c.bias = FLASHATTN_BIAS_ALIBI_SYMMETRIC;
      c.softcap = 20.f;
      c.p_drop = 0.1f;
      c.seed = seed;
      c.wl = 40;
      c.wr = 7;
      gpu_check(c);
      c.name = "gpu alibi per batch, varlen with empty sequences, block-sparse";
      c.p_drop = 0.f;
      c.softcap = 0.f;
      c.band = false;
      c.batch = 4;
      c.seqlens_q = {150, 0, 77, 9};
      c.seqlens_k = {210, 13, 0, 140};
      c.sparse = alg == FLASHATTN_ALGORITHM_FLASH;
      c.block_q = 128;
      c.block_k = 64;
      gpu_check(c);
    }
  Config c = gbase("gpu alibi per batch, deterministic", 130, 260, 128, FLASHATTN_DTYPE_BF16, ++seed);
  c.batch = 2;
  c.hq = 4;
  c.hkv = 4;
  c.bias = FLASHATTN_BIAS_ALIBI;
  c.alibi_batch_stride = 4;
  gpu_check_deterministic(c);
}

TEST_CASE("gpu: block-sparse layouts", "[gpu][fwd][bwd]") {
  REQUIRE_GPU();
  struct S {
    int64_t sq, sk, bq, bk, heads;
    double density;
    int64_t zero_row;
  };
  const S cases[] = {{256, 256, 128, 64, 1, 0.5, 1},
                     {300, 200, 128, 64, 4, 0.6, -1},
                     {100, 90, 16, 16, 4, 0.5, 0},
                     {129, 257, 7, 5, 1, 0.4, -1}};
  uint64_t seed = 3500;
  for (const S& s : cases)
    for (flashattn_dtype_t t : kGpuDtypes) {
      Config c = gbase("gpu sparse", s.sq, s.sk, 64, t, ++seed);
      c.hq = 4;
      c.hkv = 2;
      c.sparse = true;
      c.block_q = s.bq;
      c.block_k = s.bk;
      c.layout_heads = s.heads;
      c.density = s.density;
      c.zero_row_block = s.zero_row;
      gpu_check(c);
    }
}

TEST_CASE("gpu: variable-length sequences including empty ones", "[gpu][fwd][bwd]") {
  REQUIRE_GPU();
  struct V {
    std::vector<int> q, k;
  };
  const V cases[] = {{{5, 0, 17, 1, 130}, {9, 4, 0, 1, 200}}, {{0, 0, 65}, {0, 3, 63}}, {{300, 7}, {7, 300}}};
  uint64_t seed = 3600;
  for (const V& v : cases)
    for (int variant = 0; variant < 3; ++variant) {
      Config c = gbase("gpu varlen", 1, 1, 64, kGpuDtypes[variant % 3], ++seed);
      c.hq = 4;
      c.hkv = 2;
      c.seqlens_q = v.q;
      c.seqlens_k = v.k;
      if (variant == 1) {
        c.band = true;
        c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
        c.wr = 0;
      } else if (variant == 2) {
        c.bias = FLASHATTN_BIAS_ALIBI;
        c.p_drop = 0.2f;
        c.seed = 11;
      }
      gpu_check(c);
    }
}

TEST_CASE("gpu: varlen tokens past the last offset are zero (O, gradients) and -inf (LSE)", "[gpu][fwd][bwd]") {
  REQUIRE_GPU();
  uint64_t seed = 3650;
  // Head dims every GPU serves (the d=256 backward needs more than 99 KB of shared memory).
  for (int64_t d : {64, 128, 192})
    for (flashattn_dtype_t t : kGpuDtypes) {
      Config c = gbase("gpu varlen uncovered tail", 1, 1, d, t, ++seed);
      c.hq = 4;
      c.hkv = 2;
      c.seqlens_q = {70, 200, 90, 0};
      c.seqlens_k = {130, 33, 0, 150};
      c.unannounced_tail = 2;
      c.band = d == 128;
      c.wr = 0;
      gpu_check(c);
      if (d == 64) {
        c.algorithm = FLASHATTN_ALGORITHM_STANDARD;
        gpu_check(c);
      }
    }
}

TEST_CASE("gpu: strided layouts", "[gpu][fwd][bwd]") {
  REQUIRE_GPU();
  uint64_t seed = 3700;
  for (Layout L : {Layout::BHSD, Layout::Padded, Layout::Mixed, Layout::BcastBatch})
    for (flashattn_dtype_t t : kGpuDtypes) {
      Config c = gbase("gpu strides", 70, 90, 64, t, ++seed);
      c.batch = 3;
      c.hq = 4;
      c.hkv = 2;
      c.layout = L;
      gpu_check(c);
    }
}

// fp32 tensors need only element alignment on the flash path: paddings of odd element
// counts (pointers and strides 4-byte aligned only), with masks, bias and dropout.
TEST_CASE("gpu: fp32 takes element-aligned strides", "[gpu][fwd][bwd]") {
  REQUIRE_GPU();
  uint64_t seed = 3750;
  for (Layout L : {Layout::Padded, Layout::Mixed, Layout::BcastBatch}) {
    Config c = base_config("gpu fp32 odd strides", 97, 131, 72, FLASHATTN_DTYPE_FP32, ++seed);
    c.batch = 2;
    c.hq = 6;
    c.hkv = 2;
    c.layout = L;
    c.band = true;
    c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
    c.wl = 40;
    c.wr = 3;
    c.bias = FLASHATTN_BIAS_TENSOR;
    c.bias_bcast[1] = true;
    c.p_drop = 0.15f;
    c.seed = seed;
    gpu_check(c);
  }
}

TEST_CASE("gpu: dropout matches the reference and the CPU backend's masks exactly", "[gpu][dropout][fwd][bwd]") {
  REQUIRE_GPU();
  for (float p : {0.1f, 0.5f, 0.9f})
    for (flashattn_dtype_t t : kGpuDtypes) {
      Config c = gbase("gpu dropout masks", 64, 64, 64, t, 3800 + static_cast<uint64_t>(p * 10));
      c.batch = 2;
      c.hq = c.hkv = 2;
      c.p_drop = p;
      c.seed = 0xabcdef0123ull;
      c.offset = 0xfffffff0ull;  // carries into the high counter word
      c.input_scale = 0.5;
      DeviceMem dev;
      HostMem host;
      const Masks mg = recover_dropout_masks(c, dev, kGpuTolerance);
      const Masks mc = recover_dropout_masks(c, host);
      INFO(describe(c) << " gpu: " << mg.error << " cpu: " << mc.error);
      REQUIRE(mg.ok);
      REQUIRE(mc.ok);
      CHECK(mg.fwd == mc.fwd);
      CHECK(mg.bwd == mc.bwd);
      CHECK(mg.fwd == mg.bwd);
    }
  Config c = gbase("gpu dropout combined", 150, 170, 64, FLASHATTN_DTYPE_BF16, 3850);
  c.hq = 4;
  c.hkv = 2;
  c.p_drop = 0.3f;
  c.seed = 9;
  c.band = true;
  c.wr = 0;
  c.bias = FLASHATTN_BIAS_TENSOR;
  c.bias_bcast[0] = true;
  gpu_check(c);
}

TEST_CASE("gpu: a drop probability below 2^-17 (threshold 0) gives bitwise the p = 0 results",
          "[gpu][dropout][fwd][bwd]") {
  REQUIRE_GPU();
  DeviceMem dev;
  // fa2's dropout-free kernels, and at head dim 128 on compute capability 9.0 fa3's, which
  // serves dropout-free runs only; the standard algorithm's softmax kernels.
  Config c = gbase("gpu dropout below threshold", 200, 300, 64, FLASHATTN_DTYPE_FP16, 3880);
  check_dropout_below_threshold_is_off(c, dev);
  c = gbase("gpu dropout below threshold, causal GQA", 300, 200, 128, FLASHATTN_DTYPE_BF16, 3881);
  c.hq = 4;
  c.hkv = 2;
  c.band = true;
  c.wr = 0;
  check_dropout_below_threshold_is_off(c, dev);
  c = gbase("gpu dropout below threshold, standard", 100, 130, 64, FLASHATTN_DTYPE_BF16, 3882);
  c.algorithm = FLASHATTN_ALGORITHM_STANDARD;
  check_dropout_below_threshold_is_off(c, dev);
}

TEST_CASE("gpu: dropout alone over whole and partial tiles at every kernel head dim", "[gpu][dropout][fwd][bwd]") {
  REQUIRE_GPU();
  // Dropout without any other option takes the backward's fast path (its own flavor, with
  // masked and unmasked tiles: lengths of whole 128-key tiles and of partial ones), at
  // the head dims of every backward kernel, causal or not, GQA and varlen.
  uint64_t seed = 3900;
  for (int64_t d : {32, 64, 96, 128, 192, 256})
    for (int mask = 0; mask < 2; ++mask) {
      ++seed;
      Config c = gbase("gpu dropout alone", mask ? 256 : 200, mask ? 300 : 256, d, kGpuDtypes[seed % 2], seed);
      c.hq = 4;
      c.hkv = 2;
      c.p_drop = 0.15f;
      c.seed = seed * 7919;
      c.band = mask == 1;
      c.wr = 0;
      gpu_check(c);
    }
  Config c = gbase("gpu dropout alone varlen", 1, 1, 64, FLASHATTN_DTYPE_BF16, 3950);
  c.seqlens_q = {0, 130, 1, 257};
  c.seqlens_k = {3, 129, 300, 257};
  c.p_drop = 0.25f;
  c.seed = 77;
  gpu_check(c);
  c.name = "gpu dropout alone varlen causal bottom-right";
  c.band = true;
  c.wr = 0;
  c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
  gpu_check(c);
}

TEST_CASE("gpu: every option combined on generated configurations", "[gpu][fwd][bwd]") {
  REQUIRE_GPU();
  uint64_t state = 0x6e7;
  auto rnd = [&](uint64_t n) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return (state >> 33) % n;
  };
  const int64_t lens[] = {1, 17, 63, 65, 128, 129, 200};
  const int64_t dims[] = {32, 40, 64, 72, 96, 128};
  const int64_t heads[][2] = {{2, 1}, {4, 2}, {3, 3}, {8, 1}};
  for (int n = 0; n < 24; ++n) {
    Config c;
    c.name = "gpu combined #" + std::to_string(n);
    c.pad16 = true;
    c.data_seed = 3900 + n;
    c.dtype = kGpuDtypes[rnd(3)];
    c.batch = 1 + rnd(2);
    c.sq = lens[rnd(7)];
    c.sk = lens[rnd(7)];
    c.dqk = c.dv = dims[rnd(6)];
    const auto& h = heads[rnd(4)];
    c.hq = h[0];
    c.hkv = h[1];
    c.layout = static_cast<Layout>(rnd(5));
    if (rnd(2)) {
      c.band = true;
      c.align = static_cast<flashattn_mask_align_t>(rnd(2));
      c.wl = rnd(3) == 0 ? -1 : static_cast<int64_t>(rnd(40));
      c.wr = rnd(2) ? 0 : static_cast<int64_t>(rnd(20)) - 1;
    }
    if (rnd(3) == 0) c.softcap = 2.f + static_cast<float>(rnd(30));
    switch (rnd(4)) {
      case 1:
        c.bias = FLASHATTN_BIAS_TENSOR;
        for (int d = 0; d < 3; ++d) c.bias_bcast[d] = rnd(3) == 0;
        break;
      case 2: c.bias = FLASHATTN_BIAS_ALIBI; break;
      case 3: c.bias = FLASHATTN_BIAS_ALIBI_SYMMETRIC; break;
      default: break;
    }
    if (rnd(3) == 0) {
      c.p_drop = 0.1f + 0.2f * static_cast<float>(rnd(3));
      c.seed = rnd(1000000);
    }
    if (rnd(3) == 0) {
      c.sparse = true;
      c.block_q = rnd(2) ? 128 : 1 + static_cast<int64_t>(rnd(64));
      c.block_k = rnd(2) ? 64 : 1 + static_cast<int64_t>(rnd(64));
      c.layout_heads = rnd(2) ? 1 : c.hq;
    }
    if (rnd(4) == 0 && !c.sparse) {
      for (int64_t b = 0; b < c.batch + 1; ++b) {
        c.seqlens_q.push_back(static_cast<int>(rnd(4) == 0 ? 0 : 1 + rnd(static_cast<uint64_t>(c.sq))));
        c.seqlens_k.push_back(static_cast<int>(rnd(4) == 0 ? 0 : 1 + rnd(static_cast<uint64_t>(c.sk))));
      }
      if (c.layout == Layout::BcastBatch) c.layout = Layout::Padded;
    }
    gpu_check(c);
  }
}

TEST_CASE("gpu: deterministic backward is bitwise reproducible", "[gpu][bwd]") {
  REQUIRE_GPU();
  for (flashattn_dtype_t t : kGpuDtypes) {
    Config c = gbase("gpu deterministic", 300, 500, 64, t, 4000);
    c.batch = 2;
    c.hq = 8;
    c.hkv = 2;
    c.bias = FLASHATTN_BIAS_TENSOR;
    c.bias_bcast[0] = c.bias_bcast[1] = true;  // dBias summed over batch and heads
    gpu_check_deterministic(c);
  }
}

TEST_CASE("gpu: grad_accumulate adds the gradients to dQ, dK, dV", "[gpu][bwd][accumulate]") {
  REQUIRE_GPU();
  DeviceMem dev;
  uint64_t seed = 4700;
  // Every option (grad_accumulate_check.hpp) on FLASH (fa2 or fa3 for fp16, bf16; the fp32
  // kernels for fp32, atomics and the deterministic order) and STANDARD.
  for (flashattn_algorithm_t algo : {FLASHATTN_ALGORITHM_FLASH, FLASHATTN_ALGORITHM_STANDARD})
    for (flashattn_dtype_t t : {FLASHATTN_DTYPE_FP16, FLASHATTN_DTYPE_BF16, FLASHATTN_DTYPE_FP32}) {
      for (const Config& c : grad_accumulate_configs(t, algo, seed))
        check_grad_accumulate(c, dev, kGpuTolerance, false);
      seed += 20;
    }
  // Several q- and k-blocks per CTA: the dK/dV epilogue (on sm_90 through fp32 rows in
  // shared memory, for 192/128 reaching into the P and dS tiles) and every dQ reduction path
  // of the fa2 head-dim configurations, causal, GQA, atomics and the deterministic order.
  const int64_t dims[][2] = {{64, 64}, {128, 128}, {192, 192}, {192, 128}};
  for (const auto& d : dims)
    for (bool det : {false, true}) {
      Config c = gbase("gpu accumulate over several tiles", 300, 517, d[0],
                       d[0] == 128 ? FLASHATTN_DTYPE_BF16 : FLASHATTN_DTYPE_FP16, ++seed);
      c.dv = d[1];
      c.batch = 2;
      c.hq = 8;
      c.hkv = 2;
      c.band = true;
      c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
      c.wr = 0;
      c.deterministic = det;
      check_grad_accumulate(c, dev, kGpuTolerance, false);
    }
}

TEST_CASE("gpu: STANDARD algorithm matches the reference", "[gpu][fwd][bwd]") {
  REQUIRE_GPU();
  uint64_t seed = 4100;
  for (flashattn_dtype_t t : kGpuDtypes) {
    Config c = gbase("gpu standard", 129, 200, 64, t, ++seed);
    c.algorithm = FLASHATTN_ALGORITHM_STANDARD;
    c.hq = 4;
    c.hkv = 2;
    gpu_check(c);
    c.name = "gpu standard with options";
    c.band = true;
    c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
    c.wr = 0;
    c.softcap = 10.f;
    c.bias = FLASHATTN_BIAS_TENSOR;
    c.bias_bcast[0] = true;
    c.p_drop = 0.2f;
    c.seed = 5;
    c.dqk = 40;
    c.dv = 24;
    gpu_check(c);
  }
}

// The cases above keep most problems within one or two tiles, and their masks and options at
// head dim 64. The cases below run every kernel configuration over several q- and k-blocks
// (the tile loops, prefetch stages and dQ reduction paths differ by head dim), with masks
// and options at the large head dims. Cases with a head dim of 256 carry "head dim 256" in
// their names: a GPU with 99 KB of shared memory per block refuses that backward by design,
// and scripts/gpu_check.sh leaves them out under that limit.

TEST_CASE("gpu: head dims 32 to 192 over several q- and k-blocks", "[gpu][fwd][bwd]") {
  REQUIRE_GPU();
  const int64_t dims[][2] = {{32, 32}, {64, 64}, {96, 96}, {128, 128}, {192, 128}, {192, 192}};
  uint64_t seed = 4400;
  for (const auto& d : dims)
    for (flashattn_dtype_t t : kGpuDtypes) {
      Config c = gbase("gpu tiles", 197, 261, d[0], t, ++seed);
      c.dv = d[1];
      gpu_check(c);
    }
}

TEST_CASE("gpu: masks and options at head dims 128 and 192 over several tiles", "[gpu][fwd][bwd]") {
  REQUIRE_GPU();
  masks_over_tiles(128, 4450);
  options_over_tiles(128, 4500);
  Config c = gbase("gpu tiles dqk 192 dv 128 causal softcap", 333, 333, 192, FLASHATTN_DTYPE_BF16, 4550);
  c.dv = 128;
  c.hq = 6;
  c.hkv = 3;
  c.band = true;
  c.wr = 0;
  c.softcap = 20.f;
  gpu_check(c);
}

TEST_CASE("gpu: head dim 256 over several tiles with masks and options", "[gpu][fwd][bwd]") {
  REQUIRE_GPU();
  uint64_t seed = 4600;
  for (flashattn_dtype_t t : kGpuDtypes) gpu_check(gbase("gpu tiles d256", 197, 261, 256, t, ++seed));
  masks_over_tiles(256, 4610);
  options_over_tiles(256, 4650);
  Config c = gbase("gpu tiles d256 deterministic varlen", 1, 1, 256, FLASHATTN_DTYPE_BF16, 4690);
  c.seqlens_q = {50, 129, 1};
  c.seqlens_k = {300, 129, 64};
  gpu_check_deterministic(c);
}

TEST_CASE("gpu: block-sparse layouts with many lookups per tile and long skipped runs", "[gpu][fwd][bwd]") {
  REQUIRE_GPU();
  struct S {
    int64_t sq, sk, d, bq, bk, heads;
    double density;
    bool causal;
    float p_drop;
  };
  // 4x4 blocks: more than 32 layout lookups per tile; density 0.03 over 2100 keys: runs of
  // dozens of skipped tiles; 48x40: blocks that cut every tile.
  const S cases[] = {{200, 300, 64, 4, 4, 1, 0.7, false, 0.f},
                     {256, 2100, 128, 128, 64, 1, 0.03, false, 0.f},
                     {256, 2100, 32, 128, 32, 1, 0.03, true, 0.f},
                     {512, 640, 64, 48, 40, 1, 0.5, true, 0.1f},
                     {512, 640, 128, 128, 64, 4, 0.5, false, 0.f}};
  uint64_t seed = 4700;
  for (const S& s : cases) {
    ++seed;
    Config c = gbase("gpu tiles sparse", s.sq, s.sk, s.d, kGpuDtypes[seed % 3], seed);
    c.hq = 4;
    c.hkv = 2;
    c.sparse = true;
    c.block_q = s.bq;
    c.block_k = s.bk;
    c.layout_heads = s.heads;
    c.density = s.density;
    if (s.causal) {
      c.band = true;
      c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
      c.wr = 0;
    }
    if (s.p_drop > 0) {
      c.p_drop = s.p_drop;
      c.seed = 17;
    }
    gpu_check(c);
  }
}

TEST_CASE("gpu: deterministic backward over several tiles with masks and varlen", "[gpu][bwd]") {
  REQUIRE_GPU();
  Config c = gbase("gpu tiles deterministic causal", 300, 300, 128, FLASHATTN_DTYPE_BF16, 4800);
  c.band = true;
  c.wr = 0;
  gpu_check_deterministic(c);
  c = gbase("gpu tiles deterministic MQA", 257, 257, 64, FLASHATTN_DTYPE_FP16, 4801);
  c.hq = 4;
  c.hkv = 1;
  gpu_check_deterministic(c);
  c = gbase("gpu tiles deterministic block-sparse causal", 256, 256, 64, FLASHATTN_DTYPE_BF16, 4802);
  c.sparse = true;
  c.block_q = c.block_k = 64;
  c.band = true;
  c.wr = 0;
  gpu_check_deterministic(c);
  c = gbase("gpu tiles deterministic varlen bias(batch, queries) dropout", 1, 1, 64, FLASHATTN_DTYPE_FP16, 4803);
  c.seqlens_q = {50, 0, 70};
  c.seqlens_k = {64, 10, 30};
  c.hq = 4;
  c.hkv = 2;
  c.bias = FLASHATTN_BIAS_TENSOR;
  c.bias_bcast[0] = c.bias_bcast[2] = true;  // dBias summed over batch and queries
  c.p_drop = 0.1f;
  c.seed = 4;
  gpu_check_deterministic(c);
}

TEST_CASE("gpu: forward without an LSE output", "[gpu][fwd]") {
  REQUIRE_GPU();
  for (flashattn_dtype_t t : kGpuDtypes) {
    Config c = gbase("gpu no LSE", 260, 300, 128, t, 4900);
    c.layout = Layout::Padded;
    c.band = true;
    c.wr = 0;
    c.with_lse = false;
    c.backward = false;
    gpu_check(c);
  }
}

TEST_CASE("gpu: long sequences", "[gpu][fwd][bwd][slow]") {
  REQUIRE_GPU();
  Config c = gbase("gpu long causal", 1024, 1024, 64, FLASHATTN_DTYPE_FP16, 4200);
  c.band = true;
  c.wr = 0;
  gpu_check(c);
  c = gbase("gpu long gqa window", 1500, 2000, 128, FLASHATTN_DTYPE_BF16, 4201);
  c.hq = 2;
  c.hkv = 1;
  c.band = true;
  c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
  c.wl = 256;
  c.wr = 0;
  gpu_check(c);
  c = gbase("gpu long forward", 2000, 2000, 64, FLASHATTN_DTYPE_FP16, 4202);
  c.backward = false;
  gpu_check(c);
}

TEST_CASE("gpu: host pointers, misaligned pointers and a non-NULL stream", "[gpu][errors]") {
  REQUIRE_GPU();
  Config c = gbase("gpu args", 64, 64, 64, FLASHATTN_DTYPE_FP16, 4300);
  const Problem p = make_problem(c);
  flashattn_plan_t plan = nullptr;
  REQUIRE(flashattn_plan_create(&plan, FLASHATTN_BACKEND_CUDA, 0) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(configure_plan(plan, p) == FLASHATTN_STATUS_SUCCESS);
  size_t ws = 0;
  REQUIRE(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_FORWARD, &ws) == FLASHATTN_STATUS_SUCCESS);
  const size_t bytes = 64 * 2 * 64 * 2;
  void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *work = nullptr;
  REQUIRE(cudaMalloc(&q, bytes + 64) == cudaSuccess);
  REQUIRE(cudaMalloc(&k, bytes + 64) == cudaSuccess);
  REQUIRE(cudaMalloc(&v, bytes + 64) == cudaSuccess);
  REQUIRE(cudaMalloc(&o, bytes + 64) == cudaSuccess);
  REQUIRE(cudaMalloc(&work, ws + 16) == cudaSuccess);
  REQUIRE(cudaMemset(q, 0, bytes + 64) == cudaSuccess);
  REQUIRE(cudaMemset(k, 0, bytes + 64) == cudaSuccess);
  REQUIRE(cudaMemset(v, 0, bytes + 64) == cudaSuccess);
  std::vector<unsigned char> host_o(bytes + 64, kPoison);
  auto o_untouched = [&] {
    std::vector<unsigned char> back(bytes + 64);
    REQUIRE(cudaMemcpy(back.data(), o, back.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
    return back == std::vector<unsigned char>(bytes + 64, kPoison);
  };
  REQUIRE(cudaMemset(o, kPoison, bytes + 64) == cudaSuccess);
  flashattn_fwd_args_t a = FLASHATTN_FWD_ARGS_INIT;
  a.q = q;
  a.k = k;
  a.v = v;
  a.o = host_o.data();  // host memory on a CUDA plan
  flashattn_status_t st = flashattn_fwd(plan, &a, work, ws, nullptr);
  CHECK(flashattn_status_string(st) == std::string(flashattn_status_string(FLASHATTN_STATUS_WRONG_MEMORY_SPACE)));
  const std::string msg = flashattn_last_error();
  INFO("message: " << msg);
  CHECK((msg.rfind("o=", 0) == 0 || msg.find(" o=") != std::string::npos || msg.find("args.o") != std::string::npos ||
         msg.find("o ") == 0));
  CHECK(host_o == std::vector<unsigned char>(bytes + 64, kPoison));
  a.o = o;
  a.q = static_cast<unsigned char*>(q) + 2;  // element-aligned but not 16-byte aligned
  st = flashattn_fwd(plan, &a, work, ws, nullptr);
  CHECK(flashattn_status_string(st) == std::string(flashattn_status_string(FLASHATTN_STATUS_MISALIGNED_POINTER)));
  CHECK(o_untouched());
  a.q = q;
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  st = flashattn_fwd(plan, &a, work, ws, stream);  // a real stream is fine
  CHECK(st == FLASHATTN_STATUS_SUCCESS);
  CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
  CHECK_FALSE(o_untouched());
  cudaStreamDestroy(stream);
  for (void* ptr : {q, k, v, o, work}) cudaFree(ptr);
  flashattn_plan_destroy(plan);
}
