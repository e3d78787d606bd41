#pragma once
// Functions compiled for both the host and the device: the same source line is the CPU backend's
// arithmetic and the CUDA kernels', so the two round alike.
//   KILN_HOST_DEVICE         callable from host and device code (nothing in a host-only compile)
//   KILN_HOST_DEVICE_INLINE  the same, forced inline on the device (inline on the host): the small
//                            helpers of the RNG and the activations, called from inner loops

#if defined(__CUDACC__)
#define KILN_HOST_DEVICE __host__ __device__
#define KILN_HOST_DEVICE_INLINE __host__ __device__ __forceinline__
#else
#define KILN_HOST_DEVICE
#define KILN_HOST_DEVICE_INLINE inline
#endif
