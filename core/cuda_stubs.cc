// The CUDA entry points of a build without CUDA: reaching one is a usage error, reported plainly.

#include "core/backend.h"

namespace kiln::cuda {
namespace {
[[noreturn]] void not_built() {
  throw Error("a CUDA op was called, but this Kiln was built without CUDA (-DKILN_CUDA=OFF)");
}
}  // namespace

void copy(const Tensor&, Tensor&) {
  not_built();
}
void memcpy_async(void*, Device, const void*, Device, std::size_t) {
  not_built();
}
void fill(Tensor&, double) {
  not_built();
}
void add(const Tensor&, const Tensor&, Tensor&) {
  not_built();
}
void mul(const Tensor&, const Tensor&, Tensor&) {
  not_built();
}
void axpy(double, const Tensor&, Tensor&) {
  not_built();
}
void scale(Tensor&, double) {
  not_built();
}
void increment(Tensor&) {
  not_built();
}
void reduce(const Tensor&, ops::Reduction, std::int64_t, std::int64_t, bool, Tensor&) {
  not_built();
}
void gemm(bool, bool, double, const Tensor&, const Tensor&, double, Tensor&, std::int64_t) {
  not_built();
}
void fill_uniform(Tensor&, double, double, std::uint64_t, std::uint64_t) {
  not_built();
}
void fill_normal(Tensor&, double, double, std::uint64_t, std::uint64_t) {
  not_built();
}

}  // namespace kiln::cuda
