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

}  // namespace kiln
