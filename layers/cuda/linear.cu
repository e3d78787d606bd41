// Linear on CUDA: cuBLASLt GEMMs with fused epilogues (core/cuda/cublaslt_gemm.h), and the small
// kernels that stand in for an epilogue cuBLASLt does not offer for a dtype combination (or that
// no epilogue can do: the activation derivative of this layer's own output, which precedes both
// backward GEMMs).
//
// Row-major tensors are column-major transposes, so every GEMM below is written in cuBLASLt's
// column-major terms: y^T (out, M) = W (out, in) [row-major] ^T-view x^T.

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/cuda/cublaslt_gemm.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/element.cuh"
#include "core/ops.h"
#include "core/stream.h"
#include "layers/cuda/activations_cuda.h"
#include "layers/cuda/attention_cuda.h"
#include "layers/cuda/linear_cuda.h"

namespace kiln::cuda {
namespace {

std::int64_t round_up(std::int64_t v, std::int64_t multiple) {
  return (v + multiple - 1) / multiple * multiple;
}

// z (rows, cols; leading dim ldz) += bias; y (rows, cols) = act(z). y may alias z (act None).
template <typename T>
__global__ void bias_activation_kernel(T* z, std::int64_t ldz, const T* bias, Activation act, T* y,
                                       std::int64_t rows, std::int64_t cols) {
  using C = typename Compute<T>::type;
  std::int64_t n = rows * cols;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t r = i / cols, c = i % cols;
    C v = static_cast<C>(load(z[r * ldz + c]));
    if (bias) v += static_cast<C>(load(bias[c]));
    T stored = store<T>(v);
    z[r * ldz + c] = stored;
    // The activation reads z as stored, as the epilogue path's backward will.
    y[i] = store<T>(activation_apply<C>(act, static_cast<C>(load(stored))));
  }
}

// dz (rows, cols) = dy * act'(saved), saved with leading dim lds.
template <typename T, typename TO>
__global__ void activation_grad_kernel(const T* dy, const T* saved, std::int64_t lds,
                                       Activation act, TO* dz, std::int64_t rows,
                                       std::int64_t cols) {
  using C = typename Compute<T>::type;
  std::int64_t n = rows * cols;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t r = i / cols, c = i % cols;
    C s = static_cast<C>(load(saved[r * lds + c]));
    dz[i] = store<TO>(static_cast<C>(load(dy[i])) * activation_grad<C>(act, s));
  }
}

// grad (cols) += column sums of dz (rows, cols). A block owns 32 columns; its 8 row slices are
// summed in a fixed order, so the result is deterministic.
constexpr int kBiasColumns = 32, kBiasSlices = 8;
template <typename TD, typename TG>
__global__ void bias_grad_kernel(const TD* dz, std::int64_t rows, std::int64_t cols, TG* grad) {
  using C = typename Compute<TD>::type;
  __shared__ C partial[kBiasSlices][kBiasColumns];
  std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * kBiasColumns + threadIdx.x;
  C sum = 0;
  if (c < cols) {
    for (std::int64_t r = threadIdx.y; r < rows; r += kBiasSlices) {
      sum += static_cast<C>(load(dz[r * cols + c]));
    }
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    C total = 0;
    for (int s = 0; s < kBiasSlices; ++s) total += partial[s][threadIdx.x];
    grad[c] = store<TG>(static_cast<C>(load(grad[c])) + total);
  }
}

void launch_bias_activation(Tensor& z, std::int64_t ldz, const Tensor& bias, Activation act,
                            Tensor& y, std::int64_t rows, std::int64_t cols) {
  std::int64_t n = rows * cols;
  if (n == 0) return;
  auto stream = static_cast<cudaStream_t>(current_stream(z.device()));
  KILN_CUDA_DISPATCH_FLOATING(z.dtype(), T, {
    bias_activation_kernel<T><<<grid_for(n), 256, 0, stream>>>(
        static_cast<T*>(z.data()), ldz,
        bias.defined() ? static_cast<const T*>(bias.data()) : nullptr, act,
        static_cast<T*>(y.data()), rows, cols);
    KILN_CUDA_LAUNCH_CHECK();
  });
}

