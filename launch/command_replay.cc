// kiln replay: forward, backward and optimizer steps of a model on one fixed batch read from a
// safetensors file, from weights read from another; writes the eval-mode logits of the loaded
// model, the logits and parameter gradients of the first step and the loss of every step. The
// comparison scripts in tools/parity/ run PyTorch on the same weights and batch and compare.
// Tensors are read and written under PyTorch's names and in its layout: a weight that files hold
// transposed (Parameter::stored_transposed, GPT-2's Conv1D) is read as (in, out) and its
// gradient written as (in, out). Token models take (B, T) ids and (B, T) targets: masked LM's
// labels (-100 ignored), or causal LM's next tokens (the script shifts them; the loss is the mean
// over the B*T positions, as torch's cross entropy of the flattened logits).

#include <boost/program_options.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/ops.h"
#include "core/safetensors.h"
#include "launch/commands.h"
#include "layers/models/model.h"
#include "layers/softmax_cross_entropy.h"
#include "optim/amp/amp.h"
#include "optim/optimizer.h"
#include "train/init_from.h"
#include "train/model_options.h"
#include "train/parameter_loader.h"

namespace po = boost::program_options;

namespace kiln::launch {

int run_replay(const Arguments& args) {
  po::options_description options("kiln replay: steps on a fixed batch, for framework comparisons");
  options.add_options()("help,h", "show this help")("model", po::value<std::string>()->required(),
                                                    "model name")(
      "weights", po::value<std::string>()->required(),
      "the initial weights: a safetensors file or a transformers model folder")(
      "batch", po::value<std::string>()->required(), "safetensors with 'input' and 'target'")(
      "out", po::value<std::string>()->required(), "safetensors to write")(
      "steps", po::value<int>()->default_value(1), "optimizer steps (AdamW)")(
      "lr", po::value<double>()->default_value(1e-4), "AdamW learning rate")(
      "weight-decay", po::value<double>()->default_value(0.0), "AdamW weight decay")(
      "amp", po::value<std::string>()->default_value("O0"), "O0..O3")(
      "half", po::value<std::string>()->default_value("fp16"), "fp16 or bf16")(
      "device", po::value<std::string>()->default_value("auto"), "cpu, cuda or auto")(
      "loss-scale", po::value<std::string>()->default_value("auto"),
      "auto (a dynamic scale from 65536 with fp16, as torch's GradScaler), or a number: that "
      "static scale")(
      "dtype", po::value<std::string>()->default_value("f32"),
      "f32, or f64 (CPU, O0, one step without an update: a float64 reference for the "
      "gradients)")("channels-last", "NHWC activations for convolutions")(
      "num-classes", po::value<int>(), "classes")("seq-len", po::value<int>(), "BERT length")(
      "set", po::value<std::vector<std::string>>()->composing(),
      "experiment field of the model's shape, e.g. model.gpt.num_layers=2");
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(options).run(), vm);
  if (vm.count("help")) {
    std::cout << options << "\n";
    return 0;
  }
  po::notify(vm);
  std::string dev = vm["device"].as<std::string>();
  Device device = dev == "auto" ? (cuda_device_count() > 0 ? Device::cuda(0) : Device::cpu())
                                : parse_device(dev);
  std::vector<std::string> overrides;
  if (vm.count("set")) overrides = vm["set"].as<std::vector<std::string>>();
  const config::Experiment experiment =
      train::default_model_experiment(vm["model"].as<std::string>(), overrides);
  ModelOptions mo = train::model_options_from(experiment);
  mo.dropout = 0.0;  // comparisons need the same function on both sides
  if (vm.count("num-classes")) mo.num_classes = vm["num-classes"].as<int>();
  if (vm.count("seq-len")) mo.seq_len = vm["seq-len"].as<int>();
  // A safetensors file, or a transformers model folder checked against the model's shape before
  // the model is built.
  const std::string weights_path = vm["weights"].as<std::string>();
  const std::map<std::string, Tensor> weights =
      train::read_init_weights(weights_path, experiment.model());
  Model model = make_model(mo);
  train::load_named_tensors({weights_path, &weights, ""}, model.net->parameters(), {}, false);
  for (Buffer* b : model.net->buffers()) {
    auto it = weights.find(b->name);
    if (it != weights.end()) b->value.copy_from(it->second.to(DType::F32));
  }
  optim::AmpOptions amp;
  amp.level = optim::opt_level_from_name(vm["amp"].as<std::string>());
  amp.half = optim::half_type_from_name(vm["half"].as<std::string>());
  const std::string loss_scale = vm["loss-scale"].as<std::string>();
  if (loss_scale != "auto") {
    std::size_t used = 0;
    double s = 0;
    try {
      s = std::stod(loss_scale, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != loss_scale.size() || !(s > 0) || !std::isfinite(s)) {
      throw InputError("--loss-scale: expected auto or a positive number, got '" + loss_scale +
                       "'");
    }
    amp.loss_scale = optim::LossScaleMode::Static;
    amp.scaler.init_scale = s;
    amp.scaler.min_scale = std::min(amp.scaler.min_scale, s);
  }
  const std::string dtype = vm["dtype"].as<std::string>();
  if (dtype != "f32" && dtype != "f64") {
    throw InputError("--dtype: expected f32 or f64, got '" + dtype + "'");
  }
  // The optimizers run in f32: the f64 reference is one forward and backward.
  const bool f64 = dtype == "f64";
  if (f64 && (!device.is_cpu() || amp.level != optim::OptLevel::O0 || vm["steps"].as<int>() != 1)) {
    throw InputError("--dtype f64 runs on the CPU at O0 for --steps 1");
  }
  model.net->to(device, f64 ? DType::F64 : optim::parameter_dtype(amp));
  optim::OptimizerOptions oo;
  oo.kind = optim::OptimizerKind::AdamW;
  oo.lr = vm["lr"].as<double>();
  oo.weight_decay = vm["weight-decay"].as<double>();
  oo.exclude_flagged_from_decay = false;
  std::unique_ptr<optim::MixedPrecisionOptimizer> opt;
  if (!f64)
    opt = std::make_unique<optim::MixedPrecisionOptimizer>(trainable(model.net->parameters()), oo,
                                                           amp);

  SafetensorsFile batch = load_safetensors(vm["batch"].as<std::string>());
  Tensor input = batch.tensors.at("input").to(device);
  Tensor target = batch.tensors.at("target").to(device);
  Context ctx;
  ctx.run.device = device;
  ctx.training = true;
  ctx.run.precision = optim::precision_policy(amp);
  if (f64) ctx.run.precision = PrecisionPolicy{DType::F64, DType::F64};
  if (is_floating(input.dtype())) input = input.to(ctx.run.precision.activation);
  ctx.run.channels_last = vm.count("channels-last") > 0;
  const DType out_dtype = f64 ? DType::F64 : DType::F32;
  SoftmaxCrossEntropy loss_fn;
  NamedTensors out;
  // Per step: the loss, the loss scale its gradients carried, 1 where the update was skipped.
  std::vector<double> losses, scales, skipped;
  // Inference first: the loaded model in eval mode (batch norm from its running statistics),
  // the logits a user of the converted weights gets.
  model.net->set_training(false);
  ctx.training = false;
  out.emplace_back("eval_logits",
                   model.net->forward(ctx, input).to(Device::cpu(), out_dtype).clone());
  model.net->set_training(true);
  ctx.training = true;
  int steps = vm["steps"].as<int>();
  // The step scalars the layers read: the step here, the loss scale where the optimizer keeps it.
  HostWrittenScalars scalars(device);
  ctx.step = scalars.scalars();
  if (opt) ctx.step.loss_scale = opt->loss_scale_source();
  for (int step = 0; step < steps; ++step) {
    const double scale = opt ? opt->scale() : 1.0;
    if (opt) opt->zero_grad();
    scalars.set_step(static_cast<std::uint64_t>(step));
    ctx.weights_version = opt ? opt->weights_version() : 0;
    Tensor logits = model.net->forward(ctx, input);
    Tensor flat = logits.dim() == 3 ? logits.reshape({-1, logits.size(-1)}) : logits;
    Tensor t = target.dim() == 2 ? target.reshape({-1}) : target;
    Tensor loss = loss_fn.forward(ctx, flat, t);
    losses.push_back(loss.item());
    model.net->backward(ctx, loss_fn.backward(ctx));
    if (step == 0) {
      // clone(): on the CPU in the same dtype to() returns the tensor itself, and the gradient
      // would be scaled in place and then overwritten by later steps.
      out.emplace_back("logits", logits.to(Device::cpu(), out_dtype).clone());
      for (Parameter* p : trainable(model.net->parameters())) {
        Tensor g = p->grad.to(Device::cpu(), out_dtype).clone();
        ops::scale(g, 1.0 / scale);
        if (p->stored_transposed) g = g.transpose(0, 1).contiguous();  // the file's layout
        out.emplace_back("grad." + p->name, g);
      }
    }
    scales.push_back(scale);
    skipped.push_back(opt && opt->step().skipped ? 1.0 : 0.0);
  }
  auto vector_of = [](const std::vector<double>& v) {
    return Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())});
  };
  out.emplace_back("loss", vector_of(losses));
  out.emplace_back("loss_scale", vector_of(scales));
  out.emplace_back("skipped", vector_of(skipped));
  save_safetensors(vm["out"].as<std::string>(), out);
  int skips = 0;
  for (double s : skipped) skips += s > 0;
  std::printf("replay %s on %s (%s, %s): %d step(s), %d skipped, first loss %.6f, last loss %.6f\n",
              mo.name.c_str(), device.str().c_str(), vm["amp"].as<std::string>().c_str(),
              dtype.c_str(), steps, skips, losses.front(), losses.back());
  return 0;
}

}  // namespace kiln::launch
