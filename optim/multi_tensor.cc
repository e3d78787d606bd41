// The multi-tensor descriptor table and the CPU passes (the reference the CUDA kernels are checked
// against).

#include "optim/multi_tensor.h"

#include <cstring>

#include "core/cpu/element.h"
#include "core/cpu/parallel.h"

namespace kiln::optim::detail {
namespace {

bool same_entries(const std::vector<TensorEntry>& a, const std::vector<TensorEntry>& b) {
  if (a.size() != b.size()) return false;
  return a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(TensorEntry)) == 0;
}

DType dtype_of(std::int32_t code) {
  return static_cast<DType>(code);
}

template <typename V>
using ComputeOf = typename cpu::Compute<V>::type;

// Runs f(V{}, G{}) with V, G the host types of the entry's value and grad.
template <typename F>
void dispatch_value_grad(const TensorEntry& e, F&& f) {
  KILN_DISPATCH_FLOATING(dtype_of(e.value_dtype), V,
                         { KILN_DISPATCH_FLOATING(dtype_of(e.grad_dtype), G, f(V{}, G{})); });
}

template <typename C>
void store_copy(const TensorEntry& e, std::int64_t i, C value) {
  if (e.copy == nullptr) return;
  KILN_DISPATCH_FLOATING(dtype_of(e.copy_dtype), T,
                         static_cast<T*>(e.copy)[i] = cpu::store<T>(static_cast<double>(value)));
}

template <typename T, typename C>
inline T store_value(C v) {
  if constexpr (std::is_same<T, float>::value || std::is_same<T, double>::value) {
    return static_cast<T>(v);
  } else {
    return cpu::store_float<T>(static_cast<float>(v));
  }
}

// A run of one tensor's elements: the unit the host passes split across cores.
struct Span {
  std::size_t tensor;
  std::int64_t start, count;
};

std::vector<Span> spans_of(const std::vector<TensorEntry>& entries, std::int64_t* total) {
  std::vector<Span> spans;
  *total = 0;
  for (std::size_t t = 0; t < entries.size(); ++t) {
    for (std::int64_t start = 0; start < entries[t].numel; start += kChunkElements) {
      spans.push_back({t, start, std::min(kChunkElements, entries[t].numel - start)});
    }
    *total += entries[t].numel;
  }
  return spans;
}

// One pass of an element-wise rule: each element's weight, gradient and the rule's state values
// are loaded, updated by Rule::element and stored back (the CUDA kernel does the same). Elements
// are independent, so the spans run on every core.
template <typename Rule>
void cpu_elementwise(const std::vector<TensorEntry>& entries, const Rule& rule) {
  std::int64_t total = 0;
  const std::vector<Span> spans = spans_of(entries, &total);
  cpu::parallel_blocks(static_cast<std::int64_t>(spans.size()), total, [&](std::int64_t b) {
    const Span& span = spans[static_cast<std::size_t>(b)];
    const TensorEntry& e = entries[span.tensor];
    dispatch_value_grad(e, [&](auto v_tag, auto g_tag) {
      using V = decltype(v_tag);
      using G = decltype(g_tag);
      using C = ComputeOf<V>;
      const auto s = rule.template scalars<C>(e);
      V* p = static_cast<V*>(e.value);
      const G* g = static_cast<const G*>(e.grad);
      const StateView<C> states(e, rule.steps_done);
      for (std::int64_t i = span.start; i < span.start + span.count; ++i) {
        C pv = static_cast<C>(cpu::load(p[i]));
        C state[Rule::kStates];
        states.template load_all<Rule::kStates>(i, state);
        Rule::element(pv, static_cast<C>(cpu::load(g[i])), state, s);
        states.template store_all<Rule::kStates>(i, state);
        p[i] = store_value<V>(pv);
        store_copy(e, i, pv);
      }
    });
  });
}

}  // namespace

