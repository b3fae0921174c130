// KILN_HD marks arithmetic shared by the CPU reference and the CUDA kernels: plain inline C++ for
// the host compiler, __host__ __device__ when nvcc compiles it.
#pragma once

#if defined(__CUDACC__)
#define KILN_HD __host__ __device__ __forceinline__
#else
#define KILN_HD inline
#endif
