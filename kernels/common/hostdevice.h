// Qualifier for helpers compiled into both the CPU backend and the CUDA kernels.
#pragma once
#if defined(__CUDACC__)
#define FA_HD __host__ __device__ __forceinline__
#else
#define FA_HD inline
#endif
