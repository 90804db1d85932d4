// The Hopper copy engine (TMA: loads, stores) and shared-memory barriers (mbarrier) as the sm_90a kernels
// of every family use them: sm_90 instructions, called only from code compiled for sm_90a.
// Tensor maps come from the host (common/tensor_map.h) as __grid_constant__ parameters.
#pragma once
#include <stdint.h>

namespace flashattn {
namespace hopper {

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count = 1) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_expect(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0u);
}
// Starts fetching a tensor map into the copy engine's descriptor cache, so the first copy
// through it does not wait for the fetch.
__device__ __forceinline__ void tma_prefetch_map(const void* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
// Box (the map's columns x rows) of a 4-D map (cols, rows, heads, batch) at (c, r, h, b) into
// shared memory at dst, completing on bar.
__device__ __forceinline__ void tma_load(uint32_t dst, const void* map, int c, int r, int h, int b, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c), "r"(r), "r"(h), "r"(b), "r"(bar)
      : "memory");
}

// Box (the map's columns x rows) of a 4-D map at (c, r, h, b) from shared memory at src to global
// memory, in this thread's bulk group; elements outside the tensor are not written.
__device__ __forceinline__ void tma_store(const void* map, uint32_t src, int c, int r, int h, int b) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(src), "r"(c), "r"(r), "r"(h), "r"(b)
               : "memory");
}
// Adds the fp32 box of a 3-D map at (c, h, r) element by element into global memory, from
// shared memory at src (in the map's layout), in this thread's bulk group; elements outside
// the tensor are skipped.
__device__ __forceinline__ void tma_reduce_add_3d(const void* map, uint32_t src, int c, int h, int r) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(src), "r"(c), "r"(h), "r"(r)
      : "memory");
}
// The same for a 4-D map at (c, h, r, b).
__device__ __forceinline__ void tma_reduce_add_4d(const void* map, uint32_t src, int c, int h, int r, int b) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(src), "r"(c), "r"(h), "r"(r), "r"(b)
      : "memory");
}
// Closes this thread's open bulk group.
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Waits until every bulk group of this thread has read its shared-memory source.
__device__ __forceinline__ void bulk_wait_read_all() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// Waits until every bulk group of this thread has completed (its global writes done).
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// Byte offset, in a tile laid out as the copy engine loads (and stores) boxes in the
// kSw-byte swizzle, of the 16-byte chunk that holds 16-bit columns 8 n8 .. 8 n8 + 7 of row r:
// column blocks of kSw / 2 columns, kTileRows rows of kSw bytes each, the blocks' chunk k of
// row r at k ^ x with x = (r kSw / 128) % (kSw / 16) (r % 8 in the 128-byte swizzle, (r / 2)
// % 4 in the 64-byte one). A warp's 4-byte stores of a wgmma accumulator's rows g and columns
// 2t through it (plus 4t) hit 32 distinct banks.
template <int kSw, int kTileRows>
__device__ __forceinline__ uint32_t swizzled_chunk(int r, int n8) {
  constexpr int kChunks = kSw / 16;
  const int x = (r * kSw / 128) % kChunks;
  return static_cast<uint32_t>((n8 / kChunks) * kTileRows * kSw + r * kSw + (((n8 % kChunks) ^ x) << 4));
}

// Makes this thread's generic-proxy shared-memory writes visible to the async proxy (a TMA
// store or a wgmma that reads them after a barrier).
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Orders this thread's generic-proxy and async-proxy accesses to global memory (a turn
// counter's acquire before the bulk reduce-adds it allows; completed reduce-adds before the
// release that passes the turn on).
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }

}  // namespace hopper
}  // namespace flashattn
