// Forward and backward of the CPU backend against the fp64 reference (reference.hpp), for
// every option alone and combined, on awkward shapes. Each check bounds the library's max
// and mean error by the same-precision standard attention's error (harness.hpp), and
// requires exact O = 0 / LSE = -inf / dQ = 0 on fully masked rows and untouched padding in
// strided outputs.
#include <math.h>
#include <stdlib.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "catch_compat.hpp"
#include "harness.hpp"

using namespace fat;

namespace {

const flashattn_dtype_t kDtypes[3] = {FLASHATTN_DTYPE_FP16, FLASHATTN_DTYPE_BF16, FLASHATTN_DTYPE_FP32};

// Whether this process's bf16 forward and backward multiply on AMX tiles
// (src/cpu/cpu_impl.hpp, amx_products): the amx set is usable here and FLASHATTN_CPU_ISA
// does not pick another.
bool amx_active() {
  const char* env = getenv("FLASHATTN_CPU_ISA");
  return env != nullptr ? strcmp(env, "amx") == 0 : cpu_isa_usable("amx");
}

// A shape of the AMX tests, and its bf16 configuration.
struct AmxShape {
  int64_t sq, sk, dqk, dv, hq, hkv;
};

Config amx_config(const char* name, const AmxShape& sh, uint64_t seed) {
  Config c = base_config(name, sh.sq, sh.sk, sh.dqk, FLASHATTN_DTYPE_BF16, seed);
  c.dv = sh.dv;
  c.hq = sh.hq;
  c.hkv = sh.hkv;
  return c;
}

}  // namespace

// The AMX products' edges: odd head dims (a last pair with a zero half, K rows and Q^T
// padded to 32 head dims), dv off the 16-column unit (O^T's rows padded to 32), partial
// key tiles (V^T's last pair with one key, P^T's padding rows and columns), query tiles
// of 1-37 rows (32-row tile pairs), several 64-row tiles and 256-row blocks, head dim
// 256, GQA, and the backward (on tiles too) recomputing P from the LSE of the tile
// products, under every option that touches the scores or P. Each is checked against the
// fp64 reference under the suite's 1x bound.
TEST_CASE("bf16 forward on AMX tiles on awkward shapes", "[fwd][bwd]") {
  if (!amx_active())
    FA_SKIP_TEST("no AMX-BF16 here (or FLASHATTN_CPU_ISA picks another set): bf16 runs use the fp32 kernels");
  const AmxShape shapes[] = {{37, 77, 33, 20, 2, 1},     {130, 1, 16, 16, 2, 2},   {100, 129, 64, 64, 4, 2},
                             {300, 301, 128, 128, 2, 1}, {70, 65, 256, 256, 1, 1}, {9, 200, 1, 7, 3, 1},
                             {33, 64, 31, 128, 1, 1}};
  uint64_t seed = 1700;
  for (const AmxShape& sh : shapes)
    for (int variant = 0; variant < 3; ++variant) {
      Config c = amx_config("amx", sh, ++seed);
      if (variant == 1) {
        set_causal(c, 2);
        c.softcap = 4.f;
        c.p_drop = 0.25f;
        c.seed = 5;
      } else if (variant == 2) {
        c.bias = FLASHATTN_BIAS_ALIBI;
        c.band = true;
        c.wl = 20;
        c.wr = 3;
        c.layout = Layout::Padded;
      }
      run_and_check_cpu(c);
    }
}

