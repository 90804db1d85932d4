// Turn counters of the deterministic backward (fa2 and fa3): a CTA that adds its dQ piece of
// a query block waits until the block's counter in global memory equals its turn, adds, then
// passes the turn on. Zero before the launch.
#pragma once
#include <stdint.h>

namespace flashattn {

__device__ __forceinline__ int turn_load(const int32_t* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// Sets the counter to v (the next turn), ordered after this thread's earlier writes.
__device__ __forceinline__ void turn_pass(int32_t* p, int v) {
  asm volatile("st.release.gpu.global.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
// Spins until *p == v (the CTAs before this one in the order took their turns).
__device__ __forceinline__ void turn_wait(const int32_t* p, int v) {
  while (turn_load(p) != v) __nanosleep(64);
}

}  // namespace flashattn
