#pragma once
// The training loop: builds the model, data, optimizer (with mixed precision), data parallelism
// and checkpoints from an Experiment, then trains with gradient accumulation, evaluates every K
// steps and at the end, logs (rank 0: terminal, JSONL, TensorBoard), saves checkpoints and stops
// cleanly on SIGTERM or SIGUSR1 (preemption, train/preemption.h) after committing one. Its parts:
// run_setup (device, process settings, data options), parameter_loader (init_from and resume),
// metrics_sink (every report), fault_injection (reliability tests), benchmark.cc.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "comm/data_parallel.h"
#include "comm/world.h"
#include "configs/kiln.pb.h"
#include "core/gemm_tally.h"
#include "train/evaluator.h"
#include "train/preemption.h"

namespace kiln::train {

struct TrainResult {
  std::int64_t steps = 0;          // optimizer steps completed in total
  std::int64_t skipped_steps = 0;  // skipped for inf/NaN gradients
  double final_loss = 0;           // mean training loss of the last logging interval
  EvalResult eval;                 // the last evaluation (at the end)
  double samples_per_s = 0;        // over the whole run, all ranks
  bool preempted = false;    // stopped by a signal (SIGTERM, SIGUSR1, SIGINT) after a checkpoint
  bool interrupted = false;  // of which by SIGINT on some rank (kiln train exits 130, else 75)
  int stop_signal = 0;       // the signal that stopped it (on any rank), 0 when none did
  std::string last_checkpoint;
  // The first failed write of the run's logs (metrics.jsonl, TensorBoard, stdout) on this rank,
  // naming the file and the reason; "" when they were written whole (kiln train exits 74 else).
  std::string log_write_failure;
};

struct LayerTime {
  std::string layer;
  double forward_ms = 0;  // median per step
  double backward_ms = 0;
  // Host time spent issuing the layer's work (leaf types only): where it is near the GPU time,
  // the GPU waits for the host there.
  double host_forward_ms = 0;
  double host_backward_ms = 0;
};

struct BenchResult {
  std::vector<double> step_ms;  // each timed step (CUDA events on the GPU, wall clock on CPU)
  double median_ms = 0;
  double samples_per_s = 0;  // all ranks, from the median step
  double tflops_per_gpu = 0;
  double mfu = 0;               // against the GPU's dense half-precision peak (0 if unknown)
  double flops_per_sample = 0;  // forward + backward
  double data_wait_fraction = 0;
  std::size_t peak_allocated_bytes = 0;  // the CUDA graphs' pool included (graph_pool_bytes)
  std::size_t graph_pool_bytes = 0;      // free blocks of the graphs' pool: their working memory
  std::size_t peak_reserved_bytes = 0;
  double fragmentation = 0;
  std::uint64_t raw_allocations_in_timed_steps = 0;  // cudaMalloc calls after warm-up
  std::vector<LayerTime> layers;                     // with profiling: top-level layers
  std::vector<LayerTime> layer_types;  // with profiling: leaf layers by type, mean per step
  // Data parallelism (more than one rank): the median over the timed steps of the communication
  // not hidden behind backward (DataParallel's CommStepTiming::exposed_ms); -1 with one rank.
  double exposed_comm_ms = -1;
  // With profiling and data parallelism: the median step's bucket timeline, from the step's start.
  CommStepTiming comm_timeline;
  std::vector<std::size_t> bucket_bytes;
  // train.cuda_graphs: whether every timed micro-step replayed a captured graph, and the host
  // time per step spent issuing work (loader hand-over, copies, launches; the GPU is not waited
  // for inside a step).
  bool graph = false;
  double host_ms_per_step = 0;
  // The GEMMs issued in the warm-up and timed steps (core/gemm_tally.h; with CUDA graphs, those
  // of the captures): how much of their FLOPs, and with profiling of the timed steps' GEMM time,
  // ran in FP8.
  GemmTotals gemms;
  bool gemms_timed = false;
};

struct TrainerOptions {
  std::string config_path;  // for messages
  std::string resume;       // overrides checkpoint.resume when set
  bool quiet = false;       // no per-interval log lines (tests)
  // Only evaluate: a checkpoint from another world size or batch size is fine (the training data
  // position is not restored).
  bool evaluate_only = false;
  // The heuristic's convolution and GEMM algorithms, no autotune (autobatch's probes).
  bool heuristic_algorithms = false;
  // Lock logging.dir and checkpoint.dir on rank 0 for the trainer's life (kiln train; a second
  // run on the same directory is refused: train/run_lock.h).
  bool lock_directories = false;
  // How the command line named the checkpoint (kiln eval: --checkpoint), for messages.
  std::string resume_flag = "--resume";
  // kiln eval without --checkpoint: no checkpoint falls back to model.init_from's weights.
  bool init_from_fallback = false;
};

class Trainer {
 public:
  Trainer(const config::Experiment& experiment, const World& world, TrainerOptions options = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  TrainResult train();
  // On the eval split, all ranks, without changing anything.
  EvalResult evaluate(const EvalOptions& options = {});
  // Training steps for throughput: `warmup` untimed, then `steps` timed. With `profile`, the
  // forward and backward time of each top-level layer from CUDA events.
  BenchResult benchmark(int warmup, int steps, bool profile);
  // The weights the trainer started from: the checkpoint directory it restored, else
  // "model.init_from FILE", else "" (random initialisation).
  std::string weights_source() const;

  // The state the trainer's parts share (train/trainer_state.h; not for users).
  struct State;

 private:
  std::unique_ptr<State> s_;
};

}  // namespace kiln::train
