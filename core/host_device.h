#pragma once
// Functions written once for the CPU loops and the CUDA kernels.

#ifdef __CUDACC__
#define KILN_HOST_DEVICE __host__ __device__
// Small helpers on the hot path of kernels (the Philox rounds): always inlined on the device.
#define KILN_HOST_DEVICE_INLINE __host__ __device__ __forceinline__
#else
#define KILN_HOST_DEVICE
#define KILN_HOST_DEVICE_INLINE inline
#endif
