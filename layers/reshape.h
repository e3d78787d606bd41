#pragma once
// Flatten: (N, d1, d2, ...) -> (N, d1*d2*...), keeping dim 0 (PyTorch's nn.Flatten()).
// Reshape: (N, ...) -> (N, target...), target a per-sample shape with at most one -1.
// No parameters; dx = dy reshaped to the input's shape (written, a view where possible).
// Dtypes pass through unchanged.

#include <string>

#include "layers/layer.h"

namespace kiln {

class Reshape : public Layer {
 public:
  explicit Reshape(Shape sample_shape);
  std::string type() const override { return "Reshape"; }
  Shape output_shape(const Shape& input) const override;

 protected:
  Tensor forward_impl(Context& ctx, const Tensor& x) override;
  Tensor backward_impl(Context& ctx, const Tensor& dy) override;

 private:
  Shape target_;  // per sample
  Shape input_shape_;
};

class Flatten : public Reshape {
 public:
  Flatten() : Reshape({-1}) {}
  std::string type() const override { return "Flatten"; }
};

}  // namespace kiln
