// Checked size arithmetic: every size derived from caller input (element counts, byte
// extents of strided tensors, LSE, bias, layout and workspace sizes on every backend) is
// computed as a CheckedSize, so an overflow is reported instead of wrapping to a small
// number that a run would then overrun. Host code only (the CUDA host files include it).
#pragma once
#include <stdint.h>

namespace flashattn {

// A non-negative count that remembers overflow. The limit is INT64_MAX, which is also
// PTRDIFF_MAX on the supported 64-bit targets: no object can be larger, so any size
// beyond it is an error whatever the size_t range. Once a step overflows (or a negative
// operand appears) the result stays invalid through every later operation.
class CheckedSize {
 public:
  constexpr CheckedSize() = default;
  constexpr CheckedSize(int64_t v) : value_(v < 0 ? 0 : v), ok_(v >= 0) {}  // NOLINT: implicit by design

  bool ok() const { return ok_; }
  // The value; meaningful only when ok().
  int64_t value() const { return value_; }

  friend CheckedSize operator+(CheckedSize a, CheckedSize b) {
    CheckedSize r;
    r.ok_ = a.ok_ && b.ok_ && !__builtin_add_overflow(a.value_, b.value_, &r.value_);
    return r;
  }
  friend CheckedSize operator*(CheckedSize a, CheckedSize b) {
    CheckedSize r;
    r.ok_ = a.ok_ && b.ok_ && !__builtin_mul_overflow(a.value_, b.value_, &r.value_);
    return r;
  }
  CheckedSize& operator+=(CheckedSize b) { return *this = *this + b; }
  CheckedSize& operator*=(CheckedSize b) { return *this = *this * b; }

  // Rounded up to a multiple of `unit` (> 0).
  CheckedSize round_up(int64_t unit) const {
    const CheckedSize up = *this + CheckedSize(unit - 1);
    CheckedSize r;
    r.ok_ = up.ok_;
    r.value_ = up.value_ / unit * unit;
    return r;
  }

 private:
  int64_t value_ = 0;
  bool ok_ = true;
};

// The product of all factors, checked.
template <class... Ts>
CheckedSize checked_product(Ts... factors) {
  CheckedSize r(1);
  ((r *= CheckedSize(static_cast<int64_t>(factors))), ...);
  return r;
}

}  // namespace flashattn
