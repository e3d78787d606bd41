#pragma once
// What a run sets up before its model exists: the device, the process-wide settings the
// experiment asks for (determinism, algorithm search, memory limits), whether a progress bar
// is wanted, and the data options the loader and datasets are built from.

#include <optional>
#include <string>

#include "comm/communicator.h"
#include "comm/data_parallel.h"
#include "comm/world.h"
#include "configs/experiment.h"
#include "core/device.h"
#include "data/factory.h"
#include "data/loader.h"
#include "layers/models/model.h"
#include "optim/amp/amp.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "train/checkpointer.h"
#include "train/evaluator.h"
#include "train/graphed_step.h"

namespace kiln::train {

// train.device: CUDA (the local rank's GPU), CPU, or AUTO (CUDA when a GPU is visible).
Device choose_device(const config::TrainConfig& train, const World& world);

// Environment for deterministic runs, convolution algorithm search (the heuristic's choice when
// deterministic or `heuristic_algorithms`, else benchmarked), the allocator's limit.
void configure_process(const config::Experiment& experiment, Device device,
                       bool heuristic_algorithms = false);

// parallel.backend as comm/ names it.
CommBackend comm_backend(const config::ParallelConfig& parallel);
// parallel.compression as comm/ names it (after fill_defaults migrated allreduce_in_half).
GradientCompression gradient_compression(const config::ParallelConfig& parallel);

// model.memory_format: NHWC activations for convolutions on CUDA when asked, or (AUTO) when
// they run in half precision; NCHW on the CPU.
bool channels_last(const config::ModelConfig& model, Device device, const PrecisionPolicy& policy);

// logging.progress: ON, OFF, or AUTO = stdout is a terminal and no launcher started the process.
bool progress_bar_wanted(const config::LoggingConfig& logging, const World& world);

// The dataset kind name data::make_dataset takes, and its options, for this experiment's model.
std::string dataset_kind(const config::Experiment& experiment, const Model& model);
data::DatasetOptions dataset_options(const config::Experiment& experiment, const Model& model);
// The path data::make_dataset reads `split` from ("train", or data.eval_split): data.path, but
// for LLMC_SHARDS evaluation ("test") data.eval_path, the validation shards' glob.
std::string dataset_path(const config::Experiment& experiment, const std::string& split);
// The training loader of this rank.
data::LoaderOptions loader_options(const config::Experiment& experiment,
                                   const config::BatchPlan& plan, const World& world,
                                   Device device);

// precision.*, optimizer.* and schedule.* as optim/'s options.
optim::AmpOptions amp_options(const config::Experiment& experiment);
optim::OptimizerOptions optimizer_options(const config::Experiment& experiment);
// Which processor updates the offloaded optimizer (train.offload_update); nullopt without offload.
std::optional<config::TrainConfig::OffloadUpdate> offload_update(const config::Experiment& e);
optim::ScheduleOptions schedule_options(const config::Experiment& experiment,
                                        std::int64_t total_steps);

// parallel.* as DataParallel's options (and train.offload OPTIMIZER_AND_WEIGHTS: the shards in
// host memory).
DataParallelOptions data_parallel_options(const config::Experiment& experiment);
// Gradients go through DataParallel's buckets: more than one rank, or ZeRO-3's host shards of the
// weights on one (train.offload OPTIMIZER_AND_WEIGHTS).
bool reduces_in_buckets(const config::Experiment& experiment, int world_size);

// train.cuda_graphs (filled by config::fill_device_defaults) as this run can have it: Graphed on
// CUDA, Resident on the CPU (nothing to capture), Eager when off or when a part needs the host
// every step. *note: the line that says
// why a wanted mode was not taken ("" when nothing to say).
StepMode choose_step_mode(const config::Experiment& experiment, bool cuda, int world_size,
                          std::string* note);

// checkpoint.* (and --resume, when given: `resume_override`) as the checkpointer's options.
CheckpointerOptions checkpointer_options(const config::Experiment& experiment,
                                         const std::string& resume_override, bool evaluate_only,
                                         std::int64_t total_steps);
EvaluatorOptions evaluator_options(const config::Experiment& experiment, std::int64_t total_steps);
// train.steps, or train.epochs over the loader's batches per epoch, in optimizer steps.
std::int64_t total_steps(const config::TrainConfig& train, std::int64_t batches_per_epoch,
                         int accumulation);

}  // namespace kiln::train
