/*
 * A C99 program using the *installed* libflashattn the way a user would: header from
 * the install prefix, library found by find_package(flashattn) or pkg-config.
 *
 * Runs one CPU forward pass (fp32, GQA, seqlen_q != seqlen_k) on pseudo-random data and
 * checks O and LSE against a naive double-precision softmax attention computed here,
 * plus the version handshake and one error path. Exits nonzero on any failure.
 */
#include <flashattn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { B = 2, SQ = 5, SK = 7, HQ = 4, HKV = 2, D = 16 };

static int failures = 0;

static void expect(int ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "consumer.c: FAILED: %s\n", what);
    ++failures;
  }
}

static void check_status(flashattn_status_t st, const char* call) {
  if (st != FLASHATTN_STATUS_SUCCESS) {
    fprintf(stderr, "consumer.c: %s returned %s: %s\n", call, flashattn_status_string(st), flashattn_last_error());
    exit(1);
  }
}

/* Deterministic values in [-1, 1). */
static float next_value(uint32_t* state) {
  *state = *state * 1664525u + 1013904223u;
  return (float)((*state >> 8) & 0xFFFFu) / 32768.0f - 1.0f;
}

int main(void) {
  static float q[B * SQ * HQ * D], k[B * SK * HKV * D], v[B * SK * HKV * D];
  static float o[B * SQ * HQ * D], lse[B * HQ * SQ];
  uint32_t state = 12345u;
  size_t n;
  for (n = 0; n < sizeof q / sizeof q[0]; ++n) q[n] = next_value(&state);
  for (n = 0; n < sizeof k / sizeof k[0]; ++n) k[n] = next_value(&state);
  for (n = 0; n < sizeof v / sizeof v[0]; ++n) v[n] = next_value(&state);

  int major = -1, minor = -1, patch = -1;
  expect(flashattn_get_version(&major, &minor, &patch) == FLASHATTN_VERSION_NUMBER,
         "flashattn_get_version() equals FLASHATTN_VERSION_NUMBER of the installed header");
  expect(major == FLASHATTN_VERSION_MAJOR, "runtime major version equals the header's");

  flashattn_plan_t plan = NULL;
  check_status(flashattn_plan_create(&plan, FLASHATTN_BACKEND_CPU, 0), "flashattn_plan_create");

  /* A bad shape is refused with a specific status and a message. */
  expect(flashattn_plan_set_shape(plan, B, SQ, SK, 3, 2, D, D) == FLASHATTN_STATUS_INVALID_HEADS,
         "heads_q=3, heads_kv=2 gives FLASHATTN_STATUS_INVALID_HEADS");
  expect(flashattn_last_error()[0] != '\0', "a failed call leaves a message in flashattn_last_error()");

  check_status(flashattn_plan_set_shape(plan, B, SQ, SK, HQ, HKV, D, D), "flashattn_plan_set_shape");
  check_status(flashattn_plan_set_dtype(plan, FLASHATTN_DTYPE_FP32), "flashattn_plan_set_dtype");
  size_t ws_bytes = 0;
  check_status(flashattn_plan_get_workspace_size(plan, FLASHATTN_PASS_FORWARD, &ws_bytes),
               "flashattn_plan_get_workspace_size");
  void* ws = ws_bytes ? malloc(ws_bytes) : NULL;
  if (ws_bytes && !ws) return 1;

  flashattn_fwd_args_t args = FLASHATTN_FWD_ARGS_INIT;
  args.q = q;
  args.k = k;
  args.v = v;
  args.o = o;
  args.lse = lse;
  check_status(flashattn_fwd(plan, &args, ws, ws_bytes, NULL), "flashattn_fwd");

  /* Naive reference in double precision, default scale 1/sqrt(D). */
  const double scale = 1.0 / sqrt((double)D);
  double max_err_o = 0.0, max_err_lse = 0.0;
  int b, h, i, j, d;
  for (b = 0; b < B; ++b)
    for (h = 0; h < HQ; ++h)
      for (i = 0; i < SQ; ++i) {
        const int hk = h / (HQ / HKV);
        const float* qi = q + ((b * SQ + i) * HQ + h) * D;
        double s[SK], m = -INFINITY, sum = 0.0;
        for (j = 0; j < SK; ++j) {
          const float* kj = k + ((b * SK + j) * HKV + hk) * D;
          double dot = 0.0;
          for (d = 0; d < D; ++d) dot += (double)qi[d] * kj[d];
          s[j] = scale * dot;
          if (s[j] > m) m = s[j];
        }
        for (j = 0; j < SK; ++j) sum += exp(s[j] - m);
        const double ref_lse = m + log(sum);
        const float got_lse = lse[(b * HQ + h) * SQ + i];
        expect(isfinite(got_lse), "LSE is finite");
        if (fabs(got_lse - ref_lse) > max_err_lse) max_err_lse = fabs(got_lse - ref_lse);
        for (d = 0; d < D; ++d) {
          double ref_o = 0.0;
          for (j = 0; j < SK; ++j) ref_o += exp(s[j] - ref_lse) * v[((b * SK + j) * HKV + hk) * D + d];
          const float got_o = o[((b * SQ + i) * HQ + h) * D + d];
          expect(isfinite(got_o), "O is finite");
          if (fabs(got_o - ref_o) > max_err_o) max_err_o = fabs(got_o - ref_o);
        }
      }
  printf("consumer.c: libflashattn %d.%d.%d, max |O - ref| = %.3g, max |LSE - ref| = %.3g\n", major, minor, patch,
         max_err_o, max_err_lse);
  expect(max_err_o < 1e-4, "O matches the naive reference within 1e-4");
  expect(max_err_lse < 1e-4, "LSE matches the naive reference within 1e-4");

  flashattn_plan_destroy(plan);
  flashattn_plan_destroy(NULL);
  free(ws);
  return failures ? 1 : 0;
}
