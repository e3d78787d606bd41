// The multi-tensor descriptor table and the CPU passes (the reference the CUDA kernels are checked
// against).

#include "optim/multi_tensor.h"

#include <cstring>
#include <string>
#include <type_traits>

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

// The scalar loop of an element-wise rule over elements [begin, end) of one entry: each element's
// weight, gradient and the rule's state values are loaded, updated by Rule::element and stored
// back (the CUDA kernel does the same). The reference the vectorised loops below are held to.
template <typename Rule, typename V, typename G>
void rule_scalar_range(const TensorEntry& e, const Rule& rule, std::int64_t begin,
                       std::int64_t end) {
  using C = ComputeOf<V>;
  const auto s = rule.template scalars<C>(e);
  V* p = static_cast<V*>(e.value);
  const G* g = static_cast<const G*>(e.grad);
  const StateView<C> states(e, rule.steps_done);
  for (std::int64_t i = begin; i < end; ++i) {
    C pv = static_cast<C>(cpu::load(p[i]));
    C state[Rule::kStates];
    states.template load_all<Rule::kStates>(i, state);
    Rule::element(pv, static_cast<C>(cpu::load(g[i])), state, s);
    states.template store_all<Rule::kStates>(i, state);
    p[i] = store_value<V>(pv);
    store_copy(e, i, pv);
  }
}

// ---- Vectorised loops ----
// A span is processed in blocks of kVectorBlock elements: one loop loads the block into local
// arrays (widening bf16), one applies the rule to every element, one stores (rounding bf16), so
// each loop has a fixed trip count, no aliasing and no per-element branch, and GCC vectorises it.
// The last, partial block takes the scalar loop. The bodies are always inlined into three entry
// points compiled for baseline x86-64 (SSE2), AVX2 and AVX-512 (KILN_VECTOR_LOOPS_ below).

#define KILN_VECTOR_INLINE inline __attribute__((always_inline))
// A lambda inside the loops: inlined too, or it would be built for the baseline target.
#define KILN_VECTOR_LAMBDA __attribute__((always_inline))

constexpr int kVectorBlock = 64;

struct NoCopy {};

// The element types the vectorised loops load and store (others take the scalar loops).
template <typename T>
constexpr bool is_vector_type() {
  return std::is_same<T, float>::value || std::is_same<T, BFloat16>::value;
}

KILN_VECTOR_INLINE float widen(float x) {
  return x;
}
KILN_VECTOR_INLINE float widen(BFloat16 x) {
  return bf16_bits_widen(x.bits);
}
template <typename T>
KILN_VECTOR_INLINE T narrow(float x);  // round to nearest (even), as cpu::store_float
template <>
KILN_VECTOR_INLINE float narrow<float>(float x) {
  return x;
}
template <>
KILN_VECTOR_INLINE BFloat16 narrow<BFloat16>(float x) {
  return BFloat16{float_to_bf16_bits(x)};
}
// 1 when x is inf or NaN (as !std::isfinite), as an integer the vectoriser can OR together.
KILN_VECTOR_INLINE std::uint32_t nonfinite_bit(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return (u & 0x7f800000u) == 0x7f800000u ? 1u : 0u;
}

// One entry's pointers and bf16 rounding stream, as StateView holds them.
struct RulePointers {
  float* value;
  const void* grad;
  void* copy;
  void* slots[3];
  std::uint32_t seed;
  std::int64_t offset;
};

template <bool kBf16State>
KILN_VECTOR_INLINE void load_state_block(const void* slot, std::int64_t i, float* out) {
  constexpr int B = kVectorBlock;
  if (slot == nullptr) {
    for (int j = 0; j < B; ++j) out[j] = 0.0f;
  } else if (kBf16State) {
    const std::uint16_t* in = static_cast<const std::uint16_t*>(slot) + i;
    for (int j = 0; j < B; ++j) out[j] = bf16_bits_widen(in[j]);
  } else {
    const float* in = static_cast<const float*>(slot) + i;
    for (int j = 0; j < B; ++j) out[j] = in[j];
  }
}

