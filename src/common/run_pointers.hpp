// Every memory pointer of a run (AttnParams), named as the caller knows it: the fields of
// flashattn_fwd_args_t, flashattn_bwd_args_t and flashattn_kvcache_args_t. Backends check
// them for their memory space.
// Host-only (no device code includes it).
#pragma once
#include <array>

#include "common/params.h"

namespace flashattn {

struct NamedPointer {
  const void* ptr;  // NULL when the run does not use it
  const char* name;
};

inline std::array<NamedPointer, 23> run_pointers(const AttnParams& p) {
  return {{{p.q, "args.q"},
           {p.k, p.kv_enabled ? "args.k_cache" : "args.k"},
           {p.v, p.kv_enabled ? "args.v_cache" : "args.v"},
           {p.o, "args.o"},
           {p.o_in, "args.o"},
           {p.lse, "args.lse"},
           {p.lse_in, "args.lse"},
           {p.dout, "args.dout"},
           {p.dq, "args.dq"},
           {p.dk, "args.dk"},
           {p.dv, "args.dv"},
           {p.bias, "args.bias"},
           {p.dbias, "args.dbias"},
           {p.alibi_slopes, "args.alibi_slopes"},
           {p.cu_seqlens_q, "args.cu_seqlens_q"},
           {p.cu_seqlens_k, "args.cu_seqlens_k"},
           {p.kv_seqused, "args.cache_seqlens"},
           {p.kv_batch_idx, "args.cache_batch_idx"},
           {p.kv_block_table, "args.block_table"},
           {p.k_new, "args.k_new"},
           {p.v_new, "args.v_new"},
           {p.rotary_cos, "args.rotary_cos"},
           {p.rotary_sin, "args.rotary_sin"}}};
}

}  // namespace flashattn
