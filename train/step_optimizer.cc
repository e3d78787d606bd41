#include "train/step_optimizer.h"

#include <algorithm>
#include <sstream>

#include "optim/amp/amp.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "train/run_setup.h"

namespace kiln::train {
namespace {

// ZeRO: this rank's pieces as parameters of their own (values are views into the model's
// weights, gradients views into the reduced gradient shards), so the optimizer and the
// mixed-precision pass run on them unchanged.
struct ShardedParameters {
  std::vector<std::unique_ptr<Parameter>> pieces;
  std::vector<std::size_t> parameter_index;  // per piece: its parameter's index in the model list
  std::vector<Parameter*> list() const {
    std::vector<Parameter*> out;
    for (const auto& p : pieces) out.push_back(p.get());
    return out;
  }
};

ShardedParameters shard_parameters(const std::vector<Parameter*>& parameters, DataParallel& dp) {
  std::map<const Parameter*, std::size_t> index;
  for (std::size_t i = 0; i < parameters.size(); ++i) index[parameters[i]] = i;
  ShardedParameters out;
  for (const ShardPiece& piece : dp.shard_pieces()) {
    Parameter& whole = *piece.parameter;
    auto p = std::make_unique<Parameter>();
    p->name = whole.name;
    p->value =
        whole.value.view({whole.value.numel()}).slice(0, piece.offset, piece.offset + piece.numel);
    p->grad = piece.grad;
    p->no_weight_decay = whole.no_weight_decay;
    p->fp32_in_half = whole.fp32_in_half;
    out.pieces.push_back(std::move(p));
    auto it = index.find(&whole);
    KILN_CHECK(it != index.end(), "ZeRO: parameter " + whole.name + " is not the model's");
    out.parameter_index.push_back(it->second);
  }
  return out;
}

// "<parameter>.<key>" -> "<parameter>" (state keys hold no dot).
std::string parameter_of(const std::string& state_name) {
  std::size_t dot = state_name.rfind('.');
  return dot == std::string::npos ? state_name : state_name.substr(0, dot);
}

}  // namespace

PrecisionChoice precision_for(const config::Experiment& experiment, Device device) {
  (void)device;
  optim::AmpOptions a = amp_options(experiment);
  return {optim::precision_policy(a), optim::parameter_dtype(a)};
}

struct StepOptimizer::Impl {
  Impl(const std::vector<Parameter*>& parameters, const config::Experiment& e, std::int64_t total,
       DataParallel* dp)
      : sharded(dp != nullptr && dp->zero_stage() > 0 ? dp : nullptr),
        shards(sharded ? shard_parameters(parameters, *sharded) : ShardedParameters{}),
        optimizer(sharded ? shards.list() : parameters, optimizer_options(e), amp_options(e),
                  sharded ? sharded->communicator().device() : Device::cpu()),
        schedule(schedule_options(e, total)),
        model_parameters(parameters),
        total_steps(total) {
    for (Parameter* p : parameters) {
      full_numel[p->name] = p->value.numel();
      if (!sharded) range[p->name] = {0, p->value.numel()};
    }
    if (sharded) {
      for (const ShardPiece& piece : sharded->shard_pieces()) {
        range[piece.parameter->name] = {piece.offset, piece.numel};
      }
    }
  }
  DataParallel* sharded;
  ShardedParameters shards;
  optim::MixedPrecisionOptimizer optimizer;
  optim::LrSchedule schedule;
  std::vector<Parameter*> model_parameters;
  // Per parameter name: {offset, numel} of the range this rank's optimizer holds, and its length.
  std::map<std::string, std::pair<std::int64_t, std::int64_t>> range;
  std::map<std::string, std::int64_t> full_numel;
  std::int64_t total_steps;
  std::int64_t skipped_before_resident = 0;
  Communicator* found_inf_comm = nullptr;  // whose all-reduce the found-inf hook runs
  // Every rank's found-inf flag summed before the skip decision, so that all ranks skip alike.
  void agree_on_found_inf(Communicator* comm);
};

StepOptimizer::StepOptimizer(const std::vector<Parameter*>& parameters,
                             const NamedTensors& fp32_init, const config::Experiment& experiment,
                             std::int64_t total_steps, DataParallel* sharded)
    : impl_(std::make_unique<Impl>(parameters, experiment, total_steps, sharded)) {
  // O2 masters start from the exact fp32 initial values, not from their half rounding.
  std::map<std::string, const Tensor*> init;
  for (const auto& [name, t] : fp32_init) init[name] = &t;
  bool any = false;
  for (auto& [name, tensor] : impl_->optimizer.state()) {
    const std::string suffix = ".master";
    if (name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      const std::string parameter = name.substr(0, name.size() - suffix.size());
      auto it = init.find(parameter);
      if (it != init.end()) {
        const auto [offset, numel] = impl_->range.at(parameter);
        tensor->view({numel}).copy_from(
            it->second->view({it->second->numel()}).slice(0, offset, offset + numel));
        any = true;
      }
    }
  }
  if (any) impl_->optimizer.refresh_model_weights();
  if (impl_->sharded != nullptr) {
    // Norms of whole tensors: this rank's partial sums added up over the ranks.
    Communicator* shard_comm = &impl_->sharded->communicator();
    impl_->optimizer.set_sumsq_hook([shard_comm](double local) {
      return shard_comm->all_reduce_host(local, HostReduceOp::Sum);
    });
    // LAMB: each piece's partial sums, added up per parameter over the ranks.
    const std::size_t params = impl_->model_parameters.size();
    const std::vector<std::size_t>& index = impl_->shards.parameter_index;
    impl_->optimizer.optimizer().set_tensor_sumsq_hook(
        [shard_comm, params, &index](std::vector<double>& sums) {
          std::vector<double> whole(2 * params, 0.0);
          for (std::size_t i = 0; i < index.size(); ++i) {
            whole[2 * index[i]] += sums[2 * i];
            whole[2 * index[i] + 1] += sums[2 * i + 1];
          }
          shard_comm->all_reduce_host(whole, HostReduceOp::Sum);
          for (std::size_t i = 0; i < index.size(); ++i) {
            sums[2 * i] = whole[2 * index[i]];
            sums[2 * i + 1] = whole[2 * index[i] + 1];
          }
        });
  }
  if (impl_->sharded != nullptr) impl_->sharded->gather_parameters();
}

StepOptimizer::~StepOptimizer() = default;

double StepOptimizer::loss_scale() const {
  return impl_->optimizer.scale();
}
std::uint64_t StepOptimizer::weights_version() const {
  return impl_->optimizer.weights_version();
}

void StepOptimizer::Impl::agree_on_found_inf(Communicator* comm) {
  // Installed once per communicator, not every step: the hook is a std::function.
  if (comm == found_inf_comm || comm == nullptr || comm->size() == 1) return;
  optimizer.set_found_inf_hook([comm](Tensor& flag) { comm->all_reduce(flag, ReduceOp::Sum); });
  found_inf_comm = comm;
}

StepOutcome StepOptimizer::step(std::int64_t step, Communicator* comm) {
  double lr = impl_->schedule.lr_at(step);
  impl_->optimizer.set_lr(lr);
  impl_->agree_on_found_inf(comm);
  optim::StepResult r = impl_->optimizer.step();
  // Every rank updated its pieces: the whole weights reach every rank before the next forward.
  if (impl_->sharded != nullptr && !r.skipped) impl_->sharded->gather_parameters();
  StepOutcome o;
  o.skipped = r.skipped;
  o.found_inf = r.found_inf;
  o.grad_norm = r.grad_norm;
  o.loss_scale = impl_->optimizer.scaler().enabled() ? r.scale : 1.0;
  o.lr = lr;
  return o;
}

void StepOptimizer::make_resident(std::int64_t next_step, std::int64_t skipped_so_far) {
  impl_->skipped_before_resident = skipped_so_far;
  KILN_CHECK(impl_->sharded == nullptr,
             "device-resident optimizer steps with parallel.zero_stage > 0 (ZeRO combines norms "
             "on the host)");
  // One learning rate per step of the run, and the last one for any step beyond it.
  std::vector<double> table;
  const std::int64_t n = std::max<std::int64_t>(impl_->total_steps, next_step) + 1;
  table.reserve(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) table.push_back(impl_->schedule.lr_at(i));
  impl_->optimizer.make_resident(std::move(table), next_step);
}

bool StepOptimizer::resident() const {
  return impl_->optimizer.resident();
}

const double* StepOptimizer::loss_scale_source() const {
  return impl_->optimizer.loss_scale_source();
}

void StepOptimizer::step_resident(Communicator* comm) {
  impl_->agree_on_found_inf(comm);
  impl_->optimizer.step_resident();
}

StepOutcome StepOptimizer::report(std::int64_t* skipped_steps) {
  const optim::ResidentReport r = impl_->optimizer.report();
  StepOutcome o;
  o.skipped = r.skipped;
  o.found_inf = r.found_inf;
  o.grad_norm = r.grad_norm;
  o.loss_scale = impl_->optimizer.scaler().enabled() ? r.loss_scale : 1.0;
  o.lr = r.lr;
  if (skipped_steps != nullptr) *skipped_steps = impl_->skipped_before_resident + r.skipped_steps;
  return o;
}

NamedTensors StepOptimizer::state() {
  NamedTensors out;
  for (auto& [name, tensor] : impl_->optimizer.state()) out.emplace_back(name, *tensor);
  return out;
}

bool StepOptimizer::sharded() const {
  return impl_->sharded != nullptr;
}

std::map<std::string, std::string> StepOptimizer::shard_metadata() const {
  std::map<std::string, std::string> m;
  if (impl_->sharded == nullptr) return m;
  const Communicator& comm = impl_->sharded->communicator();
  m["zero_world_size"] = std::to_string(comm.size());
  m["zero_rank"] = std::to_string(comm.rank());
  for (const ShardPiece& piece : impl_->sharded->shard_pieces()) {
    m["piece:" + piece.parameter->name] =
        std::to_string(piece.offset) + " " + std::to_string(piece.numel);
  }
  return m;
}

void StepOptimizer::load_state(const std::vector<const SafetensorsFile*>& files,
                               const std::string& what) {
  // Per file: the range of each parameter it holds ({0, whole} in an unsharded file).
  auto range_in = [&](const SafetensorsFile& f, const std::string& parameter,
                      std::int64_t whole) -> std::pair<std::int64_t, std::int64_t> {
    if (f.metadata.count("zero_world_size") == 0) return {0, whole};
    auto it = f.metadata.find("piece:" + parameter);
    if (it == f.metadata.end()) return {0, 0};
    std::istringstream in(it->second);
    std::int64_t offset = -1, numel = -1;
    if (!(in >> offset >> numel) || offset < 0 || numel < 0 || offset + numel > whole) {
      throw InputError(what + ": bad shard range '" + it->second + "' for " + parameter);
    }
    return {offset, numel};
  };
  for (auto& [name, tensor] : impl_->optimizer.state()) {
    if (name == "optimizer.step") {
      bool found = false;
      for (const SafetensorsFile* f : files) {
        auto it = f->tensors.find(name);
        if (it != f->tensors.end() && it->second.shape() == tensor->shape()) {
          tensor->copy_from(it->second);
          found = true;
          break;
        }
      }
      if (!found) throw InputError(what + ": no optimizer state '" + name + "'");
      continue;
    }
    const std::string parameter = parameter_of(name);
    auto whole_it = impl_->full_numel.find(parameter);
    KILN_CHECK(whole_it != impl_->full_numel.end(), "optimizer state of unknown " + parameter);
    const std::int64_t whole = whole_it->second;
    const auto [offset, numel] = impl_->range.at(parameter);
    Tensor dst = tensor->view({tensor->numel()});
    std::int64_t covered = 0;
    for (const SafetensorsFile* f : files) {
      auto it = f->tensors.find(name);
      if (it == f->tensors.end()) continue;
      const auto [src_offset, src_numel] = range_in(*f, parameter, whole);
      if (it->second.numel() != src_numel) {
        throw InputError(what + ": state '" + name + "' has shape " +
                         shape_str(it->second.shape()) + ", expected " + std::to_string(src_numel) +
                         " elements");
      }
      const std::int64_t lo = std::max(offset, src_offset);
      const std::int64_t hi = std::min(offset + numel, src_offset + src_numel);
      if (lo >= hi) continue;
      Tensor src = it->second.contiguous();
      dst.slice(0, lo - offset, hi - offset)
          .copy_from(src.view({src_numel}).slice(0, lo - src_offset, hi - src_offset));
      covered += hi - lo;
    }
    if (covered != numel) {
      throw InputError(what + ": no optimizer state '" + name +
                       "' (or not all of it; a checkpoint of another optimizer or precision)");
    }
  }
  impl_->optimizer.refresh_model_weights();
  if (impl_->sharded != nullptr) impl_->sharded->gather_parameters();
}

std::vector<Parameter*> StepOptimizer::updated_parameters() {
  return impl_->sharded != nullptr ? impl_->shards.list() : impl_->model_parameters;
}

config::LossScalerState StepOptimizer::scaler_state() const {
  config::LossScalerState s;
  auto st = impl_->optimizer.scaler().state();
  s.set_scale(st.scale);
  s.set_growth_tracker(st.growth_tracker);
  return s;
}

void StepOptimizer::load_scaler_state(const config::LossScalerState& state) {
  optim::LossScaler::State st;
  st.scale = state.scale();
  st.growth_tracker = state.growth_tracker();
  impl_->optimizer.scaler().load_state(st);
}

}  // namespace kiln::train