// The AMX backward's edges (flash_bwd.cpp: every tile pair on S^T, its five products on
// tiles, Z and dS rounded to bf16): one query row or key, lengths off every tile (dQ, dK
// and dV written in whole 32-row blocks, Z^T and dS^T padded with zeros, dS transposed
// from a partial key tile), seqlen_q != seqlen_k under both causal alignments, odd head
// dims and dqk != dv, GQA (dK and dV summed over the group), the dot rows of a short last
// block (257 = 256 + 1 rows: their scores recomputed by dot products), dropout (Z without
// 1 / (1 - p), which scales dZ and dV), softcap, windows, ALiBi, a broadcast bias tensor
// with dBias (the two-pass schedule: dQ per query tile, dK and dV per key tile), strided
// layouts and varlen. Each is checked against the fp64 reference under the suite's 1x
// bound. (Gradient accumulation: test_grad_accumulate, run per set as cpu_isa.<set>.*.)
TEST_CASE("bf16 backward on AMX tiles on awkward shapes", "[bwd]") {
  if (!amx_active())
    FA_SKIP_TEST("no AMX-BF16 here (or FLASHATTN_CPU_ISA picks another set): bf16 runs use the fp32 kernels");
  const AmxShape shapes[] = {{1, 1, 16, 16, 1, 1},   {1, 200, 64, 64, 2, 1},     {200, 1, 32, 48, 2, 2},
                             {65, 63, 40, 24, 4, 2}, {127, 129, 128, 128, 2, 1}, {257, 70, 72, 72, 3, 1},
                             {33, 97, 31, 17, 2, 1}};
  uint64_t seed = 2700;
  for (const AmxShape& sh : shapes)
    for (int variant = 0; variant < 5; ++variant) {
      Config c = amx_config("amx bwd", sh, ++seed);
      if (variant == 1) {
        set_causal(c, 1);
        c.p_drop = 0.3f;
        c.seed = 9;
      } else if (variant == 2) {
        set_causal(c, 2);
        c.wl = 40;
        c.softcap = 3.f;
        c.layout = Layout::BHSD;
      } else if (variant == 3) {
        c.bias = FLASHATTN_BIAS_TENSOR;
        c.bias_bcast[2] = sh.sq % 2 == 1;  // a broadcast row of dBias: summed over the query tiles
        c.batch = 2;
      } else if (variant == 4) {
        c.bias = FLASHATTN_BIAS_ALIBI;
        c.band = true;
        c.wl = 50;
        c.wr = 7;
        c.p_drop = 0.2f;
        c.seed = 3;
        c.layout = Layout::Padded;
      }
      run_and_check_cpu(c);
    }
  Config c = base_config("amx bwd varlen", 1, 1, 40, FLASHATTN_DTYPE_BF16, 2800);
  c.seqlens_q = {70, 0, 1, 129};
  c.seqlens_k = {33, 5, 64, 130};
  c.batch = 4;
  c.hq = 4;
  c.hkv = 2;
  set_causal(c, 2);
  run_and_check_cpu(c);
}

TEST_CASE("dense attention on lengths that are not multiples of any tile", "[fwd][bwd]") {
  const int64_t pairs[][2] = {{1, 1},   {1, 17},    {17, 1},    {17, 17},   {63, 65},
                              {65, 63}, {127, 129}, {129, 127}, {200, 200}, {1, 200}};
  uint64_t seed = 100;
  for (const auto& pr : pairs)
    for (flashattn_dtype_t t : kDtypes) {
      if (pr[0] * pr[1] >= 127 * 127 && t == FLASHATTN_DTYPE_FP32) continue;  // keep the suite quick
      run_and_check_cpu(base_config("dense", pr[0], pr[1], pr[0] == 200 ? 64 : 40, t, ++seed));
    }
}

TEST_CASE("head dimensions including dqk != dv", "[fwd][bwd]") {
  const int64_t dims[][2] = {{8, 8},     {40, 40}, {64, 64}, {72, 72}, {128, 128}, {256, 256},
                             {192, 128}, {40, 24}, {24, 40}, {1, 1},   {3, 5},     {256, 8}};
  uint64_t seed = 200;
  for (const auto& d : dims) {
    ++seed;
    Config c = base_config("head dim", 33, 47, d[0], seed % 2 ? FLASHATTN_DTYPE_FP16 : FLASHATTN_DTYPE_BF16, seed);
    c.dv = d[1];
    run_and_check_cpu(c);
  }
  Config c = base_config("head dim fp32", 9, 21, 256, FLASHATTN_DTYPE_FP32, 250);
  c.dv = 72;
  run_and_check_cpu(c);
}

TEST_CASE("GQA and MQA", "[fwd][bwd]") {
  const int64_t heads[][2] = {{8, 2}, {6, 1}, {4, 4}, {3, 3}, {12, 4}};
  uint64_t seed = 300;
  for (const auto& h : heads)
    for (flashattn_dtype_t t : kDtypes) {
      Config c = base_config("gqa", 29, 37, 32, t, ++seed);
      c.hq = h[0];
      c.hkv = h[1];
      c.batch = 2;
      run_and_check_cpu(c);
    }
}

// Forwards of at most 8 query rows per sequence take the decode schedule (cpu_impl.hpp):
// query heads packed per kv head, whole GQA groups per task while their rows fit 64 (8
// heads of 8 rows, 32 heads of 2), else 64 / rows heads of a group per task, so a task's
// heads may end inside a group (32 heads of one kv head with 3 rows: 21 per task); keys
// split into ranges merged after (from 512 keys on), with windows of 256 keys.
TEST_CASE("decode schedule: GQA groups split across tasks, key splits, masks", "[fwd][bwd]") {
  const int64_t heads[][2] = {{8, 2}, {32, 1}, {5, 5}, {12, 4}};
  const int64_t rows[] = {1, 3, 8};
  uint64_t seed = 900;
  for (const auto& h : heads)
    for (int64_t sq : rows)
      for (flashattn_dtype_t t : kDtypes) {
        Config c = base_config("decode", sq, 1100, 32, t, ++seed);
        c.hq = h[0];
        c.hkv = h[1];
        c.batch = 2;
        c.band = sq > 1;  // causal, bottom-right (the last row sees every key)
        c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
        c.wr = 0;
        c.wl = sq == 8 ? 700 : -1;  // a window that skips whole splits
        run_and_check_cpu(c);
      }
}

