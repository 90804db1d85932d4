// reference_fp64 (reference/) as a filter, for the test that holds the Python fp64
// reference (reference/reference.py) to it: bindings/python/tests/test_reference_sync.py.
//
// Reads one problem from stdin as whitespace-separated numbers, in this order (a list is
// its length followed by its elements; integers and doubles in decimal):
//   batch heads_q heads_kv head_dim_qk head_dim_v max_sq max_sk
//   cu_q (list) cu_k (list) scale softcap
//   band align window_left window_right
//   bias_kind bcast_b bcast_h bcast_q bcast_k bias (list, expanded) slopes (list)
//   p_drop seed offset
//   layout (list) layout_heads n_row_blocks n_col_blocks block_q block_k
//   backward q (list) k (list) v (list) dout (list)
// and writes `name count values...` lines for o, lse and, with backward, dq, dk, dv,
// dbias, every value with 17 significant digits. Exit status 2 on malformed input.
#include <stdio.h>

#include <vector>

#include "reference.hpp"

namespace {

bool read_i64(int64_t& x) { return scanf("%lld", reinterpret_cast<long long*>(&x)) == 1; }
bool read_f64(double& x) { return scanf("%lf", &x) == 1; }

template <typename T, bool (*Read)(T&)>
bool read_list(std::vector<T>& out) {
  int64_t n = 0;
  if (!read_i64(n) || n < 0) return false;
  out.resize(static_cast<size_t>(n));
  for (T& x : out)
    if (!Read(x)) return false;
  return true;
}

bool read_u8(uint8_t& x) {
  int64_t v = 0;
  if (!read_i64(v) || v < 0 || v > 255) return false;
  x = static_cast<uint8_t>(v);
  return true;
}

bool read_problem(fat::RefSpec& s, fat::RefInputs& in, bool& backward) {
  int64_t align = 0, bias_kind = 0, band = 0, bwd = 0, seed = 0, offset = 0;
  int64_t bcast[4] = {0, 0, 0, 0};
  double p = 0.0;
  bool ok = read_i64(s.batch) && read_i64(s.heads_q) && read_i64(s.heads_kv) && read_i64(s.head_dim_qk) &&
            read_i64(s.head_dim_v) && read_i64(s.max_sq) && read_i64(s.max_sk) &&
            read_list<int64_t, read_i64>(s.cu_q) && read_list<int64_t, read_i64>(s.cu_k) && read_f64(s.scale) &&
            read_f64(s.softcap) && read_i64(band) && read_i64(align) && read_i64(s.window_left) &&
            read_i64(s.window_right) && read_i64(bias_kind);
  for (int64_t& f : bcast) ok = ok && read_i64(f);
  ok = ok && read_list<double, read_f64>(s.bias) && read_list<double, read_f64>(s.slopes) && read_f64(p) &&
       read_i64(seed) && read_i64(offset) && read_list<uint8_t, read_u8>(s.layout) && read_i64(s.layout_heads) &&
       read_i64(s.n_row_blocks) && read_i64(s.n_col_blocks) && read_i64(s.block_q) && read_i64(s.block_k) &&
       read_i64(bwd) && read_list<double, read_f64>(in.q) && read_list<double, read_f64>(in.k) &&
       read_list<double, read_f64>(in.v) && read_list<double, read_f64>(in.dout);
  if (!ok) return false;
  s.band = band != 0;
  s.align = static_cast<int>(align);
  s.bias_kind = static_cast<int>(bias_kind);
  for (int d = 0; d < 4; ++d) s.bias_bcast[d] = bcast[d] != 0;
  s.p_drop = static_cast<float>(p);
  s.seed = static_cast<uint64_t>(seed);
  s.offset = static_cast<uint64_t>(offset);
  s.magnitudes = false;
  backward = bwd != 0;
  return static_cast<int64_t>(s.cu_q.size()) == s.batch + 1 && static_cast<int64_t>(s.cu_k.size()) == s.batch + 1;
}

void write(const char* name, const std::vector<double>& x) {
  printf("%s %zu", name, x.size());
  for (double v : x) printf(" %.17g", v);
  printf("\n");
}

}  // namespace

int main() {
  fat::RefSpec s;
  fat::RefInputs in;
  bool backward = false;
  if (!read_problem(s, in, backward)) {
    fprintf(stderr, "reference_dump: malformed problem on stdin (see the format in reference_dump.cpp)\n");
    return 2;
  }
  const fat::RefOutputs r = fat::reference_fp64(s, in, backward);
  write("o", r.o);
  write("lse", r.lse);
  if (backward) {
    write("dq", r.dq);
    write("dk", r.dk);
    write("dv", r.dv);
    write("dbias", r.dbias);
  }
  return 0;
}
