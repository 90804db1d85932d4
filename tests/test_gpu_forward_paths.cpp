// The CUDA forward on each of its kernel families. CTest runs this program twice
// (tests/CMakeLists.txt): with FLASHATTN_CUDA_FORWARD=fa3 (the FA3-design kernels of
// kernels/fa3, which then must serve every served case here or the run fails) and with
// FLASHATTN_CUDA_FORWARD=fa2; each result is checked against the fp64 reference and the
// CPU backend (gpu_check.hpp), so both paths meet the same bound on the same cases.
#include <string>

#include "catch_compat.hpp"
#include "gpu_check.hpp"
#include "gpu_mem.hpp"
#include "gpu_paths.hpp"
#include "harness.hpp"

using namespace fat;

namespace {

// The path this process was started with ("" when FLASHATTN_CUDA_FORWARD is unset).
std::string forced_path() { return forced_value("FLASHATTN_CUDA_FORWARD"); }

// The head dims fa3 serves (head_dim_qk, head_dim_v), every one of which the served-case
// tests below run on both paths.
struct HeadDims {
  int64_t d, dv;
};
constexpr HeadDims kServedDims[] = {{64, 64}, {96, 96}, {128, 128}, {192, 128}, {192, 192}, {256, 256}};
// Head dims below an instance's that fa3 serves on the smallest instance that holds them
// (multiples of 8 within its last column block), the tensor maps spanning the real head
// dims: 32 on 64, 72 and 80 on 96 (32-column blocks), 120 and 104/120 on 128, 176/120 on
// 192/128, 136 on 192/192, 248 on 256.
constexpr HeadDims kBelowDims[] = {{32, 32},   {72, 72},   {80, 80},   {120, 120},
                                   {104, 120}, {176, 120}, {136, 136}, {248, 248}};

// Forward only unless the case asks for the backward too (which then reads this path's O and LSE).
Config fcase(const char* name, int64_t sq, int64_t sk, HeadDims d, flashattn_dtype_t t, uint64_t seed) {
  Config c = gbase(name, sq, sk, d.d, t, seed);
  c.dv = d.dv;
  c.backward = false;
  return c;
}

// A causal case (bottom-right; `mask` as set_causal's) of `batch` sequences and hq query
// heads over hkv key heads.
Config causal_case(const char* name, int64_t sq, int64_t sk, HeadDims d, flashattn_dtype_t t, uint64_t seed,
                   int64_t batch, int64_t hq, int64_t hkv, int mask = 2) {
  Config c = fcase(name, sq, sk, d, t, seed);
  c.batch = batch;
  c.hq = hq;
  c.hkv = hkv;
  set_causal(c, mask);
  return c;
}

// BHSD and padded layouts at each head dims of `dims`, GQA 2:1 over two sequences, causal,
// with the backward on this path's O and LSE; seeds from seed + 1.
template <size_t N>
void check_strided(const HeadDims (&dims)[N], uint64_t seed) {
  for (Layout lay : {Layout::BHSD, Layout::Padded})
    for (const HeadDims& d : dims) {
      ++seed;
      Config c = gbase("paths strided", 257, 300, d.d, kGpuDtypes[seed % 2], seed);
      c.dv = d.dv;
      c.batch = 2;
      c.hq = 4;
      c.hkv = 2;
      c.layout = lay;
      c.band = true;
      c.wr = 0;
      gpu_check(c);
    }
}

// Each (seqlen_q, seqlen_k) of `pairs` at each head dims of `dims`, unmasked and causal in
// both alignments, the dtypes alternating; seeds from seed + 1.
template <size_t N, size_t P>
void check_lengths(const HeadDims (&dims)[N], const int64_t (&pairs)[P][2], uint64_t seed) {
  for (const HeadDims& d : dims)
    for (const auto& pr : pairs)
      for (int mask = 0; mask < 3; ++mask) {
        ++seed;
        Config c = fcase("paths dense", pr[0], pr[1], d, kGpuDtypes[seed % 2], seed);
        set_causal(c, mask);
        gpu_check(c);
      }
}

}  // namespace

TEST_CASE("forward paths: the process runs with a forced path", "[gpu][fwd]") {
  REQUIRE_GPU();
  INFO("FLASHATTN_CUDA_FORWARD=" << forced_path() << " (tests/CMakeLists.txt sets fa2 or fa3)");
  CHECK((forced_path() == "fa2" || forced_path() == "fa3"));
}

