#include "layers/embedding.h"

#include <cmath>

#include "core/cpu/element.h"
#include "core/ops.h"
#include "layers/attention.h"
#include "layers/cuda/embedding_cuda.h"

namespace kiln {

Embedding::Embedding(std::int64_t num_embeddings, std::int64_t dim, std::int64_t padding_idx)
    : num_(num_embeddings), dim_(dim), padding_idx_(padding_idx) {
  KILN_CHECK(num_ > 0 && dim_ > 0, "Embedding: sizes must be positive");
  KILN_CHECK(padding_idx_ == kNoPadding || (padding_idx_ >= 0 && padding_idx_ < num_),
             "Embedding: padding_idx " + std::to_string(padding_idx_) + " out of range");
  weight_ = &add_parameter("weight", {num_, dim_});
  if (!ParameterShapesOnly::active()) Embedding::reset_parameters(0);
}

Shape Embedding::output_shape(const Shape& input) const {
  Shape out = input;
  out.push_back(dim_);
  return out;
}

void Embedding::reset_parameters(std::uint64_t seed) {
  Tensor w = Tensor::empty(weight_->value.shape(), DType::F32);
  ops::fill_normal(w, 0.0, 1.0, seed);
  if (padding_idx_ != kNoPadding) w.select(0, padding_idx_).fill(0.0);
  weight_->value.copy_from(w);
}

Tensor Embedding::forward_impl(Context& ctx, const Tensor& ids) {
  KILN_CHECK(ids.dtype() == DType::I64 || ids.dtype() == DType::I32,
             "Embedding " + name() + ": ids must be I64 or I32, got " + ids.str());
  Tensor flat = ids.to(DType::I64).contiguous().view({-1});
  std::int64_t n = flat.numel();
  DType out_dtype = transformer_ops::activation_dtype(ctx, weight_->value.dtype());
  Tensor y = Tensor::empty({n, dim_}, out_dtype, ids.device());
  if (ids.device().is_cuda()) {
    DeviceGuard guard(ids.device());
    cuda::embedding_forward(flat, weight_->value, y);
  } else {
    const std::int64_t* id = flat.data<std::int64_t>();
    for (std::int64_t i = 0; i < n; ++i) {
      if (id[i] < 0 || id[i] >= num_)
        throw InputError("Embedding " + name() + ": id " + std::to_string(id[i]) +
                         " out of range [0, " + std::to_string(num_) + ")");
    }
    KILN_DISPATCH_FLOATING(weight_->value.dtype(), W, {
      KILN_DISPATCH_FLOATING(out_dtype, T, {
        const W* w = weight_->value.data<W>();
        T* out = y.data<T>();
        for (std::int64_t i = 0; i < n; ++i)
          for (std::int64_t d = 0; d < dim_; ++d)
            out[i * dim_ + d] = cpu::store<T>(cpu::load(w[id[i] * dim_ + d]));
      });
    });
  }
  saved_ids_ = flat;
  return y.view(output_shape(ids.shape()));
}

Tensor Embedding::backward_impl(Context& ctx, const Tensor& dy) {
  (void)ctx;
  KILN_CHECK(saved_ids_.defined(), "Embedding " + name() + ": backward before forward");
  std::int64_t n = saved_ids_.numel();
  KILN_CHECK(dy.numel() == n * dim_,
             "Embedding " + name() + ": dy " + dy.str() + " for " + std::to_string(n) + " ids");
  if (weight_->frozen) return Tensor();  // the ids have no gradient either
  Tensor dyc = dy.contiguous().view({n, dim_});
  if (dy.device().is_cuda()) {
    DeviceGuard guard(dy.device());
    cuda::embedding_backward(saved_ids_, dyc, padding_idx_, weight_->grad);
  } else {
    // Positions in order: the sum for a repeated id is formed in the same order as on CUDA.
    const std::int64_t* id = saved_ids_.data<std::int64_t>();
    KILN_DISPATCH_FLOATING(weight_->grad.dtype(), G, {
      KILN_DISPATCH_FLOATING(dyc.dtype(), T, {
        G* g = weight_->grad.data<G>();
        const T* d = dyc.data<T>();
        for (std::int64_t i = 0; i < n; ++i) {
          if (id[i] == padding_idx_) continue;
          for (std::int64_t c = 0; c < dim_; ++c)
            g[id[i] * dim_ + c] =
                cpu::store<G>(cpu::load(g[id[i] * dim_ + c]) + cpu::load(d[i * dim_ + c]));
        }
      });
    });
  }
  return Tensor();
}

}  // namespace kiln
