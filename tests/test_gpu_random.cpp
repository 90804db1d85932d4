// Configurations drawn at random, run on the CUDA backend against the fp64 reference and the
// CPU backend (gpu_check). Half the draws take only what the fa3 kernels serve (no bias,
// softcap, dropout, varlen or block-sparse layout; causal or no mask; GQA, any head dims,
// deterministic mode), at lengths of several of their tiles, so that the automatic path runs
// them there; the other half take any option. Draws are numbered from FA_GPU_RANDOM_SEED
// (default 1); ctest runs them in shards (FA_GPU_RANDOM_SHARD of kShards, each kPerShard
// draws; unset: every shard), so a failing draw is reproduced by its seed and shard.
#include <stdlib.h>

#include <string>

#include "catch_compat.hpp"
#include "gpu_check.hpp"
#include "gpu_mem.hpp"
#include "harness.hpp"

using namespace fat;

namespace {

constexpr int kShards = FA_GPU_RANDOM_SHARDS, kPerShard = 20;  // the shard count from tests/CMakeLists.txt

struct Rng {
  uint64_t state;
  uint64_t operator()(uint64_t n) {  // uniform in [0, n)
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return (state >> 33) % n;
  }
  bool chance(int percent) { return (*this)(100) < static_cast<uint64_t>(percent); }
};

// A length of 1 to about 1,100 tokens, short ones as likely as long ones.
int64_t draw_len(Rng& r) {
  const int64_t tops[] = {2, 8, 70, 200, 400, 1100};
  return 1 + static_cast<int64_t>(r(static_cast<uint64_t>(tops[r(6)])));
}

// A head dim: a kernel's own (64, 96, 128, 192, 256) or any of 1..256.
int64_t draw_dim(Rng& r) {
  const int64_t own[] = {64, 96, 128, 192, 256};
  return r.chance(60) ? own[r(5)] : 1 + static_cast<int64_t>(r(256));
}

void draw_mask(Rng& r, Config& c, bool any) {
  const uint64_t m = r(any ? 3 : 2);
  if (m == 0) return;
  c.band = true;
  c.align = static_cast<flashattn_mask_align_t>(r(2));
  c.wr = 0;
  if (m == 2) {  // a window
    c.wl = r(3) == 0 ? -1 : static_cast<int64_t>(r(300));
    c.wr = r(2) ? -1 : static_cast<int64_t>(r(50));
  }
}

void draw_options(Rng& r, Config& c) {
  if (r.chance(20)) c.softcap = 2.f + static_cast<float>(r(30));
  switch (r(5)) {
    case 1:
      c.bias = FLASHATTN_BIAS_TENSOR;
      for (int d = 0; d < 3; ++d) c.bias_bcast[d] = r(3) == 0;
      break;
    case 2:
      c.bias = FLASHATTN_BIAS_ALIBI;
      if (r(2)) c.alibi_batch_stride = c.hq + static_cast<int64_t>(r(3));
      break;
    case 3: c.bias = FLASHATTN_BIAS_ALIBI_SYMMETRIC; break;
    default: break;
  }
  if (r.chance(25)) {
    c.p_drop = 0.05f + 0.3f * static_cast<float>(r(3));
    c.seed = r(1000000);
  }
  if (r.chance(15)) {
    c.sparse = true;
    c.block_q = r(2) ? 128 : 1 + static_cast<int64_t>(r(96));
    c.block_k = r(2) ? 128 : 1 + static_cast<int64_t>(r(96));
    c.layout_heads = r(2) ? 1 : c.hq;
  } else if (r.chance(20)) {
    for (int64_t b = 0; b < c.batch + 1; ++b) {
      c.seqlens_q.push_back(static_cast<int>(r(5) == 0 ? 0 : 1 + r(static_cast<uint64_t>(c.sq))));
      c.seqlens_k.push_back(static_cast<int>(r(5) == 0 ? 0 : 1 + r(static_cast<uint64_t>(c.sk))));
    }
    if (c.layout == Layout::BcastBatch) c.layout = Layout::Padded;
  }
}

// Draw n of the sequence from seed: the lengths are drawn again until the fp64 reference's
// work (batch x heads x sq x sk x (dqk + dv)) stays below about 2e8 multiply-adds.
Config draw(uint64_t seed, int n) {
  Rng r{seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(n) * 0xbf58476d1ce4e5b9ull + 1};
  for (int i = 0; i < 4; ++i) r(2);
  Config c;
  const bool any = r(2) == 0;
  c.name = "gpu random, seed " + std::to_string(seed) + " draw " + std::to_string(n) + (any ? " (any option)" : "");
  c.pad16 = true;
  c.data_seed = seed * 100000 + static_cast<uint64_t>(n);
  c.dtype = r.chance(20) ? FLASHATTN_DTYPE_FP32 : kGpuDtypes[r(2)];
  c.batch = 1 + static_cast<int64_t>(r(3));
  c.hkv = 1 + static_cast<int64_t>(r(3));
  c.hq = c.hkv * (1 + static_cast<int64_t>(r(r(2) ? 2 : 8)));
  c.dqk = draw_dim(r);
  c.dv = r.chance(70) ? c.dqk : draw_dim(r);
  if (c.dqk == 192 && r(2)) c.dv = 128;
  do {
    c.sq = draw_len(r);
    c.sk = r.chance(50) ? c.sq : draw_len(r);
  } while (c.batch * c.hq * c.sq * c.sk * (c.dqk + c.dv) > 200000000);
  c.layout = static_cast<Layout>(r(5));
  draw_mask(r, c, any);
  c.deterministic = r.chance(25);
  if (any) draw_options(r, c);
  return c;
}

}  // namespace

TEST_CASE("gpu random: drawn configurations match the reference and the CPU backend", "[gpu][random]") {
  REQUIRE_GPU();
  const char* seed_text = getenv("FA_GPU_RANDOM_SEED");
  const char* shard_text = getenv("FA_GPU_RANDOM_SHARD");
  const uint64_t seed = seed_text ? strtoull(seed_text, nullptr, 10) : 1;
  const int first = shard_text ? atoi(shard_text) : 0, last = shard_text ? first : kShards - 1;
  for (int s = first; s <= last; ++s)
    for (int n = s * kPerShard; n < (s + 1) * kPerShard; ++n) gpu_check(draw(seed, n));
}
