// Merging partial attention results over a split of the keys: the row merge shared by
// split-KV runs and the public flashattn_combine on the CPU.
#include <math.h>

#include "backends.hpp"
#include "cpu/cpu_impl.hpp"
#include "cpu/kvcache.hpp"
#include "cpu/tensor_view.hpp"
#include "cpu/thread_pool.hpp"
#include "error.hpp"

namespace flashattn {
namespace cpu {

float combine_row(int64_t n, const float* o, int64_t o_step, const float* lse, int64_t lse_step, int64_t dim,
                  float* out) {
  // The largest finite-or-NaN-free LSE: exp(lse_i - lse_max) <= 1 cannot overflow. A NaN
  // part is not skipped: its weight is NaN and makes the row NaN.
  float lse_max = -INFINITY;
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    const float l = lse[i * lse_step];
    nan |= l != l;
    if (l > lse_max) lse_max = l;
  }
  for (int64_t d = 0; d < dim; ++d) out[d] = 0.f;
  if (nan) {
    for (int64_t d = 0; d < dim; ++d) out[d] = NAN;
    return NAN;
  }
  if (lse_max == -INFINITY) return -INFINITY;
  float sum = 0.f;
  for (int64_t i = 0; i < n; ++i) {
    const float l = lse[i * lse_step];
    if (l != -INFINITY) sum += expf(l - lse_max);
  }
  const float lse_out = lse_max + logf(sum);
  for (int64_t i = 0; i < n; ++i) {
    const float l = lse[i * lse_step];
    if (l == -INFINITY) continue;
    const float w = expf(l - lse_out);
    const float* part = o + i * o_step;
    for (int64_t d = 0; d < dim; ++d) out[d] += w * part[d];
  }
  return lse_out;
}

}  // namespace cpu

flashattn_status_t cpu_combine(const CombineParams& c) {
  FA_TRY(cpu::check_host_memory(c.o_partial, "args.o_partial"));
  FA_TRY(cpu::check_host_memory(c.lse_partial, "args.lse_partial"));
  FA_TRY(cpu::check_host_memory(c.o, "args.o"));
  if (c.lse != nullptr) FA_TRY(cpu::check_host_memory(c.lse, "args.lse"));
  const int64_t n_rows = c.batch * c.seqlen_q * c.heads;
  const int threads = cpu::default_thread_count();
  cpu::TaskCounter tasks(n_rows);
  const double work = static_cast<double>(n_rows * c.num_splits * c.head_dim);
  cpu::run_team(cpu::team_size(threads, n_rows, work), [&](const cpu::TeamMember&) {
    float out[FLASHATTN_MAX_HEAD_DIM];
    for (int64_t t = tasks.next(); t >= 0; t = tasks.next()) {
      const int64_t h = t % c.heads, i = (t / c.heads) % c.seqlen_q, b = t / (c.heads * c.seqlen_q);
      const float* o = c.o_partial + b * c.o_partial_stride[1] + i * c.o_partial_stride[2] + h * c.o_partial_stride[3];
      const float* lse =
          c.lse_partial + b * c.lse_partial_stride[1] + h * c.lse_partial_stride[2] + i * c.lse_partial_stride[3];
      const float l =
          cpu::combine_row(c.num_splits, o, c.o_partial_stride[0], lse, c.lse_partial_stride[0], c.head_dim, out);
      const int64_t off = b * c.o_stride.b + i * c.o_stride.s + h * c.o_stride.h;
      cpu::row_from_float(out, c.dtype, cpu::elem_ptr(c.o, c.dtype, off), c.head_dim);
      if (c.lse != nullptr) c.lse[(b * c.heads + h) * c.seqlen_q + i] = l;
    }
  });
  return FLASHATTN_STATUS_SUCCESS;
}

}  // namespace flashattn
