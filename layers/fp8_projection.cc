#include "layers/fp8_projection.h"

#include <cmath>
#include <string>
#include <utility>

#include "core/check.h"
#include "core/gemm_tally.h"
#include "core/ops.h"
#include "layers/cuda/fp8_projection_cuda.h"
#include "layers/cuda/linear_cuda.h"

namespace kiln {
namespace {

// A role's row: core/fp8.h's state, then these.
// Rows of whole 16-byte units (layers/cuda/fp8_projection_cuda.h's layout).
int row_length(const Fp8Settings& s) {
  return (kFp8RowState + kFp8StateHeader + s.scaling.history + 3) / 4 * 4;
}

template <typename C>
void emulate_cast(const C* x, std::int64_t n, float scale, Fp8Format format, C* out, float& amax) {
  amax = 0.0f;
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(x[i]);
    const float a = std::fabs(v);
    if (!std::isnan(amax) && !(a <= amax)) amax = a;  // NaN ranks above all, as on CUDA
    out[i] = static_cast<C>(fp8_decode(fp8_encode(v * scale, format), format) / scale);
  }
}

}  // namespace

Shape Fp8Projection::state_shape(const Fp8Settings& settings) {
  return {kRoles, row_length(settings)};
}

Fp8Projection::Fp8Projection(Buffer& state, const Fp8Settings& settings)
    : state_(&state), settings_(settings) {
  KILN_CHECK(settings.scaling.history >= 1, "precision.fp8.amax_history must be at least 1");
  KILN_CHECK(state.value.shape() == state_shape(settings) && state.value.device().is_cpu(),
             "FP8 projection: state buffer " + state.value.str());
  float* p = state.value.data<float>();
  for (int role = 0; role < kRoles; ++role) {
    float* row = p + role * row_length(settings);
    row[kFp8RowState] = 1.0f;    // the scale of the next cast
    row[kFp8RowScale] = 1.0f;    // the last cast's scale
    row[kFp8RowInverse] = 1.0f;  // and its inverse
  }
}

bool Fp8Projection::applies(std::int64_t rows, std::int64_t in, std::int64_t out) {
  return rows > 0 && rows % 16 == 0 && in % 16 == 0 && out % 16 == 0;
}

float* Fp8Projection::slot(Role role) {
  return state_->value.data<float>() + role * row_length(settings_);
}

void Fp8Projection::cast_into(Role role, const Tensor& x, bool record, Fp8Operand* rows,
                              Fp8Operand* transposed) {
  KILN_CHECK(x.dim() == 2 && x.is_contiguous() && x.device() == state_->value.device(),
             "FP8 projection: cast of " + x.str());
  float* row = slot(role);
  const Fp8Format f = format(role);
  if (record && (settings_.scaling.recipe == Fp8Recipe::Current || !primed_[role])) {
    cuda::fp8_projection_amax(x, row, settings_.scaling, f,
                              settings_.scaling.recipe == Fp8Recipe::Delayed);
  }
  for (Fp8Operand* op : {rows, transposed}) {
    if (op == nullptr) continue;
    op->format = f;
    op->scale_inverse = row + kFp8RowInverse;
    op->bytes =
        Tensor::empty(op == rows ? x.shape() : Shape{x.size(1), x.size(0)}, DType::U8, x.device());
  }
  cuda::fp8_projection_cast(x, row, settings_.scaling, f, record, rows ? &rows->bytes : nullptr,
                            transposed ? &transposed->bytes : nullptr);
  if (record) primed_[role] = true;
}

Fp8Operand Fp8Projection::cast(Role role, const Tensor& x, bool transposed, bool record) {
  Fp8Operand op;
  cast_into(role, x, record, transposed ? nullptr : &op, transposed ? &op : nullptr);
  return op;
}

Fp8Operand Fp8Projection::cast_input(const Tensor& x, bool record) {
  Fp8Operand rows;
  cast_into(Input, x, record, &rows, &input_t_);
  return rows;
}

Fp8Operand Fp8Projection::input_transposed(const Tensor& x) {
  Fp8Operand out;
  std::swap(out, input_t_);
  if (!out.bytes.defined()) out = cast(Input, x, /*transposed=*/true, /*record=*/false);
  return out;
}

void Fp8Projection::cast_gradient(const Tensor& dz, Fp8Operand& rows, Fp8Operand& transposed) {
  cast_into(Gradient, dz, /*record=*/true, &rows, &transposed);
}

Tensor Fp8Projection::emulate(Role role, const Tensor& x, bool record) {
  KILN_CHECK(x.device().is_cpu() && state_->value.device().is_cpu() &&
                 (x.dtype() == DType::F32 || x.dtype() == DType::F64),
             "FP8 projection: the CPU twin takes f32 or f64 host tensors, got " + x.str());
  Tensor xc = x.contiguous();
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  float* row = slot(role);
  const Fp8Format f = format(role);
  float* state = row + kFp8RowState;
  float amax = 0.0f;
  auto run = [&](float scale) {
    if (x.dtype() == DType::F64)
      emulate_cast(xc.data<double>(), x.numel(), scale, f, out.data<double>(), amax);
    else
      emulate_cast(xc.data<float>(), x.numel(), scale, f, out.data<float>(), amax);
  };
  if (!record) {
    run(row[kFp8RowScale]);
    return out;
  }
  const bool unrecorded = state[2] == 0.0f && state[kFp8StateHeader] == 0.0f;
  if (settings_.scaling.recipe == Fp8Recipe::Current || unrecorded) {
    run(1.0f);  // the pass before the cast: its amax
    state[0] = fp8_scale_for(amax, f, settings_.scaling.margin, state[0]);
  }
  const float scale = state[0];
  run(scale);
  row[kFp8RowScale] = scale;
  row[kFp8RowInverse] = 1.0f / scale;
  fp8_scaling_record(state, settings_.scaling, f, amax);
  return out;
}

