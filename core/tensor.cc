#include "core/tensor.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <sstream>

#include "core/allocator.h"
#include "core/backend.h"
#include "core/stream.h"

namespace kiln {
namespace {

std::int64_t wrap_dim(std::int64_t d, std::int64_t dims, const char* what) {
  std::int64_t w = d < 0 ? d + dims : d;
  KILN_CHECK(w >= 0 && w < std::max<std::int64_t>(dims, 1),
             std::string(what) + ": dimension " + std::to_string(d) + " out of range for " +
                 std::to_string(dims) + " dimensions");
  return w;
}

[[noreturn]] void no_cuda() {
  throw Error("a CUDA tensor was used, but this Kiln was built without CUDA (-DKILN_CUDA=OFF)");
}

}  // namespace

std::string shape_str(const Shape& shape) {
  std::ostringstream os;
  os << "(";
  for (std::size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ")";
  return os.str();
}

std::int64_t shape_numel(const Shape& shape) {
  return std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  std::int64_t s = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= std::max<std::int64_t>(shape[i], 1);
  }
  return strides;
}

Storage::Storage(std::size_t bytes, Device device, void* stream)
    : bytes_(bytes), device_(device), owner_(&allocator_for(device)) {
  data_ = owner_->allocate(bytes, stream);
}

Storage::Storage(std::size_t bytes, Device device, CachingAllocator& from)
    : bytes_(bytes), device_(device), owner_(&from) {
  data_ = owner_->allocate(bytes);
}

Storage::Storage(void* external, std::size_t bytes, Device device)
    : data_(external), bytes_(bytes), device_(device) {}

Storage::~Storage() {
  if (owner_ != nullptr) owner_->free(data_);
}

template <typename MakeStorage>
Tensor Tensor::allocated(const Shape& shape, DType dtype, MakeStorage make_storage) {
  for (std::int64_t s : shape) {
    KILN_CHECK(s >= 0, "negative size in shape " + shape_str(shape));
  }
  Tensor t;
  t.storage_ = make_storage(std::max<std::size_t>(shape_numel(shape) * dtype_size(dtype), 1));
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  return allocated(shape, dtype, [&](std::size_t bytes) {
    return std::make_shared<Storage>(bytes, device, current_stream(device));
  });
}

Tensor Tensor::zeros_in_host_memory(const Shape& shape, DType dtype, Device device) {
  Tensor t = allocated(shape, dtype, [&](std::size_t bytes) {
    return std::make_shared<Storage>(bytes, device,
                                     device.is_cuda() ? pinned_allocator() : host_allocator());
  });
  t.fill(0.0);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill(value);
  return t;
}

Tensor Tensor::wrap(void* data, const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.storage_ = std::make_shared<Storage>(data, shape_numel(shape) * dtype_size(dtype), device);
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::scalar(double value, DType dtype, Device device) {
  return full({}, value, dtype, device);
}

std::int64_t Tensor::size(std::int64_t d) const {
  return shape_[wrap_dim(d, dim(), "size")];
}
std::int64_t Tensor::stride(std::int64_t d) const {
  return strides_[wrap_dim(d, dim(), "stride")];
}

bool Tensor::is_contiguous() const {
  std::int64_t expected = 1;
  for (std::size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] == 1) continue;
    if (strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

std::string Tensor::str() const {
  if (!defined()) return "undefined tensor";
  return std::string(dtype_name(dtype_)) + " " + shape_str(shape_) + " " + device().str();
}

void* Tensor::data() const {
  KILN_CHECK(defined(), "data() of an undefined tensor");
  return static_cast<char*>(storage_->data()) + offset_ * dtype_size(dtype_);
}

namespace {

// `shape` with its one -1 (if any) inferred, checked to hold `numel` elements.
Shape resolve_shape(const Shape& shape, std::int64_t numel, const std::string& of) {
  Shape resolved = shape;
  std::int64_t known = 1, infer = -1;
  for (std::size_t i = 0; i < resolved.size(); ++i) {
    if (resolved[i] == -1) {
      KILN_CHECK(infer < 0, "view: more than one -1 in " + shape_str(shape));
      infer = static_cast<std::int64_t>(i);
    } else {
      known *= resolved[i];
    }
  }
  if (infer >= 0) {
    KILN_CHECK(known > 0 && numel % known == 0,
               "view: cannot infer -1 in " + shape_str(shape) + " for " + of);
    resolved[infer] = numel / known;
  }
  KILN_CHECK(shape_numel(resolved) == numel,
             "view: shape " + shape_str(shape) + " does not match " + of);
  return resolved;
}

}  // namespace

Tensor Tensor::view(const Shape& shape) const {
  KILN_CHECK(is_contiguous(), "view of a non-contiguous tensor " + str() + "; use reshape()");
  Tensor t = *this;
  t.shape_ = resolve_shape(shape, numel(), str());
  t.strides_ = contiguous_strides(t.shape_);
  return t;
}

namespace {

// The strides under which `shape` views memory laid out as (old_shape, old_strides), or false
// when it cannot without a copy: PyTorch's computeStride. Each run of dimensions that are
// contiguous among themselves must be split or merged whole.
bool view_strides(const Shape& old_shape, const Shape& old_strides, const Shape& shape,
                  Shape* strides) {
  strides->assign(shape.size(), 1);
  if (old_shape.empty()) return true;
  std::int64_t view_d = static_cast<std::int64_t>(shape.size()) - 1;
  std::int64_t chunk_stride = old_strides.back(), tensor_numel = 1, view_numel = 1;
  for (std::int64_t d = static_cast<std::int64_t>(old_shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= old_shape[d];
    const bool chunk_ends =
        d == 0 || (old_shape[d - 1] != 1 && old_strides[d - 1] != tensor_numel * chunk_stride);
    if (!chunk_ends) continue;
    while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
      (*strides)[view_d] = view_numel * chunk_stride;
      view_numel *= shape[view_d];
      --view_d;
    }
    if (view_numel != tensor_numel) return false;
    if (d > 0) {
      chunk_stride = old_strides[d - 1];
      tensor_numel = 1;
      view_numel = 1;
    }
  }
  return view_d == -1;
}

}  // namespace

Tensor Tensor::reshape(const Shape& shape) const {
  if (is_contiguous()) return view(shape);
  const Shape resolved = resolve_shape(shape, numel(), str());
  Shape strides;
  if (numel() > 0 && view_strides(shape_, strides_, resolved, &strides)) {
    Tensor t = *this;
    t.shape_ = resolved;
    t.strides_ = strides;
    return t;
  }
  return contiguous().view(shape);
}

Tensor Tensor::slice(std::int64_t d, std::int64_t start, std::int64_t end) const {
  d = wrap_dim(d, dim(), "slice");
  KILN_CHECK(start >= 0 && start <= end && end <= shape_[d],
             "slice [" + std::to_string(start) + ", " + std::to_string(end) + ") of dimension " +
                 std::to_string(d) + " of " + str());
  Tensor t = *this;
  t.offset_ += start * strides_[d];
  t.shape_[d] = end - start;
  return t;
}

Tensor Tensor::select(std::int64_t d, std::int64_t index) const {
  d = wrap_dim(d, dim(), "select");
  KILN_CHECK(index >= 0 && index < shape_[d], "select index out of range for " + str());
  Tensor t = *this;
  t.offset_ += index * strides_[d];
  t.shape_.erase(t.shape_.begin() + d);
  t.strides_.erase(t.strides_.begin() + d);
  return t;
}

Tensor Tensor::transpose(std::int64_t d0, std::int64_t d1) const {
  d0 = wrap_dim(d0, dim(), "transpose");
  d1 = wrap_dim(d1, dim(), "transpose");
  Tensor t = *this;
  std::swap(t.shape_[d0], t.shape_[d1]);
  std::swap(t.strides_[d0], t.strides_[d1]);
  return t;
}

Tensor Tensor::permute(const std::vector<std::int64_t>& order) const {
  KILN_CHECK(static_cast<std::int64_t>(order.size()) == dim(), "permute: wrong number of dims");
  Tensor t = *this;
  std::vector<bool> seen(order.size(), false);
  for (std::size_t i = 0; i < order.size(); ++i) {
    std::int64_t d = wrap_dim(order[i], dim(), "permute");
    KILN_CHECK(!seen[d], "permute: repeated dimension");
    seen[d] = true;
    t.shape_[i] = shape_[d];
    t.strides_[i] = strides_[d];
  }
  return t;
}

Tensor Tensor::unsqueeze(std::int64_t d) const {
  std::int64_t w = d < 0 ? d + dim() + 1 : d;
  KILN_CHECK(w >= 0 && w <= dim(), "unsqueeze: dimension out of range");
  Tensor t = *this;
  std::int64_t stride = w < dim() ? strides_[w] * shape_[w] : 1;
  t.shape_.insert(t.shape_.begin() + w, 1);
  t.strides_.insert(t.strides_.begin() + w, stride);
  return t;
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device());
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(Device d) const {
  return to(d, dtype_);
}
Tensor Tensor::to(DType t) const {
  return to(device(), t);
}

Tensor Tensor::to(Device d, DType t) const {
  if (d == device() && t == dtype_) return *this;
  Tensor out = empty(shape_, t, d);
  out.copy_from(*this);
  return out;
}

void Tensor::copy_from(const Tensor& src) {
  KILN_CHECK(defined() && src.defined(), "copy_from with an undefined tensor");
  KILN_CHECK(src.shape_ == shape_,
             "copy_from: shape " + shape_str(src.shape_) + " into " + shape_str(shape_));
  Device from = src.device(), to_device = device();
  if (from.is_cpu() && to_device.is_cpu()) {
    cpu::copy(src, *this);
    return;
  }
  if (!cuda_built()) no_cuda();
  if (from == to_device) {
    DeviceGuard guard(to_device);
    cuda::copy(src, *this);
    return;
  }
  // Across devices: move contiguous bytes in the source's dtype, then cast and restride on the
  // destination device.
  Tensor source = src.contiguous();
  Tensor staging =
      (is_contiguous() && dtype_ == src.dtype_) ? *this : empty(shape_, src.dtype_, to_device);
  {
    DeviceGuard guard(to_device.is_cuda() ? to_device : from);
    cuda::memcpy_async(staging.data(), to_device, source.data(), from, source.nbytes());
  }
  if (staging.data() != data()) copy_from(staging);
}

void Tensor::fill(double value) {
  if (!is_contiguous()) {
    Tensor tmp = full(shape_, value, dtype_, device());
    copy_from(tmp);
    return;
  }
  if (device().is_cpu()) {
    cpu::fill(*this, value);
  } else {
    if (!cuda_built()) no_cuda();
    DeviceGuard guard(device());
    cuda::fill(*this, value);
  }
}

double Tensor::item() const {
  KILN_CHECK(numel() == 1, "item() of a tensor with " + std::to_string(numel()) + " elements");
  return to_vector<double>()[0];
}

}  // namespace kiln