// StateView::store_all over a block. The words hash the element's index in the whole parameter;
// while its upper 32 bits stay the same over the block (every block but one in 2^32 elements)
// their part of the hash is computed once.
template <int N, bool kBf16State>
KILN_VECTOR_INLINE void store_state_block(const RulePointers& a, std::int64_t i,
                                          float (*st)[kVectorBlock]) {
  constexpr int B = kVectorBlock;
  if (!kBf16State) {
    for (int k = 0; k < N; ++k) {
      if (a.slots[k] == nullptr) continue;
      float* out = static_cast<float*>(a.slots[k]) + i;
      for (int j = 0; j < B; ++j) out[j] = st[k][j];
    }
    return;
  }
  const std::uint64_t first = static_cast<std::uint64_t>(a.offset + i);
  const std::uint64_t last = first + (B - 1);
  std::uint32_t h[B];
  if ((first >> 32) == (last >> 32)) {
    const std::uint32_t high = mix32(a.seed ^ static_cast<std::uint32_t>(first >> 32));
    const std::uint32_t low = static_cast<std::uint32_t>(first);
    for (int j = 0; j < B; ++j) h[j] = mix32((low + static_cast<std::uint32_t>(j)) ^ high);
  } else {
    for (int j = 0; j < B; ++j) {
      const std::uint64_t index = first + static_cast<std::uint64_t>(j);
      h[j] = mix32(static_cast<std::uint32_t>(index) ^
                   mix32(a.seed ^ static_cast<std::uint32_t>(index >> 32)));
    }
  }
  for (int k = 0; k < N; ++k) {
    if (a.slots[k] == nullptr) continue;
    std::uint16_t* out = static_cast<std::uint16_t*>(a.slots[k]) + i;
    if (k == 0) {
      for (int j = 0; j < B; ++j) out[j] = bf16_bits_stochastic(st[k][j], h[j]);
    } else if (k == 1) {
      for (int j = 0; j < B; ++j) out[j] = bf16_bits_stochastic(st[k][j], h[j] >> 16);
    } else {
      for (int j = 0; j < B; ++j) {
        out[j] = bf16_bits_stochastic(st[k][j], mix32(h[j] ^ 0x9e3779b9u));
      }
    }
  }
}

template <typename Rule, typename G, typename K, bool kBf16State>
KILN_VECTOR_INLINE void rule_block(const typename Rule::template Scalars<float>& s,
                                   const RulePointers& a, std::int64_t i) {
  constexpr int B = kVectorBlock;
  constexpr int N = Rule::kStates;
  float pv[B], gv[B], st[N][B];
  float* p = a.value + i;
  const G* g = static_cast<const G*>(a.grad) + i;
  for (int j = 0; j < B; ++j) pv[j] = p[j];
  for (int j = 0; j < B; ++j) gv[j] = widen(g[j]);
  for (int k = 0; k < N; ++k) load_state_block<kBf16State>(a.slots[k], i, st[k]);
  for (int j = 0; j < B; ++j) {
    float state[N];
    for (int k = 0; k < N; ++k) state[k] = st[k][j];
    Rule::element(pv[j], gv[j], state, s);
    for (int k = 0; k < N; ++k) st[k][j] = state[k];
  }
  for (int j = 0; j < B; ++j) p[j] = pv[j];
  if constexpr (!std::is_same<K, NoCopy>::value) {
    K* copy = static_cast<K*>(a.copy) + i;
    for (int j = 0; j < B; ++j) copy[j] = narrow<K>(pv[j]);
  }
  store_state_block<N, kBf16State>(a, i, st);
}

// Calls f(s) under both outcomes of `condition`, `s` carrying `known` in `field` on the false
// side, so that the rule inlined into each copy has that branch decided (the same test, or a
// constant): GCC does not vectorise the block loop with the rule's invariant branches in it.
template <typename S, typename T, typename F>
KILN_VECTOR_INLINE std::int64_t decided(bool condition, S s, T S::*field, T known, F&& f) {
  if (condition) return f(s);
  s.*field = known;
  return f(s);
}

