// Dropout: the Philox4x32-10 stream (Random123 known answers), the keying documented at
// flashattn_plan_set_dropout (recomputed here from the header text and pinned with literal
// words computed independently), and the library's masks, recovered from its outputs:
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

// The documented keying, spelled out from flashattn.h rather than calling dropout_keep.
uint32_t documented_word(uint64_t seed, uint64_t offset, uint64_t b, uint64_t heads_q, uint64_t h, uint32_t i,
                         uint32_t j) {
  const uint64_t counter_hi = offset + b * heads_q + h;
  const flashattn::Philox4 w = flashattn::philox4x32_10(
      j / 4, i, static_cast<uint32_t>(counter_hi & 0xffffffffu), static_cast<uint32_t>(counter_hi >> 32),
      static_cast<uint32_t>(seed & 0xffffffffu), static_cast<uint32_t>(seed >> 32));
  return w.x[j % 4];
}

uint32_t documented_threshold(float p) { return static_cast<uint32_t>(floor(static_cast<double>(p) * 4294967296.0)); }

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
  // Literal words from an independent implementation of Philox4x32-10 and of the header's
  // keying; the offsets near 2^32 make offset + b*heads_q + h carry into the high word.
  struct Pin {
    uint64_t seed, offset, b, heads_q, h;
    uint32_t i, j, word;
  };
  const Pin pins[] = {
      {0x0123456789abcdefull, 0, 0, 4, 0, 0, 0, 0xb850222eu},
      {0x0123456789abcdefull, 0, 1, 4, 3, 17, 6, 0x50479cfeu},
      {42, 0xfffffffeull, 0, 8, 5, 3, 9, 0x523de311u},
      {42, 0xfffffffeull, 1, 8, 1, 0, 2, 0xe01ed51eu},
      {0xfedcba9876543210ull, 123456789012345ull, 2, 16, 15, 1000, 4095, 0x5b394e9eu},
  };
  for (const Pin& p : pins) {
    INFO("seed " << p.seed << " offset " << p.offset << " (b,h,i,j)=(" << p.b << "," << p.h << "," << p.i << "," << p.j
                 << ")");
    CHECK(documented_word(p.seed, p.offset, p.b, p.heads_q, p.h, p.i, p.j) == p.word);
    // keep iff word >= threshold: a threshold just below keeps, one just above drops.
    CHECK(flashattn::dropout_keep(p.seed, p.offset, p.b, p.heads_q, p.h, p.i, p.j, p.word));
    CHECK(!flashattn::dropout_keep(p.seed, p.offset, p.b, p.heads_q, p.h, p.i, p.j, p.word + 1));
  }
  // dropout_threshold is floor(p * 2^32).
  for (float p : {0.0f, 0.1f, 0.5f, 0.9f, 0.999f}) CHECK(flashattn::dropout_threshold(p) == documented_threshold(p));
  // And the keying over a grid, including both 32-bit halves of seed and offset.
  size_t mismatches = 0;
  for (uint64_t seed : {0ull, 1ull, 0x100000000ull, 0xdeadbeefcafef00dull})
    for (uint64_t offset : {0ull, 5ull, 0xffffffffull, 0x123400000000ull})
      for (uint32_t i = 0; i < 9; ++i)
        for (uint32_t j = 0; j < 13; ++j)
          for (uint64_t b = 0; b < 2; ++b)
            for (uint64_t h = 0; h < 3; ++h) {
              const uint32_t thr = documented_threshold(0.3f);
              const bool doc = documented_word(seed, offset, b, 3, h, i, j) >= thr;
              mismatches += doc != flashattn::dropout_keep(seed, offset, b, 3, h, i, j, thr);
            }
  CHECK(mismatches == 0);
}

TEST_CASE("library keep decisions are pinned to the documented Philox words", "[dropout][fwd]") {
  // Each pinned (b, h, i, j) is run twice: with p just below word / 2^32 it must be kept,
  // just above it must be dropped. This pins the library's keying to ~1e-6 of the stream.
  struct Pin {
    uint64_t seed, offset;
    int64_t heads_q, b, h, i, j;
    uint32_t word;
  };
  const Pin pins[] = {
      {0x0123456789abcdefull, 0, 4, 0, 0, 0, 0, 0xb850222eu},
      {0x0123456789abcdefull, 0, 4, 1, 3, 17, 6, 0x50479cfeu},
      {42, 0xfffffffeull, 8, 0, 5, 3, 9, 0x523de311u},
      {42, 0xfffffffeull, 8, 1, 1, 0, 2, 0xe01ed51eu},
  };
  for (const Pin& pin : pins) {
    for (int side = 0; side < 2; ++side) {
      const double target = (static_cast<double>(pin.word) + (side == 0 ? -2000.0 : 2000.0)) / 4294967296.0;
      Config c = mask_config(static_cast<float>(target), pin.seed, pin.offset);
      c.hq = c.hkv = pin.heads_q;
      c.sq = 20;
      c.sk = 12;
      c.dv = 20;
      const Masks m = library_masks(c);
      INFO("pin (b,h,i,j)=(" << pin.b << "," << pin.h << "," << pin.i << "," << pin.j << ") p=" << c.p_drop);
      REQUIRE(m.ok);
      const int64_t row = (pin.b * c.sq + pin.i) * c.hq + pin.h;
      CHECK(m.fwd[row * c.sk + pin.j] == (side == 0 ? 1 : 0));
      CHECK(m.bwd[row * c.sk + pin.j] == (side == 0 ? 1 : 0));
    }
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
