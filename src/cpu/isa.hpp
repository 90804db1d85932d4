// The instruction sets the CPU tile kernels are built for, and which one a process uses.
//
// tile_math.cpp compiles the kernels once per instruction set (target attributes, so the
// library itself needs nothing beyond the baseline and loads on any x86-64 CPU) and
// calls the set chosen here: the best one the running CPU supports, or the one named by
// the environment variable FLASHATTN_CPU_ISA (baseline, avx2, avx512 or amx), which tests use
// to run every path the host has. The choice is made once per process, when the first
// CPU plan is created (check_forced_isa), and never changes afterwards.
#pragma once
#include "flashattn.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FA_HAVE_X86_BUILDS 1  // the avx2, avx512 and amx sets are compiled
#endif

namespace flashattn {
namespace cpu {

enum class Isa { kBaseline, kAvx2, kAvx512, kAmx };
constexpr int kIsaCount = 4;

// "baseline", "avx2" (AVX2 + FMA + F16C), "avx512" (AVX-512F, with AVX2 + FMA + F16C),
// "amx" (the avx512 set, whose bf16 forward and backward multiply on AMX-BF16 tiles: amx.hpp;
// needs AVX512BW, AVX512-BF16, AMX-TILE, AMX-BF16 and Linux's permission to use tile data).
const char* isa_name(Isa isa);

// Why the set is not usable here (the build lacks it, the CPU lacks a feature, or for amx
// Linux refused the process's tile data permission, with the error), or null when the
// library has it compiled in and the running CPU (and OS) supports it. The first call for
// amx asks Linux for the permission (once per process).
const char* isa_refusal(Isa isa);
bool isa_usable(Isa isa);

// The set the process's kernels use: FLASHATTN_CPU_ISA's if set, else the best usable.
Isa selected_isa();

// FLASHATTN_CPU_ISA, when set: INVALID_VALUE for a name that is no set, NOT_SUPPORTED
// for a set this CPU or build lacks (messages name the variable and its value). Called at
// CPU plan creation; fixes the process's choice on the first call.
flashattn_status_t check_forced_isa();

}  // namespace cpu
}  // namespace flashattn
