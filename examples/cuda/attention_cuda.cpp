// libflashattn on a GPU: fp16 causal grouped-query attention, forward and backward, on
// cudaMalloc'd buffers and a user stream; the result is checked against the CPU backend
// run on the same (host) data.
//
// Build: c++ -std=c++17 attention_cuda.cpp -I/usr/local/cuda/include
//          $(pkg-config --cflags --libs flashattn) -L/usr/local/cuda/lib64 -lcudart
// With no GPU (or a library built without CUDA) it prints a skip line and exits 0.
#include <cuda_runtime.h>
#include <flashattn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CUDA_CHECK(call)                                                      \
  do {                                                                        \
    cudaError_t e_ = (call);                                                  \
    if (e_ != cudaSuccess) {                                                  \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                           \
    }                                                                         \
  } while (0)

#define FA_CHECK(call)                                                                                         \
  do {                                                                                                         \
    flashattn_status_t s_ = (call);                                                                            \
    if (s_ != FLASHATTN_STATUS_SUCCESS) {                                                                      \
      std::fprintf(stderr, "%s failed: %s: %s\n", #call, flashattn_status_string(s_), flashattn_last_error()); \
      std::exit(1);                                                                                            \
    }                                                                                                          \
  } while (0)

namespace {

// IEEE binary16 <-> float on the host (round to nearest even), to fill and read buffers.
uint16_t to_half(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  const uint16_t sign = uint16_t((b >> 16) & 0x8000u);
  const int32_t exp = int32_t((b >> 23) & 0xffu) - 127 + 15;
  uint32_t man = b & 0x7fffffu;
  if (exp >= 31) return uint16_t(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10) return sign;
    man |= 0x800000u;
    const uint32_t shift = uint32_t(14 - exp), half = 1u << (shift - 1), rem = man & ((1u << shift) - 1);
    uint32_t r = man >> shift;
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return uint16_t(sign | r);
  }
  uint32_t r = (uint32_t(exp) << 10) | (man >> 13);
  const uint32_t rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return uint16_t(sign | r);
}

float from_half(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) return (sign ? -1.f : 1.f) * float(man) * (1.f / 16777216.f);
  const uint32_t bits = exp == 31 ? (sign | 0x7f800000u | (man << 13)) : (sign | ((exp + 112) << 23) | (man << 13));
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

constexpr int64_t B = 2, S = 256, HQ = 8, HKV = 2, D = 64;

struct Problem {
  std::vector<uint16_t> q, k, v, dout;
};

// Make a plan for the problem on a backend.
flashattn_plan_t make_plan(flashattn_backend_t backend) {
  flashattn_plan_t plan = nullptr;
  FA_CHECK(flashattn_plan_create(&plan, backend, 0));
  FA_CHECK(flashattn_plan_set_shape(plan, B, S, S, HQ, HKV, D, D));
  FA_CHECK(flashattn_plan_set_dtype(plan, FLASHATTN_DTYPE_FP16));
  FA_CHECK(flashattn_plan_set_band_mask(plan, FLASHATTN_ALIGN_TOP_LEFT, FLASHATTN_WINDOW_UNBOUNDED, 0));
  return plan;
}

double max_abs_diff(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  double m = 0.0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, double(std::abs(from_half(a[i]) - from_half(b[i]))));
  return m;
}

}  // namespace

