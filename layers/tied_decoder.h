#pragma once
// A projection onto a vocabulary whose weight is another layer's: the token embedding (V, E) of
// BERT's masked-LM decoder and GPT-2's LM head.
//   x (N..., E) -> y (N..., V) = x W^T (+ bias)
// The weight is shared, not owned: its gradient is accumulated here and by the embedding, and
// the embedding's own backward (which runs later) fires on_grad_ready for it, so data
// parallelism reduces the summed gradient once.
// Gradient contract: parameter gradients accumulated (+=); dx is written (=).

#include <cstdint>
#include <string>

#include "layers/layer.h"
#include "layers/weight_cast_cache.h"

namespace kiln {

class TiedDecoder : public Layer {
 public:
  // `bias`: a (V) bias of the decoder's own, named "bias" (BERT's cls.predictions.bias).
  TiedDecoder(Parameter* weight, std::int64_t vocab, std::int64_t hidden, bool bias);
  std::string type() const override { return "TiedDecoder"; }
  Shape output_shape(const Shape& input) const override;
  double forward_flops(const Shape& input) const override;
  void reset_parameters(std::uint64_t) override;
  Parameter& weight() { return *weight_; }

 protected:
  Tensor forward_impl(Context& ctx, const Tensor& x) override;
  Tensor backward_impl(Context& ctx, const Tensor& dy) override;
  void release_saved() override {
    x_mm_ = Tensor();
    padded_ = Tensor();
  }

 private:
  Parameter* weight_;
  Parameter* bias_ = nullptr;
  std::int64_t vocab_, hidden_;
  WeightCastCache cache_;
  WeightCastCache padded_cache_;  // CUDA: the weight with zero rows up to the logits' row length
  Tensor x_mm_;                   // (N, E)
  Tensor padded_;                 // CUDA, no bias: the (N, ld) logits buffer dy is written over
  bool padded_gradient(const Tensor& dy2, const Tensor& dy_mm) const;
  Shape input_shape_;
  DType activation_ = DType::F32;
};

}  // namespace kiln
