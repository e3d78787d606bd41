// CUDA multi-tensor kernels: one block per chunk of ChunkEntry; the element rules come from
// optim/rules/*.h (this file is compiled with --fmad=false so that they round as on the CPU).
// Per-chunk partial sums are combined in a fixed order, so norms are deterministic.

#include "core/cuda/block_sum.cuh"
#include "core/cuda/cuda_check.h"
#include "core/cuda/element.cuh"
#include "optim/multi_tensor.h"

namespace kiln::optim::detail {
namespace {

constexpr int kThreads = 256;

cudaStream_t as_stream(void* stream) {
  return static_cast<cudaStream_t>(stream);
}

// Runs f(T{}) with T the device type of a half/float dtype code (f64 is refused on the host).
template <typename F>
__device__ __forceinline__ void with_type(std::int32_t code, F&& f) {
  switch (static_cast<DType>(code)) {
    case DType::F16:
      f(__half{});
      break;
    case DType::BF16:
      f(__nv_bfloat16{});
      break;
    default:
      f(float{});
      break;
  }
}

__device__ __forceinline__ void store_copy(const TensorEntry& e, std::int64_t i, float value) {
  if (e.copy == nullptr) return;
  if (static_cast<DType>(e.copy_dtype) == DType::BF16) {
    static_cast<__nv_bfloat16*>(e.copy)[i] = cuda::store<__nv_bfloat16>(value);
  } else if (static_cast<DType>(e.copy_dtype) == DType::F16) {
    static_cast<__half*>(e.copy)[i] = cuda::store<__half>(value);
  } else {
    static_cast<float*>(e.copy)[i] = value;
  }
}

__global__ void unscale_check_sumsq_kernel(const TensorEntry* entries, const ChunkEntry* chunks,
                                           float inv_scale, const StepState* state, bool write,
                                           float* found_inf, double* partials) {
  const ChunkEntry c = chunks[blockIdx.x];
  const TensorEntry& e = entries[c.tensor];
  // Resident mode reads the factor at run time; a factor of 1 leaves the gradients as they are.
  if (state != nullptr) inv_scale = state->inv_scale;
  write = write && inv_scale != 1.0f;
  double sumsq = 0.0;
  bool bad = false;
  with_type(e.value_dtype, [&](auto v_tag) {
    with_type(e.grad_dtype, [&](auto g_tag) {
      using V = decltype(v_tag);
      using G = decltype(g_tag);
      const G* in = static_cast<const G*>(e.grad) + c.start;
      V* out = static_cast<V*>(e.value) + c.start;
      for (std::int64_t i = threadIdx.x; i < c.count; i += kThreads) {
        float g = cuda::load(in[i]);
        if (!finite(g)) bad = true;
        float x = g * inv_scale;
        sumsq += static_cast<double>(x) * static_cast<double>(x);
        if (write) out[i] = cuda::store<V>(x);
      }
    });
  });
  if (bad) *found_inf = 1.0f;  // every writer stores the same value
  double total = cuda::block_sum<kThreads>(sumsq);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void partials_norm_kernel(const double* partials, int n, float* out) {
  double acc = 0.0;
  for (int i = threadIdx.x; i < n; i += kThreads) acc += partials[i];
  double total = cuda::block_sum<kThreads>(acc);
  if (threadIdx.x == 0) out[0] = static_cast<float>(sqrt(total));
}

__global__ void scale_grads_kernel(const TensorEntry* entries, const ChunkEntry* chunks,
                                   float factor) {
  const ChunkEntry c = chunks[blockIdx.x];
  const TensorEntry& e = entries[c.tensor];
  with_type(e.grad_dtype, [&](auto g_tag) {
    using G = decltype(g_tag);
    G* g = static_cast<G*>(e.grad) + c.start;
    for (std::int64_t i = threadIdx.x; i < c.count; i += kThreads) {
      g[i] = cuda::store<G>(cuda::load(g[i]) * factor);
    }
  });
}

// One pass of an element-wise rule (the CPU loop in multi_tensor.cc does the same): each
// element's weight, gradient and the rule's state values are loaded, updated by Rule::element and
// stored back.
template <typename Rule>
__global__ void elementwise_kernel(const TensorEntry* entries, const ChunkEntry* chunks,
                                   Rule rule) {
  if (!load_resident(rule)) return;  // a skipped resident step
  const ChunkEntry c = chunks[blockIdx.x];
  const TensorEntry& e = entries[c.tensor];
  const auto s = rule.template scalars<float>(e);
  const StateView<float> states(e, rule.steps_done);
  with_type(e.value_dtype, [&](auto v_tag) {
    with_type(e.grad_dtype, [&](auto g_tag) {
      using V = decltype(v_tag);
      using G = decltype(g_tag);
      V* p = static_cast<V*>(e.value);
      const G* g = static_cast<const G*>(e.grad);
      for (std::int64_t i = c.start + threadIdx.x; i < c.start + c.count; i += kThreads) {
        float pv = cuda::load(p[i]);
        float state[Rule::kStates];
        states.template load_all<Rule::kStates>(i, state);
        Rule::element(pv, cuda::load(g[i]), state, s);
        states.template store_all<Rule::kStates>(i, state);
        p[i] = cuda::store<V>(pv);
        store_copy(e, i, pv);
      }
    });
  });
}

// LAMB stage 1: moments, and per-chunk sums of squares of the weights and of the update.
__global__ void lamb_moments_kernel(const TensorEntry* entries, const ChunkEntry* chunks,
                                    LambRule step, double* param_partials,
                                    double* update_partials) {
  if (!load_resident(step)) return;  // a skipped resident step
  const ChunkEntry c = chunks[blockIdx.x];
  const TensorEntry& e = entries[c.tensor];
  const LambRule::Scalars<float> s = step.scalars<float>(e);
  double param_sumsq = 0.0, update_sumsq = 0.0;
  with_type(e.value_dtype, [&](auto v_tag) {
    with_type(e.grad_dtype, [&](auto g_tag) {
      using V = decltype(v_tag);
      using G = decltype(g_tag);
      const V* p = static_cast<const V*>(e.value);
      const G* g = static_cast<const G*>(e.grad);
      const StateView<float> states(e, step.steps_done);
      for (std::int64_t i = c.start + threadIdx.x; i < c.start + c.count; i += kThreads) {
        float mv[2];
        states.template load_all<2>(i, mv);
        LambRule::moments(cuda::load(g[i]), mv[0], mv[1], s);
        states.template store_all<2>(i, mv);
        // The update is computed from the moments as stored, as the last stage reads them.
        states.template load_all<2>(i, mv);
        float pv = cuda::load(p[i]);
        float u = LambRule::update(pv, mv[0], mv[1], s);
        param_sumsq += static_cast<double>(pv) * static_cast<double>(pv);
        update_sumsq += static_cast<double>(u) * static_cast<double>(u);
      }
    });
  });
  double p_total = cuda::block_sum<kThreads>(param_sumsq);
  double u_total = cuda::block_sum<kThreads>(update_sumsq);
  if (threadIdx.x == 0) {
    param_partials[blockIdx.x] = p_total;
    update_partials[blockIdx.x] = u_total;
  }
}

// One tensor's {param, update} sums of squares from its chunks' partials; every thread gets them.
__device__ void lamb_tensor_totals(const TensorEntry& e, const double* param_partials,
                                   const double* update_partials, double* p_total,
                                   double* u_total) {
  double p_acc = 0.0, u_acc = 0.0;
  for (int i = threadIdx.x; i < e.chunk_count; i += kThreads) {
    p_acc += param_partials[e.first_chunk + i];
    u_acc += update_partials[e.first_chunk + i];
  }
  *p_total = cuda::block_sum<kThreads>(p_acc);
  *u_total = cuda::block_sum<kThreads>(u_acc);
}

// LAMB stage 2: one block per tensor turns its chunks' partials into the trust ratio.
__global__ void lamb_ratio_kernel(const TensorEntry* entries, const double* param_partials,
                                  const double* update_partials, float* ratios) {
  const TensorEntry& e = entries[blockIdx.x];
  double p_total, u_total;
  lamb_tensor_totals(e, param_partials, update_partials, &p_total, &u_total);
  if (threadIdx.x == 0)
    ratios[blockIdx.x] = LambRule::trust_ratio<float>(p_total, u_total, e.adapt != 0);
}

// LAMB stage 3: p -= lr * ratio * update, the update recomputed from (p, m, v).
__global__ void lamb_apply_kernel(const TensorEntry* entries, const ChunkEntry* chunks,
                                  LambRule step, const float* ratios) {
  if (!load_resident(step)) return;  // a skipped resident step
  const ChunkEntry c = chunks[blockIdx.x];
  const TensorEntry& e = entries[c.tensor];
  const LambRule::Scalars<float> s = step.scalars<float>(e);
  const float step_size = s.lr * ratios[c.tensor];
  with_type(e.value_dtype, [&](auto v_tag) {
    using V = decltype(v_tag);
    V* p = static_cast<V*>(e.value);
    const StateView<float> states(e, step.steps_done);
    for (std::int64_t i = c.start + threadIdx.x; i < c.start + c.count; i += kThreads) {
      float pv = cuda::load(p[i]);
      pv = pv - step_size * LambRule::update(pv, states.load(0, i), states.load(1, i), s);
      p[i] = cuda::store<V>(pv);
      store_copy(e, i, pv);
    }
  });
}

// Sharded LAMB: one block per tensor writes its {param_sumsq, update_sumsq} for the host to
// combine with the other ranks' pieces of the same parameter.
__global__ void lamb_tensor_sums_kernel(const TensorEntry* entries, const double* param_partials,
                                        const double* update_partials, double* sums) {
  const TensorEntry& e = entries[blockIdx.x];
  double p_total, u_total;
  lamb_tensor_totals(e, param_partials, update_partials, &p_total, &u_total);
  if (threadIdx.x == 0) {
    sums[2 * blockIdx.x] = p_total;
    sums[2 * blockIdx.x + 1] = u_total;
  }
}

// Sharded LAMB: the trust ratios from the combined sums.
__global__ void lamb_ratio_from_sums_kernel(const TensorEntry* entries, int num_tensors,
                                            const double* sums, float* ratios) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t < num_tensors) {
    ratios[t] = LambRule::trust_ratio<float>(sums[2 * t], sums[2 * t + 1], entries[t].adapt != 0);
  }
}

}  // namespace

