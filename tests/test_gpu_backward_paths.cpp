// The CUDA backward on each of its kernel families. CTest runs this program twice
// (tests/CMakeLists.txt): with FLASHATTN_CUDA_BACKWARD=fa3 (the FA3-design kernels of
// kernels/fa3, which then must serve every served case here or the run fails) and with
// FLASHATTN_CUDA_BACKWARD=fa2; each result is checked against the fp64 reference and the
// CPU backend (gpu_check.hpp), so both paths meet the same bound on the same cases. One case
// of the fa3 run starts this program again without the variable (the automatic path) and
// compares the deterministic gradients bit for bit.
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "catch_compat.hpp"
#include "gpu_check.hpp"
#include "gpu_mem.hpp"
#include "gpu_paths.hpp"
#include "grad_accumulate_check.hpp"
#include "harness.hpp"

using namespace fat;

namespace {

// The head dims the fa3 backward serves (kernels/instances.json, "hopper" "backward"), in two
// groups, each case below a test per group (each within the per-test timeout): 64 and 128;
// 96, 192 and 256. 64, 96 and 128 split a step's 128 keys between the consumer warpgroups
// (96 in the 64-byte swizzle, its dQ in a 64- and a 32-column piece that alternate between
// them by step); 192 and 256 split the head-dim columns of 64 keys (at 192 unevenly: two
// column blocks and one).
using Dims = std::vector<int64_t>;
const Dims kFirstDims = {64, 128};
const Dims kLaterDims = {96, 192, 256};
// Head dims below an instance's that the fa3 backward serves on the smallest instance that
// holds them (multiples of 8 within its last 32 columns, the dQ reduce-adds' boxes), the
// tensor maps spanning the real head dims and the dK, dV stores skipping the columns past
// them: 40 on 64, 72 on 96, 120 on 128, 176 and 232 on 192 and 256 (head-dim split).
const Dims kBelowDims = {40, 72, 120, 176, 232};

// The path this process was started with ("" when FLASHATTN_CUDA_BACKWARD is unset).
std::string forced_path() { return forced_value("FLASHATTN_CUDA_BACKWARD"); }

// Causal in the given alignment (0: no mask).
// The deterministic case the automatic path must run bitwise as a forced fa3 does: GQA 4:1,
// causal bottom-right, several key and query blocks.
Config auto_det_case() {
  Config c = gbase("bwd paths deterministic, automatic path", 300, 500, 128, FLASHATTN_DTYPE_BF16, 9650);
  c.batch = 2;
  c.hq = 8;
  c.hkv = 2;
  set_causal(c, 2);
  c.deterministic = true;
  return c;
}

// dQ, dK and dV as written, one after the other.
std::vector<uint8_t> grad_bits(const LibResult& r) {
  std::vector<uint8_t> b(r.raw_dq);
  b.insert(b.end(), r.raw_dk.begin(), r.raw_dk.end());
  b.insert(b.end(), r.raw_dv.begin(), r.raw_dv.end());
  return b;
}

// The child-process side of the comparison below: the variable that receives the bits' path.
constexpr const char* kBitsVar = "FAT_BWD_AUTO_BITS";

// Lengths off every tile (128, 80 or 64 queries x 128 or 64 keys a step; at d = 64 each
// consumer warpgroup's dQ half of a 128-query step full, partial or past the queries; at
// d = 128 unmasked steps of 80 whole and partial, the last with 1-16, 17-64 or 65-79
// rows), whole tiles, more queries than keys and fewer (bottom-right: rows that see no key;
// top-left: keys no row sees), causal in both alignments.
void check_awkward_lengths(const Dims& dims, uint64_t seed) {
  const int64_t pairs[][2] = {{1, 1},      {1, 17},     {17, 1},      {17, 129},  {129, 17}, {129, 129},
                              {1000, 129}, {129, 1000}, {1000, 1000}, {256, 256}, {64, 384}, {384, 64},
                              {80, 80},    {161, 200},  {150, 200},   {79, 129}};
  for (int64_t d : dims)
    for (const auto& pr : pairs)
      for (int mask = 0; mask < 3; ++mask) {
        ++seed;
        Config c = gbase("bwd paths dense", pr[0], pr[1], d, kGpuDtypes[seed % 2], seed);
        set_causal(c, mask);
        gpu_check(c);
      }
}

// GQA and MQA over three sequences: dK and dV of a key head sum over the query heads of its
// group.
void check_gqa(const Dims& dims, uint64_t seed) {
  const int64_t heads[][2] = {{8, 2}, {6, 1}, {4, 4}};
  for (const auto& h : heads)
    for (int64_t d : dims)
      for (int mask = 0; mask < 3; ++mask) {
        ++seed;
        Config c = gbase("bwd paths gqa", 300, 517, d, kGpuDtypes[seed % 2], seed);
        c.batch = 3;
        c.hq = h[0];
        c.hkv = h[1];
        set_causal(c, mask);
        gpu_check(c);
      }
}

// BHSD and padded layouts, GQA, causal bottom-right.
void check_strided(const Dims& dims, uint64_t seed) {
  for (Layout lay : {Layout::BHSD, Layout::Padded})
    for (int64_t d : dims) {
      ++seed;
      Config c = gbase("bwd paths strided", 257, 300, d, kGpuDtypes[seed % 2], seed);
      c.batch = 2;
      c.hq = 4;
      c.hkv = 2;
      c.layout = lay;
      set_causal(c, 2);
      gpu_check(c);
    }
}

// GQA 4:1 over two sequences, unmasked and causal in both alignments, more keys than
// queries and fewer: several key blocks (128 or 64) and query blocks (64, 80 or 128) a head,
// partial last blocks, so every dQ row takes several ordered adds (at d = 192 and 256
// several pieces a warpgroup a step). Five runs each, bitwise equal and right.
void check_deterministic(const Dims& dims, uint64_t seed) {
  const int64_t lens[][2] = {{300, 500}, {500, 300}};
  for (int64_t d : dims)
    for (const auto& l : lens)
      for (int mask = 0; mask < 3; ++mask) {
        ++seed;
        Config c = gbase("bwd paths deterministic", l[0], l[1], d, kGpuDtypes[seed % 2], seed);
        c.batch = 2;
        c.hq = 8;
        c.hkv = 2;
        set_causal(c, mask);
        gpu_check_deterministic(c, 5);
      }
}

// flashattn_plan_set_grad_accumulate: several key blocks and query blocks, GQA, causal in
// both alignments (keys no query sees add nothing), and deterministic (then two
// accumulating runs are bitwise equal).
void check_accumulating(const Dims& dims, uint64_t seed) {
  DeviceMem dev;
  for (bool det : {false, true})
    for (int64_t d : dims)
      for (int mask = 0; mask < 3; ++mask) {
        ++seed;
        Config c = gbase("bwd paths grad_accumulate", mask == 2 ? 517 : 300, mask == 2 ? 300 : 517, d,
                         kGpuDtypes[seed % 2], seed);
        c.batch = 2;
        c.hq = 4;
        c.hkv = 2;
        set_causal(c, mask);
        c.grad_accumulate = true;
        c.deterministic = det;
        check_grad_accumulate(c, dev, kGpuTolerance, false);
      }
}

}  // namespace