void launch_bias_grad(const Tensor& dz, Tensor& grad) {
  std::int64_t rows = dz.size(0), cols = dz.size(1);
  if (cols == 0) return;
  auto stream = static_cast<cudaStream_t>(current_stream(dz.device()));
  unsigned blocks = static_cast<unsigned>((cols + kBiasColumns - 1) / kBiasColumns);
  KILN_CUDA_DISPATCH_FLOATING(dz.dtype(), TD, {
    KILN_CUDA_DISPATCH_FLOATING(grad.dtype(), TG, {
      bias_grad_kernel<TD, TG><<<blocks, dim3(kBiasColumns, kBiasSlices), 0, stream>>>(
          static_cast<const TD*>(dz.data()), rows, cols, static_cast<TG*>(grad.data()));
      KILN_CUDA_LAUNCH_CHECK();
    });
  });
}

// The input activation's derivative in the dx GEMM's epilogue: cuBLASLt's DGELU is GELU's tanh
// form, read from a pre-activation of the GEMM's half dtype.
bool dgelu_epilogue_applies(const InputActivation* input, DType mm, const Tensor& dx) {
  if (input == nullptr || input->act != Activation::GELU || !is_half(mm) || dx.dtype() != mm ||
      input->saved.dtype() != mm || input->saved.size(0) != dx.size(0))
    return false;
  const char* off = std::getenv("KILN_DGELU_UNFUSED");
  return off == nullptr || std::strcmp(off, "0") == 0;
}

// The bias gradient from the column-sum kernels (transformer_ops::accumulate_bias_grad): on the
// H200 they beat the weight-gradient GEMM's BGRADB epilogue, which slows the GEMM more than
// their one read of dz costs (GPT-2 124M x16: 0.12 ms a step). KILN_BIAS_GRAD_EPILOGUE=1 asks for
// the epilogue.
bool bias_grad_epilogue() {
  const char* v = std::getenv("KILN_BIAS_GRAD_EPILOGUE");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

// A forward GEMM (y^T = W^T-view x^T) on FP8 operands: W's rows and x's rows, both with k = in
// contiguous, which is the TN layout cuBLASLt's FP8 GEMMs ask for. The forward accumulates in
// the tensor cores' fast mode, as Transformer Engine's does; the backward GEMMs do not.
void use_fp8(LtGemm& g, const Fp8Forward* fp8) {
  if (fp8 == nullptr) return;
  g.fp8 = true;
  g.fast_accumulation = true;
  g.a = fp8->weight.bytes.data();
  g.a_format = fp8->weight.format;
  g.a_scale = fp8->weight.scale_inverse;
  g.b = fp8->input.bytes.data();
  g.b_format = fp8->input.format;
  g.b_scale = fp8->input.scale_inverse;
}

}  // namespace

