#pragma once
// Data-parallel training of the tiny model, shared by the CPU (MPI) and GPU (NCCL) tests.

#include <cstring>

#include "comm/data_parallel.h"
#include "tests/comm/tiny_model.h"

namespace kiln::testing {

struct DpRun {
  int steps = 4;
  std::int64_t global_batch = 12;
  int micro_steps = 1;  // gradient accumulation: micro-batches per optimizer step
  double lr = 0.05;
  bool install_hook = true;
  bool with_unused = false;
  DataParallelOptions options;
};

struct DpResult {
  std::vector<double> values;
  std::uint64_t bucket_all_reduces = 0;
  std::size_t buckets = 0;
};

// Trains on this rank's shard of each global batch; rank r initialises with seed + r, so the
// start-up broadcast is what makes the ranks agree.
inline DpResult data_parallel_run(Communicator& comm, std::uint64_t seed, DType dtype,
                                  const DpRun& run) {
  const Device device = comm.device();
  auto model = make_tiny_model(seed + static_cast<std::uint64_t>(comm.rank()), device, dtype,
                               run.with_unused);
  DataParallel dp(model->parameters(), model->buffers(), comm, run.options);
  Layer& net = active_part(*model, run.with_unused);
  Context ctx;
  ctx.run.device = device;
  if (run.install_hook) ctx.on_grad_ready = dp.grad_ready_hook();
  const std::int64_t shard = run.global_batch / comm.size();
  const std::int64_t micro = shard / run.micro_steps;
  KILN_CHECK(shard * comm.size() == run.global_batch && micro * run.micro_steps == shard,
             "batch does not divide");
  auto params = model->parameters();
  for (int s = 0; s < run.steps; ++s) {
    dp.zero_grad();
    Tensor x, t;
    global_batch(static_cast<std::uint64_t>(s), run.global_batch, device, dtype, x, t);
    for (int m = 0; m < run.micro_steps; ++m) {
      dp.set_accumulation_micro_step(m + 1 < run.micro_steps);
      const std::int64_t begin = comm.rank() * shard + m * micro;
      Tensor xm = x.slice(0, begin, begin + micro).contiguous();
      Tensor tm = t.slice(0, begin, begin + micro).contiguous();
      Tensor y = net.forward(ctx, xm);
      // The local mean over the shard: micro-batch gradients add up to it.
      net.backward(ctx, mse_grad(y, tm, shard));
    }
    dp.finish();
    sgd_step(params, run.lr);
  }
  DpResult result;
  result.values = parameter_values(*model);
  result.bucket_all_reduces = dp.bucket_all_reduces();
  result.buckets = dp.bucket_count();
  return result;
}

// true when every rank holds bitwise rank 0's values.
inline bool bitwise_equal_on_all_ranks(Communicator& comm, const std::vector<double>& values) {
  Tensor mine = Tensor::from_vector(values, {static_cast<std::int64_t>(values.size())});
  Tensor all = Tensor::empty({mine.numel() * comm.size()}, DType::F64, Device::cpu());
  if (comm.device().is_cpu()) {
    comm.all_gather(mine, all);
  } else {
    Tensor dev_all = all.to(comm.device());
    comm.all_gather(mine.to(comm.device()), dev_all);
    all = dev_all.to(Device::cpu());
  }
  std::vector<double> v = all.to_vector<double>();
  bool same = true;
  for (int r = 1; r < comm.size(); ++r) {
    same = same &&
           std::memcmp(v.data(), v.data() + r * values.size(), values.size() * sizeof(double)) == 0;
  }
  return same;
}

}  // namespace kiln::testing
