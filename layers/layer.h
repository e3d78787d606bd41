#pragma once
// The Layer interface. A layer has forward(ctx, x) -> y and backward(ctx, dy) -> dx, keeps what
// backward needs from the last forward until that backward is done (one backward per forward,
// as autograd without retain_graph), and owns named Parameters and Buffers.
//
// Gradient contract: parameter gradients are ACCUMULATED (+=) into Parameter::grad, which may be
// a view into a flat bucket owned by data parallelism; input gradients are written (=). The
// trainer zeroes parameter gradients before the first micro-batch of each optimizer step, so
// gradient accumulation and weights shared between layers (BERT's tied decoder) need no special
// case. After a layer's backward has finished writing its own parameters' gradients, the
// ctx.on_grad_ready hook is called for each of them (data parallelism starts bucket all-reduces
// from it).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/parameter.h"
#include "core/precision.h"
#include "core/step_scalars.h"
#include "core/tensor.h"

namespace kiln {

class Layer;
struct KvCache;  // layers/attention.h

// What a run fixes once: where layers compute, in what precision, with which dropout key and
// activation layout.
struct RunSettings {
  Device device = Device::cpu();
  PrecisionPolicy precision;
  std::uint64_t seed = 0;      // key of the counter-based RNG (dropout)
  bool channels_last = false;  // NHWC activations for convolutional models
};

// What one forward call gets besides its input tensor.
struct CallInputs {
  Tensor attention_mask;  // (B, T) of 1 (attend) / 0 (padding), optional
  // Generation (kiln sample): causal attention layers append the new tokens' keys and values to
  // this cache and attend over everything in it; the input holds only the new tokens.
  KvCache* kv_cache = nullptr;
  // Packed documents: (B, T) I32 on the input's device, for each token the index in its row of
  // its document's first token. Causal attention attends only within a token's document and
  // rotary positions restart at its first token. Undefined: each row is one sequence.
  Tensor document_starts;
};

// Called as each layer's forward or backward begins and ends (profiling, ZeRO-2's gradient
// allocation). A context holds a list: observers compose without knowing of each other.
using LayerObserver = std::function<void(Layer& layer, bool forward, bool begin)>;

struct Context {
  RunSettings run;
  bool training = true;
  // Set while a recomputing layer re-runs its forward inside backward: layers must not change
  // state a second time (BatchNorm's running statistics), only rebuild what backward needs.
  bool recomputing = false;
  // The step's scalars in memory (core/step_scalars.h): the same masks replay for the same step,
  // and the loss's backward multiplies by the loss scale there; layers keep the addresses from
  // forward for their backward.
  StepScalars step;
  std::uint64_t weights_version = 0;  // bumped by the optimizer after each update (O1 casts)
  CallInputs call;
  std::function<void(Parameter&)> on_grad_ready;
  std::vector<LayerObserver> observers;
};

// A layer observer that calls `hook` with Layer::written_parameters() as each layer's backward
// begins: comm/ knows parameters, not layers (ZeRO-2 allocates gradient buckets from it).
LayerObserver on_backward_begin(std::function<void(const std::vector<Parameter*>& written)> hook);
// Tells every observer of `ctx` (Layer::forward/backward and fused chains call it).
void notify_observers(Context& ctx, Layer& layer, bool forward, bool begin);

// While one lives on this thread, layers register their parameters with shapes but no memory
// (a null data pointer) and models skip their initialisation, so a model can be counted (kiln
// plan of a 7B model on a login node) without the 8 bytes per parameter of fp32 values and
// gradients. Such a model can be inspected, not run.
class ParameterShapesOnly {
 public:
  ParameterShapesOnly();
  ~ParameterShapesOnly();
  ParameterShapesOnly(const ParameterShapesOnly&) = delete;
  ParameterShapesOnly& operator=(const ParameterShapesOnly&) = delete;
  static bool active();

 private:
  bool previous_;
};

class Layer {
 public:
  virtual ~Layer() = default;
  Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  // Public entry points: add NVTX ranges and profiling, then run the implementation.
  Tensor forward(Context& ctx, const Tensor& x);
  Tensor backward(Context& ctx, const Tensor& dy);

  virtual std::string type() const = 0;  // "Linear"
  // Output shape for an input shape (batch included), for `kiln model` and checks.
  virtual Shape output_shape(const Shape& input) const = 0;
  // Forward multiply-adds x 2 for one input of this shape (batch included); backward is taken
  // as twice the forward.
  virtual double forward_flops(const Shape& input) const {
    (void)input;
    return 0;
  }