void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Activation act, Tensor& y,
                    Tensor& saved, std::int64_t& saved_ld, const Tensor& residual,
                    const Fp8Forward* fp8) {
  if (residual.defined()) {
    KILN_CHECK(
        residual.dtype() == y.dtype() && residual.numel() == y.numel() && residual.is_contiguous(),
        "Linear: residual " + residual.str() + " for output " + y.str());
    if (act == Activation::None) {
      LtGemm g;  // y^T (out, M) = W^T-view (out, in) x^T (in, M) + bias + residual^T
      g.trans_a = true;
      g.m = w.size(0);
      g.n = x.size(0);
      g.k = x.size(1);
      g.a = w.data();
      g.lda = g.k;
      g.b = x.data();
      g.ldb = g.k;
      g.ab_type = x.dtype();
      g.d = y.data();
      g.ldd = g.m;
      g.d_type = y.dtype();
      g.c = residual.data();
      g.beta = 1.0;
      g.bias = bias.defined() ? bias.data() : nullptr;
      g.epilogue = bias.defined() ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
      use_fp8(g, fp8);
      saved = Tensor();
      saved_ld = g.m;
      if (lt_matmul(g, x.device())) return;
    }
    linear_forward(x, w, bias, act, y, saved, saved_ld, Tensor(), fp8);
    ops::add(y, residual, y);
    return;
  }
  std::int64_t rows = x.size(0), in = x.size(1), out = w.size(0);  // x (M, in), w (out, in)
  Device device = x.device();
  saved = Tensor();
  saved_ld = out;
  LtGemm g;  // y^T (out, M) = W^T-view (out, in) x^T (in, M)
  g.trans_a = true;
  g.m = out;
  g.n = rows;
  g.k = in;
  g.a = w.data();
  g.lda = in;
  g.b = x.data();
  g.ldb = in;
  g.ab_type = x.dtype();
  g.d = y.data();
  g.ldd = out;
  g.d_type = y.dtype();
  g.bias = bias.defined() ? bias.data() : nullptr;
  use_fp8(g, fp8);
  bool has_bias = bias.defined();
  switch (act) {
    case Activation::None:
      g.epilogue = has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
      if (lt_matmul(g, device)) return;
      break;
    case Activation::ReLU:
      g.epilogue = has_bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
      if (lt_matmul(g, device)) {
        saved = y;  // y > 0 is ReLU's mask
        return;
      }
      break;
    case Activation::GELU: {
      // cuBLASLt's GELU is the tanh form; it writes the pre-activation z into aux for backward.
      // Its approximation is good for half outputs only: fp32 takes our kernel.
      if (!is_half(y.dtype())) break;
      std::int64_t ld = round_up(out, 8);
      Tensor aux = Tensor::empty({rows, ld}, y.dtype(), device);  // (M, ld)
      g.epilogue = has_bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
      g.aux = aux.data();
      g.aux_ld = ld;
      if (lt_matmul(g, device)) {
        saved = aux;
        saved_ld = ld;
        return;
      }
      g.aux = nullptr;
      g.aux_ld = 0;
      break;
    }
    case Activation::GELUErf: {
      // No erf-GELU epilogue: GEMM + bias into z, then our kernel.
      Tensor z = Tensor::empty({rows, out}, y.dtype(), device);  // (M, out)
      g.d = z.data();
      g.epilogue = has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
      if (lt_matmul(g, device)) {
        cuda::activation_forward(act, z, y);
        saved = z;
        return;
      }
      g.d = y.data();
      break;
    }
  }
  // Fallback: plain GEMM into z, then bias and activation in one kernel.
  g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  g.bias = nullptr;
  Tensor z = act == Activation::None ? y : Tensor::empty({rows, out}, y.dtype(), device);
  g.d = z.data();
  KILN_CHECK(lt_matmul(g, device), std::string("Linear: cuBLASLt has no GEMM for ") +
                                       dtype_name(x.dtype()) + " -> " + dtype_name(y.dtype()));
  if (has_bias || act != Activation::None) {
    Tensor b = bias.defined() && bias.dtype() != z.dtype() ? bias.to(z.dtype()) : bias;
    launch_bias_activation(z, out, b, act, y, rows, out);
  }
  if (act == Activation::ReLU) saved = y;
  if (act == Activation::GELU || act == Activation::GELUErf) saved = z;
}