void MultiTensorTable::set(std::vector<TensorEntry> entries, Device device) {
  bool changed = device != device_ || !device_buffer_.defined();
  // Chunk indices are part of the entries, so they are filled before the comparison. (Comparing
  // before filling them re-uploaded the table on every call: a pageable copy and an allocation in
  // each step, which a captured CUDA graph replays from freed memory.)
  std::int32_t chunk = 0;
  std::vector<ChunkEntry> chunks;
  for (std::size_t t = 0; t < entries.size(); ++t) {
    entries[t].first_chunk = chunk;
    std::int32_t count = 0;
    for (std::int64_t start = 0; start < entries[t].numel; start += kChunkElements) {
      ChunkEntry c;
      c.tensor = static_cast<std::int32_t>(t);
      c.start = start;
      c.count = std::min(kChunkElements, entries[t].numel - start);
      chunks.push_back(c);
      ++count;
    }
    entries[t].chunk_count = count;
    chunk += count;
  }
  changed = changed || !same_entries(entries, entries_);
  entries_ = std::move(entries);
  chunks_ = std::move(chunks);
  device_ = device;
  if (!changed || device.is_cpu()) return;
  std::size_t entry_bytes = entries_.size() * sizeof(TensorEntry);
  std::size_t chunk_bytes = chunks_.size() * sizeof(ChunkEntry);
  Tensor host =
      Tensor::empty({static_cast<std::int64_t>(entry_bytes + chunk_bytes + 1)}, DType::U8);
  if (entry_bytes) std::memcpy(host.data(), entries_.data(), entry_bytes);
  if (chunk_bytes) {
    std::memcpy(static_cast<char*>(host.data()) + entry_bytes, chunks_.data(), chunk_bytes);
  }
  device_buffer_ = host.to(device);
  std::int64_t nchunks = std::max<std::int64_t>(1, num_chunks());
  if (!partials_[0].defined() || partials_[0].numel() < nchunks) {
    partials_[0] = Tensor::empty({nchunks}, DType::F64, device);
    partials_[1] = Tensor::empty({nchunks}, DType::F64, device);
  }
  std::int64_t ntensors = std::max<std::int64_t>(1, num_tensors());
  if (!tensor_scalars_.defined() || tensor_scalars_.numel() < ntensors) {
    tensor_scalars_ = Tensor::empty({ntensors}, DType::F32, device);
  }
}

const TensorEntry* MultiTensorTable::device_entries() const {
  return static_cast<const TensorEntry*>(device_buffer_.data());
}
const ChunkEntry* MultiTensorTable::device_chunks() const {
  return reinterpret_cast<const ChunkEntry*>(static_cast<const char*>(device_buffer_.data()) +
                                             entries_.size() * sizeof(TensorEntry));
}
double* MultiTensorTable::chunk_partials(int which) {
  return static_cast<double*>(partials_[which].data());
}
float* MultiTensorTable::tensor_scalars() {
  return static_cast<float*>(tensor_scalars_.data());
}

double cpu_unscale_check_sumsq(const std::vector<TensorEntry>& entries, double inv_scale,
                               bool write, bool* found_inf) {
  // Each span's sum of squares on its own, added up in span order: the same on any number of
  // cores.
  std::int64_t total = 0;
  const std::vector<Span> spans = spans_of(entries, &total);
  std::vector<double> partial(spans.size(), 0.0);
  std::vector<char> inf(spans.size(), 0);
  cpu::parallel_blocks(static_cast<std::int64_t>(spans.size()), total, [&](std::int64_t b) {
    const Span& span = spans[static_cast<std::size_t>(b)];
    const TensorEntry& e = entries[span.tensor];
    dispatch_value_grad(e, [&](auto v_tag, auto g_tag) {
      using V = decltype(v_tag);
      using G = decltype(g_tag);
      using C = ComputeOf<V>;
      const G* in = static_cast<const G*>(e.grad);
      V* out = static_cast<V*>(e.value);
      C factor = static_cast<C>(inv_scale);
      double sumsq = 0.0;
      bool bad = false;
      for (std::int64_t i = span.start; i < span.start + span.count; ++i) {
        C g = static_cast<C>(cpu::load(in[i]));
        if (!finite(g)) bad = true;
        C x = g * factor;
        sumsq += static_cast<double>(x) * static_cast<double>(x);
        if (write) out[i] = store_value<V>(x);
      }
      partial[static_cast<std::size_t>(b)] = sumsq;
      inf[static_cast<std::size_t>(b)] = bad ? 1 : 0;
    });
  });
  double sumsq = 0.0;
  for (std::size_t b = 0; b < spans.size(); ++b) {
    sumsq += partial[b];
    if (inf[b] != 0) *found_inf = true;
  }
  return sumsq;
}