// A varlen decode splits its keys as the dense one does (the split count from the shape,
// each sequence's keys split by its own length), and the merge places each sequence's rows
// at its tokens: sequences with no query row, with no key, and shorter than one split.
TEST_CASE("varlen decode: key splits, empty sequences, the dense decode's bits", "[fwd][bwd]") {
  uint64_t seed = 960;
  for (flashattn_dtype_t t : kDtypes) {
    Config c = base_config("varlen decode", 1, 1, 32, t, ++seed);
    c.hq = 8;
    c.hkv = 2;
    c.seqlens_q = {1, 0, 1, 1, 1};
    c.seqlens_k = {1500, 700, 0, 333, 40};
    run_and_check_cpu(c);

    Config dense = base_config("dense decode", 1, 1500, 40, t, ++seed);
    dense.batch = 2;
    dense.hq = 8;
    dense.hkv = 2;
    Config packed = dense;
    packed.batch = 1;
    packed.sk = 1;
    packed.seqlens_q = {1, 1};
    packed.seqlens_k = {1500, 1500};
    const LibResult a = run_cpu(make_problem(dense)), b = run_cpu(make_problem(packed));
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK(a.o == b.o);
    CHECK(a.lse == b.lse);
  }
}

TEST_CASE("causal mask with seqlen_q != seqlen_k in both alignments", "[fwd][bwd]") {
  const int64_t shapes[][2] = {{17, 65}, {65, 17}, {1, 63}, {63, 1}, {64, 64}, {129, 127}};
  uint64_t seed = 400;
  for (const auto& s : shapes)
    for (auto align : {FLASHATTN_ALIGN_TOP_LEFT, FLASHATTN_ALIGN_BOTTOM_RIGHT})
      for (flashattn_dtype_t t : {FLASHATTN_DTYPE_FP16, FLASHATTN_DTYPE_BF16}) {
        Config c = base_config("causal", s[0], s[1], 64, t, ++seed);
        c.band = true;
        c.align = align;
        c.wr = 0;
        c.batch = 2;
        run_and_check_cpu(c);
      }
}

TEST_CASE("sliding windows in both alignments", "[fwd][bwd]") {
  const int64_t windows[][2] = {{8, 0}, {4, 4}, {0, 0}, {16, -1}, {-1, 3}, {0, 7}, {30, 2}};
  uint64_t seed = 500;
  for (const auto& w : windows)
    for (auto align : {FLASHATTN_ALIGN_TOP_LEFT, FLASHATTN_ALIGN_BOTTOM_RIGHT}) {
      ++seed;
      Config c = base_config("window", seed % 2 ? 45 : 70, seed % 2 ? 70 : 45, 40,
                             seed % 3 ? FLASHATTN_DTYPE_FP16 : FLASHATTN_DTYPE_BF16, seed);
      c.band = true;
      c.align = align;
      c.wl = w[0];
      c.wr = w[1];
      run_and_check_cpu(c);
    }
}

TEST_CASE("fully masked rows give O = 0 and LSE = -inf and zero gradients", "[fwd][bwd]") {
  // Bottom-right causal with seqlen_q > seqlen_k: the first sq - sk rows see no key.
  Config c = base_config("bottom-right causal sq > sk", 40, 13, 32, FLASHATTN_DTYPE_FP16, 601);
  c.band = true;
  c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
  c.wr = 0;
  run_and_check_cpu(c);
  // A window that excludes every key of the rows past the end of K.
  c = base_config("window excluding all keys", 30, 9, 16, FLASHATTN_DTYPE_BF16, 602);
  c.band = true;
  c.wl = 0;
  c.wr = 0;
  run_and_check_cpu(c);
  // Block-sparse layout with a row of zero blocks.
  c = base_config("sparse zero row", 48, 40, 32, FLASHATTN_DTYPE_FP16, 603);
  c.sparse = true;
  c.block_q = 16;
  c.block_k = 8;
  c.zero_row_block = 1;
  run_and_check_cpu(c);
  // A bias row of -inf.
  c = base_config("bias -inf row", 20, 33, 16, FLASHATTN_DTYPE_FP32, 604);
  c.bias = FLASHATTN_BIAS_TENSOR;
  c.bias_inf_row = 7;
  run_and_check_cpu(c);
  c.dtype = FLASHATTN_DTYPE_FP16;
  c.bias_bcast[0] = true;
  run_and_check_cpu(c);
  // Varlen: a sequence with queries but no keys.
  c = base_config("varlen empty keys", 1, 1, 16, FLASHATTN_DTYPE_FP16, 605);
  c.seqlens_q = {5, 7, 3};
  c.seqlens_k = {6, 0, 4};
  run_and_check_cpu(c);
}