TEST_CASE("forward paths: awkward lengths at every served head dim, causal in both alignments", "[gpu][fwd]") {
  REQUIRE_PATH();
  // Lengths off every tile, and whole tiles (192 x 128 at d = 64; 128 x 128; 128 x 112 at
  // head_dim_qk 192, 128 x 64 at d = 256): no key block then takes the element mask unless
  // causal. Query tiles whose consumer warpgroups hold few rows or none (17, 129, 300, 1000
  // rows in 192-row tiles: the last tile's last warpgroups without a mask, causal the first
  // tile's first ones, its tiles shifted up by whole warpgroups).
  const int64_t pairs[][2] = {{1, 1},     {1, 17},     {17, 1},     {17, 129},    {129, 17},
                              {129, 129}, {1000, 129}, {129, 1000}, {1000, 1000}, {256, 256},
                              {128, 384}, {384, 128},  {128, 224},  {300, 336},   {192, 320}};
  check_lengths(kServedDims, pairs, 9000);
}

TEST_CASE("forward paths: GQA and MQA, several sequences, causal and not", "[gpu][fwd]") {
  REQUIRE_PATH();
  const int64_t heads[][2] = {{8, 2}, {6, 1}, {4, 4}};
  uint64_t seed = 9100;
  for (const auto& h : heads)
    for (const HeadDims& d : kServedDims)
      for (bool causal : {false, true}) {
        ++seed;
        Config c = fcase("paths gqa", 300, 517, d, kGpuDtypes[seed % 2], seed);
        c.batch = 3;
        c.hq = h[0];
        c.hkv = h[1];
        c.band = causal;
        c.wr = causal ? 0 : -1;
        c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
        gpu_check(c);
      }
}

TEST_CASE("forward paths: strided layouts and the backward on this path's O and LSE", "[gpu][fwd][bwd]") {
  REQUIRE_PATH();
  check_strided(kServedDims, 9200);
}

TEST_CASE("forward paths: head dims below an instance, awkward lengths, causal, GQA, strided", "[gpu][fwd]") {
  REQUIRE_PATH();
  // Lengths off the tiles and whole ones, more queries than keys and fewer, every mask.
  const int64_t pairs[][2] = {{1, 17}, {129, 17}, {300, 336}, {1000, 129}, {128, 384}};
  check_lengths(kBelowDims, pairs, 9600);
  // GQA and MQA over three sequences, unmasked and causal bottom-right.
  uint64_t seed = 9730;
  const int64_t heads[][2] = {{8, 2}, {6, 1}};
  for (const auto& h : heads)
    for (const HeadDims d : {HeadDims{72, 72}, HeadDims{120, 120}, HeadDims{176, 120}})
      for (int mask : {0, 2}) {
        ++seed;
        gpu_check(
            causal_case("paths below an instance, gqa", 300, 517, d, kGpuDtypes[seed % 2], seed, 3, h[0], h[1], mask));
      }
  // BHSD and padded layouts (the columns past the head dim in a padded row stay untouched).
  const HeadDims strided[] = {{72, 72}, {104, 120}};
  check_strided(strided, 9740);
}

TEST_CASE("forward paths: head dims not a multiple of 8 on zero-padded copies, causal, GQA, odd strides",
          "[gpu][fwd]") {
  REQUIRE_PATH();
  // fa3 (and fa2) run them on copies padded to a multiple of 8: 60 and 3/5 on the 64
  // instance, 100, 111, 125/128 and 100/120 (Q, K copied, V, O direct) on 128, 190/125 on
  // 192/128, 250 on 256.
  const HeadDims staged[] = {{60, 60}, {3, 5}, {100, 100}, {111, 111}, {128, 125}, {100, 120}, {190, 125}, {250, 250}};
  const int64_t pairs[][2] = {{1, 17}, {129, 17}, {300, 336}, {1000, 129}};
  check_lengths(staged, pairs, 9800);
  uint64_t seed = 9900;
  for (const HeadDims d : {HeadDims{100, 100}, HeadDims{3, 5}, HeadDims{128, 125}})
    for (int mask : {0, 2}) {
      ++seed;
      // GQA 4:1 over three sequences.
      gpu_check(causal_case("paths staged, gqa", 300, 517, d, kGpuDtypes[seed % 2], seed, 3, 8, 2, mask));
      // Odd element strides and 4-byte-aligned rows where every tensor is copied (the copies
      // read and write element by element); else the padded layout of 16-byte rows.
      Config c = causal_case("paths staged, padded layout", 257, 300, d, kGpuDtypes[seed % 2], seed, 2, 4, 2, mask);
      c.layout = Layout::Padded;
      c.pad16 = d.d % 8 == 0 || d.dv % 8 == 0;
      gpu_check(c);
    }
  // Causal with more query tiles than SMs: fa3's tile counter after the copies.
  gpu_check(causal_case("paths staged, tiles > SMs", 777, 1100, {60, 60}, FLASHATTN_DTYPE_BF16, 9920, 5, 8, 2));
}

