#include "layers/weight_cast_cache.h"

namespace kiln {

const Tensor& WeightCastCache::get(const Tensor& value, DType dtype, std::uint64_t weights_version,
                                   bool channels_last) {
  if (value.dtype() == dtype && !channels_last) return value;
  if (!cast_.defined() || source_ != value.data() || version_ != weights_version ||
      dtype_ != dtype || channels_last_ != channels_last || cast_.device() != value.device()) {
    // A cast to another dtype always makes a new contiguous tensor.
    cast_ = (channels_last ? value.permute({0, 2, 3, 1}) : value).to(dtype).contiguous();
    source_ = value.data();
    version_ = weights_version;
    dtype_ = dtype;
    channels_last_ = channels_last;
  }
  return cast_;
}

const Tensor& WeightCastCache::get_padded_rows(const Tensor& value, DType dtype,
                                               std::uint64_t weights_version,
                                               std::int64_t padded_rows) {
  const std::int64_t rows = value.size(0);
  if (!cast_.defined() || source_ != value.data() || version_ != weights_version ||
      dtype_ != dtype || channels_last_ || cast_.device() != value.device() ||
      cast_.size(0) != padded_rows) {
    if (!cast_.defined() || cast_.size(0) != padded_rows || cast_.dtype() != dtype ||
        cast_.device() != value.device()) {
      cast_ = Tensor::zeros({padded_rows, value.size(1)}, dtype, value.device());
    }
    Tensor head = cast_.slice(0, 0, rows);
    head.copy_from(value);
    source_ = value.data();
    version_ = weights_version;
    dtype_ = dtype;
    channels_last_ = false;
  }
  return cast_;
}

Tensor stack_rows(const std::vector<const Tensor*>& parts, DType dtype) {
  KILN_CHECK(!parts.empty(), "stack_rows: no parts");
  std::int64_t rows = 0;
  const std::int64_t cols = parts[0]->size(1);
  for (const Tensor* p : parts) {
    KILN_CHECK(p->dim() == 2 && p->size(1) == cols && p->device() == parts[0]->device(),
               "stack_rows: " + p->str() + " does not stack under " + parts[0]->str());
    rows += p->size(0);
  }
  Tensor out = Tensor::empty({rows, cols}, dtype, parts[0]->device());
  std::int64_t lo = 0;
  for (const Tensor* p : parts) {
    Tensor block = out.slice(0, lo, lo + p->size(0));
    block.copy_from(*p);
    lo += p->size(0);
  }
  return out;
}

}  // namespace kiln
