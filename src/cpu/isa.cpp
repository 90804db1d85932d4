#include "cpu/isa.hpp"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.hpp"

#if FA_HAVE_X86_BUILDS
#include <cpuid.h>
#endif
#if FA_HAVE_X86_BUILDS && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace flashattn {
namespace cpu {
namespace {

const char* const kNames[kIsaCount] = {"baseline", "avx2", "avx512", "amx"};

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

#if FA_HAVE_X86_BUILDS
// The CPU's AMX-BF16 features and the OS's tile state (XCR0 bits 17 and 18), or what lacks.
const char* amx_cpu_refusal() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return "the CPU reports no extended features (CPUID leaf 7)";
  if (!(b & (1u << 30)) || !(b & (1u << 31))) return "the CPU lacks AVX512BW or AVX512VL";
  if (!(d & (1u << 24)) || !(d & (1u << 22))) return "the CPU lacks AMX-TILE and AMX-BF16";
  const unsigned max_sub = a;
  if (max_sub < 1 || !__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a & (1u << 5))) return "the CPU lacks AVX512-BF16";
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return "the OS does not enable XSAVE";
  unsigned lo, hi;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & (3u << 17)) != (3u << 17)) return "the OS does not enable the AMX tile state (XCR0)";
  return nullptr;
}

// Asks Linux for the process's permission to use AMX tile data (arch_prctl
// ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA: Linux 5.16 and later), once per process.
const char* amx_refusal_once() {
  if (const char* why = isa_refusal(Isa::kAvx512)) return why;
  if (const char* why = amx_cpu_refusal()) return why;
#if defined(__linux__)
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0) return nullptr;
  static char why[160];
  snprintf(why, sizeof why, "Linux refused the AMX tile data permission (arch_prctl ARCH_REQ_XCOMP_PERM: %s)",
           strerror(errno));
  return why;
#else
  return "AMX tile data needs Linux's permission request (arch_prctl), and this is not Linux";
#endif
}
#endif

}  // namespace

const char* isa_name(Isa isa) { return kNames[static_cast<int>(isa)]; }

const char* isa_refusal(Isa isa) {
  switch (isa) {
    case Isa::kBaseline: return nullptr;
#if FA_HAVE_X86_BUILDS
    case Isa::kAvx2:
      __builtin_cpu_init();
      // Every AVX2+FMA CPU also has F16C (x86-64-v3 requires all three).
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? nullptr : "the CPU lacks AVX2 or FMA";
    case Isa::kAvx512:
      if (const char* why = isa_refusal(Isa::kAvx2)) return why;
      return __builtin_cpu_supports("avx512f") ? nullptr : "the CPU lacks AVX-512F";
    case Isa::kAmx: {
      static const char* const why = amx_refusal_once();  // once per process, thread-safely
      return why;
    }
#endif
    default: return "this build has no x86-64 instruction sets";
  }
}

bool isa_usable(Isa isa) { return isa_refusal(isa) == nullptr; }

Isa selected_isa() {
  static const Isa isa = pick();  // once per process, thread-safely
  return isa;
}

flashattn_status_t check_forced_isa() {
  selected_isa();
  const int forced = forced_index();
  if (forced < 0) return FLASHATTN_STATUS_SUCCESS;
  if (forced == kIsaCount)
    return fail(FLASHATTN_STATUS_INVALID_VALUE, "FLASHATTN_CPU_ISA=%s is not one of baseline, avx2, avx512, amx",
                secure_getenv("FLASHATTN_CPU_ISA"));
  if (const char* why = isa_refusal(static_cast<Isa>(forced)))
    return fail(FLASHATTN_STATUS_NOT_SUPPORTED, "FLASHATTN_CPU_ISA=%s: %s", kNames[forced], why);
  return FLASHATTN_STATUS_SUCCESS;
}

}  // namespace cpu
}  // namespace flashattn
