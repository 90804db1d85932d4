// A straightforward fp64 attention reference covering every option the CLI exposes:
// GQA/MQA, head_dim_v != head_dim, band masks (causal, sliding window, both alignments),
// softcap, ALiBi (both kinds), dropout (Philox keep decision from the header's contract),
// block-sparse layouts; forward (O, LSE) and backward (dQ, dK, dV).
//
// It shares no code with the library: it is written from the documented semantics, so
// an agreement is evidence, not a tautology.
#pragma once
#include <cstdint>
#include <vector>

#include "problem.hpp"

namespace facli {

// All tensors are logical-BSHD contiguous fp64 (HostTensor::to_double of the rounded
// inputs); LSE is [batch, heads_q, seqlen_q], -inf for a fully masked row.
struct RefOutputs {
  std::vector<double> o, lse, dq, dk, dv;
};

void reference_forward(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                       const std::vector<double>& v, RefOutputs* out);
// Uses out->o and out->lse from reference_forward.
void reference_backward(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                        const std::vector<double>& v, const std::vector<double>& dout, RefOutputs* out);

// Philox4x32-10 (Salmon et al. 2011) on counter c and key k.
void reference_philox(const uint32_t c[4], const uint32_t k[2], uint32_t out[4]);
// Keep decision of dropout element (b, h, i, j) as flashattn_plan_set_dropout documents it.
bool reference_dropout_keep(uint64_t seed, uint64_t offset, int64_t b, int64_t heads_q, int64_t h, int64_t i,
                            int64_t j, float p);

}  // namespace facli
