#include "train/gradient_sync.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>

namespace kiln::train {
namespace {

// One process: the gradients live in one buffer per dtype and device (views into it, each
// 256-byte aligned), so zeroing them before a step is one memset instead of one per parameter
// (GPT-2 124M: 148 launches in the step's graph).
class LocalGradients final : public GradientSync {
 public:
  explicit LocalGradients(std::vector<Parameter*> parameters) : parameters_(std::move(parameters)) {
    constexpr std::int64_t kAlignBytes = 256;
    std::map<std::pair<DType, std::string>, std::vector<Parameter*>> groups;
    for (Parameter* p : parameters_) {
      if (p->grad.defined() && p->grad.is_contiguous())
        groups[{p->grad.dtype(), p->grad.device().str()}].push_back(p);
    }
    for (auto& [key, members] : groups) {
      const std::int64_t align = kAlignBytes / static_cast<std::int64_t>(dtype_size(key.first));
      std::int64_t total = 0;
      for (Parameter* p : members) total += (p->grad.numel() + align - 1) / align * align;
      Tensor arena = Tensor::zeros({total}, key.first, members.front()->grad.device());
      std::int64_t offset = 0;
      for (Parameter* p : members) {
        const std::int64_t n = p->grad.numel();
        Tensor view = arena.slice(0, offset, offset + n).view(p->grad.shape());
        view.copy_from(p->grad);
        p->grad = view;
        offset += (n + align - 1) / align * align;
      }
      arenas_.push_back(arena);
    }
  }
  void zero_gradients() override {
    for (Tensor& arena : arenas_) arena.zero();
    for (Parameter* p : parameters_) {
      if (!in_arena(*p)) p->grad.zero();
    }
  }
  void set_accumulating(bool) override {}
  void end_micro_step() override {}
  void install_hooks(Context&) override {}
  void finish() override {}
  void reset_step() override {}
  bool sharded() const override { return false; }
  int zero_stage() const override { return 0; }
  void skipped_step() override {}
  void broadcast_buffers() override {}
  NamedTensors state() const override { return {}; }
  void set_finished_steps(std::int64_t) override {}
  void load_state(const NamedTensors&, const std::string&) override {}
  optim::ShardGroup* shard_group() override { return nullptr; }
  DataParallel* data_parallel() override { return nullptr; }
  void gather_weights() override {}
  void release_weights(bool) override {}
  std::uint64_t weight_gathers() const override { return 0; }

 private:
  bool in_arena(const Parameter& p) const {
    if (!p.grad.defined()) return true;  // nothing to zero
    const char* at = static_cast<const char*>(p.grad.data());
    for (const Tensor& arena : arenas_) {
      const char* base = static_cast<const char*>(arena.data());
      if (at >= base && at < base + arena.nbytes()) return true;
    }
    return false;
  }
  std::vector<Parameter*> parameters_;
  std::vector<Tensor> arenas_;  // the gradients' storage, one per dtype and device
};

// ZeRO's ranks as the sharded optimizer sees them: DataParallel's shard pieces and collectives.
class DataParallelShards final : public optim::ShardGroup {
 public:
  explicit DataParallelShards(DataParallel& dp) : dp_(dp) {}
  int size() const override { return dp_.communicator().size(); }
  int rank() const override { return dp_.communicator().rank(); }
  Device device() const override { return dp_.communicator().device(); }
  std::vector<optim::ParameterRange> ranges() const override {
    std::vector<optim::ParameterRange> out;
    for (const ShardPiece& piece : dp_.shard_pieces()) {
      out.push_back({piece.parameter, piece.offset, piece.numel, piece.grad, piece.value});
    }
    return out;
  }
  void sum(std::vector<double>& values) override {
    dp_.communicator().all_reduce_host(values, HostReduceOp::Sum);
  }
  void gather_parameters() override { dp_.gather_parameters(); }