void cpu_scale_grads(const std::vector<TensorEntry>& entries, double factor) {
  std::int64_t total = 0;
  const std::vector<Span> spans = spans_of(entries, &total);
  cpu::parallel_blocks(static_cast<std::int64_t>(spans.size()), total, [&](std::int64_t b) {
    const Span& span = spans[static_cast<std::size_t>(b)];
    const TensorEntry& e = entries[span.tensor];
    KILN_DISPATCH_FLOATING(dtype_of(e.grad_dtype), G, {
      using C = ComputeOf<G>;
      G* g = static_cast<G*>(e.grad);
      C f = static_cast<C>(factor);
      for (std::int64_t i = span.start; i < span.start + span.count; ++i) {
        g[i] = store_value<G>(static_cast<C>(cpu::load(g[i])) * f);
      }
    });
  });
}

std::vector<double> cpu_lamb_moments_sumsq(const std::vector<TensorEntry>& entries,
                                           const LambRule& rule) {
  std::vector<double> sums(2 * entries.size(), 0.0);
  LambRule step = rule;
  if (!load_resident(step)) return sums;
  for (std::size_t t = 0; t < entries.size(); ++t) {
    const TensorEntry& e = entries[t];
    dispatch_value_grad(e, [&](auto v_tag, auto g_tag) {
      using V = decltype(v_tag);
      using G = decltype(g_tag);
      using C = ComputeOf<V>;
      const LambRule::Scalars<C> s = step.scalars<C>(e);
      const V* p = static_cast<const V*>(e.value);
      const G* g = static_cast<const G*>(e.grad);
      const StateView<C> states(e, step.steps_done);
      double param_sumsq = 0.0, update_sumsq = 0.0;
      for (std::int64_t i = 0; i < e.numel; ++i) {
        C mv[2];
        states.template load_all<2>(i, mv);
        LambRule::moments(static_cast<C>(cpu::load(g[i])), mv[0], mv[1], s);
        states.template store_all<2>(i, mv);
        // The update is computed from the moments as stored, as the last stage reads them.
        states.template load_all<2>(i, mv);
        C pv = static_cast<C>(cpu::load(p[i]));
        C u = LambRule::update(pv, mv[0], mv[1], s);
        param_sumsq += static_cast<double>(pv) * static_cast<double>(pv);
        update_sumsq += static_cast<double>(u) * static_cast<double>(u);
      }
      sums[2 * t] = param_sumsq;
      sums[2 * t + 1] = update_sumsq;
    });
  }
  return sums;
}

void cpu_lamb_apply(const std::vector<TensorEntry>& entries, const LambRule& rule,
                    const std::vector<double>& sums) {
  LambRule step = rule;
  if (!load_resident(step)) return;
  for (std::size_t t = 0; t < entries.size(); ++t) {
    const TensorEntry& e = entries[t];
    dispatch_value_grad(e, [&](auto v_tag, auto g_tag) {
      using V = decltype(v_tag);
      using C = ComputeOf<V>;
      (void)g_tag;
      const LambRule::Scalars<C> s = step.scalars<C>(e);
      V* p = static_cast<V*>(e.value);
      const StateView<C> states(e, step.steps_done);
      C ratio = LambRule::trust_ratio<C>(sums[2 * t], sums[2 * t + 1], e.adapt != 0);
      C step_size = s.lr * ratio;
      for (std::int64_t i = 0; i < e.numel; ++i) {
        C pv = static_cast<C>(cpu::load(p[i]));
        C u = LambRule::update(pv, states.load(0, i), states.load(1, i), s);
        pv = pv - step_size * u;
        p[i] = store_value<V>(pv);
        store_copy(e, i, pv);
      }
    });
  }
}

namespace {

template <typename Rule>
void cpu_rule_step(const std::vector<TensorEntry>& entries, const Rule& rule_in) {
  Rule rule = rule_in;
  if constexpr (Rule::kTrustRatio) {
    cpu_lamb_apply(entries, rule, cpu_lamb_moments_sumsq(entries, rule));
  } else {
    if (!load_resident(rule)) return;
    cpu_elementwise(entries, rule);
  }
}

}  // namespace

#define KILN_OPTIMIZER_STEP_(kind, Rule)                                     \
  void cpu_step(const std::vector<TensorEntry>& entries, const Rule& rule) { \
    cpu_rule_step(entries, rule);                                            \
  }
KILN_OPTIMIZERS(KILN_OPTIMIZER_STEP_)
#undef KILN_OPTIMIZER_STEP_

}  // namespace kiln::optim::detail