TEST_CASE("backward paths: the process runs with a forced path", "[gpu][bwd]") {
  REQUIRE_GPU();
  INFO("FLASHATTN_CUDA_BACKWARD=" << forced_path() << " (tests/CMakeLists.txt sets fa2 or fa3)");
  CHECK((forced_path() == "fa2" || forced_path() == "fa3"));
}

TEST_CASE("backward paths: awkward lengths at head dims 64 and 128, causal in both alignments", "[gpu][bwd]") {
  REQUIRE_PATH();
  check_awkward_lengths(kFirstDims, 9500);
}

TEST_CASE("backward paths: awkward lengths at head dims 96, 192 and 256, causal in both alignments", "[gpu][bwd]") {
  REQUIRE_PATH();
  check_awkward_lengths(kLaterDims, 10500);
}

TEST_CASE("backward paths: GQA and MQA, several sequences, causal and not", "[gpu][bwd]") {
  REQUIRE_PATH();
  check_gqa(kFirstDims, 9600);
}

TEST_CASE("backward paths: GQA and MQA at head dims 96, 192 and 256, several sequences, causal and not", "[gpu][bwd]") {
  REQUIRE_PATH();
  check_gqa(kLaterDims, 10600);
}

TEST_CASE("backward paths: head dims below an instance, awkward lengths, causal, GQA, strided", "[gpu][bwd]") {
  REQUIRE_PATH();
  // Lengths off the tiles and whole ones, more queries than keys and fewer, every mask; and
  // head_dim_qk 104 beside head_dim_v 120 on the 128 instance.
  const int64_t pairs[][2] = {{1, 17}, {129, 17}, {300, 336}, {1000, 129}, {64, 384}};
  uint64_t seed = 11500;
  for (const int64_t dv : {int64_t{0}, int64_t{120}})
    for (int64_t d : dv == 0 ? kBelowDims : Dims{104})
      for (const auto& pr : pairs)
        for (int mask = 0; mask < 3; ++mask) {
          ++seed;
          Config c = gbase("bwd paths below an instance", pr[0], pr[1], d, kGpuDtypes[seed % 2], seed);
          if (dv != 0) c.dv = dv;
          set_causal(c, mask);
          gpu_check(c);
        }
  check_gqa({72, 176}, 11600);
  check_strided({72, 120}, 11700);
}

