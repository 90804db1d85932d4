// Internal interface between the CPU entry points (cpu_backend.cpp) and the algorithm
// implementations (flash_fwd.cpp, flash_bwd.cpp, standard.cpp).
//
// Workspace model: every algorithm splits its workspace into a shared region (only the
// standard path has one: S/P and friends) followed by one private slot per thread. The
// sizes are pure functions of the shapes and options, so the size the user queried and
// the layout the run uses always agree; a run uses as many threads as the workspace
// has slots (and no more than the plan's thread count, cpu_prepare_plan()).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "checked_size.hpp"
#include "common/params.h"
#include "flashattn.h"

namespace flashattn {
namespace cpu {

// Tile sizes of the flash path: 64 x 64 score tiles keep Q/K/V/S tiles of head dim up
// to 128 inside L2 of one core, and 64 is a multiple of the GEMM column unit (16).
constexpr int64_t kBr = 64;  // query rows per tile
constexpr int64_t kBc = 64;  // key columns per tile

// The forward takes a sequence's query rows in blocks of kFwdBlockRows (a task takes one
// or two: flash_fwd.cpp); a block of at most kDotRows rows (decode, short chunks, a short
// last block) computes its scores as dot products (dot_rows) rather than GEMM tiles:
// transposing a K tile costs more than the GEMM saves when few rows share it. The two sum
// in different orders, so the backward recomputes each row's scores by the path the
// forward took, and P = exp(S - LSE) sees the S that the LSE was computed from.
constexpr int64_t kFwdBlockRows = 4 * kBr;
constexpr int64_t kDotRows = 8;

// The first of a sequence's len_q query rows whose forward scores are dot products (len_q
// when there is none): the rows of its last block when that block is short enough.
constexpr int64_t first_dot_row(int64_t len_q) {
  const int64_t last = len_q > 0 ? (len_q - 1) / kFwdBlockRows * kFwdBlockRows : 0;
  return len_q - last <= kDotRows ? last : len_q;
}

// A forward whose sequences all have at most kDotRows query rows (decode, short chunks)
// takes the decode schedule (flash_fwd.cpp): a task per (sequence, range of query heads,
// key split) that loads each K and V tile once for all the query heads sharing its kv
// head (GQA).
bool decode_schedule(const AttnParams& p);

// Key splits for `tasks` (sequence, head, query block) tasks over seqlen_k keys: enough
// tasks for the largest CPU teams (64), each split at least 256 keys (4 tiles). A function
// of the shape only, never of the thread count, so results do not depend on it.
int64_t key_splits_for(int64_t tasks, int64_t seqlen_k);

// Key splits of a decode schedule (its tasks: sequence x range of query heads).
int64_t decode_splits(const AttnParams& p);

// Key splits of a forward run (1: none): the plan's for a KV-cache run, decode_splits for
// a decode schedule (varlen too: from the batch's task count and maximum key length, each
// sequence's own keys cut into that many ranges, so a varlen decode whose sequences all
// have the maximum key length gives the dense decode's bits), else 1.
int64_t forward_splits(const AttnParams& p);

// Alignment of every buffer carved from the workspace (cache line).
constexpr int64_t kAlign = 64;

// Bump allocator over a workspace region. The sizes are computed by the same code path
// with a null base, in checked arithmetic (the API layer refuses a size that overflows),
// so carving a real workspace never overflows.
struct Carver {
  char* base;
  CheckedSize used = 0;
  // A buffer of the product of `factors` floats.
  template <class... Ts>
  float* floats(Ts... factors) {
    return array<float>(factors...);
  }
  // A buffer of the product of `factors` 32-bit words (bf16 pairs, amx.hpp).
  template <class... Ts>
  uint32_t* words(Ts... factors) {
    return array<uint32_t>(factors...);
  }
  template <class T, class... Ts>
  T* array(Ts... factors) {
    T* ptr = base ? reinterpret_cast<T*>(base + used.value()) : nullptr;
    used += checked_product(factors..., sizeof(T)).round_up(kAlign);
    return ptr;
  }
};

// Whether run p multiplies on AMX tiles (amx.hpp): bf16 inputs without rotary embedding on
// the amx set. A forward's GEMM blocks then compute S^T = K Q^T and O^T = V^T P^T with bf16
// operands and fp32 sums (P rounded to bf16, as torch's CPU attention and the GPU kernels
// do); dot blocks (decode) keep their fp32 products. A backward's tile pairs compute their
// five products on tiles (flash_bwd.cpp).
bool amx_products(const AttnParams& p);

// Per-thread slot bytes and shared bytes of each algorithm.
CheckedSize flash_fwd_shared_bytes(const AttnParams& p);
CheckedSize flash_fwd_slot_bytes(const AttnParams& p);
CheckedSize flash_bwd_slot_bytes(const AttnParams& p);
CheckedSize standard_shared_bytes(const AttnParams& p);
CheckedSize standard_slot_bytes(const AttnParams& p);

// Multiply-adds of one pass over every (query, key) pair of p, ignoring masks: the
// work estimate that sizes the team (team_size in thread_pool.hpp).
double attention_work(const AttnParams& p);

// Runs with `threads` team members; workspace holds shared + threads * slot bytes.
void flash_forward(const AttnParams& p, char* workspace, int threads);
void flash_backward(const AttnParams& p, char* workspace, int threads);
void standard_forward(const AttnParams& p, char* workspace, int threads);
void standard_backward(const AttnParams& p, char* workspace, int threads);

// CUDA device memory (that the CPU cannot read) in a pointer of the run, or in `ptr`
// named `name`: WRONG_MEMORY_SPACE naming it (host_memory.cpp: probed only when the
// process has loaded the CUDA driver).
flashattn_status_t check_host_memory(const AttnParams& p);
flashattn_status_t check_host_memory(const void* ptr, const char* name);

// Varlen tokens past cu_seqlens[batch] belong to no sequence: forward writes O = 0 and
// LSE = -inf for them, backward writes zero gradients.
void write_uncovered_tokens(const AttnParams& p);

}  // namespace cpu
}  // namespace flashattn
