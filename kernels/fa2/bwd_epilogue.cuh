// Epilogue of the FA2-design backward main kernel: dK (scaled) and dV of the CTA's k-block
// to global memory, on sm_90 staged through shared memory as whole 16-byte row chunks.
// Accumulating (p.grad_accumulate), each value is added in fp32 to the one stored there and
// rounded once: on sm_90 staged in fp32 (bwd_add_staged), otherwise straight from the
// fragments.
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

// One gradient of the accumulating epilogue through shared memory in fp32 (the K, V, P and
// dS tiles, free now, hold Bc x kD floats): the fragments times `mul` to row r's 16-byte
// chunk c at r * 4 kD + 16 (c ^ (r & 7)) bytes (kD a multiple of 32), then 4 elements per
// thread and step: the stored values loaded (as one 8-byte word when `vec`, else one by
// one), added in fp32, rounded once and stored. Inlined beside the fragment stores, loads
// of the stored values raise the main loop's register pressure into spills (sm_90a,
// d = 128); here they sit in a loop of their own.
template <int kMT, int kNT, int kD, int Bc, int kThreads, typename T>
__device__ __forceinline__ void bwd_add_staged(uint32_t s_tile, const float (&acc)[kMT][kNT][4], float mul, int m0,
                                               int n0, int g, int t, T* gdst, int64_t stride, int cols, int n_valid,
                                               bool vec, int tid) {
  static_assert(kD % 32 == 0, "the chunk swizzle stays within a row of at least 8 chunks");
  constexpr uint32_t kRowBytes = 4u * kD;
  __syncthreads();  // earlier readers of the region are done
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = m0 + mt * 16 + g + 8 * hf;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        const int c = n0 + nt * 8 + 2 * t;
        const uint32_t a = s_tile + static_cast<uint32_t>(r) * kRowBytes +
                           (static_cast<uint32_t>((c >> 2) ^ (r & 7)) << 4) + (static_cast<uint32_t>(c & 3) << 2);
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(a), "f"(__fmul_rn(acc[mt][nt][2 * hf], mul)),
                     "f"(__fmul_rn(acc[mt][nt][2 * hf + 1], mul))
                     : "memory");
      }
    }
  }
  __syncthreads();
  constexpr int kChunks = kD / 4;
#pragma unroll 1
  for (int i = tid; i < Bc * kChunks; i += kThreads) {
    const int r = i / kChunks, ch = i % kChunks;
    if (r < n_valid && ch * 4 < cols) {
      float4 v;
      asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                   : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                   : "r"(s_tile + static_cast<uint32_t>(r) * kRowBytes + (static_cast<uint32_t>(ch ^ (r & 7)) << 4)));
      T* const dst = gdst + static_cast<int64_t>(r) * stride + ch * 4;
      if (vec) {
        const uint2 old = *reinterpret_cast<const uint2*>(dst);
        const T* h = reinterpret_cast<const T*>(&old);
        uint2 sum;
        sum.x = pack2<T>(__fadd_rn(ElemTraits<T>::to_float(h[0]), v.x), __fadd_rn(ElemTraits<T>::to_float(h[1]), v.y));
        sum.y = pack2<T>(__fadd_rn(ElemTraits<T>::to_float(h[2]), v.z), __fadd_rn(ElemTraits<T>::to_float(h[3]), v.w));
        *reinterpret_cast<uint2*>(dst) = sum;
      } else {
        const float f[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int e = 0; e < 4; ++e)
          dst[e] = ElemTraits<T>::from_float(__fadd_rn(ElemTraits<T>::to_float(dst[e]), f[e]));
      }
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
  const float keep = p.rp_keep;  // dV: the dropout's keep scale, which P left out (1 without dropout)
  const bool add = p.grad_accumulate != 0;
  bool staged = false;
  if constexpr (Arch::kSm90) {
    // EPI: through shared memory (the K and V tiles, free now), then whole 16-byte row
    // chunks to global memory, when the row starts allow 16-byte stores (uniform).
    staged = ((reinterpret_cast<uintptr_t>(gdk) | reinterpret_cast<uintptr_t>(gdv)) & 15u) == 0 &&
             ((p.dk_stride.s | p.dv_stride.s) & 7) == 0;
    static_assert(4 * Bc * (D > DV ? D : DV) <= Tr::kOffStg, "fp32 rows of a gradient within the K, V, P, dS tiles");
    if (add) {
      cp_async_wait<0>();  // the prologue's copies into sK/sV, if no loop-top wait ran
      bwd_add_staged<kMTk, kNTk, D, Bc, Tr::kThreads>(sK, acc_dk, scale, wk_m0, wk_n0, g, t, gdk, p.dk_stride.s, dqk,
                                                      n_valid, staged, tid);
      bwd_add_staged<kMTk, kNTv, DV, Bc, Tr::kThreads>(sK, acc_dv, keep, wk_m0, wv_n0, g, t, gdv, p.dv_stride.s, dv,
                                                       n_valid, staged, tid);
      return;
    }
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
            const uint32_t v = pack2<T>(acc_dv[mt][nt][2 * hf] * keep, acc_dv[mt][nt][2 * hf + 1] * keep);
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
  const bool add_direct = !Arch::kSm90 && add;  // sm_90 code accumulates in bwd_add_staged only
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
                         __fmul_rn(acc_dk[mt][nt][2 * hf + 1], scale), add_direct);
      }
#pragma unroll
      for (int nt = 0; nt < kNTv; ++nt) {
        const int c = wv_n0 + nt * 8 + 2 * t;
        if (c < dv)
          store_grad2<T>(gdv + static_cast<int64_t>(r) * p.dv_stride.s + c, __fmul_rn(acc_dv[mt][nt][2 * hf], keep),
                         __fmul_rn(acc_dv[mt][nt][2 * hf + 1], keep), add_direct);
      }
    }
  }
}

}  // namespace fa2
}  // namespace flashattn