TEST_CASE("backward paths: head dims below an instance, deterministic and accumulating", "[gpu][bwd]") {
  REQUIRE_PATH();
  check_deterministic({120}, 11730);
  check_accumulating({72, 232}, 11830);
}

TEST_CASE("backward paths: head dims not a multiple of 8 on zero-padded copies, causal, GQA, odd strides",
          "[gpu][bwd]") {
  REQUIRE_PATH();
  // fa3 (and fa2) run them on copies padded to a multiple of 8: 60 on the 64 instance; 100,
  // 111, 100/120 (Q, K, dQ, dK copied) and 128/125 (V, O, dO, dV copied) on 128; 190 and 250
  // on 192 and 256.
  const int64_t pairs[][2] = {{1, 17}, {129, 17}, {300, 336}, {1000, 129}};
  const int64_t dims[][2] = {{60, 60}, {100, 100}, {111, 111}, {100, 120}, {128, 125}, {190, 190}, {250, 250}};
  uint64_t seed = 12500;
  for (const auto& d : dims)
    for (const auto& pr : pairs)
      for (int mask = 0; mask < 3; ++mask) {
        ++seed;
        Config c = gbase("bwd paths staged", pr[0], pr[1], d[0], kGpuDtypes[seed % 2], seed);
        c.dv = d[1];
        set_causal(c, mask);
        gpu_check(c);
      }
  check_gqa({100}, 12600);
  // Odd element strides where every tensor is copied (the copies read and write element by
  // element).
  for (int mask : {0, 2}) {
    Config c = gbase("bwd paths staged, odd strides", 257, 300, 100, kGpuDtypes[mask / 2], 12650 + mask);
    c.batch = 2;
    c.hq = 4;
    c.hkv = 2;
    c.layout = Layout::Padded;
    c.pad16 = false;
    set_causal(c, mask);
    gpu_check(c);
  }
  check_deterministic({100}, 12660);
  check_accumulating({60}, 12680);
}

TEST_CASE("backward paths: strided layouts, large inputs, an explicit scale", "[gpu][bwd]") {
  REQUIRE_PATH();
  check_strided(kFirstDims, 9700);
  check_strided(kLaterDims, 10700);
  Config c = gbase("bwd paths large inputs", 333, 200, 64, FLASHATTN_DTYPE_FP16, 9711);
  c.input_scale = 8.0;
  gpu_check(c);
  c = gbase("bwd paths scale 0.3", 200, 333, 128, FLASHATTN_DTYPE_BF16, 9712);
  c.scale = 0.3f;
  gpu_check(c);
}

TEST_CASE("backward paths: deterministic mode is bitwise reproducible and right", "[gpu][bwd][deterministic]") {
  REQUIRE_PATH();
  check_deterministic(kFirstDims, 9630);
}

TEST_CASE("backward paths: deterministic mode at head dims 96, 192 and 256 is bitwise reproducible and right",
          "[gpu][bwd][deterministic]") {
  REQUIRE_PATH();
  check_deterministic(kLaterDims, 10630);
}

namespace {

// Deterministic c run twice, bitwise equal, and within the bf16 bound of its
// non-deterministic run (for lengths where an fp64 reference would take minutes).
void check_deterministic_against_plain(const Config& c) {
  const Problem p = make_problem(c);
  DeviceMem dev;
  const LibResult a = run_library(p, dev, 0), b = run_library(p, dev, 0);
  INFO(describe(c) << ": " << a.error << " " << b.error);
  REQUIRE(a.ok());
  require_same_bits(a, b);
  Config plain = c;
  plain.deterministic = false;
  const LibResult r = run_library(make_problem(plain), dev, 0);
  REQUIRE(r.ok());
  for (const auto& pr : {std::make_pair(&a.dq, &r.dq), std::make_pair(&a.dk, &r.dk), std::make_pair(&a.dv, &r.dv)}) {
    const ErrStats e = error_stats(*pr.first, *pr.second);
    INFO("max |det - plain| " << e.max_abs << ", max |plain| " << e.max_ref);
    CHECK(e.nonfinite_mismatch == 0);
    CHECK(e.max_abs <= 2e-2 * e.max_ref);
  }
}

}  // namespace

