#include "layers/rotary.h"

#include <cmath>
#include <string>

#include "core/cpu/element.h"
#include "core/dispatch.h"
#include "layers/cuda/rotary_cuda.h"

namespace kiln {

RotaryEmbedding::RotaryEmbedding(std::int64_t head_dim, std::int64_t max_positions,
                                 const RotaryOptions& o)
    : head_dim_(head_dim), max_positions_(max_positions) {
  KILN_CHECK(head_dim > 0 && head_dim % 2 == 0,
             "RotaryEmbedding: head_dim " + std::to_string(head_dim) + " must be even");
  KILN_CHECK(max_positions > 0, "RotaryEmbedding: max_positions must be positive");
  const std::int64_t half = head_dim / 2;
  const float pi = 3.14159265358979323846f;
  for (std::int64_t i = 0; i < half; ++i) {
    // transformers: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), in fp32.
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    float f = 1.0f / std::pow(static_cast<float>(o.theta), exponent);
    if (o.llama3_factor > 0) {  // transformers' _compute_llama3_parameters
      const float factor = static_cast<float>(o.llama3_factor);
      const float old_len = static_cast<float>(o.original_max_positions);
      const float low_wavelen = old_len / static_cast<float>(o.low_freq_factor);
      const float high_wavelen = old_len / static_cast<float>(o.high_freq_factor);
      // In torch's order of operations (2 pi / t is reciprocal(t) * 2 pi), so every frequency
      // equals transformers' to the bit.
      const float wavelen = (1.0f / f) * (2 * pi);
      float scaled = wavelen > low_wavelen ? f / factor : f;
      const float smooth = ((1.0f / wavelen) * old_len - static_cast<float>(o.low_freq_factor)) /
                           static_cast<float>(o.high_freq_factor - o.low_freq_factor);
      const float smoothed = (1 - smooth) * scaled / factor + smooth * scaled;
      if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) scaled = smoothed;
      f = scaled;
    }
    inv_freq_.push_back(f);
  }
}

const std::pair<Tensor, Tensor>& RotaryEmbedding::tables(Device device, DType dtype) const {
  const DType td = dtype == DType::F64 ? DType::F64 : DType::F32;
  auto key = std::make_pair(std::make_pair(static_cast<int>(device.kind), device.index),
                            static_cast<int>(td));
  auto it = tables_.find(key);
  if (it != tables_.end()) return it->second;
  const std::int64_t half = head_dim_ / 2;
  std::vector<double> c(static_cast<std::size_t>(max_positions_ * half)), s(c.size());
  for (std::int64_t p = 0; p < max_positions_; ++p)
    for (std::int64_t i = 0; i < half; ++i) {
      // The angle as transformers forms it: position (fp32) times inv_freq, in fp32.
      const float angle = static_cast<float>(p) * inv_freq_[static_cast<std::size_t>(i)];
      c[static_cast<std::size_t>(p * half + i)] = std::cos(static_cast<double>(angle));
      s[static_cast<std::size_t>(p * half + i)] = std::sin(static_cast<double>(angle));
    }
  Tensor cos = Tensor::from_vector(c, {max_positions_, half}).to(td).to(device);
  Tensor sin = Tensor::from_vector(s, {max_positions_, half}).to(td).to(device);
  return tables_.emplace(key, std::make_pair(cos, sin)).first->second;
}

namespace {

template <typename T, typename C>
void rotate_rows(T* x, std::int64_t rows, std::int64_t row_stride, const C* cos, const C* sin,
                 std::int64_t heads, std::int64_t d, std::int64_t tokens, std::int64_t first,
                 const std::int32_t* starts, bool inverse) {
  const std::int64_t half = d / 2;
  const C sign = inverse ? C(-1) : C(1);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t pos = starts != nullptr ? r % tokens - starts[r] : first + r % tokens;
    const C* cr = cos + pos * half;
    const C* sr = sin + pos * half;
    for (std::int64_t h = 0; h < heads; ++h) {
      T* v = x + r * row_stride + h * d;
      for (std::int64_t i = 0; i < half; ++i) {
        const C a = cpu::load(v[i]), b = cpu::load(v[i + half]);
        const C s = sign * sr[i];
        v[i] = cpu::store<T>(a * cr[i] - b * s);
        v[i + half] = cpu::store<T>(b * cr[i] + a * s);
      }
    }
  }
}

}  // namespace

