// FLASHATTN_CUDA_FORWARD and FLASHATTN_CUDA_BACKWARD (kernel_path.hpp).
#include "cuda/kernel_path.hpp"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

namespace flashattn {
namespace {

struct PathValue {
  char text[64];
};
PathValue read_value(const char* name) {
  PathValue v{};
  const char* e = secure_getenv(name);
  snprintf(v.text, sizeof v.text, "%s", e != nullptr ? e : "");
  return v;
}

}  // namespace

const char* path_var_name(PathVar var) {
  return var == PathVar::kForward ? "FLASHATTN_CUDA_FORWARD" : "FLASHATTN_CUDA_BACKWARD";
}

const char* forced_path_value(PathVar var) {
  static const PathValue forward = read_value(path_var_name(PathVar::kForward));
  static const PathValue backward = read_value(path_var_name(PathVar::kBackward));
  return var == PathVar::kForward ? forward.text : backward.text;
}

ForcedPath forced_path(PathVar var) {
  const char* v = forced_path_value(var);
  if (v[0] == '\0') return ForcedPath::kAuto;
  if (strcmp(v, "fa2") == 0) return ForcedPath::kFa2;
  if (strcmp(v, "fa3") == 0) return ForcedPath::kFa3;
  return ForcedPath::kInvalid;
}

}  // namespace flashattn
