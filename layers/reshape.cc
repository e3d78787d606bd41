#include "layers/reshape.h"

namespace kiln {

Reshape::Reshape(Shape sample_shape) : target_(std::move(sample_shape)) {
  int unknown = 0;
  for (std::int64_t d : target_) {
    if (d == -1)
      ++unknown;
    else if (d < 0)
      throw InputError("Reshape: negative size in " + shape_str(target_));
  }
  if (unknown > 1) throw InputError("Reshape: more than one -1 in " + shape_str(target_));
}

Shape Reshape::output_shape(const Shape& input) const {
  KILN_CHECK(!input.empty(), "Reshape " + name() + ": a 0-D input has no batch dimension");
  std::int64_t per_sample = 1;
  for (std::size_t i = 1; i < input.size(); ++i) per_sample *= input[i];
  std::int64_t known = 1;
  for (std::int64_t d : target_) known *= d == -1 ? 1 : d;
  Shape out = {input[0]};
  for (std::int64_t d : target_) {
    if (d == -1) {
      KILN_CHECK(known > 0 && per_sample % known == 0, "Reshape " + name() + ": cannot view " +
                                                           shape_str(input) + " as (N, " +
                                                           shape_str(target_) + ")");
      out.push_back(per_sample / known);
    } else {
      out.push_back(d);
    }
  }
  KILN_CHECK(shape_numel(out) == shape_numel(input),
             "Reshape " + name() + ": " + shape_str(input) +
                 " has a different number of elements from " + shape_str(out));
  return out;
}

Tensor Reshape::forward_impl(Context& ctx, const Tensor& x) {  // (N, ...) -> (N, target...)
  (void)ctx;
  input_shape_ = x.shape();
  return x.reshape(output_shape(x.shape()));
}

Tensor Reshape::backward_impl(Context& ctx, const Tensor& dy) {
  (void)ctx;
  KILN_CHECK(dy.numel() == shape_numel(input_shape_),
             "Reshape " + name() + ": dy " + dy.str() + " for input " + shape_str(input_shape_));
  return dy.reshape(input_shape_);
}

}  // namespace kiln
