// Dropout: the Philox4x32-10 stream (Random123 known answers), the keying documented at
// flashattn_plan_set_dropout (recomputed here from the header text and pinned with literal
// 16-bit values computed independently), the threshold and the scale of kept values, and
// the library's masks, recovered from its outputs:
// with V = identity (seqlen_k <= head_dim_v) row i of O is row i of the dropped, rescaled P,
// and with dO = identity (seqlen_q <= head_dim_v) column i of dV is row i of it again, as
// the backward recomputes it.
#include <math.h>

#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "common/philox.h"
#include "harness.hpp"

using namespace fat;

namespace {

// The documented keying, spelled out from flashattn.h rather than calling dropout_keep:
// r is halfword j % 8 of the call's four words, the low half of a word first.
uint32_t documented_r(uint64_t seed, uint64_t offset, uint64_t b, uint64_t heads_q, uint64_t h, uint32_t i,
                      uint32_t j) {
  const uint64_t counter_hi = offset + b * heads_q + h;
  const flashattn::Philox4 w = flashattn::philox4x32_10(
      j / 8, i, static_cast<uint32_t>(counter_hi & 0xffffffffu), static_cast<uint32_t>(counter_hi >> 32),
      static_cast<uint32_t>(seed & 0xffffffffu), static_cast<uint32_t>(seed >> 32));
  return (w.x[(j % 8) / 2] >> (16 * (j % 2))) & 0xffffu;
}

// t = min(floor(p * 65536 + 1/2), 65535).
uint32_t documented_threshold(float p) {
  return static_cast<uint32_t>(fmin(floor(static_cast<double>(p) * 65536.0 + 0.5), 65535.0));
}

// Literal 16-bit values r of (b, h, i, j) from an independent implementation of
// Philox4x32-10 and of the header's keying (Python integers). Columns 0 and 1 (and 8 and 9)
// are the two halves of one word, so a swapped halfword order fails; the offsets near 2^32
// make offset + b*heads_q + h carry into the high word, and offset 2^64 - 1 wraps it to 4.
struct Pin {
  uint64_t seed, offset, b, heads_q, h;
  uint32_t i, j, r;
};
const Pin kPins[] = {
    {0x0123456789abcdefull, 0, 0, 4, 0, 0, 0, 0x222eu},
    {0x0123456789abcdefull, 0, 0, 4, 0, 0, 1, 0xb850u},
    {0x0123456789abcdefull, 0, 1, 4, 3, 17, 6, 0x9d0fu},
    {42, 0xfffffffeull, 0, 8, 5, 3, 8, 0x0b1eu},
    {42, 0xfffffffeull, 0, 8, 5, 3, 9, 0xc18cu},
    {42, 0xfffffffeull, 1, 8, 1, 0, 2, 0x7414u},
    {7, 3, 1, 2, 1, 11, 7, 0xfdfeu},
    {7, 3, 1, 2, 1, 11, 11, 0x0550u},
    {0xfedcba9876543210ull, 123456789012345ull, 2, 16, 15, 1000, 4092, 0x878fu},
    {0xfedcba9876543210ull, 123456789012345ull, 2, 16, 15, 1000, 4095, 0xc98eu},
    {0xffffffff00000001ull, 0xffffffffffffffffull, 1, 3, 2, 5, 3, 0x0f26u},
};

Masks library_masks(const Config& c) {
  HostMem mem;
  const Masks m = recover_dropout_masks(c, mem);
  INFO(m.error);
  REQUIRE(m.ok);
  return m;
}

Config mask_config(float p, uint64_t seed, uint64_t offset) {
  Config c;
  c.name = "mask recovery";
  c.batch = 2;
  c.sq = 64;
  c.sk = 64;
  c.hq = c.hkv = 3;
  c.dqk = 16;
  c.dv = 64;
  c.dtype = FLASHATTN_DTYPE_FP32;
  c.p_drop = p;
  c.seed = seed;
  c.offset = offset;
  c.data_seed = seed + 17;
  c.input_scale = 0.5;
  return c;
}

}  // namespace

