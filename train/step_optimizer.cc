#include "train/step_optimizer.h"

#include <algorithm>

#include "optim/amp/amp.h"
#include "optim/host_offload.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "train/run_setup.h"

namespace kiln::train {

PrecisionChoice precision_for(const config::Experiment& experiment, Device device) {
  (void)device;
  optim::AmpOptions a = amp_options(experiment);
  return {optim::precision_policy(a), optim::parameter_dtype(a)};
}

struct StepOptimizer::Impl {
  Impl(const std::vector<Parameter*>& parameters, NamedTensors fp32_init,
       const config::Experiment& e, std::int64_t total, optim::ShardGroup* group)
      : offload(host_cores(e) && group == nullptr ? std::make_unique<optim::HostOffload>(parameters)
                                                  : nullptr),
        host_shards(host_cores(e) && group != nullptr
                        ? std::make_unique<optim::HostShardGroup>(*group)
                        : nullptr),
        shards(offload ? offload->parameters() : parameters, std::move(fp32_init),
               optimizer_options(e), amp_options(e), host_shards ? host_shards.get() : group),
        optimizer(shards.optimizer()),
        schedule(schedule_options(e, total)),
        total_steps(total) {
    // The masters' first half rounding (O2) was written into the host twins (ZeRO's shards: and
    // gathered to the device already).
    if (offload) offload->weights_to_device();
    if ((offload || host_shards) && !parameters.empty()) {
      device_scale = Tensor::zeros({1}, DType::F64, parameters.front()->value.device());
    }
    publish_scale();
  }
  static bool host_cores(const config::Experiment& e) {
    return offload_update(e) == config::TrainConfig::HOST_CORES;
  }
  // train.offload with HOST_CORES: the optimizer runs on host twins of the parameters (one rank,
  // or ZeRO stage 0), or of this rank's ranges of them (ZeRO).
  std::unique_ptr<optim::HostOffload> offload;
  std::unique_ptr<optim::HostShardGroup> host_shards;
  optim::ShardedOptimizer shards;
  optim::MixedPrecisionOptimizer& optimizer;
  optim::LrSchedule schedule;
  std::int64_t total_steps;
  std::int64_t skipped_before_resident = 0;
  Communicator* found_inf_comm = nullptr;  // whose all-reduce the found-inf hook runs
  // With offload, the loss scale the backward reads: a device copy of the host optimizer's.
  Tensor device_scale;
  // Every rank's found-inf flag summed before the skip decision, so that all ranks skip alike.
  void agree_on_found_inf(Communicator* comm);
  void publish_scale() {
    if (!device_scale.defined()) return;
    device_scale.copy_from(
        Tensor::from_vector(std::vector<double>{optimizer.scaler().scale()}, {1}));
  }
};

StepOptimizer::StepOptimizer(const std::vector<Parameter*>& parameters, NamedTensors fp32_init,
                             const config::Experiment& experiment, std::int64_t total_steps,
                             optim::ShardGroup* shards)
    : impl_(std::make_unique<Impl>(parameters, std::move(fp32_init), experiment, total_steps,
                                   shards)) {}

StepOptimizer::~StepOptimizer() = default;

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
  if (impl_->offload) impl_->offload->gradients_to_host();
  if (impl_->host_shards) impl_->host_shards->gradients_to_host();
  optim::StepResult r = impl_->shards.step();  // ZeRO's host shards copy up as they gather
  if (impl_->offload && !r.skipped) impl_->offload->weights_to_device();
  impl_->publish_scale();
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
  KILN_CHECK(!impl_->offload && !impl_->host_shards,
             "device-resident optimizer steps with train.offload (the update runs on the host)");
  KILN_CHECK(!impl_->shards.sharded(),
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
  if (impl_->device_scale.defined()) return impl_->device_scale.data<double>();
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
  return impl_->shards.state();
}

bool StepOptimizer::sharded() const {
  return impl_->shards.sharded();
}

std::map<std::string, std::string> StepOptimizer::shard_metadata() const {
  return impl_->shards.shard_metadata();
}

void StepOptimizer::load_state(const std::vector<const SafetensorsFile*>& files,
                               const std::string& what) {
  // The model's weights were just restored: the host twins take them before the masters load.
  if (impl_->offload) impl_->offload->weights_to_host();
  if (impl_->host_shards) impl_->host_shards->weights_to_host();
  impl_->shards.load_state(files, what);
  if (impl_->offload) impl_->offload->weights_to_device();
}

std::vector<Parameter*> StepOptimizer::updated_parameters() {
  return impl_->shards.updated_parameters();
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
  impl_->optimizer.load_scaler_state(st);
  impl_->publish_scale();
}

}  // namespace kiln::train