int main() {
  int devices = 0;
  if (!flashattn_has_cuda_backend() || cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0 ||
      flashattn_cuda_device_count() == 0) {
    std::printf("FLASHATTN_TEST_SKIPPED: no CUDA device or libflashattn built without CUDA\n");
    return 0;
  }
  CUDA_CHECK(cudaSetDevice(0));

  const size_t nq = size_t(B * S * HQ * D), nk = size_t(B * S * HKV * D), nl = size_t(B * HQ * S);
  Problem p{std::vector<uint16_t>(nq), std::vector<uint16_t>(nk), std::vector<uint16_t>(nk), std::vector<uint16_t>(nq)};
  for (size_t i = 0; i < nq; ++i)
    p.q[i] = to_half(float(std::sin(0.37 * double(i)))), p.dout[i] = to_half(float(std::cos(0.05 * double(i))));
  for (size_t i = 0; i < nk; ++i)
    p.k[i] = to_half(float(std::cos(0.13 * double(i)))), p.v[i] = to_half(float(std::sin(0.07 * double(i))));

  // ---- GPU: device buffers, a stream, asynchronous forward and backward ----
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void *dq_in, *dk_in, *dv_in, *d_o, *d_dout, *d_dq, *d_dk, *d_dv;
  float* d_lse;
  for (void** ptr : {&dq_in, &d_o, &d_dout, &d_dq}) CUDA_CHECK(cudaMalloc(ptr, nq * 2));
  for (void** ptr : {&dk_in, &dv_in, &d_dk, &d_dv}) CUDA_CHECK(cudaMalloc(ptr, nk * 2));
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d_lse), nl * sizeof(float)));
  CUDA_CHECK(cudaMemcpyAsync(dq_in, p.q.data(), nq * 2, cudaMemcpyHostToDevice, stream));
  CUDA_CHECK(cudaMemcpyAsync(dk_in, p.k.data(), nk * 2, cudaMemcpyHostToDevice, stream));
  CUDA_CHECK(cudaMemcpyAsync(dv_in, p.v.data(), nk * 2, cudaMemcpyHostToDevice, stream));
  CUDA_CHECK(cudaMemcpyAsync(d_dout, p.dout.data(), nq * 2, cudaMemcpyHostToDevice, stream));

  flashattn_plan_t gpu = make_plan(FLASHATTN_BACKEND_CUDA);
  size_t fwd_bytes = 0, bwd_bytes = 0;
  FA_CHECK(flashattn_plan_get_workspace_size(gpu, FLASHATTN_PASS_FORWARD, &fwd_bytes));
  FA_CHECK(flashattn_plan_get_workspace_size(gpu, FLASHATTN_PASS_BACKWARD, &bwd_bytes));
  void* d_ws = nullptr;
  const size_t ws_bytes = std::max(fwd_bytes, bwd_bytes);
  if (ws_bytes) CUDA_CHECK(cudaMalloc(&d_ws, ws_bytes));

  flashattn_fwd_args_t fa = FLASHATTN_FWD_ARGS_INIT;
  fa.q = dq_in;
  fa.k = dk_in;
  fa.v = dv_in;
  fa.o = d_o;
  fa.lse = d_lse;
  FA_CHECK(flashattn_fwd(gpu, &fa, d_ws, fwd_bytes, stream));
  flashattn_bwd_args_t ba = FLASHATTN_BWD_ARGS_INIT;
  ba.q = dq_in;
  ba.k = dk_in;
  ba.v = dv_in;
  ba.o = d_o;
  ba.lse = d_lse;
  ba.dout = d_dout;
  ba.dq = d_dq;
  ba.dk = d_dk;
  ba.dv = d_dv;
  FA_CHECK(flashattn_bwd(gpu, &ba, d_ws, bwd_bytes, stream));

  std::vector<uint16_t> o(nq), dq(nq), dk(nk), dv(nk);
  CUDA_CHECK(cudaMemcpyAsync(o.data(), d_o, nq * 2, cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaMemcpyAsync(dq.data(), d_dq, nq * 2, cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaMemcpyAsync(dk.data(), d_dk, nk * 2, cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaMemcpyAsync(dv.data(), d_dv, nk * 2, cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));

  // ---- CPU backend on the same data: the oracle ----
  flashattn_plan_t cpu = make_plan(FLASHATTN_BACKEND_CPU);
  std::vector<uint16_t> co(nq), cdq(nq), cdk(nk), cdv(nk);
  std::vector<float> clse(nl);
  size_t cf = 0, cb = 0;
  FA_CHECK(flashattn_plan_get_workspace_size(cpu, FLASHATTN_PASS_FORWARD, &cf));
  FA_CHECK(flashattn_plan_get_workspace_size(cpu, FLASHATTN_PASS_BACKWARD, &cb));
  std::vector<unsigned char> cws(std::max<size_t>(std::max(cf, cb), 1));
  flashattn_fwd_args_t cfa = FLASHATTN_FWD_ARGS_INIT;
  cfa.q = p.q.data();
  cfa.k = p.k.data();
  cfa.v = p.v.data();
  cfa.o = co.data();
  cfa.lse = clse.data();
  FA_CHECK(flashattn_fwd(cpu, &cfa, cws.data(), cf, nullptr));
  flashattn_bwd_args_t cba = FLASHATTN_BWD_ARGS_INIT;
  cba.q = p.q.data();
  cba.k = p.k.data();
  cba.v = p.v.data();
  cba.o = co.data();
  cba.lse = clse.data();
  cba.dout = p.dout.data();
  cba.dq = cdq.data();
  cba.dk = cdk.data();
  cba.dv = cdv.data();
  FA_CHECK(flashattn_bwd(cpu, &cba, cws.data(), cb, nullptr));

  const double eo = max_abs_diff(o, co), eq = max_abs_diff(dq, cdq), ek = max_abs_diff(dk, cdk),
               ev = max_abs_diff(dv, cdv);
  std::printf("GPU vs CPU backend (fp16), max abs difference: O %.3g, dQ %.3g, dK %.3g, dV %.3g\n", eo, eq, ek, ev);

  flashattn_plan_destroy(gpu);
  flashattn_plan_destroy(cpu);
  for (void* ptr : {dq_in, dk_in, dv_in, d_o, d_dout, d_dq, d_dk, d_dv, static_cast<void*>(d_lse), d_ws})
    CUDA_CHECK(cudaFree(ptr));
  CUDA_CHECK(cudaStreamDestroy(stream));

  if (eo > 1e-2 || eq > 5e-2 || ek > 5e-2 || ev > 5e-2) {
    std::fprintf(stderr, "FAILED\n");
    return 1;
  }
  std::printf("OK\n");
  return 0;
}