namespace {

// weight.grad (out, in) += dz^T x by `gw` (column-major dW^T (in, out), its D to be set here), and
// bias.grad += column sums of dz when asked for.
void accumulate_weight_grad(LtGemm gw, const Tensor& dz, DType mm, Tensor& weight_grad,
                            Tensor* bias_grad) {
  const std::int64_t in = gw.m, out = gw.n;
  const Device device = dz.device();
  gw.ldd = in;
  gw.beta = 1.0;
  // Accumulating straight into the grad needs a contiguous grad of a type cuBLASLt can write.
  bool direct = weight_grad.is_contiguous() &&
                (weight_grad.dtype() == mm || (is_half(mm) && weight_grad.dtype() == DType::F32));
  Tensor wg =
      direct ? weight_grad : Tensor::zeros({out, in}, is_half(mm) ? DType::F32 : mm, device);
  gw.d = wg.data();
  gw.d_type = wg.dtype();
  bool bias_done = false, weight_done = false;
  if (bias_grad && !bias_grad_epilogue()) {
    accumulate_bias_grad(dz, *bias_grad);
    bias_done = true;
  }
  if (bias_grad && !bias_done) {
    // BGRADB writes (not accumulates) the column sums of dz: into a temporary, then added.
    Tensor db = Tensor::empty({out}, wg.dtype(), device);
    gw.epilogue = CUBLASLT_EPILOGUE_BGRADB;
    gw.bias = db.data();
    if (lt_matmul(gw, device)) {
      ops::axpy(1.0, db.dtype() == bias_grad->dtype() ? db : db.to(bias_grad->dtype()), *bias_grad);
      bias_done = weight_done = true;
    }
    gw.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    gw.bias = nullptr;
  }
  if (!weight_done) {
    KILN_CHECK(lt_matmul(gw, device),
               "Linear: cuBLASLt has no weight-gradient GEMM for " + std::string(dtype_name(mm)));
    if (bias_grad && !bias_done) launch_bias_grad(dz, *bias_grad);
  }
  if (!direct) ops::axpy(1.0, wg.to(weight_grad.dtype()), weight_grad);
}

// dx (M, in) by `gx` (column-major dx^T (in, M), its D to be set here), with the input
// activation's derivative in the epilogue where it applies: true when it was.
bool input_gradient(LtGemm gx, DType mm, Tensor& dx, const InputActivation* input_activation) {
  const Device device = dx.device();
  const std::int64_t rows = dx.size(0), in = dx.size(1);
  gx.d = dx.data();
  gx.ldd = in;
  gx.d_type = dx.dtype();
  if (dgelu_epilogue_applies(input_activation, mm, dx)) {
    gx.epilogue = CUBLASLT_EPILOGUE_DGELU;
    gx.aux = const_cast<void*>(input_activation->saved.data());
    gx.aux_ld = input_activation->saved_ld;
    if (lt_matmul(gx, device)) return true;
    gx.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    gx.aux = nullptr;
    gx.aux_ld = 0;
  }
  if (!lt_matmul(gx, device)) {
    // Half output from a different half input type (or similar): compute in fp32, then cast.
    Tensor dx32 = Tensor::empty({rows, in}, is_half(mm) ? DType::F32 : mm, device);
    gx.d = dx32.data();
    gx.d_type = dx32.dtype();
    KILN_CHECK(lt_matmul(gx, device),
               "Linear: cuBLASLt has no input-gradient GEMM for " + std::string(dtype_name(mm)));
    dx.copy_from(dx32);
  }
  return false;
}

// A TN GEMM of FP8 operands, both with k contiguous: column-major D (m, n) = a-rows^T b-rows.
LtGemm fp8_tn_gemm(std::int64_t m, std::int64_t n, std::int64_t k, const Fp8Operand& a,
                   const Fp8Operand& b) {
  LtGemm g;
  g.fp8 = true;
  g.trans_a = true;
  g.m = m;
  g.n = n;
  g.k = k;
  g.lda = g.ldb = k;
  g.a = a.bytes.data();
  g.a_format = a.format;
  g.a_scale = a.scale_inverse;
  g.b = b.bytes.data();
  g.b_format = b.format;
  g.b_scale = b.scale_inverse;
  return g;
}

// Backward's GEMMs on FP8 operands, both TN with k contiguous: dW^T (in, out) = x^T-rows (in, M)
// by dz^T-rows (out, M), and dx^T (in, M) = W^T-rows (in, out) by dz-rows (M, out). x and W are
// cast again with forward's scales; dz with its own (recorded).
bool fp8_backward(const Tensor& x, const Tensor& w, const Tensor& dz, Tensor& weight_grad,
                  Tensor* bias_grad, Tensor& dx, Fp8Projection& fp8) {
  const std::int64_t rows = x.size(0), in = x.size(1), out = w.size(0);
  Fp8Operand dz_rows, dz_t;
  fp8.cast_gradient(dz, dz_rows, dz_t);
  if (weight_grad.defined()) {
    const Fp8Operand x_t = fp8.input_transposed(x);
    accumulate_weight_grad(fp8_tn_gemm(in, out, rows, x_t, dz_t), dz, x.dtype(), weight_grad,
                           bias_grad);
  }
  if (!dx.defined()) return false;
  const Fp8Operand w_t = fp8.cast(Fp8Projection::Weight, w, /*transposed=*/true, false);
  // No DGELU epilogue on FP8 operands: cuBLASLt's runs at a third of the plain GEMM's speed there
  // (GPT-2 XL's c_proj, H200), so the producer applies the derivative itself.
  return input_gradient(fp8_tn_gemm(in, rows, out, w_t, dz_rows), x.dtype(), dx, nullptr);
}

}  // namespace