 private:
  DataParallel& dp_;
};

class DataParallelSync final : public GradientSync {
 public:
  DataParallelSync(std::unique_ptr<DataParallel> dp, std::vector<WeightUnit> units,
                   bool gather_once_per_step)
      : dp_(std::move(dp)), shards_(*dp_), gather_once_per_step_(gather_once_per_step) {
    if (dp_->zero_stage() != 3) return;
    std::set<const Parameter*> in_unit;
    for (std::size_t i = 0; i < units.size(); ++i) {
      for (const Parameter* p : units[i].parameters) in_unit.insert(p);
      unit_index_[units[i].layer] = i;
    }
    units_ = std::move(units);
    kept_.assign(units_.size(), false);
    // A model's own parameters (no unit's): gathered now and kept, refreshed after each update.
    for (Parameter* p : dp_->parameters()) {
      if (in_unit.count(p) == 0) resident_.push_back(p);
    }
    dp_->acquire_values(resident_);
  }
  ~DataParallelSync() override { dp_->release_values(resident_); }
  void zero_gradients() override { dp_->zero_grad_lazily(); }
  void set_accumulating(bool accumulating) override {
    accumulating_ = accumulating;
    dp_->set_accumulation_micro_step(accumulating);
  }
  void end_micro_step() override { dp_->end_micro_step(); }
  void install_hooks(Context& ctx) override {
    ctx.on_grad_ready = dp_->grad_ready_hook();
    auto allocate = dp_->gradient_allocation_hook();
    if (allocate) ctx.observers.push_back(on_backward_begin(std::move(allocate)));
    if (units_.empty()) return;
    ctx.observers.push_back([this](Layer& layer, bool forward, bool begin) {
      auto it = unit_index_.find(&layer);
      if (it == unit_index_.end()) return;
      const std::size_t i = it->second;
      if (!begin) {
        // Gathered once per step: kept until the backward of the step's last micro-step.
        if (gather_once_per_step_ && (forward || accumulating_)) return;
        kept_[i] = false;
        return dp_->release_values(units_[i].parameters);
      }
      if (kept_[i]) return;
      dp_->acquire_values(units_[i].parameters);
      kept_[i] = gather_once_per_step_;
      // The unit that comes next, in the model's order going forward and in reverse going
      // backward, is gathered while this one computes.
      if (forward && i + 1 < units_.size()) dp_->prefetch_values(units_[i + 1].parameters);
      if (!forward && i > 0) dp_->prefetch_values(units_[i - 1].parameters);
    });
  }
  void finish() override {
    release_kept();  // a unit whose backward did not run in the last micro-step
    dp_->finish();
  }
  void reset_step() override {
    release_kept();
    dp_->reset_step();
  }
  bool sharded() const override { return dp_->zero_stage() > 0; }
  int zero_stage() const override { return dp_->zero_stage(); }
  void skipped_step() override { dp_->reset_compression_state(); }
  void broadcast_buffers() override { dp_->broadcast_buffers(); }
  NamedTensors state() const override { return dp_->compression_state(); }
  void set_finished_steps(std::int64_t steps) override { dp_->set_finished_steps(steps); }
  void load_state(const NamedTensors& state, const std::string& where) override {
    dp_->load_compression_state(state, where);
  }
  optim::ShardGroup* shard_group() override { return sharded() ? &shards_ : nullptr; }
  DataParallel* data_parallel() override { return dp_.get(); }
  void gather_weights() override { dp_->acquire_values(dp_->parameters()); }
  void release_weights(bool written) override { dp_->release_values(dp_->parameters(), written); }
  std::uint64_t weight_gathers() const override { return dp_->value_gathers(); }

 private:
  void release_kept() {
    for (std::size_t i = 0; i < kept_.size(); ++i) {
      if (!kept_[i]) continue;
      kept_[i] = false;
      dp_->release_values(units_[i].parameters);
    }
  }

  std::unique_ptr<DataParallel> dp_;
  DataParallelShards shards_;
  std::vector<WeightUnit> units_;                   // ZeRO-3, in the model's order
  std::map<const Layer*, std::size_t> unit_index_;  // ZeRO-3: into units_
  std::vector<Parameter*> resident_;                // ZeRO-3: in no unit
  bool gather_once_per_step_ = false;               // ZeRO-3: see make_data_parallel_sync
  std::vector<bool> kept_;     // ZeRO-3, gathered once per step: units held until released
  bool accumulating_ = false;  // the current micro-step is not the step's last
};

// Every parameter `layer` and the layers below it use: their own and the shared (tied) ones.
void collect_used(Layer& layer, std::vector<Parameter*>& out) {
  for (Parameter* p : layer.written_parameters()) {
    if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
  }
  for (Parameter* p : layer.parameters()) {
    if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
  }
  for (Layer* child : layer.children()) collect_used(*child, out);
}

}  // namespace

std::unique_ptr<GradientSync> make_local_gradients(std::vector<Parameter*> parameters) {
  return std::make_unique<LocalGradients>(std::move(parameters));
}

std::vector<WeightUnit> weight_units(Layer& model) {
  std::vector<WeightUnit> units;
  for (Layer* child : model.children()) {
    if (child->type() == "Sequential") {
      for (WeightUnit& unit : weight_units(*child)) units.push_back(std::move(unit));
      continue;
    }
    WeightUnit unit;
    unit.layer = child;
    collect_used(*child, unit.parameters);
    if (!unit.parameters.empty()) units.push_back(std::move(unit));
  }
  return units;
}

std::unique_ptr<GradientSync> make_data_parallel_sync(std::unique_ptr<DataParallel> dp,
                                                      std::vector<WeightUnit> units,
                                                      bool gather_once_per_step) {
  return std::make_unique<DataParallelSync>(std::move(dp), std::move(units), gather_once_per_step);
}

}  // namespace kiln::train