TEST_CASE("softcap", "[fwd][bwd]") {
  uint64_t seed = 700;
  for (float cap : {2.f, 10.f, 50.f})
    for (flashattn_dtype_t t : kDtypes) {
      Config c = base_config("softcap", 37, 53, 32, t, ++seed);
      c.scale = 0.5f;
      c.softcap = cap;
      c.input_scale = 1.5;
      run_and_check_cpu(c);
    }
  Config c = base_config("softcap causal", 64, 64, 64, FLASHATTN_DTYPE_BF16, 710);
  c.softcap = 5.f;
  c.band = true;
  c.wr = 0;
  run_and_check_cpu(c);
}

TEST_CASE("bias tensor with broadcast strides and dBias summed over broadcast dims", "[fwd][bwd]") {
  const bool patterns[][4] = {{false, false, false, false}, {true, false, false, false}, {false, true, false, false},
                              {true, true, false, false},   {false, false, true, false}, {true, true, true, false},
                              {false, false, false, true},  {true, false, true, true}};
  uint64_t seed = 800;
  for (const auto& pat : patterns)
    for (flashattn_dtype_t t : kDtypes) {
      Config c = base_config("bias", 19, 33, 16, t, ++seed);
      c.batch = 2;
      c.hq = 3;
      c.hkv = 1;
      c.bias = FLASHATTN_BIAS_TENSOR;
      for (int d = 0; d < 4; ++d) c.bias_bcast[d] = pat[d];
      run_and_check_cpu(c);
    }
  Config c = base_config("bias without dBias", 19, 33, 16, FLASHATTN_DTYPE_FP16, 850);
  c.bias = FLASHATTN_BIAS_TENSOR;
  c.want_dbias = false;
  run_and_check_cpu(c);
}

TEST_CASE("ALiBi both kinds and both alignments", "[fwd][bwd]") {
  uint64_t seed = 900;
  for (auto kind : {FLASHATTN_BIAS_ALIBI, FLASHATTN_BIAS_ALIBI_SYMMETRIC})
    for (auto align : {FLASHATTN_ALIGN_TOP_LEFT, FLASHATTN_ALIGN_BOTTOM_RIGHT})
      for (int shape = 0; shape < 2; ++shape) {
        ++seed;
        Config c = base_config("alibi", shape ? 50 : 23, shape ? 23 : 50, 32,
                               seed % 2 ? FLASHATTN_DTYPE_FP16 : FLASHATTN_DTYPE_BF16, seed);
        c.hq = 4;
        c.hkv = 2;
        c.bias = kind;
        c.align = align;
        run_and_check_cpu(c);
        c.band = true;  // with a causal mask on the same alignment
        c.wr = 0;
        c.dtype = FLASHATTN_DTYPE_FP32;
        run_and_check_cpu(c);
      }
}

