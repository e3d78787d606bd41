#pragma once
// Elementwise activations: the GELU layer (exact erf form and tanh approximation) and the
// activation math shared with Linear's fused epilogue, usable in host and device code.
//
// GELU: y = gelu(x), any shape, y has x's shape and ctx.run.precision.activation's dtype.
// No parameters; the input gradient dx = dy * gelu'(x) is written (=). Half dtypes compute in
// fp32 (f64 in f64).

#include <cmath>
#include <string>

#include "core/host_device.h"
#include "layers/layer.h"

namespace kiln {

// The activation applied after a Linear's bias (its "epilogue").
enum class Activation {
  None,
  ReLU,
  GELU,     // tanh approximation: what cuBLASLt's GELU epilogues compute
  GELUErf,  // exact erf form (PyTorch's nn.GELU() default, BERT, ViT)
};
const char* activation_name(Activation a);

enum class GeluForm { Erf, Tanh };

// The normal CDF as erfc(-x / sqrt 2) / 2: 1 + erf(x / sqrt 2) cancels for negative x (3 digits
// lost at x = -3), where CPU and GPU would then differ far beyond rounding.
template <typename T>
KILN_HOST_DEVICE_INLINE T gelu_erf(T x) {
  return T(0.5) * x * ::erfc(x * T(-0.70710678118654752440));
}
template <typename T>
KILN_HOST_DEVICE_INLINE T gelu_erf_grad(T x) {
  T cdf = T(0.5) * ::erfc(x * T(-0.70710678118654752440));
  T pdf = ::exp(T(-0.5) * x * x) * T(0.39894228040143267794);  // 1/sqrt(2 pi)
  return cdf + x * pdf;
}
// sigmoid(z) and 1 - sigmoid(z), each without cancellation (e = exp(-|z|) never overflows).
template <typename T>
KILN_HOST_DEVICE_INLINE void sigmoid_pair(T z, T& s, T& one_minus_s) {
  T e = ::exp(-::fabs(z));
  T r = T(1) / (T(1) + e);
  s = z >= T(0) ? r : e * r;
  one_minus_s = z >= T(0) ? e * r : r;
}
// The tanh form, computed as x * sigmoid(2u) (= x (1 + tanh u) / 2): the textbook 1 + tanh u
// cancels for negative x, where CPU and GPU tanh would then differ in the last digits.
template <typename T>
KILN_HOST_DEVICE_INLINE T gelu_tanh(T x) {
  T inner = T(0.79788456080286535588) * (x + T(0.044715) * x * x * x);  // sqrt(2/pi)
  T s, one_minus_s;
  sigmoid_pair(T(2) * inner, s, one_minus_s);
  return x * s;
}
template <typename T>
KILN_HOST_DEVICE_INLINE T gelu_tanh_grad(T x) {
  T inner = T(0.79788456080286535588) * (x + T(0.044715) * x * x * x);
  T dinner = T(0.79788456080286535588) * (T(1) + T(3) * T(0.044715) * x * x);
  T s, one_minus_s;
  sigmoid_pair(T(2) * inner, s, one_minus_s);
  // d/dx x s(2u) = s + 2 x s (1 - s) u'
  return s + T(2) * x * s * one_minus_s * dinner;
}

// act(z) and act'(z) for the epilogue activations (ReLU's derivative at 0 is 0, as PyTorch's).
template <typename T>
KILN_HOST_DEVICE_INLINE T activation_apply(Activation a, T z) {
  switch (a) {
    case Activation::ReLU:
      return z > T(0) ? z : T(0);
    case Activation::GELU:
      return gelu_tanh(z);
    case Activation::GELUErf:
      return gelu_erf(z);
    default:
      return z;
  }
}
template <typename T>
KILN_HOST_DEVICE_INLINE T activation_grad(Activation a, T z) {
  switch (a) {
    case Activation::ReLU:
      return z > T(0) ? T(1) : T(0);
    case Activation::GELU:
      return gelu_tanh_grad(z);
    case Activation::GELUErf:
      return gelu_erf_grad(z);
    default:
      return T(1);
  }
}

class GELU : public Layer {
 public:
  explicit GELU(GeluForm form = GeluForm::Erf) : form_(form) {}
  std::string type() const override { return "GELU"; }
  Shape output_shape(const Shape& input) const override { return input; }
  GeluForm form() const { return form_; }

 protected:
  Tensor forward_impl(Context& ctx, const Tensor& x) override;
  Tensor backward_impl(Context& ctx, const Tensor& dy) override;
  void release_saved() override { saved_input_ = Tensor(); }

 private:
  GeluForm form_;
  Tensor saved_input_;  // x, contiguous
};

}  // namespace kiln