void RotaryEmbedding::check_rows(const Tensor& x, std::int64_t heads, std::int64_t tokens) const {
  KILN_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.size(1) >= heads * head_dim_,
             "RotaryEmbedding: expected rows (N, >= " + std::to_string(heads * head_dim_) +
                 ") with contiguous columns, got " + x.str());
  KILN_CHECK(tokens > 0 && x.size(0) % tokens == 0,
             "RotaryEmbedding: " + std::to_string(x.size(0)) + " rows are not sequences of " +
                 std::to_string(tokens) + " tokens");
}

void RotaryEmbedding::apply(Tensor& x, std::int64_t heads, std::int64_t tokens,
                            std::int64_t first_position, bool inverse) const {
  check_rows(x, heads, tokens);
  if (first_position < 0 || first_position + tokens > max_positions_)
    throw InputError("RotaryEmbedding: positions [" + std::to_string(first_position) + ", " +
                     std::to_string(first_position + tokens) + ") exceed max_positions " +
                     std::to_string(max_positions_));
  const auto& [cos, sin] = tables(x.device(), x.dtype());
  if (x.device().is_cuda()) {
    DeviceGuard guard(x.device());
    cuda::rotary_apply(x, cos, sin, heads, head_dim_, tokens, first_position, Tensor(), inverse);
    return;
  }
  KILN_DISPATCH_FLOATING(x.dtype(), T, {
    using C = typename cpu::Compute<T>::type;
    rotate_rows<T, C>(x.data<T>(), x.size(0), x.stride(0), cos.data<C>(), sin.data<C>(), heads,
                      head_dim_, tokens, first_position, nullptr, inverse);
  });
}

void RotaryEmbedding::apply(Tensor& x, std::int64_t heads, std::int64_t tokens,
                            const Tensor& document_starts, bool inverse) const {
  check_rows(x, heads, tokens);
  KILN_CHECK(document_starts.dtype() == DType::I32 && document_starts.is_contiguous() &&
                 document_starts.numel() == x.size(0) && document_starts.device() == x.device(),
             "RotaryEmbedding: document starts " + document_starts.str() +
                 " must be contiguous I32 with one entry per row of " + x.str() + ", on " +
                 x.device().str());
  if (tokens > max_positions_)
    throw InputError("RotaryEmbedding: " + std::to_string(tokens) +
                     " tokens exceed max_positions " + std::to_string(max_positions_));
  const auto& [cos, sin] = tables(x.device(), x.dtype());
  if (x.device().is_cuda()) {
    DeviceGuard guard(x.device());
    cuda::rotary_apply(x, cos, sin, heads, head_dim_, tokens, 0, document_starts, inverse);
    return;
  }
  const std::int32_t* starts = document_starts.data<std::int32_t>();
  for (std::int64_t r = 0; r < x.size(0); ++r)
    if (starts[r] < 0 || starts[r] > r % tokens)
      throw InputError("RotaryEmbedding: document start " + std::to_string(starts[r]) +
                       " of token " + std::to_string(r % tokens) + " (row " +
                       std::to_string(r / tokens) + ") is not in [0, " +
                       std::to_string(r % tokens) + "]");
  KILN_DISPATCH_FLOATING(x.dtype(), T, {
    using C = typename cpu::Compute<T>::type;
    rotate_rows<T, C>(x.data<T>(), x.size(0), x.stride(0), cos.data<C>(), sin.data<C>(), heads,
                      head_dim_, tokens, 0, starts, inverse);
  });
}

}  // namespace kiln
