#include "cpu/isa.hpp"

#include <stdlib.h>
#include <string.h>

#include "error.hpp"

namespace flashattn {
namespace cpu {
namespace {

const char* const kNames[kIsaCount] = {"baseline", "avx2", "avx512"};

// FLASHATTN_CPU_ISA's set: -1 when unset, kIsaCount for a name that is no set.
int forced_index() {
  const char* env = secure_getenv("FLASHATTN_CPU_ISA");
  if (env == nullptr) return -1;
  for (int i = 0; i < kIsaCount; ++i)
    if (strcmp(env, kNames[i]) == 0) return i;
  return kIsaCount;
}

Isa pick() {
  const int forced = forced_index();
  if (forced >= 0 && forced < kIsaCount && isa_usable(static_cast<Isa>(forced))) return static_cast<Isa>(forced);
  for (int i = kIsaCount - 1; i > 0; --i)
    if (isa_usable(static_cast<Isa>(i))) return static_cast<Isa>(i);
  return Isa::kBaseline;
}

}  // namespace

const char* isa_name(Isa isa) { return kNames[static_cast<int>(isa)]; }

bool isa_usable(Isa isa) {
  switch (isa) {
    case Isa::kBaseline: return true;
#if FA_HAVE_X86_BUILDS
    case Isa::kAvx2:
      __builtin_cpu_init();
      // Every AVX2+FMA CPU also has F16C (x86-64-v3 requires all three).
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::kAvx512:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    default: return false;
  }
}

Isa selected_isa() {
  static const Isa isa = pick();  // once per process, thread-safely
  return isa;
}

flashattn_status_t check_forced_isa() {
  selected_isa();
  const int forced = forced_index();
  if (forced < 0) return FLASHATTN_STATUS_SUCCESS;
  if (forced == kIsaCount)
    return fail(FLASHATTN_STATUS_INVALID_VALUE, "FLASHATTN_CPU_ISA=%s is not one of baseline, avx2, avx512",
                secure_getenv("FLASHATTN_CPU_ISA"));
  if (!isa_usable(static_cast<Isa>(forced)))
    return fail(FLASHATTN_STATUS_NOT_SUPPORTED,
                "FLASHATTN_CPU_ISA=%s: this CPU (or this build) lacks that instruction set", kNames[forced]);
  return FLASHATTN_STATUS_SUCCESS;
}

}  // namespace cpu
}  // namespace flashattn
