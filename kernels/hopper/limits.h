// Limits of an sm_90 CTA that the Hopper kernels' tile plans are sized against, plain C++ so
// the host's launch code reads the same numbers.
#pragma once

namespace flashattn {
namespace hopper {

// The opt-in dynamic shared memory of a CTA on sm_90: 227 KB.
constexpr int kSmemLimit = 227 * 1024;

}  // namespace hopper
}  // namespace flashattn