TEST_CASE("backward paths: deterministic causal runs with more key blocks than SMs", "[gpu][bwd][deterministic]") {
  REQUIRE_PATH();
  // 17000 keys are 133 key blocks of one (key head, sequence) at d = 64 (266 at d = 256),
  // more CTAs than an H100 holds at once: a turn order that waited on a CTA not yet
  // dispatched would hang here (the per-test timeout).
  for (int64_t d : {64, 256})
    for (int mask = 1; mask < 3; ++mask) {
      Config c = gbase("bwd paths deterministic, many key blocks", 17000, 17000, d, FLASHATTN_DTYPE_BF16,
                       (d == 64 ? 9870 : 10870) + static_cast<uint64_t>(mask));
      c.hq = 2;
      c.hkv = 1;
      set_causal(c, mask);
      c.deterministic = true;
      check_deterministic_against_plain(c);
    }
}

TEST_CASE("backward paths: deterministic runs without a mask launched in chunks of pairs",
          "[gpu][bwd][deterministic]") {
  REQUIRE_PATH();
  // 21 (key head, sequence) pairs, GQA 2:1, 2048 queries: on an H100 the fa3 backward
  // launches them in chunks of 8 pairs at d = 64 and 5 at d = 128 (BwdScratch::chain_groups),
  // the last chunk short.
  for (int64_t d : {64, 128}) {
    Config c = gbase("bwd paths deterministic, chunked launch order", 2048, 2048, d, FLASHATTN_DTYPE_BF16,
                     d == 64 ? 9890 : 10890);
    c.batch = 3;
    c.hq = 14;
    c.hkv = 7;
    c.deterministic = true;
    check_deterministic_against_plain(c);
  }
}