  const std::string& name() const { return name_; }
  // Every parameter of this layer and its children, each once, in registration order.
  std::vector<Parameter*> parameters();
  // The parameters whose gradients this layer's own backward writes: its own and the shared ones
  // it uses (tied weights), not its children's, and not frozen ones. ZeRO-2 allocates their
  // gradients as it begins.
  std::vector<Parameter*> written_parameters();
  std::vector<Buffer*> buffers();
  std::vector<Layer*> children();
  std::int64_t parameter_count();

  void set_training(bool training);
  bool training() const { return training_; }
  // The first layer of a model has no one to pass an input gradient to; a layer told so may
  // skip computing it and return an undefined tensor from backward.
  void set_input_gradient(bool needed) { input_gradient_ = needed; }
  bool input_gradient() const { return input_gradient_; }
  // Activation recomputation (train.recompute: BLOCKS): in training, forward keeps only this
  // layer's input and drops what it and its children saved; backward re-runs the forward with
  // the forward's context (the same dropout keys and streams, so the same masks) before the real
  // backward, so gradients are bit for bit those without recomputation.
  void set_recompute(bool on) { recompute_ = on; }
  bool recompute() const { return recompute_; }
  // Moves parameters and buffers to `device`; parameter values to `dtype` except fp32_in_half
  // ones, which stay fp32. Gradients are allocated to match (zeroed); frozen ones get none.
  void to(Device device, DType parameter_dtype = DType::F32);
  // Sets this layer's and its children's full names under `prefix` (called by containers).
  void set_name(const std::string& name);
  // Deterministic initialisation (PyTorch's defaults unless a model says otherwise).
  virtual void reset_parameters(std::uint64_t seed);

 protected:
  virtual Tensor forward_impl(Context& ctx, const Tensor& x) = 0;
  virtual Tensor backward_impl(Context& ctx, const Tensor& dy) = 0;
  // Drops what forward saved for backward; called once backward is done, so that activations
  // are freed as backward walks down the model (as autograd frees saved tensors) and the
  // backward pass's temporaries reuse their memory instead of adding to the peak.
  virtual void release_saved() {}
  // release_saved() of this layer and every layer below it.
  void release_saved_recursive();

  // Registers a parameter named `local_name` (e.g. "weight"); value uninitialised, grad zero.
  Parameter& add_parameter(const std::string& local_name, const Shape& shape,
                           bool no_weight_decay = false, bool fp32_in_half = false);
  Buffer& add_buffer(const std::string& local_name, const Shape& shape, double fill = 0.0);
  template <typename L>
  L& add_child(const std::string& local_name, std::unique_ptr<L> child) {
    L& ref = *child;
    children_.emplace_back(local_name, std::move(child));
    return ref;
  }
  // A parameter owned by another layer and used here too (tied weights): listed once, by its owner.
  void use_shared_parameter(Parameter* p) { shared_.push_back(p); }

  // The parameters this layer itself owns (not its children's).
  std::vector<std::unique_ptr<Parameter>>& own_parameters() { return params_; }
  std::uint64_t layer_id() const { return layer_id_; }

 private:
  std::string name_;
  bool training_ = true;
  bool input_gradient_ = true;
  std::vector<std::unique_ptr<Parameter>> params_;
  std::vector<std::string> param_local_names_;
  std::vector<std::unique_ptr<Buffer>> buffers_;
  std::vector<std::string> buffer_local_names_;
  std::vector<std::pair<std::string, std::unique_ptr<Layer>>> children_;
  std::vector<Parameter*> shared_;
  bool recompute_ = false;
  // A recomputing layer's forward input and context, kept from forward until backward re-runs it.
  bool recompute_pending_ = false;
  Tensor recompute_input_;
  std::unique_ptr<Context> recompute_ctx_;
  std::uint64_t layer_id_ = next_layer_id();
  static std::uint64_t next_layer_id();
};

// Applies children in order.
class Sequential : public Layer {
 public:
  template <typename L>
  L& add(const std::string& name, std::unique_ptr<L> layer) {
    L& ref = add_child(name, std::move(layer));
    order_.push_back(&ref);
    return ref;
  }
  std::string type() const override { return "Sequential"; }
  Shape output_shape(const Shape& input) const override;
  double forward_flops(const Shape& input) const override;
  const std::vector<Layer*>& layers() const { return order_; }

 protected:
  Tensor forward_impl(Context& ctx, const Tensor& x) override;
  Tensor backward_impl(Context& ctx, const Tensor& dy) override;

 private:
  std::vector<Layer*> order_;
};

}  // namespace kiln
