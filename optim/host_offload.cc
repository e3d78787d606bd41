#include "optim/host_offload.h"

#include "core/allocator.h"

namespace kiln::optim {
namespace {

std::size_t aligned(std::size_t bytes) {
  constexpr std::size_t kAlign = 256;
  return (bytes + kAlign - 1) / kAlign * kAlign;
}

// One block for the twins of tensors on `device`: pinned for a GPU, so that the copies run at the
// bus's speed and the upward ones stay asynchronous.
std::shared_ptr<void> twin_block(std::size_t bytes, Device device) {
  CachingAllocator& allocator = device.is_cuda() ? pinned_allocator() : host_allocator();
  void* block = bytes > 0 ? allocator.allocate(bytes) : nullptr;
  return std::shared_ptr<void>(block, [&allocator](void* b) {
    if (b != nullptr) allocator.free(b);
  });
}

// The device tensor `range` of a parameter's weights: its own (ZeRO-3's shard) or a slice.
Tensor device_value(const ParameterRange& range) {
  if (range.value.defined()) return range.value;
  Tensor& whole = range.parameter->value;
  return whole.view({whole.numel()}).slice(0, range.offset, range.offset + range.numel);
}

}  // namespace

HostOffload::HostOffload(const std::vector<Parameter*>& parameters) : model_(parameters) {
  for (const Parameter* p : parameters) bytes_ += 2 * aligned(p->value.nbytes());
  const bool cuda = !parameters.empty() && parameters.front()->value.device().is_cuda();
  block_ = twin_block(bytes_, cuda ? Device::cuda() : Device::cpu());
  char* at = static_cast<char*>(block_.get());
  for (const Parameter* p : parameters) {
    auto twin = std::make_unique<Parameter>(*p);
    twin->value = Tensor::wrap(at, p->value.shape(), p->value.dtype(), Device::cpu());
    at += aligned(p->value.nbytes());
    twin->grad =
        Tensor::wrap(at, p->value.shape(), p->grad.defined() ? p->grad.dtype() : p->value.dtype(),
                     Device::cpu());
    at += aligned(p->value.nbytes());
    twin->grad.zero();
    twins_.push_back(std::move(twin));
  }
  weights_to_host();
}

HostOffload::~HostOffload() = default;

std::vector<Parameter*> HostOffload::parameters() {
  std::vector<Parameter*> out;
  out.reserve(twins_.size());
  for (const auto& t : twins_) out.push_back(t.get());
  return out;
}

void HostOffload::gradients_to_host() {
  for (std::size_t i = 0; i < model_.size(); ++i) twins_[i]->grad.copy_from(model_[i]->grad);
}

void HostOffload::weights_to_device() {
  for (std::size_t i = 0; i < model_.size(); ++i) model_[i]->value.copy_from(twins_[i]->value);
}

void HostOffload::weights_to_host() {
  for (std::size_t i = 0; i < model_.size(); ++i) twins_[i]->value.copy_from(model_[i]->value);
}

HostShardGroup::HostShardGroup(ShardGroup& device_group)
    : device_group_(device_group), device_ranges_(device_group.ranges()) {
  std::size_t bytes = 0;
  for (const ParameterRange& r : device_ranges_) {
    bytes += aligned(r.grad.nbytes()) + aligned(device_value(r).nbytes());
  }
  block_ = twin_block(bytes, device_group.device());
  char* at = static_cast<char*>(block_.get());
  for (const ParameterRange& r : device_ranges_) {
    ParameterRange twin = r;
    const Tensor value = device_value(r);
    twin.value = Tensor::wrap(at, value.shape(), value.dtype(), Device::cpu());
    at += aligned(value.nbytes());
    twin.grad = Tensor::wrap(at, r.grad.shape(), r.grad.dtype(), Device::cpu());
    at += aligned(r.grad.nbytes());
    twin.grad.zero();
    twins_.push_back(twin);
  }
  weights_to_host();
}

HostShardGroup::~HostShardGroup() = default;

void HostShardGroup::gather_parameters() {
  for (std::size_t i = 0; i < twins_.size(); ++i) {
    device_value(device_ranges_[i]).copy_from(twins_[i].value);
  }
  device_group_.gather_parameters();
}

void HostShardGroup::gradients_to_host() {
  for (std::size_t i = 0; i < twins_.size(); ++i) twins_[i].grad.copy_from(device_ranges_[i].grad);
}

void HostShardGroup::weights_to_host() {
  for (std::size_t i = 0; i < twins_.size(); ++i) {
    twins_[i].value.copy_from(device_value(device_ranges_[i]));
  }
}

}  // namespace kiln::optim
