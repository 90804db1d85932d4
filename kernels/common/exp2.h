// The kernels compute the softmax in base 2 (exp2 of scores scaled by log2(e)) and turn its
// log-sum-exp back to base e with ln(2).
#pragma once

namespace flashattn {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

}  // namespace flashattn
