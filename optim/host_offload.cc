#include "optim/host_offload.h"

#include "core/allocator.h"

namespace kiln::optim {
namespace {

std::size_t aligned(std::size_t bytes) {
  constexpr std::size_t kAlign = 256;
  return (bytes + kAlign - 1) / kAlign * kAlign;
}

}  // namespace

HostOffload::HostOffload(const std::vector<Parameter*>& parameters) : model_(parameters) {
  for (const Parameter* p : parameters) bytes_ += 2 * aligned(p->value.nbytes());
  const bool cuda = !parameters.empty() && parameters.front()->value.device().is_cuda();
  // Pinned so that the copies run at the bus's speed and the upward ones stay asynchronous.
  CachingAllocator& allocator = cuda ? pinned_allocator() : host_allocator();
  void* block = bytes_ > 0 ? allocator.allocate(bytes_) : nullptr;
  block_ = std::shared_ptr<void>(block, [&allocator](void* b) {
    if (b != nullptr) allocator.free(b);
  });
  char* at = static_cast<char*>(block);
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

}  // namespace kiln::optim
