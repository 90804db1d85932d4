// flashattn_combine on CUDA against the CPU backend's combine of the same parts: strided
// fp32 parts with -inf (skipped, their O NaN) and all--inf rows, every output dtype, and
// outputs poisoned first. The KV-cache entry point on CUDA is checked in
// test_kvcache_errors.cpp (NOT_SUPPORTED until its kernels exist).
#include <cuda_runtime_api.h>
#include <math.h>

#include <limits>
#include <vector>

#include "catch_compat.hpp"
#include "dtype.hpp"
#include "gpu_mem.hpp"

using namespace fat;

TEST_CASE("gpu: combine matches the CPU combine, skipping -inf parts", "[gpu][combine]") {
  REQUIRE_GPU();
  const int64_t S = 5, B = 3, Q = 4, H = 6, D = 80;
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
      bad += !(fabs(g - c) <= tol * (1 + fabs(c)));
    }
    CHECK(bad == 0);
    size_t bad_lse = 0;
    for (size_t n = 0; n < lse_cpu.size(); ++n)
      bad_lse += !(lse_gpu[n] == lse_cpu[n] || fabs(lse_gpu[n] - lse_cpu[n]) <= 1e-5 * (1 + fabs(lse_cpu[n])));
    CHECK(bad_lse == 0);
    mem.release(d_part);
    mem.release(d_lse_part);
    mem.release(d_o);
    mem.release(d_lse);
  }
}
