#include "layers/lora.h"

#include <algorithm>
#include <cmath>

#include "core/ops.h"

namespace kiln {
namespace {

// out += alpha * op(a) op(b): one accumulating GEMM when `out` can be the GEMM's output (a's
// dtype, or f32 from halves), else through a temporary in the GEMM's output dtype.
void add_product(double alpha, bool ta, const Tensor& a, bool tb, const Tensor& b, Tensor& out) {
  if (out.dtype() == a.dtype() || (is_half(a.dtype()) && out.dtype() == DType::F32)) {
    ops::gemm(ta, tb, alpha, a, b, 1.0, out);
    return;
  }
  Tensor product =
      Tensor::empty(out.shape(), is_half(a.dtype()) ? DType::F32 : a.dtype(), out.device());
  ops::gemm(ta, tb, alpha, a, b, 0.0, product);
  Tensor cast = product.to(out.dtype());
  if (out.is_contiguous()) {
    ops::axpy(1.0, cast, out);
  } else {
    Tensor sum = out.contiguous();
    ops::axpy(1.0, cast, sum);
    out.copy_from(sum);
  }
}

}  // namespace

const std::vector<std::string>& lora_projection_names() {
  static const std::vector<std::string> names = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                 "gate_proj", "up_proj", "down_proj"};
  return names;
}

bool is_lora_parameter(const std::string& name) {
  return name.find("lora_A.weight") != std::string::npos ||
         name.find("lora_B.weight") != std::string::npos;
}

void reset_lora_parameter(Parameter& p, std::uint64_t seed) {
  if (p.name.find("lora_B.weight") != std::string::npos) {
    p.value.fill(0.0);
    return;
  }
  const double bound = 1.0 / std::sqrt(static_cast<double>(p.value.size(-1)));
  ops::fill_uniform(p.value, -bound, bound, seed);
}

bool LoraOptions::targets_module(const std::string& module) const {
  return enabled() && std::find(targets.begin(), targets.end(), module) != targets.end();
}

LowRankAdapter::LowRankAdapter(std::int64_t in_features, std::int64_t out_features,
                               const LoraOptions& options)
    : in_(in_features), out_(out_features), rank_(options.rank), scale_(options.scale()) {
  KILN_CHECK(options.rank > 0, "LowRankAdapter: rank " + std::to_string(options.rank));
  a_ = &add_parameter("lora_A.weight", {rank_, in_});
  b_ = &add_parameter("lora_B.weight", {out_, rank_});
  if (options.dropout > 0)
    dropout_ = &add_child("lora_dropout", std::make_unique<Dropout>(options.dropout));
  if (!ParameterShapesOnly::active()) LowRankAdapter::reset_parameters(0);
}

Shape LowRankAdapter::output_shape(const Shape& input) const {
  Shape out = input;
  if (!out.empty()) out.back() = out_;
  return out;
}

double LowRankAdapter::forward_flops(const Shape& input) const {
  if (input.empty()) return 0;
  const double rows = static_cast<double>(shape_numel(input) / input.back());
  return 2.0 * rows * static_cast<double>(rank_) * static_cast<double>(in_ + out_);
}

void LowRankAdapter::reset_parameters(std::uint64_t seed) {
  // nn.init.kaiming_uniform_(A, a=sqrt(5)) is U(-1/sqrt(in), 1/sqrt(in)); B starts at zero.
  reset_lora_parameter(*a_, seed * 1000003ull + 17);
  reset_lora_parameter(*b_, seed);
  a_cache_.clear();
  b_cache_.clear();
}

Tensor LowRankAdapter::forward_impl(Context& ctx, const Tensor& x) {
  Tensor out;
  std::swap(out, pending_output_);
  KILN_CHECK(x.dim() == 2 && x.size(1) == in_, "LowRankAdapter " + name() + ": expected (N, " +
                                                   std::to_string(in_) + "), got " + x.str());
  KILN_CHECK(out.defined() && out.dim() == 2 && out.size(0) == x.size(0) && out.size(1) == out_,
             "LowRankAdapter " + name() + ": the output to add into is " +
                 (out.defined() ? out.str() : std::string("missing")) + " for input " + x.str());
  const DType mm = x.dtype();
  x_ = dropout_ != nullptr ? dropout_->forward(ctx, x).to(mm) : x;
  t_ = Tensor::empty({x.size(0), rank_}, mm, x.device());  // (N, r)
  ops::gemm(false, true, 1.0, x_, a_cache_.get(a_->value, mm, ctx.weights_version), 0.0, t_);
  add_product(scale_, false, t_, true, b_cache_.get(b_->value, mm, ctx.weights_version), out);
  if (!ctx.training) release_saved();
  return out;
}

Tensor LowRankAdapter::backward_impl(Context& ctx, const Tensor& dy) {
  Tensor dx;
  std::swap(dx, pending_dx_);
  KILN_CHECK(t_.defined(), "LowRankAdapter " + name() + ": backward before forward");
  const DType mm = t_.dtype();
  const Tensor g = dy.dtype() == mm ? dy : dy.to(mm);  // (N, out), rows may be strided
  // dB += scale dy^T t; dt = scale dy B; dA += dt^T x.
  ops::gemm_accumulate(true, false, g, t_, b_->grad, scale_);
  Tensor dt = Tensor::empty(t_.shape(), mm, t_.device());  // (N, r)
  ops::gemm(false, false, scale_, g, b_cache_.get(b_->value, mm, ctx.weights_version), 0.0, dt);
  ops::gemm_accumulate(true, false, dt, x_, a_->grad);
  if (dx.defined()) {
    const Tensor& a = a_cache_.get(a_->value, mm, ctx.weights_version);
    if (dropout_ != nullptr) {
      Tensor dxd = Tensor::empty({t_.size(0), in_}, mm, t_.device());
      ops::gemm(false, false, 1.0, dt, a, 0.0, dxd);
      Tensor through = dropout_->backward(ctx, dxd).to(dx.dtype());
      ops::axpy(1.0, through, dx);
    } else {
      add_product(1.0, false, dt, false, a, dx);
    }
  }
  return dx;
}

}  // namespace kiln
