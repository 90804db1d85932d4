// Every memory pointer of a run (AttnParams), named as the caller knows it: the fields of
// flashattn_fwd_args_t / flashattn_bwd_args_t. Backends check them for their memory space.
// Host-only (no device code includes it).
#pragma once
#include <array>

#include "common/params.h"

namespace flashattn {

struct NamedPointer {
  const void* ptr;  // NULL when the run does not use it
  const char* name;
};

inline std::array<NamedPointer, 16> run_pointers(const AttnParams& p) {
  return {{{p.q, "args.q"},
           {p.k, "args.k"},
           {p.v, "args.v"},
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
           {p.cu_seqlens_k, "args.cu_seqlens_k"}}};
}

}  // namespace flashattn