TEST_CASE("forward paths: without an LSE output, and large inputs", "[gpu][fwd]") {
  REQUIRE_PATH();
  Config c = fcase("paths no lse", 200, 333, {128, 128}, FLASHATTN_DTYPE_BF16, 9301);
  c.with_lse = false;
  gpu_check(c);
  c = fcase("paths large inputs", 333, 200, {64, 64}, FLASHATTN_DTYPE_FP16, 9302);
  c.input_scale = 8.0;
  gpu_check(c);
}

TEST_CASE("forward paths: what fa3 does not implement runs on fa2, or is refused when fa3 is forced",
          "[gpu][fwd][errors]") {
  REQUIRE_PATH();
  std::vector<Config> cases = fa3_unserved_option_cases(false, 9403);
  // Head dims whose copies padded to a multiple of 8 no instance holds within its last
  // column block (64/112; 104/64).
  cases.push_back(fcase("paths dqk 59 dv 111 staged", 100, 130, {59, 111}, FLASHATTN_DTYPE_FP16, 9410));
  Config c = fcase("paths dqk 100 dv 64 staged, causal", 100, 130, {100, 64}, FLASHATTN_DTYPE_BF16, 9411);
  c.band = true;
  c.wr = 0;
  cases.push_back(c);
  // Varlen batches at a head dim below an instance's and at one copied.
  for (const HeadDims d : {HeadDims{72, 72}, HeadDims{100, 100}}) {
    c = fcase("paths varlen", 1, 1, d, FLASHATTN_DTYPE_BF16, 9413);
    c.seqlens_q = {5, 130, 0};
    c.seqlens_k = {17, 129, 40};
    cases.push_back(c);
  }
  // dv 64 on the 128/128 instance: a 64-column block of V and O wholly past the tensor.
  c = fcase("paths dqk 128 dv 64", 100, 130, {128, 64}, FLASHATTN_DTYPE_BF16, 9403);
  cases.push_back(c);
  c = fcase("paths alibi per (batch, head), causal", 150, 170, {128, 128}, FLASHATTN_DTYPE_BF16, 9409);
  c.batch = 2;
  c.hq = 4;
  c.hkv = 2;
  c.bias = FLASHATTN_BIAS_ALIBI;
  c.alibi_batch_stride = c.hq + 3;
  c.band = true;
  c.wr = 0;
  c.align = FLASHATTN_ALIGN_BOTTOM_RIGHT;
  cases.push_back(c);
  for (const Config& cc : cases) {
    if (forced_path() != "fa3") {
      gpu_check(cc);
      continue;
    }
    check_fa3_refuses(cc, "FLASHATTN_CUDA_FORWARD", false);
  }
}

TEST_CASE("forward paths: causal tiles over several L2 sections of heads, the last one smaller", "[gpu][fwd]") {
  REQUIRE_PATH();
  // fa3 numbers causal tiles in sections of the heads whose K and V fit 16 MB: at 3000 keys
  // 10 heads at d = 128 and 5 at d = 256, so 3 sequences x 4 heads make sections of 10 + 2 and
  // 5 + 5 + 2; every tile must be computed once.
  uint64_t seed = 9550;
  for (const HeadDims d : {HeadDims{128, 128}, HeadDims{256, 256}}) {
    ++seed;
    gpu_check(causal_case("paths causal sections", 130, 3000, d, kGpuDtypes[seed % 2], seed, 3, 4, 2));
  }
  // Sections, the tile counter and three consumer warpgroups at once: at d = 64 and 3000
  // keys a section holds 21 heads, so 3 sequences x 48 heads (GQA 6:1) make six sections of
  // 21 and one of 18; their 144 tiles of 130 rows (the third consumer holds 2 of them)
  // outnumber the SMs, so the persistent CTAs claim tiles from the counter across section
  // boundaries.
  gpu_check(
      causal_case("paths causal sections, tiles > SMs", 130, 3000, {64, 64}, FLASHATTN_DTYPE_BF16, 9560, 3, 48, 8));
}