void cuda_unscale_check_sumsq(MultiTensorTable& table, float inv_scale, bool write,
                              float* found_inf, void* stream, const StepState* state) {
  if (table.num_chunks() == 0) return;
  unscale_check_sumsq_kernel<<<table.num_chunks(), kThreads, 0, as_stream(stream)>>>(
      table.device_entries(), table.device_chunks(), inv_scale, state, write, found_inf,
      table.chunk_partials(0));
  KILN_CUDA_LAUNCH_CHECK();
}

void cuda_partials_norm(MultiTensorTable& table, float* out, void* stream) {
  partials_norm_kernel<<<1, kThreads, 0, as_stream(stream)>>>(table.chunk_partials(0),
                                                              table.num_chunks(), out);
  KILN_CUDA_LAUNCH_CHECK();
}

void cuda_scale_grads(MultiTensorTable& table, float factor, void* stream) {
  if (table.num_chunks() == 0) return;
  scale_grads_kernel<<<table.num_chunks(), kThreads, 0, as_stream(stream)>>>(
      table.device_entries(), table.device_chunks(), factor);
  KILN_CUDA_LAUNCH_CHECK();
}

namespace {

// LAMB's first stage (moments, per-chunk sums) and its last (the update by the trust ratios),
// shared by the whole and the sharded (ZeRO) step.
void launch_lamb_moments(MultiTensorTable& table, const LambRule& step, void* stream) {
  lamb_moments_kernel<<<table.num_chunks(), kThreads, 0, as_stream(stream)>>>(
      table.device_entries(), table.device_chunks(), step, table.chunk_partials(0),
      table.chunk_partials(1));
  KILN_CUDA_LAUNCH_CHECK();
}

void launch_lamb_apply(MultiTensorTable& table, const LambRule& step, void* stream) {
  lamb_apply_kernel<<<table.num_chunks(), kThreads, 0, as_stream(stream)>>>(
      table.device_entries(), table.device_chunks(), step, table.tensor_scalars());
  KILN_CUDA_LAUNCH_CHECK();
}

}  // namespace

