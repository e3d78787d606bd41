#pragma once
// FP8 projections (precision.fp8, issue 37): the three GEMMs of a transformer block's projection
// (y = x W^T forward, dW += dz^T x and dx = dz W backward) with both operands cast to FP8 by
// per-tensor scales, fp32 accumulation and the output in the activation dtype. One component per
// projection, owned by the layer that runs it (Linear, GPT-2's attention, the llama family's
// attention and MLP), holds the scaling state of its three tensors (input and weight in E4M3, the
// output gradient in E5M2 or E4M3) in a Buffer: checkpointed, so resume is bit for bit.
//
// The casts update the state on the device (core/fp8.h's fp8_scaling_record in the cast's last
// block), so a step never reads it on the host and CUDA graphs replay it. Forward casts x (rows,
// and x^T kept for the weight gradient) and W and records their amax; backward casts W^T again
// with the scale forward used (the same tensor) and dz and dz^T with its own, which it records.
// cuBLASLt's FP8 GEMMs on sm_89/sm_90 take both operands with k contiguous, so each GEMM's
// operands are cast in that layout (the transposes come out of the cast kernel, not from a pass of
// their own).
//
// The CPU twin (CI): the same casts emulated bit for bit (the bytes decoded and divided by the
// scale), the same state updates, the GEMMs in f32.

#include <cstdint>
#include <vector>

#include "core/fp8.h"
#include "core/parameter.h"
#include "core/tensor.h"
#include "layers/layer.h"

namespace kiln {

struct Fp8Settings {
  bool enabled = false;
  Fp8ScalingOptions scaling;
  Fp8Format gradient_format = Fp8Format::E5M2;
};

// An FP8 GEMM operand: the bytes (the layout the GEMM asks for) and the device float its products
// are multiplied by (the inverse of the scale the bytes were cast with).
struct Fp8Operand {
  Tensor bytes;  // U8
  Fp8Format format = Fp8Format::E4M3;
  const float* scale_inverse = nullptr;
};

class Fp8Projection {
 public:
  enum Role { Input = 0, Weight = 1, Gradient = 2 };
  static constexpr int kRoles = 3;
  // The state buffer's shape for these settings: one 16-byte aligned row per role, the inverse of
  // the last cast's scale, that scale, the cast kernels' scratch (amax, blocks done), then
  // core/fp8.h's state (layers/cuda/fp8_projection_cuda.h).
  static Shape state_shape(const Fp8Settings& settings);
  // The initial state (scale 1, nothing recorded) written into `state` (the owner's buffer).
  Fp8Projection(Buffer& state, const Fp8Settings& settings);

  const Fp8Settings& settings() const { return settings_; }
  Fp8Format format(Role role) const {
    return role == Gradient ? settings_.gradient_format : Fp8Format::E4M3;
  }
  // Whether cuBLASLt's FP8 GEMMs take a projection of these sizes (every dimension a multiple of
  // 16); one that does not runs in the GEMM dtype.
  static bool applies(std::int64_t rows, std::int64_t in, std::int64_t out);

  // Whether this forward (and so its backward) runs in FP8: training, with sizes cuBLASLt's FP8
  // GEMMs take (evaluation and generation run in the GEMM dtype: the weights are not FP8).
  bool begin_forward(const Context& ctx, std::int64_t rows, std::int64_t in, std::int64_t out) {
    active_ = ctx.training && applies(rows, in, out);
    return active_;
  }
  bool active() const { return active_; }

  // CUDA: `x` (R, C), contiguous, F32/F16/BF16, cast with `role`'s scale into the rows layout
  // (R, C) and/or the transposed one (C, R). `record`: the amax measured updates the state (a
  // fresh tensor); otherwise the last cast's scale is used again and nothing is recorded (the
  // backward's second look at forward's operands, a recomputation).
  Fp8Operand cast(Role role, const Tensor& x, bool transposed, bool record);
  // Both layouts of the output gradient dz (M, out): rows (for dx) and transposed (for dW).
  void cast_gradient(const Tensor& dz, Fp8Operand& rows, Fp8Operand& transposed);
  // The forward's input x (M, in) for its GEMM: rows; the transposed layout that the weight
  // gradient needs is made by the same pass and kept until input_transposed() is asked for it.
  Fp8Operand cast_input(const Tensor& x, bool record);
  // x^T as cast_input kept it (then forgotten), or cast again at its scale.
  Fp8Operand input_transposed(const Tensor& x);
  void release_saved() { input_t_ = Fp8Operand(); }  // with the owner's saved activations

  // CPU twin: the values the GEMM sees, fp8(x * scale) / scale in x's dtype (F32 or F64), the
  // state updated as cast() does.
  Tensor emulate(Role role, const Tensor& x, bool record);

 private:
  float* slot(Role role);  // the role's state row (on the buffer's device)
  // The cast behind cast(), cast_input() and cast_gradient(): into either layout or both.
  void cast_into(Role role, const Tensor& x, bool record, Fp8Operand* rows, Fp8Operand* transposed);
  Buffer* state_;
  Fp8Settings settings_;
  bool primed_[kRoles] = {false, false, false};  // a cast was recorded by this process
  bool active_ = false;
  Fp8Operand input_t_;  // see cast_input
};

// The FP8 projections' scaling states among `buffers` (those named "...fp8_*scaling", of
// Fp8Projection::state_shape), in the given order.
std::vector<Buffer*> fp8_scaling_buffers(const std::vector<Buffer*>& buffers);
// The overflows (casts whose amax was infinite or NaN) counted so far by the FP8 scaling states
// among `buffers`; reads them on the host.
double fp8_overflows(const std::vector<Buffer*>& buffers);
// rows (3 x projections, row length) F32: scaling states one after another (roles input, weight,
// gradient), each row's next scale taken again from its amax history (Delayed scaling after the
// histories of the data-parallel ranks were merged). On the rows' device.
void fp8_scales_from_history(Tensor& rows, const Fp8Settings& settings);

// A projection without bias or activation, in FP8 where `fp8` is set and begin_forward says so,
// else in the GEMM dtype (ops::gemm). x (M, in) and w (out, in) in the GEMM dtype.
// Forward: y (M, out) = x W^T, written.
void project_forward(Fp8Projection* fp8, const Context& ctx, const Tensor& x, const Tensor& w,
                     Tensor& y);
// Backward (after that forward): dw (out, in) += dz^T x (accumulated, in fp32 before its one
// rounding) and dx (M, in) = dz W (written), each where defined.
void project_backward(Fp8Projection* fp8, const Tensor& x, const Tensor& w, const Tensor& dz,
                      Tensor& dw, Tensor& dx);

}  // namespace kiln