TEST_CASE("forward paths: last query tiles that leave warpgroups idle, unmasked and causal", "[gpu][fwd]") {
  REQUIRE_PATH();
  // fa3's last query tile of each sequence holds 40 rows at d = 64 (1000 = 5 x 192 + 40) and 6
  // at d = 256 (1030 = 8 x 128 + 6; O through the Q tile): one consumer warpgroup computes,
  // the others only release the stages, so tiles differ in length and the CTAs claim them
  // from the counter (3 x 8 x 6 and 2 x 8 x 9 tiles, more than the SMs).
  Config c = fcase("paths idle warpgroups d64", 1000, 1000, {64, 64}, FLASHATTN_DTYPE_BF16, 9570);
  c.batch = 3;
  c.hq = 8;
  c.hkv = 2;
  gpu_check(c);
  c = fcase("paths idle warpgroups d256", 1030, 300, {256, 256}, FLASHATTN_DTYPE_FP16, 9571);
  c.batch = 2;
  c.hq = 8;
  c.hkv = 8;
  gpu_check(c);
  // The other two-consumer configurations (128-row tiles: 1030 = 8 x 128 + 6), GQA 4:1.
  uint64_t seed = 9572;
  for (const HeadDims d : {HeadDims{96, 96}, HeadDims{128, 128}, HeadDims{192, 128}}) {
    ++seed;
    c = fcase("paths idle warpgroups", 1030, 700, d, kGpuDtypes[seed % 2], seed);
    c.batch = 2;
    c.hq = 8;
    c.hkv = 2;
    gpu_check(c);
  }
  // Under the causal mask, bottom-right with fewer queries than keys, GQA: the first tile's
  // idle warpgroups (the tiles shifted up by whole warpgroups) beside the band's uneven tiles.
  gpu_check(causal_case("paths idle warpgroups causal d64", 1000, 1400, {64, 64}, FLASHATTN_DTYPE_FP16, 9580, 2, 8, 2));
  gpu_check(
      causal_case("paths idle warpgroups causal d128", 1030, 1500, {128, 128}, FLASHATTN_DTYPE_BF16, 9581, 2, 8, 2));
}

TEST_CASE("forward paths: causal runs with more query tiles than SMs, twice on one workspace", "[gpu][fwd]") {
  REQUIRE_PATH();
  // 5 sequences x 8 heads x 5 query tiles of 192 rows: more tiles than a GPU has SMs, so
  // fa3's persistent CTAs claim tiles from the counter in the workspace.
  const Config c = causal_case("paths causal, tiles > SMs", 777, 1100, {64, 64}, FLASHATTN_DTYPE_BF16, 9501, 5, 8, 2);
  gpu_check(c);
  // Twice on one workspace, O poisoned in between: a counter the second run did not reset
  // would leave tiles unwritten. Equal K, V rows make every output row V's row.
  const Problem p = make_problem(c);
  flashattn_plan_t plan = nullptr;
  REQUIRE(flashattn_plan_create(&plan, FLASHATTN_BACKEND_CUDA, 0) == FLASHATTN_STATUS_SUCCESS);
  REQUIRE(configure_plan(plan, p) == FLASHATTN_STATUS_SUCCESS);
  size_t ws_bytes = 0;
  REQUIRE(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_FORWARD, &ws_bytes) == FLASHATTN_STATUS_SUCCESS);
  const size_t es = 2;
  void* buf[5] = {};
  const size_t bytes[5] = {static_cast<size_t>(p.lay[0].elems) * es, static_cast<size_t>(p.lay[1].elems) * es,
                           static_cast<size_t>(p.lay[2].elems) * es, static_cast<size_t>(p.lay[3].elems) * es,
                           ws_bytes > 0 ? ws_bytes : 1};
  for (int i = 0; i < 5; ++i) REQUIRE(cudaMalloc(&buf[i], bytes[i]) == cudaSuccess);
  for (int i = 0; i < 3; ++i) REQUIRE(cudaMemset(buf[i], 0x3c, bytes[i]) == cudaSuccess);  // bf16 0x3c3c = 0.0115
  std::vector<unsigned char> first(bytes[3]), second(bytes[3]);
  flashattn_fwd_args_t a = fwd_args(buf[0], buf[1], buf[2], buf[3], nullptr);
  for (std::vector<unsigned char>* out : {&first, &second}) {
    REQUIRE(cudaMemset(buf[3], 0xff, bytes[3]) == cudaSuccess);
    REQUIRE(flashattn_fwd(plan, &a, buf[4], ws_bytes, nullptr) == FLASHATTN_STATUS_SUCCESS);
    REQUIRE(cudaMemcpy(out->data(), buf[3], bytes[3], cudaMemcpyDeviceToHost) == cudaSuccess);
  }
  size_t poisoned = 0;
  for (size_t i = 0; i + 1 < first.size(); i += 2) poisoned += first[i] == 0xff && first[i + 1] == 0xff;
  CHECK(poisoned == 0);
  CHECK(first == second);
  for (void* b : buf) cudaFree(b);
  flashattn_plan_destroy(plan);
}

TEST_CASE("forward paths: inputs shared across the batch run on fa2; a forced fa3 names the tensor it cannot map",
          "[gpu][fwd][errors]") {
  REQUIRE_PATH();
  check_fa3_unmappable("FLASHATTN_CUDA_FORWARD", false, 9420);
}

TEST_CASE("forward paths: zero-padded copies beside a tensor fa3 cannot map run on fa2; a forced fa3 names it",
          "[gpu][fwd][errors]") {
  REQUIRE_PATH();
  check_fa3_unmappable_after_staging("FLASHATTN_CUDA_FORWARD", false, 9421);
}
