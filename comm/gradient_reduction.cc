#include "comm/gradient_reduction.h"

#include <optional>

#include "core/check.h"
#include "core/stream.h"

namespace kiln {
namespace {

class AllReduce : public GradientReduction {
 public:
  explicit AllReduce(Communicator& comm) : comm_(comm) {}
  void reduce(std::size_t, Tensor& flat, Tensor&, std::int64_t) override {
    comm_.all_reduce_on_comm_stream(flat, ReduceOp::Average);
  }

 protected:
  Communicator& comm_;
};

class HalfAllReduce final : public AllReduce {
 public:
  HalfAllReduce(Communicator& comm, DType half) : AllReduce(comm), half_(half) {}
  void add_bucket(std::size_t index, DType dtype, std::int64_t numel,
                  const std::vector<Tensor>&) override {
    staging_.resize(index + 1);
    if (dtype == DType::F32) staging_[index] = Tensor::empty({numel}, half_, comm_.device());
  }
  void reduce(std::size_t index, Tensor& flat, Tensor& shard, std::int64_t steps) override {
    Tensor& staging = staging_.at(index);
    if (!staging.defined()) return AllReduce::reduce(index, flat, shard, steps);
    // On the communication stream, where there is one (else the work runs where it is).
    std::optional<StreamGuard> guard;
    if (comm_.comm_stream() != nullptr) guard.emplace(comm_.device(), comm_.comm_stream());
    staging.copy_from(flat);
    comm_.all_reduce_on_comm_stream(staging, ReduceOp::Average);
    flat.copy_from(staging);
  }

 private:
  DType half_;
  std::vector<Tensor> staging_;  // per bucket: the half copy of an f32 bucket, else undefined
};

class PowerSgdReduce final : public AllReduce {
 public:
  PowerSgdReduce(Communicator& comm, PowerSgdOptions options, std::int64_t start_step)
      : AllReduce(comm), options_(options), start_step_(start_step) {}
  void add_bucket(std::size_t index, DType, std::int64_t,
                  const std::vector<Tensor>& grads) override {
    buckets_.resize(index + 1);
    if (!PowerSgdBucket::compresses_any(grads, options_.rank)) return;
    PowerSgdOptions o = options_;
    o.seed += index;  // Qs of different buckets differ; every rank draws the same
    buckets_[index] = std::make_unique<PowerSgdBucket>(grads, o);
  }
  void reduce(std::size_t index, Tensor& flat, Tensor& shard, std::int64_t steps) override {
    PowerSgdBucket* bucket = buckets_.at(index).get();
    // Before the start step (PyTorch's start_powerSGD_iter), and for buckets without matrices
    // worth compressing, the plain all-reduce.
    if (bucket == nullptr || steps < start_step_)
      return AllReduce::reduce(index, flat, shard, steps);
    StreamGuard guard(comm_.device(), comm_.comm_stream() != nullptr
                                          ? comm_.comm_stream()
                                          : current_stream(comm_.device()));
    bucket->all_reduce(comm_);
  }
  void reset() override {
    for (auto& b : buckets_) {
      if (b) b->reset();
    }
  }
  NamedTensors state() const override {
    NamedTensors out;
    for (std::size_t i = 0; i < buckets_.size(); ++i) {
      if (!buckets_[i]) continue;
      for (auto& [name, t] : buckets_[i]->state()) {
        out.emplace_back("bucket" + std::to_string(i) + "." + name, t);
      }
    }
    return out;
  }
  void load_state(const NamedTensors& state, const std::string& where) override {
    const auto find = [&](const std::string& name) {
      for (const auto& [n, t] : state) {
        if (n == name) return t;
      }
      throw InputError(where + ": no PowerSGD state " + name +
                       " (written with another parallel.compression, bucket_mb or model)");
    };
    for (std::size_t i = 0; i < buckets_.size(); ++i) {
      if (!buckets_[i]) continue;
      const std::string prefix = "bucket" + std::to_string(i) + ".";
      buckets_[i]->load_state(find(prefix + "error"), find(prefix + "q"), where);
    }
  }

 private:
  PowerSgdOptions options_;
  std::int64_t start_step_;
  std::vector<std::unique_ptr<PowerSgdBucket>> buckets_;  // null: not worth compressing
};

class ReduceScatter final : public GradientReduction {
 public:
  explicit ReduceScatter(Communicator& comm) : comm_(comm) {}
  void reduce(std::size_t, Tensor& flat, Tensor& shard, std::int64_t) override {
    comm_.reduce_scatter_on_comm_stream(flat, shard, ReduceOp::Average);
  }
  bool scatters() const override { return true; }

 private:
  Communicator& comm_;
};

}  // namespace

void GradientReduction::add_bucket(std::size_t, DType, std::int64_t, const std::vector<Tensor>&) {}

void GradientReduction::load_state(const NamedTensors&, const std::string&) {}

std::unique_ptr<GradientReduction> make_gradient_reduction(const GradientReductionOptions& options,
                                                           Communicator& comm) {
  using Kind = GradientReductionOptions::Kind;
  switch (options.kind) {
    case Kind::HalfAllReduce:
      return std::make_unique<HalfAllReduce>(comm, options.half_dtype);
    case Kind::PowerSgd:
      return std::make_unique<PowerSgdReduce>(comm, options.powersgd, options.powersgd_start_step);
    case Kind::ReduceScatter:
      return std::make_unique<ReduceScatter>(comm);
    case Kind::AllReduce:
      break;
  }
  return std::make_unique<AllReduce>(comm);
}

}  // namespace kiln
