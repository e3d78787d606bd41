#pragma once
// The one way a CUDA entry point is declared so that every build compiles: callers use it without
// #if, and a build without CUDA (-DKILN_CUDA=OFF) gets, beside the declaration, a body that
// reports the usage error. In a folder's *_cuda.h (or launcher) header:
//
//   KILN_CUDA_OP("ReLU", void forward(const Tensor& x, Tensor& y));
//
// With CUDA this is the declaration (a .cu or cuda/*.cc defines it); without CUDA it is an inline
// definition throwing "ReLU on CUDA was called, but this Kiln was built without CUDA
// (-DKILN_CUDA=OFF)". Its parameters are named for the reader, so the body silences
// -Wunused-parameter for itself only.

#include <string>

#include "core/check.h"

namespace kiln {

[[noreturn]] inline void cuda_not_built(const char* what) {
  throw Error(std::string(what) +
              " on CUDA was called, but this Kiln was built without CUDA (-DKILN_CUDA=OFF)");
}

}  // namespace kiln

// clang-format off
#if KILN_WITH_CUDA
#define KILN_CUDA_OP(what, ...) __VA_ARGS__
#else
#define KILN_CUDA_OP(what, ...)                                  \
  _Pragma("GCC diagnostic push")                                 \
  _Pragma("GCC diagnostic ignored \"-Wunused-parameter\"")       \
  inline __VA_ARGS__ { ::kiln::cuda_not_built(what); }           \
  _Pragma("GCC diagnostic pop")
#endif
// clang-format on