std::vector<Buffer*> fp8_scaling_buffers(const std::vector<Buffer*>& buffers) {
  std::vector<Buffer*> out;
  for (Buffer* b : buffers) {
    const std::string local = b->name.substr(b->name.rfind('.') + 1);
    const std::string suffix = "scaling";
    if (local.rfind("fp8_", 0) != 0 || local.size() < suffix.size() ||
        local.compare(local.size() - suffix.size(), suffix.size(), suffix) != 0 ||
        b->value.dim() != 2 || b->value.size(0) != Fp8Projection::kRoles)
      continue;
    out.push_back(b);
  }
  return out;
}

void fp8_scales_from_history(Tensor& rows, const Fp8Settings& settings) {
  KILN_CHECK(rows.dim() == 2 && rows.dtype() == DType::F32 && rows.is_contiguous() &&
                 rows.size(0) % Fp8Projection::kRoles == 0 &&
                 rows.size(1) > kFp8RowState + kFp8StateHeader + settings.scaling.history - 1,
             "fp8_scales_from_history: rows " + rows.str());
  if (rows.device().is_cuda()) {
    DeviceGuard guard(rows.device());
    return cuda::fp8_projection_scales_from_history(rows, settings.scaling,
                                                    settings.gradient_format);
  }
  float* p = rows.data<float>();
  for (std::int64_t i = 0; i < rows.size(0); ++i) {
    const Fp8Format format = i % Fp8Projection::kRoles == Fp8Projection::Gradient
                                 ? settings.gradient_format
                                 : Fp8Format::E4M3;
    fp8_scale_from_history(p + i * rows.size(1) + kFp8RowState, settings.scaling, format);
  }
}

double fp8_overflows(const std::vector<Buffer*>& buffers) {
  double total = 0;
  for (const Buffer* b : fp8_scaling_buffers(buffers)) {
    const std::vector<float> state = b->value.to(Device::cpu()).to_vector<float>();
    const std::size_t row = static_cast<std::size_t>(b->value.size(1));
    for (std::size_t role = 0; role < Fp8Projection::kRoles; ++role)
      total += state[role * row + kFp8RowState + 1];
  }
  return total;
}

namespace {

// The CPU twin's operands: halves (CPU O1) emulated in f32.
Tensor emulated(Fp8Projection& fp8, Fp8Projection::Role role, const Tensor& x, bool record) {
  return fp8.emulate(role, x.dtype() == DType::F64 ? x : x.to(DType::F32), record);
}

}  // namespace

void project_forward(Fp8Projection* fp8, const Context& ctx, const Tensor& x, const Tensor& w,
                     Tensor& y) {
  if (fp8 == nullptr || !fp8->begin_forward(ctx, x.size(0), x.size(1), w.size(0))) {
    ops::gemm(false, true, 1.0, x, w, 0.0, y);
    return;
  }
  if (x.device().is_cuda()) {
    DeviceGuard guard(x.device());
    const cuda::Fp8Forward operands = cuda::fp8_forward_operands(*fp8, x, w, ctx.recomputing);
    Tensor saved;
    std::int64_t saved_ld = 0;
    cuda::linear_forward(x, w, Tensor(), Activation::None, y, saved, saved_ld, Tensor(), &operands);
    return;
  }
  const bool record = !ctx.recomputing;
  Fp8GemmScope fp8_gemm;  // the product of the emulated casts counts as FP8 (core/gemm_tally.h)
  Tensor wq = emulated(*fp8, Fp8Projection::Weight, w, record);
  Tensor xq = emulated(*fp8, Fp8Projection::Input, x, record);
  Tensor out = Tensor::empty(y.shape(), xq.dtype());
  ops::gemm(false, true, 1.0, xq, wq, 0.0, out);
  y.copy_from(out);
}

void project_backward(Fp8Projection* fp8, const Tensor& x, const Tensor& w, const Tensor& dz,
                      Tensor& dw, Tensor& dx) {
  if (fp8 == nullptr || !fp8->active()) {
    if (dw.defined()) ops::gemm_accumulate(true, false, dz, x, dw);
    if (dx.defined()) ops::gemm(false, false, 1.0, dz, w, 0.0, dx);
    return;
  }
  if (x.device().is_cuda()) {
    DeviceGuard guard(x.device());
    cuda::linear_backward(x, w, dz, Activation::None, Tensor(), 0, dw, nullptr, dx, nullptr, fp8);
    return;
  }
  Fp8GemmScope fp8_gemms;
  Tensor dzq = emulated(*fp8, Fp8Projection::Gradient, dz, true);
  Tensor xq = emulated(*fp8, Fp8Projection::Input, x, false);
  Tensor wq = emulated(*fp8, Fp8Projection::Weight, w, false);
  if (dw.defined()) ops::gemm_accumulate(true, false, dzq, xq, dw);
  if (dx.defined()) {
    Tensor g = Tensor::empty(dx.shape(), dzq.dtype());
    ops::gemm(false, false, 1.0, dzq, wq, 0.0, g);
    dx.copy_from(g);
  }
}

}  // namespace kiln