TEST_CASE("ALiBi slopes per (batch, head) with every other option", "[fwd][bwd]") {
  uint64_t seed = 950;
  // Batch strides: packed rows, rows with NaN gaps, overlapping rows (stride below heads_q).
  for (int64_t stride : {4, 7, 1})
    for (auto kind : {FLASHATTN_BIAS_ALIBI, FLASHATTN_BIAS_ALIBI_SYMMETRIC}) {
      ++seed;
      Config c =
          base_config("alibi per batch", 29, 41, 24, seed % 2 ? FLASHATTN_DTYPE_FP16 : FLASHATTN_DTYPE_BF16, seed);
      c.batch = 3;
      c.hq = 4;
      c.hkv = 2;
      c.bias = kind;
      c.alibi_batch_stride = stride;
      c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
      run_and_check_cpu(c);
      c.name = "alibi per batch, causal, softcap, dropout, mixed layout";
      c.band = true;
      c.wr = 0;
      c.softcap = 6.f;
      c.p_drop = 0.15f;
      c.seed = seed;
      c.layout = Layout::Mixed;
      run_and_check_cpu(c);
      c.name = "alibi per batch, window, block-sparse, deterministic, fp32";
      c.dtype = FLASHATTN_DTYPE_FP32;
      c.align = FLASHATTN_ALIGN_TOP_LEFT;
      c.wl = 9;
      c.wr = 3;
      c.sparse = true;
      c.block_q = 8;
      c.block_k = 16;
      c.layout_heads = 4;
      c.deterministic = true;
      c.layout = Layout::BcastBatch;
      run_and_check_cpu(c);
      c.name = "alibi per batch, varlen with empty sequences and an unannounced tail";
      c.sparse = false;
      c.layout = Layout::Padded;
      c.seqlens_q = {12, 0, 29, 5, 0};
      c.seqlens_k = {41, 3, 17, 0, 6};
      c.batch = 5;
      c.unannounced_tail = 2;
      run_and_check_cpu(c);
      c.name = "alibi per batch, STANDARD, MQA";
      c.unannounced_tail = 0;
      c.seqlens_q.clear();
      c.seqlens_k.clear();
      c.batch = 2;
      c.hkv = 1;
      c.algorithm = FLASHATTN_ALGORITHM_STANDARD;
      run_and_check_cpu(c);
    }
}

