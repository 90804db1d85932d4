/*
 * libflashattn from C on the CPU backend: causal grouped-query attention, forward and
 * backward, checked against a naive reference; then an error and its message.
 *
 * Build: cc -std=c99 attention_cpu.c $(pkg-config --cflags --libs flashattn) -lm
 * Exit status 0 when the results match the reference.
 */
#include <flashattn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Print the failing call, status name and the library's message, then leave. */
#define CHECK(call)                                                                                        \
  do {                                                                                                     \
    flashattn_status_t st_ = (call);                                                                       \
    if (st_ != FLASHATTN_STATUS_SUCCESS) {                                                                 \
      fprintf(stderr, "%s failed: %s: %s\n", #call, flashattn_status_string(st_), flashattn_last_error()); \
      exit(1);                                                                                             \
    }                                                                                                      \
  } while (0)

enum { B = 2, SQ = 48, SK = 64, HQ = 4, HKV = 2, D = 32 };

/* Contiguous BSHD index. */
static size_t at(int b, int s, int h, int x, int S, int H) { return (((size_t)b * S + s) * H + h) * D + x; }

/* Naive causal (bottom-right aligned) attention for one query row; returns the LSE. */
static double reference_row(const float* q, const float* k, const float* v, int b, int i, int h, double* o) {
  const int hk = h / (HQ / HKV), shift = SK - SQ;
  double s[SK], m = -INFINITY, l = 0.0;
  for (int j = 0; j < SK; ++j) {
    s[j] = -INFINITY;
    if (j > i + shift) continue;
    double dot = 0.0;
    for (int x = 0; x < D; ++x) dot += (double)q[at(b, i, h, x, SQ, HQ)] * k[at(b, j, hk, x, SK, HKV)];
    s[j] = dot / sqrt((double)D);
    if (s[j] > m) m = s[j];
  }
  for (int j = 0; j < SK; ++j) l += s[j] == -INFINITY ? 0.0 : exp(s[j] - m);
  for (int x = 0; x < D; ++x) {
    o[x] = 0.0;
    for (int j = 0; j < SK; ++j)
      if (s[j] != -INFINITY) o[x] += exp(s[j] - m) / l * v[at(b, j, hk, x, SK, HKV)];
  }
  return m + log(l);
}

int main(void) {
  int major, minor, patch;
  flashattn_get_version(&major, &minor, &patch);
  printf("libflashattn %d.%d.%d (CUDA backend built: %s)\n", major, minor, patch,
         flashattn_has_cuda_backend() ? "yes" : "no");

  const size_t nq = (size_t)B * SQ * HQ * D, nk = (size_t)B * SK * HKV * D, nl = (size_t)B * HQ * SQ;
  float* q = malloc(nq * sizeof *q);
  float* k = malloc(nk * sizeof *k);
  float* v = malloc(nk * sizeof *v);
  float* o = malloc(nq * sizeof *o);
  float* dout = malloc(nq * sizeof *dout);
  float* dq = malloc(nq * sizeof *dq);
  float* dk = malloc(nk * sizeof *dk);
  float* dv = malloc(nk * sizeof *dv);
  float* lse = malloc(nl * sizeof *lse);
  if (!q || !k || !v || !o || !dout || !dq || !dk || !dv || !lse) return 1;
  for (size_t i = 0; i < nq; ++i) q[i] = (float)sin(0.37 * (double)i), dout[i] = (float)cos(0.11 * (double)i);
  for (size_t i = 0; i < nk; ++i) k[i] = (float)cos(0.13 * (double)i), v[i] = (float)sin(0.07 * (double)i);

  /* 1. Plan: shape, dtype, options. */
  flashattn_plan_t plan = NULL;
  CHECK(flashattn_plan_create(&plan, FLASHATTN_BACKEND_CPU, 0));
  CHECK(flashattn_plan_set_shape(plan, B, SQ, SK, HQ, HKV, D, D));
  CHECK(flashattn_plan_set_dtype(plan, FLASHATTN_DTYPE_FP32));
  CHECK(flashattn_plan_set_band_mask(plan, FLASHATTN_ALIGN_BOTTOM_RIGHT, FLASHATTN_WINDOW_UNBOUNDED, 0));

  /* 2. Forward with a caller-owned workspace. */
  size_t fwd_bytes = 0, bwd_bytes = 0;
  CHECK(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_FORWARD, &fwd_bytes));
  CHECK(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_BACKWARD, &bwd_bytes));
  size_t ws_bytes = fwd_bytes > bwd_bytes ? fwd_bytes : bwd_bytes;
  void* ws = ws_bytes ? malloc(ws_bytes) : NULL;
  if (ws_bytes && !ws) return 1;

  flashattn_fwd_args_t fa = FLASHATTN_FWD_ARGS_INIT;
  fa.q = q;
  fa.k = k;
  fa.v = v;
  fa.o = o;
  fa.lse = lse;
  CHECK(flashattn_fwd(plan, &fa, ws, fwd_bytes, NULL));

  double max_err = 0.0, ref[D];
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < HQ; ++h)
      for (int i = 0; i < SQ; ++i) {
        double l = reference_row(q, k, v, b, i, h, ref);
        double e = fabs(l - lse[((size_t)b * HQ + h) * SQ + i]);
        if (e > max_err) max_err = e;
        for (int x = 0; x < D; ++x) {
          e = fabs(ref[x] - o[at(b, i, h, x, SQ, HQ)]);
          if (e > max_err) max_err = e;
        }
      }
  printf("forward: max |error| vs reference = %.3g\n", max_err);

  /* 3. Backward. Check dV: the sum of dV over all keys of a kv head equals the sum of dO
     over its query heads' rows (each softmax row sums to 1). */
  flashattn_bwd_args_t ba = FLASHATTN_BWD_ARGS_INIT;
  ba.q = q;
  ba.k = k;
  ba.v = v;
  ba.o = o;
  ba.lse = lse;
  ba.dout = dout;
  ba.dq = dq;
  ba.dk = dk;
  ba.dv = dv;
  CHECK(flashattn_bwd(plan, &ba, ws, bwd_bytes, NULL));
  double bwd_err = 0.0;
  for (int b = 0; b < B; ++b)
    for (int hk = 0; hk < HKV; ++hk)
      for (int x = 0; x < D; ++x) {
        double sdv = 0.0, sdo = 0.0;
        for (int j = 0; j < SK; ++j) sdv += dv[at(b, j, hk, x, SK, HKV)];
        for (int h = hk * (HQ / HKV); h < (hk + 1) * (HQ / HKV); ++h)
          for (int i = 0; i < SQ; ++i) sdo += dout[at(b, i, h, x, SQ, HQ)];
        if (fabs(sdv - sdo) > bwd_err) bwd_err = fabs(sdv - sdo);
      }
  printf("backward: max |sum(dV) - sum(dO)| = %.3g\n", bwd_err);

  /* 4. Errors: a specific status and a message naming the argument; the plan is unchanged. */
  flashattn_status_t st = flashattn_plan_set_shape(plan, B, SQ, SK, HQ, HKV, 300, D);
  printf("set_shape(head_dim_qk=300): %s (%d): %s\n", flashattn_status_string(st), (int)st, flashattn_last_error());

  flashattn_plan_destroy(plan);
  free(ws);
  free(q), free(k), free(v), free(o), free(dout), free(dq), free(dk), free(dv), free(lse);
  if (max_err > 1e-4 || bwd_err > 1e-3 || st != FLASHATTN_STATUS_INVALID_SHAPE) {
    fprintf(stderr, "FAILED\n");
    return 1;
  }
  printf("OK\n");
  return 0;
}
