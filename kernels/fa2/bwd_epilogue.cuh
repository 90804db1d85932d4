// Epilogue of the FA2-design backward main kernel: dK (scaled) and dV of the CTA's k-block
// to global memory, on sm_90 staged through shared memory as whole 16-byte row chunks;
// when accumulating (p.grad_accumulate) straight from the fragments, each pair of values
// added in fp32 to the pair stored there and rounded once.
#pragma once
#include <stdint.h>

#include "common/params.h"
#include "fa2/bwd_ctx.cuh"
#include "fa2/bwd_primitives.cuh"
#include "fa2/bwd_state.cuh"
#include "fa2/mma.cuh"

namespace flashattn {
namespace fa2 {

// The first n_valid rows (kCols columns, the first `cols` of them stored) of a tile in
// shared memory to global rows `stride` elements apart, 16 bytes per thread and step.
template <class Tile, int kCols, int kRows, int kThreads, typename T>
__device__ __forceinline__ void bwd_rows_out(uint32_t s_tile, T* gdst, int64_t stride, int cols, int n_valid, int tid) {
  constexpr int kChunks = kCols / 8;  // 16-byte chunks per row
#pragma unroll 1
  for (int i = tid; i < kRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = (i % kChunks) * 8;
    if (r < n_valid && c < cols) {
      uint4 v;
      asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "r"(s_tile + 2u * static_cast<uint32_t>(Tile::offset(r, c))));
      *reinterpret_cast<uint4*>(gdst + static_cast<int64_t>(r) * stride + c) = v;
    }
  }
}

template <class Arch, class Tr, typename T, class G = BwdGrid<Arch, Tr>>
__device__ __forceinline__ void bwd_epilogue(const BwdKernel<Arch, Tr, T>& k,
                                             const float (&acc_dk)[G::kMTk][G::kNTk][4],
                                             const float (&acc_dv)[G::kMTk][G::kNTv][4]) {
  constexpr int Bc = Tr::Bc, D = Tr::D, DV = Tr::DV;
  constexpr int kMTk = G::kMTk, kNTk = G::kNTk, kNTv = G::kNTv;
  const AttnParams& p = k.p;
  BwdCtx& ctx = k.ctx;
  const uint32_t sK = k.sK, sV = k.sV;
  const int tid = threadIdx.x;
  // Bulk dQ reductions: complete (their shared-memory reads included) before the CTA exits.
  if constexpr (Arch::kSm90 && Tr::kDqBulk) {
    if ((tid & 31) == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
  }

  const int warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  int wk_m0, wk_n0, wv_n0;
  G::wk_pos(warp, wk_m0, wk_n0, wv_n0);
  const int b = bwd_lds(ctx.b), hk = bwd_lds(ctx.hk), n0 = bwd_lds(ctx.n0), n_valid = bwd_lds(ctx.n_valid);
  const int64_t k_tok = (p.varlen ? bwd_lds64(ctx.k_tok0) : 0) + n0;
  T* gdk = static_cast<T*>(p.dk) + (p.varlen ? 0 : static_cast<int64_t>(b) * p.dk_stride.b) + k_tok * p.dk_stride.s +
           static_cast<int64_t>(hk) * p.dk_stride.h;
  T* gdv = static_cast<T*>(p.dv) + (p.varlen ? 0 : static_cast<int64_t>(b) * p.dv_stride.b) + k_tok * p.dv_stride.s +
           static_cast<int64_t>(hk) * p.dv_stride.h;
  const int dqk = static_cast<int>(p.head_dim_qk), dv = static_cast<int>(p.head_dim_v);
  const float scale = p.scale;
  const bool add = p.grad_accumulate != 0;
  bool staged = false;
  if constexpr (Arch::kSm90) {
    // EPI: through shared memory (the K and V tiles, free now), then whole 16-byte row
    // chunks to global memory, when the row starts allow 16-byte stores (uniform).
    staged = !add && ((reinterpret_cast<uintptr_t>(gdk) | reinterpret_cast<uintptr_t>(gdv)) & 15u) == 0 &&
             ((p.dk_stride.s | p.dv_stride.s) & 7) == 0;
    if (staged) {
      // Every warp's last reads of sK and sV are done, and so are the prologue's copies into
      // them (still in flight here if the CTA had no tile to compute: no loop-top wait ran).
      cp_async_wait<0>();
      __syncthreads();
#pragma unroll
      for (int mt = 0; mt < kMTk; ++mt) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int r = wk_m0 + mt * 16 + g + 8 * hf;
#pragma unroll
          for (int nt = 0; nt < kNTk; ++nt) {
            const uint32_t v = pack2<T>(acc_dk[mt][nt][2 * hf] * scale, acc_dk[mt][nt][2 * hf + 1] * scale);
            const uint32_t a = sK + 2u * static_cast<uint32_t>(Tr::TileK::offset(r, wk_n0 + nt * 8 + 2 * t));
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a), "r"(v) : "memory");
          }
#pragma unroll
          for (int nt = 0; nt < kNTv; ++nt) {
            const uint32_t v = pack2<T>(acc_dv[mt][nt][2 * hf], acc_dv[mt][nt][2 * hf + 1]);
            const uint32_t a = sV + 2u * static_cast<uint32_t>(Tr::TileV::offset(r, wv_n0 + nt * 8 + 2 * t));
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a), "r"(v) : "memory");
          }
        }
      }
      __syncthreads();
      bwd_rows_out<typename Tr::TileK, D, Bc, Tr::kThreads>(sK, gdk, p.dk_stride.s, dqk, n_valid, tid);
      bwd_rows_out<typename Tr::TileV, DV, Bc, Tr::kThreads>(sV, gdv, p.dv_stride.s, dv, n_valid, tid);
    }
  }
#pragma unroll
  for (int mt = 0; mt < kMTk; ++mt) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = wk_m0 + mt * 16 + g + 8 * hf;
      if (staged || r >= n_valid) continue;
#pragma unroll
      for (int nt = 0; nt < kNTk; ++nt) {
        const int c = wk_n0 + nt * 8 + 2 * t;
        if (c < dqk)
          store_grad2<T>(gdk + static_cast<int64_t>(r) * p.dk_stride.s + c, __fmul_rn(acc_dk[mt][nt][2 * hf], scale),
                         __fmul_rn(acc_dk[mt][nt][2 * hf + 1], scale), add);
      }
#pragma unroll
      for (int nt = 0; nt < kNTv; ++nt) {
        const int c = wv_n0 + nt * 8 + 2 * t;
        if (c < dv)
          store_grad2<T>(gdv + static_cast<int64_t>(r) * p.dv_stride.s + c, acc_dv[mt][nt][2 * hf],
                         acc_dv[mt][nt][2 * hf + 1], add);
      }
    }
  }
}

}  // namespace fa2
}  // namespace flashattn