void cuda_lamb_moments_sumsq(MultiTensorTable& table, const LambRule& step, double* sums,
                             void* stream) {
  if (table.num_chunks() == 0) return;
  launch_lamb_moments(table, step, stream);
  lamb_tensor_sums_kernel<<<table.num_tensors(), kThreads, 0, as_stream(stream)>>>(
      table.device_entries(), table.chunk_partials(0), table.chunk_partials(1), sums);
  KILN_CUDA_LAUNCH_CHECK();
}

void cuda_lamb_apply(MultiTensorTable& table, const LambRule& step, const double* sums,
                     void* stream) {
  if (table.num_chunks() == 0) return;
  const int blocks = (table.num_tensors() + kThreads - 1) / kThreads;
  lamb_ratio_from_sums_kernel<<<blocks, kThreads, 0, as_stream(stream)>>>(
      table.device_entries(), table.num_tensors(), sums, table.tensor_scalars());
  KILN_CUDA_LAUNCH_CHECK();
  launch_lamb_apply(table, step, stream);
}

namespace {

template <typename Rule>
void launch_rule_step(MultiTensorTable& table, const Rule& rule, void* stream) {
  if (table.num_chunks() == 0) return;
  elementwise_kernel<<<table.num_chunks(), kThreads, 0, as_stream(stream)>>>(
      table.device_entries(), table.device_chunks(), rule);
  KILN_CUDA_LAUNCH_CHECK();
}

// LAMB: moments and per-chunk sums, the per-tensor trust ratios, the update.
void launch_rule_step(MultiTensorTable& table, const LambRule& step, void* stream) {
  if (table.num_chunks() == 0) return;
  launch_lamb_moments(table, step, stream);
  lamb_ratio_kernel<<<table.num_tensors(), kThreads, 0, as_stream(stream)>>>(
      table.device_entries(), table.chunk_partials(0), table.chunk_partials(1),
      table.tensor_scalars());
  KILN_CUDA_LAUNCH_CHECK();
  launch_lamb_apply(table, step, stream);
}

}  // namespace

#define KILN_OPTIMIZER_STEP_(kind, Rule)                                    \
  void cuda_step(MultiTensorTable& table, const Rule& rule, void* stream) { \
    launch_rule_step(table, rule, stream);                                  \
  }
KILN_OPTIMIZERS(KILN_OPTIMIZER_STEP_)
#undef KILN_OPTIMIZER_STEP_

}  // namespace kiln::optim::detail
