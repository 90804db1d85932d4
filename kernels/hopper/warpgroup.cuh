// Warpgroup-level helpers of the sm_90a warp-specialized kernels (fa3 forward and backward):
// register reallocation between producer and consumer warpgroups (setmaxnreg), named
// barriers, and the accumulator-to-A-operand conversion of 16-bit wgmma GEMMs.
#pragma once
#include <stdint.h>

#include "fa2/mma.cuh"

namespace flashattn {
namespace hopper {

// setmaxnreg: every warp of the warpgroup executes it; it takes effect only under
// __launch_bounds__(threads, 1) (ptxas warns C7508 otherwise).
template <uint32_t kRegs>
__device__ __forceinline__ void regs_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <uint32_t kRegs>
__device__ __forceinline__ void regs_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// Named barriers (bar.sync / bar.arrive with an id and a thread count; id 0 is __syncthreads).
__device__ __forceinline__ void bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// A warpgroup accumulator (64 x 8 NT, fp32, the C-fragment layout of wgmma.cuh) as the A
// operand of a following register-sourced wgmma (64 x 8 NT along K): for k16 step kk, the
// A-fragment layout of mma.sync m16n8k16 (rows g, g + 8; columns 16 kk + 2t.., + 8). For
// 16-bit types the layouts match element for element: no shuffles.
template <typename T, int NT>
__device__ __forceinline__ void pack_a(uint32_t (&a)[NT / 2][4], const float (&acc)[1][NT][4]) {
#pragma unroll
  for (int kk = 0; kk < NT / 2; ++kk) {
    a[kk][0] = fa2::pack2<T>(acc[0][2 * kk][0], acc[0][2 * kk][1]);
    a[kk][1] = fa2::pack2<T>(acc[0][2 * kk][2], acc[0][2 * kk][3]);
    a[kk][2] = fa2::pack2<T>(acc[0][2 * kk + 1][0], acc[0][2 * kk + 1][1]);
    a[kk][3] = fa2::pack2<T>(acc[0][2 * kk + 1][2], acc[0][2 * kk + 1][3]);
  }
}

}  // namespace hopper
}  // namespace flashattn
