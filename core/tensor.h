#pragma once
// Tensor: a strided view of typed memory on one device. Copying a Tensor shares the storage
// (like torch.Tensor); clone() copies the data. Strides and offsets count elements.

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/device.h"
#include "core/dtype.h"

namespace kiln {

using Shape = std::vector<std::int64_t>;

std::string shape_str(const Shape& shape);  // "(2, 3, 4)"
std::int64_t shape_numel(const Shape& shape);
Shape contiguous_strides(const Shape& shape);

class CachingAllocator;

// Memory a tensor views. Owning storage returns its bytes to the caching allocator it came from.
class Storage {
 public:
  Storage(std::size_t bytes, Device device, void* stream);  // allocates from device's allocator
  // Allocates from `from` memory that `device` addresses directly (pinned host memory for a GPU).
  Storage(std::size_t bytes, Device device, CachingAllocator& from);
  Storage(void* external, std::size_t bytes, Device device);  // wraps, does not own
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  Device device_;
  CachingAllocator* owner_ = nullptr;  // null: wrapped, not owned
};

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() is false

  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu());
  // Zeros in pinned host memory that `device` reads and writes in place (CUDA's unified
  // addressing: kernels reach it over the bus, no copy); on the CPU, host memory.
  static Tensor zeros_in_host_memory(const Shape& shape, DType dtype, Device device);
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype, Device device = Device::cpu());
  // Views memory owned by someone else (a flat gradient bucket, a mapped file).
  static Tensor wrap(void* data, const Shape& shape, DType dtype, Device device);
  // A CPU tensor holding a copy of `values`.
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape);
  static Tensor scalar(double value, DType dtype = DType::F32, Device device = Device::cpu());

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  std::int64_t dim() const { return static_cast<std::int64_t>(shape_.size()); }
  std::int64_t size(std::int64_t d) const;  // negative d counts from the end
  std::int64_t stride(std::int64_t d) const;
  std::int64_t numel() const { return shape_numel(shape_); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::cpu(); }
  std::int64_t offset() const { return offset_; }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  std::string str() const;  // "f32 (2, 3) cuda:0"

  void* data() const;
  template <typename T>
  T* data() const {
    KILN_CHECK(DTypeOf<T>::value == dtype_, std::string("tensor holds ") + dtype_name(dtype_) +
                                                ", asked as " + dtype_name(DTypeOf<T>::value));
    return static_cast<T*>(data());
  }

  // Views (share storage).
  Tensor view(const Shape& shape) const;  // contiguous tensors only; one -1 allowed
  // A view when the strides allow (contiguous, or merging/splitting dimensions that are laid out
  // contiguously among themselves, as PyTorch's), else a contiguous copy.
  Tensor reshape(const Shape& shape) const;
  Tensor flatten() const { return reshape({-1}); }
  Tensor slice(std::int64_t dim, std::int64_t start, std::int64_t end) const;
  Tensor select(std::int64_t dim, std::int64_t index) const;  // drops `dim`
  Tensor transpose(std::int64_t d0, std::int64_t d1) const;
  Tensor permute(const std::vector<std::int64_t>& order) const;
  Tensor unsqueeze(std::int64_t dim) const;

  // Copies.
  Tensor contiguous() const;  // self if already contiguous
  Tensor clone() const;
  Tensor to(Device device) const;  // self if already there
  Tensor to(DType dtype) const;    // self if already that type
  Tensor to(Device device, DType dtype) const;
  // Copies `src` (any device, dtype, strides; same shape) into this tensor, casting as needed.
  void copy_from(const Tensor& src);
  void fill(double value);
  void zero() { fill(0.0); }

  // Host copies of the values, converted to T.
  template <typename T>
  std::vector<T> to_vector() const;
  double item() const;  // a one-element tensor's value

 private:
  // A contiguous tensor over the storage make_storage(bytes) returns.
  template <typename MakeStorage>
  static Tensor allocated(const Shape& shape, DType dtype, MakeStorage make_storage);

  std::shared_ptr<Storage> storage_;
  std::int64_t offset_ = 0;
  Shape shape_;
  Shape strides_;
  DType dtype_ = DType::F32;
};

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape) {
  KILN_CHECK(
      static_cast<std::int64_t>(values.size()) == shape_numel(shape),
      "from_vector: " + std::to_string(values.size()) + " values for shape " + shape_str(shape));
  Tensor t = empty(shape, DTypeOf<T>::value, Device::cpu());
  std::memcpy(t.data(), values.data(), values.size() * sizeof(T));
  return t;
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  Tensor host = to(Device::cpu(), DTypeOf<T>::value).contiguous();
  const T* p = host.data<T>();
  return std::vector<T>(p, p + host.numel());
}

}  // namespace kiln
