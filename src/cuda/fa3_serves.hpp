// What the FA3-design forward and backward (kernels/fa3) have in common in deciding whether
// they serve a run: the device, the dtype and the options neither implements.
#pragma once
#include <stddef.h>

#include "backends.hpp"

namespace flashattn {

// Writes the reason into why (printf format, why_size bytes) and returns false.
__attribute__((format(printf, 3, 4))) bool fa3_refuse(char* why, size_t why_size, const char* fmt, ...);

// Whether the current device and p's dtype and options allow an fa3 kernel: a compute
// capability 9.0 device, a build with sm_90a kernels, fp16 or bf16, a dense batch without KV
// cache, bias, ALiBi, softcap, dropout or block-sparse layout, no band mask but the causal
// one (window right 0, left unbounded) in either alignment. If not, `why` says why.
bool fa3_serves_options(const AttnParams& p, char* why, size_t why_size);

}  // namespace flashattn
