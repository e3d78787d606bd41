#include "optim/sharded_optimizer.h"

#include <algorithm>
#include <sstream>

namespace kiln::optim {
namespace {

// "<parameter>.<key>" -> "<parameter>" (state keys hold no dot).
std::string parameter_of(const std::string& state_name) {
  std::size_t dot = state_name.rfind('.');
  return dot == std::string::npos ? state_name : state_name.substr(0, dot);
}

}  // namespace

ShardedOptimizer::Pieces ShardedOptimizer::make_pieces(const std::vector<Parameter*>& parameters,
                                                       const ShardGroup& group) {
  std::map<const Parameter*, std::size_t> index;
  for (std::size_t i = 0; i < parameters.size(); ++i) index[parameters[i]] = i;
  Pieces out;
  for (const ParameterRange& range : group.ranges()) {
    Parameter& whole = *range.parameter;
    auto p = std::make_unique<Parameter>();
    p->name = whole.name;
    p->value = range.value.defined() ? range.value
                                     : whole.value.view({whole.value.numel()})
                                           .slice(0, range.offset, range.offset + range.numel);
    p->grad = range.grad;
    out.element_offsets.push_back(range.offset);
    p->no_weight_decay = whole.no_weight_decay;
    p->fp32_in_half = whole.fp32_in_half;
    out.parameters.push_back(std::move(p));
    auto it = index.find(&whole);
    KILN_CHECK(it != index.end(), "ZeRO: parameter " + whole.name + " is not the model's");
    out.model_index.push_back(it->second);
  }
  return out;
}

std::vector<Parameter*> ShardedOptimizer::piece_list() const {
  std::vector<Parameter*> out;
  for (const auto& p : pieces_.parameters) out.push_back(p.get());
  return out;
}

ShardedOptimizer::ShardedOptimizer(const std::vector<Parameter*>& parameters,
                                   NamedTensors fp32_init, const OptimizerOptions& options,
                                   const AmpOptions& amp, ShardGroup* group)
    : group_(group),
      model_parameters_(parameters),
      pieces_(group != nullptr ? make_pieces(parameters, *group) : Pieces{}),
      optimizer_(group != nullptr ? piece_list() : parameters, options, amp,
                 group != nullptr ? group->device() : Device::cpu(), pieces_.element_offsets,
                 masters_from(fp32_init)) {
  for (Parameter* p : parameters) {
    full_numel_[p->name] = p->value.numel();
    if (group_ == nullptr) range_[p->name] = {0, p->value.numel()};
  }
  if (group_ != nullptr) {
    for (const ParameterRange& r : group_->ranges()) {
      range_[r.parameter->name] = {r.offset, r.numel};
    }
  }
  if (masters_from_init_) optimizer_.refresh_model_weights();
  if (group_ != nullptr) {
    install_norm_hooks();
    group_->gather_parameters();
  }
}

ShardedOptimizer::~ShardedOptimizer() = default;

MasterSource ShardedOptimizer::masters_from(NamedTensors& fp32_init) {
  // O2 masters start from the exact fp32 initial values, not from their half rounding. Runs while
  // optimizer_ is built: pieces_ (built before it) give each master's parameter and offset.
  MasterSource source;
  source.fill = [this, &fp32_init](std::size_t i, Tensor& master) {
    const std::string& name =
        pieces_.parameters.empty() ? model_parameters_.at(i)->name : pieces_.parameters.at(i)->name;
    auto it = std::find_if(fp32_init.begin(), fp32_init.end(),
                           [&](const auto& entry) { return entry.first == name; });
    if (it == fp32_init.end()) return false;
    const std::int64_t offset = pieces_.element_offsets.empty() ? 0 : pieces_.element_offsets[i];
    master.view({master.numel()})
        .copy_from(it->second.view({it->second.numel()}).slice(0, offset, offset + master.numel()));
    // Released as soon as the master of its last range holds it (ranges come in order).
    if (offset + master.numel() == it->second.numel()) it->second = Tensor();
    masters_from_init_ = true;
    return true;
  };
  source.done = [&fp32_init] { NamedTensors().swap(fp32_init); };
  return source;
}

void ShardedOptimizer::install_norm_hooks() {
  // Norms of whole tensors: this rank's partial sums added up over the ranks.
  ShardGroup* group = group_;
  optimizer_.set_sumsq_hook([group](double local) {
    std::vector<double> v{local};
    group->sum(v);
    return v[0];
  });
  // LAMB: each piece's partial sums, added up per parameter over the ranks.
  const std::size_t params = model_parameters_.size();
  const std::vector<std::size_t>& index = pieces_.model_index;
  optimizer_.optimizer().set_tensor_sumsq_hook([group, params, &index](std::vector<double>& sums) {
    std::vector<double> whole(2 * params, 0.0);
    for (std::size_t i = 0; i < index.size(); ++i) {
      whole[2 * index[i]] += sums[2 * i];
      whole[2 * index[i] + 1] += sums[2 * i + 1];
    }
    group->sum(whole);
    for (std::size_t i = 0; i < index.size(); ++i) {
      sums[2 * i] = whole[2 * index[i]];
      sums[2 * i + 1] = whole[2 * index[i] + 1];
    }
  });
}

StepResult ShardedOptimizer::step() {
  StepResult r = optimizer_.step();
  // Every rank updated its ranges: the whole weights reach every rank before the next forward.
  if (group_ != nullptr && !r.skipped) group_->gather_parameters();
  return r;
}

NamedTensors ShardedOptimizer::state() {
  NamedTensors out;
  for (auto& [name, tensor] : optimizer_.state()) out.emplace_back(name, *tensor);
  return out;
}

std::map<std::string, std::string> ShardedOptimizer::shard_metadata() const {
  std::map<std::string, std::string> m;
  if (group_ == nullptr) return m;
  m["zero_world_size"] = std::to_string(group_->size());
  m["zero_rank"] = std::to_string(group_->rank());
  for (const auto& piece : pieces_.parameters) {
    const auto [offset, numel] = range_.at(piece->name);
    m["piece:" + piece->name] = std::to_string(offset) + " " + std::to_string(numel);
  }
  return m;
}

void ShardedOptimizer::load_state(const std::vector<const SafetensorsFile*>& files,
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
  for (auto& [name, tensor] : optimizer_.state()) {
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
    auto whole_it = full_numel_.find(parameter);
    KILN_CHECK(whole_it != full_numel_.end(), "optimizer state of unknown " + parameter);
    const std::int64_t whole = whole_it->second;
    const auto [offset, numel] = range_.at(parameter);
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
  optimizer_.refresh_model_weights();
  if (group_ != nullptr) group_->gather_parameters();
}

std::vector<Parameter*> ShardedOptimizer::updated_parameters() {
  return group_ != nullptr ? piece_list() : model_parameters_;
}

}  // namespace kiln::optim