TEST_CASE("Philox4x32-10 known answers (Random123 kat_vectors)", "[dropout]") {
  struct K {
    uint32_t c[4], k[2], out[4];
  };
  const K kat[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
       {0xffffffffu, 0xffffffffu},
       {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
       {0xa4093822u, 0x299f31d0u},
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (const K& t : kat) {
    const flashattn::Philox4 r = flashattn::philox4x32_10(t.c[0], t.c[1], t.c[2], t.c[3], t.k[0], t.k[1]);
    for (int w = 0; w < 4; ++w) CHECK(r.x[w] == t.out[w]);
  }
}

TEST_CASE("dropout_keep follows the keying documented in flashattn.h", "[dropout]") {
  for (const Pin& p : kPins) {
    INFO("seed " << p.seed << " offset " << p.offset << " (b,h,i,j)=(" << p.b << "," << p.h << "," << p.i << "," << p.j
                 << ")");
    CHECK(documented_r(p.seed, p.offset, p.b, p.heads_q, p.h, p.i, p.j) == p.r);
    // keep iff r >= threshold: a threshold equal to r keeps, one above drops.
    CHECK(flashattn::dropout_keep(p.seed, p.offset, p.b, p.heads_q, p.h, p.i, p.j, p.r));
    CHECK(!flashattn::dropout_keep(p.seed, p.offset, p.b, p.heads_q, p.h, p.i, p.j, p.r + 1));
  }
  // And the keying over a grid (every column of two Philox calls), including both 32-bit
  // halves of seed and offset.
  size_t mismatches = 0;
  for (uint64_t seed : {0ull, 1ull, 0x100000000ull, 0xdeadbeefcafef00dull})
    for (uint64_t offset : {0ull, 5ull, 0xffffffffull, 0x123400000000ull})
      for (uint32_t i = 0; i < 9; ++i)
        for (uint32_t j = 0; j < 17; ++j)
          for (uint64_t b = 0; b < 2; ++b)
            for (uint64_t h = 0; h < 3; ++h) {
              const uint32_t thr = documented_threshold(0.3f);
              const bool doc = documented_r(seed, offset, b, 3, h, i, j) >= thr;
              mismatches += doc != flashattn::dropout_keep(seed, offset, b, 3, h, i, j, thr);
            }
  CHECK(mismatches == 0);
}

TEST_CASE("the threshold rounds p * 65536 to nearest and the kept scale is 65536 / (65536 - t)", "[dropout]") {
  struct T {
    float p;
    uint32_t t;
  };
  // Literal thresholds: 0.1f * 65536 = 6553.6001 rounds up, halves round up (not to even),
  // p below 2^-17 drops nothing, and p close to 1 stops at 65535 (one value in 65536 kept).
  const T cases[] = {
      {0.f, 0u},
      {1e-6f, 0u},
      {7.6e-6f, 0u},       // p * 65536 = 0.498
      {7.7e-6f, 1u},       // 0.505
      {0.5f / 65536, 1u},  // exactly half
      {1.5f / 65536, 2u},
      {2.5f / 65536, 3u},
      {1000.4f / 65536, 1000u},
      {1000.6f / 65536, 1001u},
      {0.1f, 6554u},
      {0.25f, 16384u},
      {0.5f, 32768u},
      {0.9f, 58982u},
      {0.999f, 65470u},
      {0.99999f, 65535u},              // 65535.34
      {65534.5f / 65536, 65535u},      // exactly half below the cap
      {nextafterf(1.f, 0.f), 65535u},  // 65535.996: the cap
  };
  for (const T& c : cases) {
    INFO("p = " << c.p);
    CHECK(flashattn::dropout_threshold(c.p) == c.t);
    CHECK(documented_threshold(c.p) == c.t);
    const double scale = flashattn::dropout_keep_scale(c.t);
    CHECK(scale >= 1.0);  // finite, not NaN
    CHECK(scale <= 65536.0);
    CHECK(scale == 65536.0 / (65536.0 - c.t));
    // The expectation of a kept-and-scaled 1 is exactly 1.
    CHECK(scale * (65536.0 - c.t) / 65536.0 == Approx(1.0).epsilon(1e-15));
  }
  CHECK(flashattn::dropout_keep_scale(0) == 1.0);
  CHECK(flashattn::dropout_keep_scale(65535) == 65536.0);
  CHECK(flashattn::dropout_keep_scale(6554) == Approx(1.1111186464).epsilon(1e-9));  // 1 / (1 - 0.1) = 1.1111111
}

TEST_CASE("dropout_keep keeps a fraction 1 - t / 65536 of the elements, in every column of a call", "[dropout]") {
  // 2^21 decisions per p (2^18 per column position j % 8): each fraction within 5 standard
  // deviations of the keep probability, which is within 2^-17 of 1 - p.
  for (float p : {1e-6f, 0.1f, 0.5f, 0.9f, 0.99999f}) {
    const uint32_t thr = flashattn::dropout_threshold(p);
    const double keep = 1.0 - thr / 65536.0;
    CHECK(fabs(keep - (1.0 - static_cast<double>(p))) <= 1.0 / 131072);
    size_t kept[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const uint32_t rows = 512, cols = 4096;
    for (uint32_t i = 0; i < rows; ++i)
      for (uint32_t j = 0; j < cols; ++j) kept[j % 8] += flashattn::dropout_keep(99, 12345, 1, 6, 2, i, j, thr);
    size_t total = 0;
    for (int c = 0; c < 8; ++c) {
      const double n = rows * cols / 8.0;
      INFO("p = " << p << " column " << c << ": kept " << kept[c] << " of " << n);
      CHECK(fabs(static_cast<double>(kept[c]) - n * keep) <= 5.0 * sqrt(n * keep * (1.0 - keep)) + 1.0);
      total += kept[c];
    }
    const double n = static_cast<double>(rows) * cols;
    INFO("p = " << p << ": kept " << total << " of " << n);
    CHECK(fabs(static_cast<double>(total) - n * keep) <= 5.0 * sqrt(n * keep * (1.0 - keep)) + 1.0);
  }
}

TEST_CASE("library keep decisions are pinned to the documented 16-bit values", "[dropout][fwd]") {
  // Each pin of kPins inside a 2 x 20 x 12 problem, value r, is run twice: p = (r + 0.4) /
  // 65536 rounds to t = r, which keeps it; p = (r + 0.6) / 65536 rounds to r + 1, which
  // drops it. That pins the value exactly, and a threshold that truncated (floor) or rounded
  // up (ceil) fails one side.
  size_t run = 0;
  for (const Pin& pin : kPins) {
    if (pin.b >= 2 || pin.i >= 20 || pin.j >= 12) continue;
    ++run;
    for (int side = 0; side < 2; ++side) {
      const double target = (static_cast<double>(pin.r) + (side == 0 ? 0.4 : 0.6)) / 65536.0;
      Config c = mask_config(static_cast<float>(target), pin.seed, pin.offset);
      c.hq = c.hkv = static_cast<int64_t>(pin.heads_q);
      c.sq = 20;
      c.sk = 12;
      c.dv = 20;
      const Masks m = library_masks(c);
      INFO("pin (b,h,i,j)=(" << pin.b << "," << pin.h << "," << pin.i << "," << pin.j << ") p=" << c.p_drop);
      REQUIRE(m.ok);
      const int64_t row = (static_cast<int64_t>(pin.b) * c.sq + pin.i) * c.hq + static_cast<int64_t>(pin.h);
      CHECK(m.fwd[row * c.sk + pin.j] == (side == 0 ? 1 : 0));
      CHECK(m.bwd[row * c.sk + pin.j] == (side == 0 ? 1 : 0));
    }
  }
  CHECK(run == 9);
}

TEST_CASE("the library scales kept values by 65536 / (65536 - t), not by 1 / (1 - p)", "[dropout][fwd]") {
  // The kept values of the recovered P divided by those of the same problem without
  // dropout. At p = 0.99, t = 64881 and the scale is 65536 / 655 = 100.055, 5.5e-4 above
  // 1 / (1 - p); at p = 1e-6, t = 0: nothing is dropped and nothing rescaled.
  const Masks plain = library_masks(mask_config(0.f, 4242, 3));
  REQUIRE(plain.ok);
  const struct {
    float p;
    double scale;
  } cases[] = {{0.99f, 65536.0 / 655.0}, {1e-6f, 1.0}};
  for (const auto& k : cases) {
    const Masks m = library_masks(mask_config(k.p, 4242, 3));
    REQUIRE(m.ok);
    size_t kept = 0, bad = 0;
    for (size_t n = 0; n < m.fwd.size(); ++n) {
      if (!m.fwd[n]) continue;
      ++kept;
      bad += !(fabs(m.fwd_p[n] - plain.fwd_p[n] * k.scale) <= 1e-5 * plain.fwd_p[n] * k.scale);
    }
    INFO("p = " << k.p << ": " << bad << " of " << kept << " kept values not scaled by " << k.scale);
    CHECK(kept > (k.p < 0.5f ? m.fwd.size() - 1 : 100));
    CHECK(bad == 0);
  }
}

TEST_CASE("forward and backward masks equal dropout_keep and each other", "[dropout][fwd][bwd]") {
  for (float p : {0.1f, 0.5f, 0.9f}) {
    const Config c = mask_config(p, 1234567 + static_cast<uint64_t>(p * 100), 99);
    const Masks m = library_masks(c);
    INFO("p=" << p << " " << m.error);
    REQUIRE(m.ok);
    const Problem prob = make_problem(c);
    size_t fwd_bad = 0, bwd_bad = 0, kept = 0, n = 0;
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t i = 0; i < c.sq; ++i)
        for (int64_t h = 0; h < c.hq; ++h)
          for (int64_t j = 0; j < c.sk; ++j) {
            const int64_t idx = ((b * c.sq + i) * c.hq + h) * c.sk + j;
            const bool expect = ref_dropout_keep(prob.spec, b, h, i, j);
            fwd_bad += m.fwd[idx] != expect;
            bwd_bad += m.bwd[idx] != expect;
            kept += m.fwd[idx];
            ++n;
          }
    CHECK(fwd_bad == 0);
    CHECK(bwd_bad == 0);
    // Keep fraction ~ Binomial(n, 1 - p) / n: within 5 standard deviations.
    const double frac = static_cast<double>(kept) / static_cast<double>(n);
    const double sigma = sqrt(static_cast<double>(p) * (1.0 - p) / static_cast<double>(n));
    INFO("kept " << kept << " of " << n << " (" << frac << "), expected " << 1.0 - p << " +- " << 5 * sigma);
    CHECK(fabs(frac - (1.0 - p)) <= 5 * sigma);
  }
}

TEST_CASE("dropout masks in varlen mode use the sequence index and in-sequence positions", "[dropout][fwd][bwd]") {
  Config c = mask_config(0.4f, 555, 1000);
  c.sq = c.sk = 1;  // the maximum lengths follow from the sequences
  c.seqlens_q = {10, 0, 33, 5};
  c.seqlens_k = {7, 12, 40, 0};
  c.dv = 48;
  const Masks m = library_masks(c);
  REQUIRE(m.ok);
  const Problem prob = make_problem(c);
  const int64_t SK = prob.cfg.sk;
  size_t bad = 0, n = 0;
  for (int64_t b = 0; b < prob.spec.batch; ++b)
    for (int64_t i = 0; i < prob.spec.len_q(b); ++i)
      for (int64_t h = 0; h < c.hq; ++h)
        for (int64_t j = 0; j < prob.spec.len_k(b); ++j) {
          const int64_t row = (prob.spec.cu_q[b] + i) * c.hq + h;
          const bool expect = ref_dropout_keep(prob.spec, b, h, i, j);
          bad += (m.fwd[row * SK + j] != expect) + (m.bwd[row * SK + j] != expect);
          ++n;
        }
  CHECK(n > 0);
  CHECK(bad == 0);
}

TEST_CASE("different offsets and seeds give different masks and the offset advances by batch*heads_q",
          "[dropout][fwd]") {
  const Config a = mask_config(0.5f, 2024, 0);
  Config b = a;
  b.offset = a.batch * a.hq;  // the documented way to draw an independent mask
  Config s = a;
  s.seed = 2025;
  const Masks ma = library_masks(a), mb = library_masks(b), ms = library_masks(s);
  REQUIRE(ma.ok);
  REQUIRE(mb.ok);
  REQUIRE(ms.ok);
  auto agreement = [](const std::vector<uint8_t>& x, const std::vector<uint8_t>& y) {
    size_t same = 0;
    for (size_t n = 0; n < x.size(); ++n) same += x[n] == y[n];
    return static_cast<double>(same) / static_cast<double>(x.size());
  };
  // Independent masks at p = 0.5 agree on about half of the elements.
  CHECK(agreement(ma.fwd, mb.fwd) < 0.6);
  CHECK(agreement(ma.fwd, ms.fwd) < 0.6);
  // Sequence b, head h uses counter offset + b*heads_q + h: with offset = heads_q, batch 0
  // must reproduce batch 1 of the run at offset 0.
  Config shifted = a;
  shifted.batch = 1;
  shifted.offset = a.hq;
  const Masks mshift = library_masks(shifted);
  REQUIRE(mshift.ok);
  const size_t per_batch = static_cast<size_t>(a.sq * a.hq * a.sk);
  const std::vector<uint8_t> batch1(ma.fwd.begin() + static_cast<long>(per_batch), ma.fwd.end());
  CHECK(mshift.fwd == batch1);
}

TEST_CASE("the dropout mask does not depend on dtype or algorithm", "[dropout][fwd]") {
  Config c = mask_config(0.3f, 77, 5);
  c.sq = 32;
  c.sk = 32;
  c.dv = 32;
  const Masks ref = library_masks(c);
  REQUIRE(ref.ok);
  for (flashattn_dtype_t t : {FLASHATTN_DTYPE_FP16, FLASHATTN_DTYPE_BF16}) {
    Config d = c;
    d.dtype = t;
    const Masks m = library_masks(d);
    REQUIRE(m.ok);
    CHECK(m.fwd == ref.fwd);
    CHECK(m.bwd == ref.bwd);
  }
  Config s = c;
  s.algorithm = FLASHATTN_ALGORITHM_STANDARD;
  const Masks m = library_masks(s);
  REQUIRE(m.ok);
  CHECK(m.fwd == ref.fwd);
  CHECK(m.bwd == ref.bwd);
}

TEST_CASE("a drop probability below 2^-17 (threshold 0) gives bitwise the p = 0 results", "[dropout][fwd][bwd]") {
  for (float p : kDropBelowThreshold) {
    INFO("p = " << p);
    CHECK(p > 0.f);
    CHECK(flashattn::dropout_threshold(p) == 0u);
    CHECK(!flashattn::dropout_active(flashattn::dropout_threshold(p)));
  }
  CHECK(kDropBelowThreshold[1] == nextafterf(0x1p-17f, 0.f));
  CHECK(flashattn::dropout_active(flashattn::dropout_threshold(0x1p-17f)));  // the first p that drops
  HostMem mem;
  Config c = base_config("dropout below threshold", 70, 90, 40, FLASHATTN_DTYPE_FP32, 4101);
  check_dropout_below_threshold_is_off(c, mem);
  c = base_config("dropout below threshold, causal GQA", 130, 100, 64, FLASHATTN_DTYPE_BF16, 4102);
  c.hq = 4;
  c.band = true;
  c.wr = 0;
  c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
  check_dropout_below_threshold_is_off(c, mem);
  c = base_config("dropout below threshold, standard", 50, 77, 24, FLASHATTN_DTYPE_FP16, 4103);
  c.algorithm = FLASHATTN_ALGORITHM_STANDARD;
  check_dropout_below_threshold_is_off(c, mem);
}