TEST_CASE("set_bias resets the ALiBi batch stride: per-head slopes again", "[fwd]") {
  Config c = base_config("alibi reset", 17, 23, 16, FLASHATTN_DTYPE_FP32, 990);
  c.batch = 3;
  c.hq = 4;
  c.hkv = 4;
  c.bias = FLASHATTN_BIAS_ALIBI;
  c.alibi_batch_stride = 4;  // slopes [3, 4], each sequence's different
  c.backward = false;
  Problem p = make_problem(c);
  p.spec.slopes.resize(4);  // expected after the reset: the first row for every sequence
  flashattn_plan_t plan = nullptr;
  REQUIRE(flashattn_plan_create(&plan, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(configure_plan(plan, p) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_bias(plan, FLASHATTN_BIAS_ALIBI, nullptr) == FLASHATTN_STATUS_SUCCESS);
  HostMem mem;
  const LibResult r = run_on_plan(plan, p, mem);
  REQUIRE(r.ok());
  check_against_reference(p, r);
  flashattn_plan_destroy(plan);
}

TEST_CASE("block-sparse layouts", "[fwd][bwd]") {
  struct S {
    int64_t sq, sk, bq, bk, heads;
    double density;
  };
  const S cases[] = {{64, 64, 16, 16, 1, 0.5}, {70, 45, 7, 5, 4, 0.6},   {200, 130, 128, 64, 1, 0.7},
                     {33, 33, 1, 1, 4, 0.5},   {17, 90, 32, 32, 4, 0.4}, {129, 127, 64, 128, 1, 0.3}};
  uint64_t seed = 1000;
  for (const S& s : cases) {
    ++seed;
    Config c = base_config("sparse", s.sq, s.sk, 32, seed % 2 ? FLASHATTN_DTYPE_FP16 : FLASHATTN_DTYPE_BF16, seed);
    c.hq = 4;
    c.hkv = 2;
    c.sparse = true;
    c.block_q = s.bq;
    c.block_k = s.bk;
    c.layout_heads = s.heads;
    c.density = s.density;
    run_and_check_cpu(c);
  }
}

TEST_CASE("dropout matches the reference with the Philox mask", "[fwd][bwd][dropout]") {
  uint64_t seed = 1100;
  for (float p : {0.1f, 0.5f, 0.9f})
    for (flashattn_dtype_t t : kDtypes) {
      Config c = base_config("dropout", 31, 45, 32, t, ++seed);
      c.batch = 2;
      c.hq = 4;
      c.hkv = 2;
      c.p_drop = p;
      c.seed = 0x123456789abcdefull + seed;
      c.offset = seed * 1000;
      run_and_check_cpu(c);
    }
}

TEST_CASE("variable-length sequences including empty ones", "[fwd][bwd]") {
  struct V {
    std::vector<int> q, k;
  };
  const V cases[] = {{{5, 0, 17, 1}, {9, 4, 0, 1}},
                     {{0, 0, 65}, {0, 3, 63}},
                     {{1}, {1}},
                     {{33, 17, 64, 2, 0}, {20, 40, 64, 9, 11}},
                     {{100, 3}, {7, 120}}};
  uint64_t seed = 1200;
  for (const V& v : cases)
    for (int variant = 0; variant < 4; ++variant) {
      Config c = base_config("varlen", 1, 1, 32, kDtypes[variant % 3], ++seed);
      c.hq = 4;
      c.hkv = 2;
      c.seqlens_q = v.q;
      c.seqlens_k = v.k;
      if (variant == 1) {
        c.band = true;
        c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
        c.wr = 0;
      } else if (variant == 2) {
        c.band = true;
        c.align = FLASHATTN_ALIGN_TOP_LEFT;
        c.wl = 5;
        c.wr = 0;
        c.bias = FLASHATTN_BIAS_ALIBI;
      } else if (variant == 3) {
        c.bias = FLASHATTN_BIAS_TENSOR;
        c.bias_bcast[1] = true;
        c.p_drop = 0.3f;
        c.seed = 77;
      }
      run_and_check_cpu(c);
    }
  Config c = base_config("varlen block-sparse", 1, 1, 16, FLASHATTN_DTYPE_FP16, 1290);
  c.seqlens_q = {40, 0, 23};
  c.seqlens_k = {31, 12, 50};
  c.sparse = true;
  c.block_q = 8;
  c.block_k = 16;
  c.zero_row_block = 2;
  run_and_check_cpu(c);
}

TEST_CASE("varlen with every key sequence empty and strides derived from the empty extent", "[fwd][bwd]") {
  // total_k = 0: a BHSD layout of K/V/dK/dV has head stride seq*dim = 0. A tensor with no
  // elements cannot alias, so these strides are valid; every query row is fully masked.
  for (Layout L : {Layout::BSHD, Layout::BHSD}) {
    Config c = base_config("varlen all keys empty", 1, 1, 16, FLASHATTN_DTYPE_FP16, 1390);
    c.hq = 4;
    c.hkv = 2;
    c.seqlens_q = {3, 1};
    c.seqlens_k = {0, 0};
    c.layout = L;
    run_and_check_cpu(c);
  }
}

TEST_CASE("varlen tokens past the last offset: O = 0, LSE = -inf, zero gradients", "[fwd][bwd]") {
  // The totals of flashattn_plan_set_varlen may exceed the last offsets (a buffer sized for
  // the largest batch): the uncovered query tokens behave as a query sequence with no keys,
  // the uncovered keys as keys no query sees.
  uint64_t seed = 1270;
  for (flashattn_dtype_t t : kDtypes)
    for (bool options : {false, true}) {
      Config c = base_config("varlen uncovered tail", 1, 1, 32, t, ++seed);
      c.hq = 4;
      c.hkv = 2;
      c.seqlens_q = {7, 20, 9, 0};
      c.seqlens_k = {12, 5, 0, 6};
      c.unannounced_tail = 2;
      if (options) {
        c.band = true;
        c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
        c.wr = 0;
        c.p_drop = 0.2f;
        c.seed = 5;
      }
      run_and_check_cpu(c);
    }
}

TEST_CASE("arbitrary strides: BHSD and padded and mixed and batch-broadcast inputs", "[fwd][bwd]") {
  uint64_t seed = 1300;
  for (Layout L : {Layout::BHSD, Layout::Padded, Layout::Mixed, Layout::BcastBatch})
    for (flashattn_dtype_t t : kDtypes) {
      Config c = base_config("strides", 21, 34, 24, t, ++seed);
      c.batch = 3;
      c.hq = 4;
      c.hkv = 2;
      c.dv = 16;
      c.layout = L;
      run_and_check_cpu(c);
    }
  for (Layout L : {Layout::BHSD, Layout::Padded, Layout::Mixed}) {
    Config c = base_config("strides varlen", 1, 1, 24, FLASHATTN_DTYPE_FP16, ++seed);
    c.bogus_varlen_batch_stride = L == Layout::Mixed;  // "in varlen mode the batch stride is ignored"
    c.hq = 4;
    c.hkv = 2;
    c.seqlens_q = {7, 0, 30};
    c.seqlens_k = {12, 5, 19};
    c.layout = L;
    c.band = true;
    c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
    c.wr = 0;
    run_and_check_cpu(c);
  }
}

TEST_CASE("every option combined on generated configurations", "[fwd][bwd]") {
  // A fixed-seed random walk over the option space: each configuration draws a shape and
  // every option independently, so pairs and triples of options meet.
  uint64_t state = 0x5eed;
  auto rnd = [&](uint64_t n) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return (state >> 33) % n;
  };
  const int64_t lens[] = {1, 5, 17, 31, 63, 65, 100};
  const int64_t dims[] = {8, 16, 40, 64, 72};
  const int64_t heads[][2] = {{1, 1}, {2, 1}, {4, 2}, {3, 3}, {6, 2}};
  for (int n = 0; n < 36; ++n) {
    Config c;
    c.name = "combined #" + std::to_string(n);
    c.data_seed = 1400 + n;
    c.dtype = kDtypes[rnd(3)];
    c.batch = 1 + rnd(2);
    c.sq = lens[rnd(7)];
    c.sk = lens[rnd(7)];
    c.dqk = dims[rnd(5)];
    c.dv = rnd(3) == 0 ? dims[rnd(5)] : c.dqk;
    const auto& h = heads[rnd(5)];
    c.hq = h[0];
    c.hkv = h[1];
    c.layout = static_cast<Layout>(rnd(5));
    if (rnd(2)) {
      c.band = true;
      c.align = static_cast<flashattn_mask_align_t>(rnd(2));
      c.wl = rnd(3) == 0 ? -1 : static_cast<int64_t>(rnd(20));
      c.wr = rnd(2) ? 0 : static_cast<int64_t>(rnd(10)) - 1;
    } else if (rnd(2)) {
      c.align = static_cast<flashattn_mask_align_t>(rnd(2));
    }
    if (rnd(3) == 0) c.softcap = 1.f + static_cast<float>(rnd(20));
    switch (rnd(4)) {
      case 1:
        c.bias = FLASHATTN_BIAS_TENSOR;
        for (int d = 0; d < 4; ++d) c.bias_bcast[d] = rnd(3) == 0;
        if (rnd(4) == 0) c.bias_inf_row = 0;
        break;
      case 2: c.bias = FLASHATTN_BIAS_ALIBI; break;
      case 3: c.bias = FLASHATTN_BIAS_ALIBI_SYMMETRIC; break;
      default: break;
    }
    if (c.bias == FLASHATTN_BIAS_ALIBI || c.bias == FLASHATTN_BIAS_ALIBI_SYMMETRIC)
      c.alibi_batch_stride = static_cast<int64_t>(rnd(3)) * c.hq;  // per head, or per (batch, head) with gaps
    if (rnd(3) == 0) {
      c.p_drop = 0.05f + 0.2f * static_cast<float>(rnd(4));
      c.seed = rnd(1000000);
      c.offset = rnd(1000);
    }
    if (rnd(3) == 0) {
      c.sparse = true;
      c.block_q = 1 + static_cast<int64_t>(rnd(32));
      c.block_k = 1 + static_cast<int64_t>(rnd(32));
      c.layout_heads = rnd(2) ? 1 : c.hq;
      if (rnd(3) == 0) c.zero_row_block = 0;
    }
    if (rnd(3) == 0) {
      for (int64_t b = 0; b < c.batch + 1; ++b) {
        c.seqlens_q.push_back(static_cast<int>(rnd(3) == 0 ? 0 : 1 + rnd(static_cast<uint64_t>(c.sq))));
        c.seqlens_k.push_back(static_cast<int>(rnd(3) == 0 ? 0 : 1 + rnd(static_cast<uint64_t>(c.sk))));
      }
      if (c.layout == Layout::BcastBatch) c.layout = Layout::Padded;
    }
    if (c.sparse && !c.seqlens_q.empty()) {  // the layout covers the maximum lengths
      int mq = 1, mk = 1;
      for (size_t b = 0; b < c.seqlens_q.size(); ++b) {
        mq = std::max(mq, c.seqlens_q[b]);
        mk = std::max(mk, c.seqlens_k[b]);
      }
      c.sq = mq;
      c.sk = mk;
    }
    if (c.layout == Layout::BcastBatch && c.bias == FLASHATTN_BIAS_TENSOR && c.bias_inf_row >= 0) c.bias_inf_row = -1;
    if (c.bias_inf_row >= 0 && c.bias_bcast[2]) c.bias_inf_row = -1;
    run_and_check_cpu(c);
  }
}

TEST_CASE("STANDARD algorithm on the CPU matches the reference", "[fwd][bwd]") {
  Config c = base_config("standard dense", 65, 33, 64, FLASHATTN_DTYPE_FP16, 1500);
  c.algorithm = FLASHATTN_ALGORITHM_STANDARD;
  run_and_check_cpu(c);
  c = base_config("standard everything", 37, 50, 40, FLASHATTN_DTYPE_BF16, 1501);
  c.algorithm = FLASHATTN_ALGORITHM_STANDARD;
  c.hq = 4;
  c.hkv = 2;
  c.band = true;
  c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
  c.wl = 10;
  c.wr = 0;
  c.softcap = 8.f;
  c.bias = FLASHATTN_BIAS_TENSOR;
  c.bias_bcast[0] = true;
  c.p_drop = 0.2f;
  c.seed = 9;
  c.sparse = true;
  c.block_q = 8;
  c.block_k = 8;
  c.layout = Layout::Mixed;
  run_and_check_cpu(c);
  c.name = "standard varlen alibi";
  c.sparse = false;
  c.bias = FLASHATTN_BIAS_ALIBI_SYMMETRIC;
  c.bias_bcast[0] = false;
  c.seqlens_q = {12, 0, 37};
  c.seqlens_k = {50, 3, 20};
  c.dtype = FLASHATTN_DTYPE_FP32;
  run_and_check_cpu(c);
}

TEST_CASE("fp32 gradients agree with the fp64 reference to fp32 accuracy", "[bwd]") {
  Config c = base_config("fp32 gradients", 45, 61, 48, FLASHATTN_DTYPE_FP32, 1600);
  c.hq = 4;
  c.hkv = 2;
  c.softcap = 6.f;
  c.bias = FLASHATTN_BIAS_TENSOR;
  c.bias_bcast[1] = true;
  c.p_drop = 0.15f;
  c.seed = 4;
  c.band = true;
  c.wl = 20;
  c.wr = 3;
  const Problem p = make_problem(c);
  const LibResult r = run_cpu(p);
  REQUIRE(r.ok());
  const RefOutputs e = reference_fp64(p.spec, p.in, true);
  struct T {
    const char* name;
    const std::vector<double>& got;
    const std::vector<double>& ref;
  };
  for (const T& t : {T{"O", r.o, e.o}, T{"dQ", r.dq, e.dq}, T{"dK", r.dk, e.dk}, T{"dV", r.dv, e.dv},
                     T{"dBias", r.dbias, e.dbias}}) {
    const ErrStats s = error_stats(t.got, t.ref);
    INFO(t.name << ": max abs error " << s.max_abs << ", max |ref| " << s.max_ref);
    CHECK(s.nonfinite_mismatch == 0);
    CHECK(s.max_abs <= 2e-5 * (1.0 + s.max_ref));
  }
  check_against_reference(p, r);
}

TEST_CASE("LSE is optional in the forward", "[fwd][api]") {
  Config c = base_config("no LSE", 20, 30, 16, FLASHATTN_DTYPE_FP16, 1700);
  c.with_lse = false;
  c.backward = false;
  run_and_check_cpu(c);
}

TEST_CASE("softmax scale: explicit values and 0 restores the default", "[fwd][bwd][api]") {
  Config c = base_config("explicit scale", 20, 30, 16, FLASHATTN_DTYPE_FP32, 1800);
  c.scale = 0.9f;
  run_and_check_cpu(c);
  // Default (never set) vs set to 2 then reset with 0: bitwise identical outputs.
  c.scale = 0.f;
  const Problem p = make_problem(c);
  const LibResult def = run_cpu(p);
  REQUIRE(def.ok());
  flashattn_plan_t plan = nullptr;
  REQUIRE(flashattn_plan_create(&plan, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(configure_plan(plan, p) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_softmax_scale(plan, 2.f) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(flashattn_plan_set_softmax_scale(plan, 0.f) == FLASHATTN_STATUS_SUCCESS);
  HostMem mem;
  const LibResult reset = run_on_plan(plan, p, mem);
  flashattn_plan_destroy(plan);
  REQUIRE(reset.ok());
  CHECK(reset.raw_o == def.raw_o);
  CHECK(reset.raw_lse == def.raw_lse);
  CHECK(reset.raw_dq == def.raw_dq);
}

TEST_CASE("CPU gradients are bitwise reproducible with and without deterministic mode", "[bwd]") {
  Config c = base_config("reproducible", 70, 90, 32, FLASHATTN_DTYPE_BF16, 1900);
  c.hq = 4;
  c.hkv = 1;
  c.batch = 2;
  c.bias = FLASHATTN_BIAS_TENSOR;
  c.bias_bcast[0] = c.bias_bcast[1] = true;
  c.p_drop = 0.1f;
  for (bool det : {false, true}) {
    c.deterministic = det;
    const Problem p = make_problem(c);
    require_same_bits(run_cpu(p), run_cpu(p));
  }
}

TEST_CASE("moderately long sequences", "[fwd][bwd][slow]") {
  Config c = base_config("long causal", 512, 512, 64, FLASHATTN_DTYPE_FP16, 2000);
  c.band = true;
  c.wr = 0;
  run_and_check_cpu(c);
  c = base_config("long window gqa", 300, 700, 64, FLASHATTN_DTYPE_BF16, 2001);
  c.hq = 4;
  c.hkv = 1;
  c.band = true;
  c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
  c.wl = 128;
  c.wr = 0;
  c.backward = true;
  run_and_check_cpu(c);
}