// The element rules' invariant tests (optim/rules/*.h), each taken out of the block loop.
template <typename F>
KILN_VECTOR_INLINE std::int64_t unswitched(const AdamWRule::Scalars<float>& s0, F&& f) {
  using S = AdamWRule::Scalars<float>;
  const float w = s0.one_minus_beta1;  // lerp_torch's test
  return decided(s0.grad_unscale != 1.0f, s0, &S::grad_unscale, 1.0f,
                 [&](const S& s1) KILN_VECTOR_LAMBDA {
                   return decided(s1.grad_multiplier != 1.0f, s1, &S::grad_multiplier, 1.0f,
                                  [&](const S& s2) KILN_VECTOR_LAMBDA {
                                    return decided(s2.amsgrad, s2, &S::amsgrad, false,
                                                   [&](const S& s3) KILN_VECTOR_LAMBDA {
                                                     if (w < 0.5f && w > -0.5f) return f(s3);
                                                     return f(s3);
                                                   });
                                  });
                 });
}
template <typename F>
KILN_VECTOR_INLINE std::int64_t unswitched(const SgdRule::Scalars<float>& s0, F&& f) {
  using S = SgdRule::Scalars<float>;
  return decided(
      s0.grad_unscale != 1.0f, s0, &S::grad_unscale, 1.0f, [&](const S& s1) KILN_VECTOR_LAMBDA {
        return decided(s1.grad_multiplier != 1.0f, s1, &S::grad_multiplier, 1.0f,
                       [&](const S& s2) KILN_VECTOR_LAMBDA {
                         return decided(s2.weight_decay != 0.0f, s2, &S::weight_decay, 0.0f,
                                        [&](const S& s3) KILN_VECTOR_LAMBDA {
                                          return decided(
                                              s3.use_momentum, s3, &S::use_momentum, false,
                                              [&](const S& s4) KILN_VECTOR_LAMBDA {
                                                return decided(
                                                    s4.first_step, s4, &S::first_step, false,
                                                    [&](const S& s5) KILN_VECTOR_LAMBDA {
                                                      return decided(s5.nesterov, s5, &S::nesterov,
                                                                     false, f);
                                                    });
                                              });
                                        });
                       });
      });
}

// Whole blocks of [begin, end); returns where the scalar loop takes over.
template <typename Rule, typename G, typename K, bool kBf16State>
KILN_VECTOR_INLINE std::int64_t rule_blocks(const typename Rule::template Scalars<float>& scalars,
                                            const RulePointers& a, std::int64_t begin,
                                            std::int64_t end) {
  return unswitched(scalars,
                    [&](const typename Rule::template Scalars<float>& s) KILN_VECTOR_LAMBDA {
                      std::int64_t i = begin;
                      for (; i + kVectorBlock <= end; i += kVectorBlock)
                        rule_block<Rule, G, K, kBf16State>(s, a, i);
                      return i;
                    });
}

// Keeps a sum's additions scalar and in order: GCC would otherwise vectorise the loop as an
// in-order reduction that extracts every lane, slower than the scalar chain it must equal (the
// result is the same either way; the asm emits nothing).
KILN_VECTOR_INLINE void in_order(double& sum) {
#if defined(__x86_64__)
  __asm__("" : "+x"(sum));
#else
  (void)sum;
#endif
}

// The unscale pass over whole blocks: the squares are computed a block at a time and added to
// *sumsq one by one in element order, as the scalar loop adds them.
template <typename V, typename G>
KILN_VECTOR_INLINE std::int64_t unscale_blocks(const G* in, V* out, float factor, bool write,
                                               std::int64_t begin, std::int64_t end, double* sumsq,
                                               bool* bad) {
  constexpr int B = kVectorBlock;
  std::int64_t i = begin;
  double total = *sumsq;
  bool any_bad = false;
  for (; i + B <= end; i += B) {
    float x[B];
    double squares[B];
    std::uint32_t block_bad = 0;
    for (int j = 0; j < B; ++j) {
      const float g = widen(in[i + j]);
      block_bad |= nonfinite_bit(g);
      x[j] = g * factor;
      squares[j] = static_cast<double>(x[j]) * static_cast<double>(x[j]);
    }
    for (int j = 0; j < B; ++j) {
      total += squares[j];
      in_order(total);
    }
    if (write) {
      for (int j = 0; j < B; ++j) out[i + j] = narrow<V>(x[j]);
    }
    any_bad = any_bad || block_bad != 0;
  }
  *sumsq = total;
  *bad = *bad || any_bad;
  return i;
}

template <typename G>
KILN_VECTOR_INLINE std::int64_t scale_blocks(G* g, float factor, std::int64_t begin,
                                             std::int64_t end) {
  std::int64_t i = begin;
  for (; i + kVectorBlock <= end; i += kVectorBlock) {
    for (int j = 0; j < kVectorBlock; ++j) g[i + j] = narrow<G>(widen(g[i + j]) * factor);
  }
  return i;
}

