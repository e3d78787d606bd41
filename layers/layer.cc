#include "layers/layer.h"

#include <atomic>
#include <unordered_set>

#include "core/nvtx.h"

namespace kiln {

std::uint64_t Layer::next_layer_id() {
  static std::atomic<std::uint64_t> counter{1};
  return counter++;
}

LayerObserver on_backward_begin(std::function<void(const std::vector<Parameter*>&)> hook) {
  return [hook = std::move(hook)](Layer& layer, bool forward, bool begin) {
    if (!forward && begin) hook(layer.written_parameters());
  };
}

void notify_observers(Context& ctx, Layer& layer, bool forward, bool begin) {
  for (const LayerObserver& observer : ctx.observers) observer(layer, forward, begin);
}

Tensor Layer::forward(Context& ctx, const Tensor& x) {
  NvtxRange range(name_.empty() ? "forward" : name_.c_str());
  notify_observers(ctx, *this, true, true);
  Tensor y = forward_impl(ctx, x);
  // A re-run forward (ctx.recomputing) keeps everything: its backward comes next.
  if (recompute_ && ctx.training && !ctx.recomputing) {
    release_saved_recursive();
    recompute_input_ = x;
    recompute_ctx_ = std::make_unique<Context>(ctx);
    recompute_ctx_->recomputing = true;
    recompute_pending_ = true;
  }
  notify_observers(ctx, *this, true, false);
  return y;
}

Tensor Layer::backward(Context& ctx, const Tensor& dy) {
  NvtxRange range(name_.empty() ? "backward" : name_.c_str());
  notify_observers(ctx, *this, false, true);
  if (recompute_pending_) {
    recompute_pending_ = false;
    // The forward's own context: the caller's may have moved on (attention mask, step).
    forward_impl(*recompute_ctx_, recompute_input_);
    recompute_input_ = Tensor();
    recompute_ctx_.reset();
  }
  Tensor dx = backward_impl(ctx, dy);
  release_saved();
  notify_observers(ctx, *this, false, false);
  if (ctx.on_grad_ready) {
    for (auto& p : params_)
      if (!p->frozen) ctx.on_grad_ready(*p);
  }
  return dx;
}

void Layer::release_saved_recursive() {
  release_saved();
  for (auto& [local, child] : children_) child->release_saved_recursive();
}

std::vector<Parameter*> Layer::parameters() {
  std::vector<Parameter*> out;
  std::unordered_set<Parameter*> seen;
  std::function<void(Layer&)> visit = [&](Layer& layer) {
    for (auto& p : layer.params_) {
      if (seen.insert(p.get()).second) out.push_back(p.get());
    }
    for (auto& [local, child] : layer.children_) visit(*child);
  };
  visit(*this);
  return out;
}

std::vector<Parameter*> Layer::written_parameters() {
  std::vector<Parameter*> out;
  for (auto& p : params_)
    if (!p->frozen) out.push_back(p.get());
  for (Parameter* p : shared_)
    if (!p->frozen) out.push_back(p);
  return out;
}

std::vector<Buffer*> Layer::buffers() {
  std::vector<Buffer*> out;
  std::function<void(Layer&)> visit = [&](Layer& layer) {
    for (auto& b : layer.buffers_) out.push_back(b.get());
    for (auto& [local, child] : layer.children_) visit(*child);
  };
  visit(*this);
  return out;
}

std::vector<Layer*> Layer::children() {
  std::vector<Layer*> out;
  for (auto& [local, child] : children_) out.push_back(child.get());
  return out;
}

std::int64_t Layer::parameter_count() {
  std::int64_t n = 0;
  for (Parameter* p : parameters()) n += p->value.numel();
  return n;
}

void Layer::set_training(bool training) {
  training_ = training;
  for (auto& [local, child] : children_) child->set_training(training);
}

void Layer::to(Device device, DType parameter_dtype) {
  for (auto& p : params_) {
    DType dtype = p->fp32_in_half ? DType::F32 : parameter_dtype;
    if (p->fp32_in_half && parameter_dtype == DType::F64) dtype = DType::F64;
    p->value = p->value.to(device, dtype);
    p->grad = p->frozen ? Tensor() : Tensor::zeros(p->value.shape(), dtype, device);
  }
  for (auto& b : buffers_) {
    DType dtype = parameter_dtype == DType::F64 ? DType::F64 : DType::F32;
    b->value = b->value.to(device, dtype);
  }
  for (auto& [local, child] : children_) child->to(device, parameter_dtype);
}

void Layer::set_name(const std::string& name) {
  name_ = name;
  std::string prefix = name.empty() ? "" : name + ".";
  for (std::size_t i = 0; i < params_.size(); ++i)
    params_[i]->name = prefix + param_local_names_[i];
  for (std::size_t i = 0; i < buffers_.size(); ++i)
    buffers_[i]->name = prefix + buffer_local_names_[i];
  // A child registered without a name of its own shares its parent's (a Linear's LoRA adapter:
  // mlp.down_proj.lora_A.weight beside mlp.down_proj.weight).
  for (auto& [local, child] : children_) child->set_name(local.empty() ? name : prefix + local);
}

void Layer::reset_parameters(std::uint64_t seed) {
  // Containers: give each child its own stream of random numbers.
  std::uint64_t i = 0;
  for (auto& [local, child] : children_) child->reset_parameters(seed * 1000003ull + (++i));
}

namespace {
thread_local bool shapes_only = false;
}  // namespace

ParameterShapesOnly::ParameterShapesOnly() : previous_(shapes_only) {
  shapes_only = true;
}

ParameterShapesOnly::~ParameterShapesOnly() {
  shapes_only = previous_;
}

bool ParameterShapesOnly::active() {
  return shapes_only;
}

Parameter& Layer::add_parameter(const std::string& local_name, const Shape& shape,
                                bool no_weight_decay, bool fp32_in_half) {
  auto p = std::make_unique<Parameter>();
  p->name = local_name;
  if (shapes_only) {
    p->value = Tensor::wrap(nullptr, shape, DType::F32, Device::cpu());
    p->grad = Tensor::wrap(nullptr, shape, DType::F32, Device::cpu());
  } else {
    p->value = Tensor::zeros(shape, DType::F32);
    p->grad = Tensor::zeros(shape, DType::F32);
  }
  p->no_weight_decay = no_weight_decay;
  p->fp32_in_half = fp32_in_half;
  params_.push_back(std::move(p));
  param_local_names_.push_back(local_name);
  return *params_.back();
}

Buffer& Layer::add_buffer(const std::string& local_name, const Shape& shape, double fill) {
  auto b = std::make_unique<Buffer>();
  b->name = local_name;
  b->value = Tensor::full(shape, fill, DType::F32);
  buffers_.push_back(std::move(b));
  buffer_local_names_.push_back(local_name);
  return *buffers_.back();
}

Shape Sequential::output_shape(const Shape& input) const {
  Shape s = input;
  for (const Layer* l : order_) s = l->output_shape(s);
  return s;
}

double Sequential::forward_flops(const Shape& input) const {
  double f = 0;
  Shape s = input;
  for (const Layer* l : order_) {
    f += l->forward_flops(s);
    s = l->output_shape(s);
  }
  return f;
}

Tensor Sequential::forward_impl(Context& ctx, const Tensor& x) {
  Tensor h = x;
  for (Layer* l : order_) h = l->forward(ctx, h);
  return h;
}

Tensor Sequential::backward_impl(Context& ctx, const Tensor& dy) {
  Tensor g = dy;
  for (auto it = order_.rbegin(); it != order_.rend(); ++it) g = (*it)->backward(ctx, g);
  return g;
}

}  // namespace kiln