TEST_CASE("backward paths: a deterministic run takes the forced path's bits on the automatic path",
          "[gpu][bwd][deterministic]") {
  REQUIRE_PATH();
  if (forced_path() != "fa3") FA_SKIP_TEST("the automatic path is fa3 on compute capability 9.0: bwd-fa3 only");
  const Problem p = make_problem(auto_det_case());
  DeviceMem dev;
  const LibResult forced = run_library(p, dev, 0);
  INFO(describe(p.cfg) << ": " << forced.error);
  REQUIRE(forced.ok());
  // The same case in a child process of this program without FLASHATTN_CUDA_BACKWARD (the
  // variable is read once per process), which writes its gradients' bits to a file.
  char exe[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  REQUIRE(n > 0);
  exe[n] = '\0';
  char dir[] = "/tmp/fat_bwd_auto_XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  const std::string bits = std::string(dir) + "/bits";
  const std::string cmd = "env -u FLASHATTN_CUDA_BACKWARD " + std::string(kBitsVar) + "='" + bits + "' '" +
                          std::string(exe) + "' '[auto-det-child]' > '" + std::string(dir) + "/log' 2>&1";
  const int rc = system(cmd.c_str());
  std::ifstream log(std::string(dir) + "/log");
  const std::string child_log((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  INFO("child: " << cmd << " -> " << rc << "\n" << child_log);
  REQUIRE(rc == 0);
  std::ifstream in(bits, std::ios::binary);
  const std::vector<uint8_t> automatic((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(automatic == grad_bits(forced));
  remove(bits.c_str());
  remove((std::string(dir) + "/log").c_str());
  rmdir(dir);
}

// Run only as the child of the case above ([.]: hidden from the listing and from ctest).
TEST_CASE("backward paths: the deterministic case on the automatic path (child process)", "[.][auto-det-child]") {
  const std::string out = forced_value(kBitsVar);
  REQUIRE(!out.empty());
  REQUIRE(forced_path().empty());
  const Problem p = make_problem(auto_det_case());
  DeviceMem dev;
  const LibResult r = run_library(p, dev, 0);
  INFO(describe(p.cfg) << ": " << r.error);
  REQUIRE(r.ok());
  const std::vector<uint8_t> b = grad_bits(r);
  std::ofstream f(out, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  REQUIRE(f.good());
}

TEST_CASE("backward paths: what fa3 does not implement runs on fa2, or is refused when fa3 is forced",
          "[gpu][bwd][errors]") {
  REQUIRE_PATH();
  std::vector<Config> cases = fa3_unserved_option_cases(true, 9820);
  // Head dims no instance holds within its last 32 columns (32 on 64, 136 on 192; 3 and
  // 59/111 padded to 8 and 64/112), or a dv 64 on the 128 instance; varlen batches at 72
  // and at 100 (copied).
  cases.push_back(gbase("bwd paths d32", 100, 130, 32, FLASHATTN_DTYPE_FP16, 9801));
  cases.push_back(gbase("bwd paths d136", 100, 130, 136, FLASHATTN_DTYPE_BF16, 9802));
  cases.push_back(gbase("bwd paths d3 staged", 100, 130, 3, FLASHATTN_DTYPE_FP16, 9803));
  Config c = gbase("bwd paths dqk 59 dv 111 staged", 100, 130, 59, FLASHATTN_DTYPE_BF16, 9805);
  c.dv = 111;
  cases.push_back(c);
  c = gbase("bwd paths dqk 128 dv 64", 100, 130, 128, FLASHATTN_DTYPE_BF16, 9804);
  c.dv = 64;
  cases.push_back(c);
  for (int64_t d : {72, 100}) {
    c = gbase("bwd paths varlen", 1, 1, d, FLASHATTN_DTYPE_FP16, 9806);
    c.seqlens_q = {5, 130, 0};
    c.seqlens_k = {17, 129, 40};
    cases.push_back(c);
  }
  c = gbase("bwd paths bias tensor", 150, 170, 64, FLASHATTN_DTYPE_BF16, 9809);
  c.bias = FLASHATTN_BIAS_TENSOR;
  cases.push_back(c);
  c = gbase("bwd paths block-sparse", 150, 170, 128, FLASHATTN_DTYPE_FP16, 9811);
  c.sparse = true;
  cases.push_back(c);
  for (const Config& cc : cases) {
    if (forced_path() != "fa3") {
      gpu_check(cc);
      continue;
    }
    check_fa3_refuses(cc, "FLASHATTN_CUDA_BACKWARD", true);
  }
}

TEST_CASE("backward paths: accumulating into dQ, dK, dV", "[gpu][bwd][accumulate]") {
  REQUIRE_PATH();
  check_accumulating(kFirstDims, 9830);
}

TEST_CASE("backward paths: accumulating into dQ, dK, dV at head dims 96, 192 and 256", "[gpu][bwd][accumulate]") {
  REQUIRE_PATH();
  check_accumulating(kLaterDims, 10830);
}

TEST_CASE("backward paths: any other value of the variable is refused", "[gpu][bwd][errors][bad-path]") {
  REQUIRE_GPU();
  INFO("FLASHATTN_CUDA_BACKWARD=" << forced_path() << " (tests/CMakeLists.txt sets fa4 for this case)");
  REQUIRE(forced_path() == "fa4");
  const Problem p = make_problem(gbase("bwd paths bad variable", 100, 130, 128, FLASHATTN_DTYPE_BF16, 9901));
  DeviceMem dev;
  const LibResult g = run_library(p, dev, 0);
  INFO("status " << flashattn_status_string(g.bwd) << ": " << g.error);
  CHECK(g.fwd == FLASHATTN_STATUS_SUCCESS);
  CHECK(g.bwd == FLASHATTN_STATUS_INVALID_ARGUMENT);
  CHECK(g.error.find("FLASHATTN_CUDA_BACKWARD=fa4") != std::string::npos);
  CHECK(g.outputs_untouched);
}

TEST_CASE("backward paths: inputs shared across the batch run on fa2; a forced fa3 names the tensor it cannot map",
          "[gpu][bwd][errors]") {
  REQUIRE_PATH();
  check_fa3_unmappable("FLASHATTN_CUDA_BACKWARD", true, 9830);
}

TEST_CASE("backward paths: zero-padded copies beside a tensor fa3 cannot map run on fa2; a forced fa3 names it",
          "[gpu][bwd][errors]") {
  REQUIRE_PATH();
  check_fa3_unmappable_after_staging("FLASHATTN_CUDA_BACKWARD", true, 9831);
}