// The entry points, one struct per instruction set; `attributes` is the target it is built for.
#define KILN_VECTOR_LOOPS_(Name, attributes)                                                    \
  struct Name {                                                                                 \
    template <typename Rule, typename G, typename K, bool kBf16State>                           \
    attributes static std::int64_t rule(const typename Rule::template Scalars<float>& s,        \
                                        const RulePointers& a, std::int64_t begin,              \
                                        std::int64_t end) {                                     \
      return rule_blocks<Rule, G, K, kBf16State>(s, a, begin, end);                             \
    }                                                                                           \
    template <typename V, typename G>                                                           \
    attributes static std::int64_t unscale(const G* in, V* out, float factor, bool write,       \
                                           std::int64_t begin, std::int64_t end, double* sumsq, \
                                           bool* bad) {                                         \
      return unscale_blocks<V, G>(in, out, factor, write, begin, end, sumsq, bad);              \
    }                                                                                           \
    template <typename G>                                                                       \
    attributes static std::int64_t scale(G* g, float factor, std::int64_t begin,                \
                                         std::int64_t end) {                                    \
      return scale_blocks<G>(g, factor, begin, end);                                            \
    }                                                                                           \
  };
KILN_VECTOR_LOOPS_(BaselineLoops, )
#if defined(__x86_64__)
KILN_VECTOR_LOOPS_(Avx2Loops, __attribute__((target("avx2"))))
KILN_VECTOR_LOOPS_(Avx512Loops, __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"))))
#endif
#undef KILN_VECTOR_LOOPS_

// f(Loops{}) with Loops the entry points of `loops` (resolved, not kScalar).
template <typename F>
std::int64_t with_loops(CpuLoops loops, F&& f) {
#if defined(__x86_64__)
  if (loops == CpuLoops::kAvx512) return f(Avx512Loops{});
  if (loops == CpuLoops::kAvx2) return f(Avx2Loops{});
#endif
  (void)loops;
  return f(BaselineLoops{});
}

CpuLoops resolve(CpuLoops loops) {
  if (loops != CpuLoops::kBest) {
    KILN_CHECK(cpu_loops_supported(loops),
               std::string("this processor cannot run the ") + cpu_loops_name(loops) + " loops");
    return loops;
  }
  static const CpuLoops best = cpu_loops_supported(CpuLoops::kAvx512) ? CpuLoops::kAvx512
                               : cpu_loops_supported(CpuLoops::kAvx2) ? CpuLoops::kAvx2
                                                                      : CpuLoops::kBaseline;
  return best;
}

// An element-wise rule's span on the vectorised loops when the entry's dtypes have them (f32
// weights; f32 or bf16 gradients and state; no copy or a bf16 one); false: the caller runs the
// scalar loop.
template <typename Rule>
bool rule_span_vectorised(const TensorEntry& e, const Rule& rule, std::int64_t begin,
                          std::int64_t end, CpuLoops loops) {
  const DType grad = dtype_of(e.grad_dtype);
  const bool bf16_state = dtype_of(e.state_dtype) == DType::BF16;
  const bool copy_bf16 = e.copy != nullptr && dtype_of(e.copy_dtype) == DType::BF16;
  if (dtype_of(e.value_dtype) != DType::F32 || (grad != DType::F32 && grad != DType::BF16) ||
      (!bf16_state && dtype_of(e.state_dtype) != DType::F32) || (e.copy != nullptr && !copy_bf16)) {
    return false;
  }
  const StateView<float> view(e, rule.steps_done);
  const RulePointers a{static_cast<float*>(e.value),   e.grad,    e.copy,
                       {e.state0, e.state1, e.state2}, view.seed, e.element_offset};
  const auto s = rule.template scalars<float>(e);
  auto run = [&](auto g_tag, auto k_tag, auto bf16_tag) {
    using G = decltype(g_tag);
    using K = decltype(k_tag);
    constexpr bool kBf16 = decltype(bf16_tag)::value;
    const std::int64_t done = with_loops(loops, [&](auto isa) {
      return decltype(isa)::template rule<Rule, G, K, kBf16>(s, a, begin, end);
    });
    if (done < end) rule_scalar_range<Rule, float, G>(e, rule, done, end);
  };
  auto with_state = [&](auto g_tag, auto k_tag) {
    if (bf16_state) {
      run(g_tag, k_tag, std::true_type{});
    } else {
      run(g_tag, k_tag, std::false_type{});
    }
  };
  auto with_copy = [&](auto g_tag) {
    if (copy_bf16) {
      with_state(g_tag, BFloat16{});
    } else {
      with_state(g_tag, NoCopy{});
    }
  };
  if (grad == DType::BF16) {
    with_copy(BFloat16{});
  } else {
    with_copy(float{});
  }
  return true;
}

// One pass of an element-wise rule. Elements are independent, so the spans run on every core.
template <typename Rule>
void cpu_elementwise(const std::vector<TensorEntry>& entries, const Rule& rule, CpuLoops loops) {
  std::int64_t total = 0;
  const std::vector<Span> spans = spans_of(entries, &total);
  cpu::parallel_blocks(static_cast<std::int64_t>(spans.size()), total, [&](std::int64_t b) {
    const Span& span = spans[static_cast<std::size_t>(b)];
    const TensorEntry& e = entries[span.tensor];
    const std::int64_t end = span.start + span.count;
    if (loops != CpuLoops::kScalar && rule_span_vectorised(e, rule, span.start, end, loops)) {
      return;
    }
    dispatch_value_grad(e, [&](auto v_tag, auto g_tag) {
      rule_scalar_range<Rule, decltype(v_tag), decltype(g_tag)>(e, rule, span.start, end);
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

bool cpu_loops_supported(CpuLoops loops) {
#if defined(__x86_64__)
  if (loops == CpuLoops::kAvx512) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  }
  if (loops == CpuLoops::kAvx2) return __builtin_cpu_supports("avx2");
  return true;
#else
  return loops != CpuLoops::kAvx512 && loops != CpuLoops::kAvx2;
#endif
}

const char* cpu_loops_name(CpuLoops loops) {
  switch (loops == CpuLoops::kBest ? resolve(loops) : loops) {
    case CpuLoops::kScalar:
      return "scalar";
    case CpuLoops::kAvx2:
      return "avx2";
    case CpuLoops::kAvx512:
      return "avx512";
    default:
      return "baseline";
  }
}

double cpu_unscale_check_sumsq(const std::vector<TensorEntry>& entries, double inv_scale,
                               bool write, bool* found_inf, CpuLoops loops) {
  // Each span's sum of squares on its own, added up in span order: the same on any number of
  // cores.
  if (loops != CpuLoops::kScalar) loops = resolve(loops);
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
      std::int64_t i = span.start;
      const std::int64_t end = span.start + span.count;
      if constexpr (is_vector_type<V>() && is_vector_type<G>()) {
        if (loops != CpuLoops::kScalar) {
          i = with_loops(loops, [&](auto isa) {
            return decltype(isa)::template unscale<V, G>(in, out, factor, write, span.start, end,
                                                         &sumsq, &bad);
          });
        }
      }
      for (; i < end; ++i) {
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

void cpu_scale_grads(const std::vector<TensorEntry>& entries, double factor, CpuLoops loops) {
  if (loops != CpuLoops::kScalar) loops = resolve(loops);
  std::int64_t total = 0;
  const std::vector<Span> spans = spans_of(entries, &total);
  cpu::parallel_blocks(static_cast<std::int64_t>(spans.size()), total, [&](std::int64_t b) {
    const Span& span = spans[static_cast<std::size_t>(b)];
    const TensorEntry& e = entries[span.tensor];
    KILN_DISPATCH_FLOATING(dtype_of(e.grad_dtype), G, {
      using C = ComputeOf<G>;
      G* g = static_cast<G*>(e.grad);
      C f = static_cast<C>(factor);
      std::int64_t i = span.start;
      const std::int64_t end = span.start + span.count;
      if constexpr (is_vector_type<G>()) {
        if (loops != CpuLoops::kScalar) {
          i = with_loops(loops, [&](auto isa) {
            return decltype(isa)::template scale<G>(g, f, span.start, end);
          });
        }
      }
      for (; i < end; ++i) {
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
void cpu_rule_step(const std::vector<TensorEntry>& entries, const Rule& rule_in, CpuLoops loops) {
  Rule rule = rule_in;
  if constexpr (Rule::kTrustRatio) {
    cpu_lamb_apply(entries, rule, cpu_lamb_moments_sumsq(entries, rule));
  } else {
    if (!load_resident(rule)) return;
    cpu_elementwise(entries, rule, loops == CpuLoops::kScalar ? loops : resolve(loops));
  }
}

}  // namespace

#define KILN_OPTIMIZER_STEP_(kind, Rule)                                                     \
  void cpu_step(const std::vector<TensorEntry>& entries, const Rule& rule, CpuLoops loops) { \
    cpu_rule_step(entries, rule, loops);                                                     \
  }
KILN_OPTIMIZERS(KILN_OPTIMIZER_STEP_)
#undef KILN_OPTIMIZER_STEP_

}  // namespace kiln::optim::detail