bool linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Activation act,
                     const Tensor& saved, std::int64_t saved_ld, Tensor& weight_grad,
                     Tensor* bias_grad, Tensor& dx, const InputActivation* input_activation,
                     Fp8Projection* fp8) {
  std::int64_t rows = x.size(0), in = x.size(1), out = w.size(0);
  if (rows == 0) return false;  // nothing to add, dx is empty
  Device device = x.device();
  DType mm = x.dtype();
  auto stream = static_cast<cudaStream_t>(current_stream(device));
  // dz (M, out) in the GEMM dtype. cuBLASLt's DRELU/DGELU epilogues apply the derivative to a
  // GEMM's output (the previous layer's activation), so this layer's own comes from a kernel.
  Tensor dz;
  if (act == Activation::None) {
    dz = dy.dtype() == mm ? dy : dy.to(mm);
  } else {
    Tensor g = dy.dtype() == saved.dtype() ? dy : dy.to(saved.dtype());
    dz = Tensor::empty({rows, out}, mm, device);
    std::int64_t n = rows * out;
    if (n > 0 && saved_ld == out && saved.dtype() == mm) {
      cuda::activation_backward(act, saved, g, dz);  // contiguous: the packed kernels
    } else if (n > 0) {
      KILN_CUDA_DISPATCH_FLOATING(saved.dtype(), T, {
        KILN_CUDA_DISPATCH_FLOATING(mm, TO, {
          activation_grad_kernel<T, TO><<<grid_for(n), 256, 0, stream>>>(
              static_cast<const T*>(g.data()), static_cast<const T*>(saved.data()), saved_ld, act,
              static_cast<TO*>(dz.data()), rows, out);
          KILN_CUDA_LAUNCH_CHECK();
        });
      });
    }
  }

  // weight.grad (out, in) += dz^T x, i.e. column-major dW^T (in, out) = x^T-view (in, M) dz (M,
  // out). None for a frozen weight (LoRA's base).
  if (fp8 != nullptr) return fp8_backward(x, w, dz, weight_grad, bias_grad, dx, *fp8);
  if (weight_grad.defined()) {
    LtGemm gw;
    gw.trans_b = true;
    gw.m = in;
    gw.n = out;
    gw.k = rows;
    gw.a = x.data();
    gw.lda = in;
    gw.b = dz.data();
    gw.ldb = out;
    gw.ab_type = mm;
    accumulate_weight_grad(gw, dz, mm, weight_grad, bias_grad);
  }

  // dx (M, in) = dz W, i.e. column-major dx^T (in, M) = W-view (in, out) dz^T (out, M).
  if (dx.defined()) {
    LtGemm gx;
    gx.m = in;
    gx.n = rows;
    gx.k = out;
    gx.a = w.data();
    gx.lda = in;
    gx.b = dz.data();
    gx.ldb = out;
    gx.ab_type = mm;
    return input_gradient(gx, mm, dx, input_activation);
  }
  return false;
}

}  // namespace kiln::cuda
