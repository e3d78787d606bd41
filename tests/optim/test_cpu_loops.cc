// The CPU passes' vectorised loops (optim/multi_tensor.h CpuLoops) against the scalar loops, for
// every instruction set this processor runs: AdamW (fp32 and bf16 moments, AMSGrad) and SGD
// (momentum, dampening, Nesterov, none) over f32 and bf16 gradients, with and without a bf16 copy,
// unscaling and clipping factors, sizes that are no multiple of the vector block, a ZeRO offset
// whose blocks straddle 2^32; the unscale pass with inf and NaN gradients; gradient scaling.
// Every byte written must be equal.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "core/ops.h"
#include "optim/multi_tensor.h"

namespace kiln::optim::detail {
namespace {

const std::int64_t kSizes[] = {1, 63, 64, 65, 1000, 32768 + 77};  // the last: two spans

std::vector<CpuLoops> vector_loops() {
  std::vector<CpuLoops> out;
  for (CpuLoops l : {CpuLoops::kBaseline, CpuLoops::kAvx2, CpuLoops::kAvx512}) {
    if (cpu_loops_supported(l)) out.push_back(l);
  }
  return out;
}

Tensor random(std::int64_t n, DType dtype, double scale, std::uint64_t seed) {
  Tensor t = Tensor::empty({n}, DType::F32);
  ops::fill_normal(t, 0.0, scale, seed);
  return t.to(dtype);
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// One tensor's buffers for a rule step; clone() gives an independent copy of the same bytes.
struct Buffers {
  Tensor value, grad, copy, state[3];

  Buffers clone() const {
    Buffers b;
    b.value = value.clone();
    b.grad = grad.clone();
    if (copy.defined()) b.copy = copy.clone();
    for (int k = 0; k < 3; ++k) {
      if (state[k].defined()) b.state[k] = state[k].clone();
    }
    return b;
  }
  TensorEntry entry(double weight_decay, std::int64_t offset) const {
    TensorEntry e;
    e.value = value.data();
    e.grad = grad.data();
    e.copy = copy.defined() ? copy.data() : nullptr;
    e.state0 = state[0].defined() ? state[0].data() : nullptr;
    e.state1 = state[1].defined() ? state[1].data() : nullptr;
    e.state2 = state[2].defined() ? state[2].data() : nullptr;
    e.numel = value.numel();
    e.weight_decay = weight_decay;
    e.value_dtype = static_cast<std::int32_t>(value.dtype());
    e.grad_dtype = static_cast<std::int32_t>(grad.dtype());
    e.copy_dtype = static_cast<std::int32_t>(copy.defined() ? copy.dtype() : DType::F32);
    e.state_dtype = static_cast<std::int32_t>(state[0].defined() ? state[0].dtype() : DType::F32);
    e.rng_key = 0x5eed0000c0ffeeull + static_cast<std::uint64_t>(e.numel);
    e.element_offset = offset;
    return e;
  }
  void expect_equal(const Buffers& o, const std::string& what) const {
    EXPECT_TRUE(same_bytes(value, o.value)) << what << ": value";
    EXPECT_TRUE(same_bytes(copy, o.copy)) << what << ": copy";
    for (int k = 0; k < 3; ++k) EXPECT_TRUE(same_bytes(state[k], o.state[k])) << what << ": state";
  }
};

Buffers make_buffers(std::int64_t n, DType grad, DType copy, DType state, int states,
                     std::uint64_t seed) {
  Buffers b;
  b.value = random(n, DType::F32, 1.0, seed);
  b.grad = random(n, grad, 0.01, seed + 1);
  if (copy != DType::U8) b.copy = Tensor::zeros({n}, copy);
  for (int k = 0; k < states; ++k) {
    // Moments as after some steps (exp_avg_sq and its maximum >= 0).
    Tensor s = random(n, DType::F32, 1e-3, seed + 2 + static_cast<std::uint64_t>(k));
    float* v = s.data<float>();
    for (std::int64_t i = 0; k > 0 && i < n; ++i) v[i] = v[i] * v[i];
    b.state[k] = s.to(state);
  }
  return b;
}

// Runs `rule` for a few steps on the scalar loops and on every vectorised one from the same
// buffers, and compares every byte after each step.
template <typename Rule, typename Configure>
void check_rule(const std::string& name, int states, Configure configure) {
  std::uint64_t seed = 1;
  for (DType grad : {DType::F32, DType::BF16}) {
    for (DType copy : {DType::U8, DType::BF16, DType::F16}) {
      for (DType state : {DType::F32, DType::BF16}) {
        for (std::int64_t n : kSizes) {
          for (std::int64_t offset : {std::int64_t{0}, (std::int64_t{1} << 32) - 100}) {
            const std::string what = name + " grad " + dtype_name(grad) + " copy " +
                                     (copy == DType::U8 ? "none" : dtype_name(copy)) + " state " +
                                     dtype_name(state) + " n " + std::to_string(n) + " offset " +
                                     std::to_string(offset);
            Buffers ref = make_buffers(n, grad, copy, state, states, seed += 10);
            const std::vector<CpuLoops> all = vector_loops();
            std::vector<Buffers> vec;
            for (std::size_t l = 0; l < all.size(); ++l) vec.push_back(ref.clone());
            for (std::int64_t step = 0; step < 3; ++step) {
              Rule rule;
              configure(rule, step);
              cpu_step({ref.entry(0.01, offset)}, rule, CpuLoops::kScalar);
              for (std::size_t l = 0; l < all.size(); ++l) {
                cpu_step({vec[l].entry(0.01, offset)}, rule, all[l]);
                vec[l].expect_equal(
                    ref, what + " " + cpu_loops_name(all[l]) + " step " + std::to_string(step));
              }
            }
          }
        }
      }
    }
  }
}

// The step's fields as Optimizer::apply fills them; a clipping coefficient below 1 when `clip`.
template <typename Rule>
void load(Rule& rule, std::int64_t step, bool clip, float grad_unscale) {
  rule.lr = 1e-3;
  rule.grad_unscale = grad_unscale;
  rule.load_counts(step, 3.0, clip ? 1.0 : 0.0);
}

TEST(CpuLoops, AdamWMatchesScalar) {
  for (bool amsgrad : {false, true}) {
    for (bool clip : {false, true}) {
      for (float unscale : {1.0f, 1.0f / 1024.0f}) {
        check_rule<AdamWRule>(std::string("adamw") + (amsgrad ? " amsgrad" : "") +
                                  (clip ? " clip" : "") + (unscale != 1.0f ? " unscale" : ""),
                              amsgrad ? 3 : 2, [&](AdamWRule& r, std::int64_t step) {
                                r.amsgrad = amsgrad;
                                load(r, step, clip, unscale);
                              });
      }
    }
  }
}

TEST(CpuLoops, AdamWLerpOtherBranch) {
  // beta1 = 0.3: lerp_torch's weight 0.7 takes its second formula.
  check_rule<AdamWRule>("adamw beta1 0.3", 2, [](AdamWRule& r, std::int64_t step) {
    r.beta1 = 0.3;
    load(r, step, false, 1.0f);
  });
}

TEST(CpuLoops, SgdMatchesScalar) {
  struct Case {
    double momentum, dampening;
    bool nesterov;
  };
  for (Case c : {Case{0.0, 0.0, false}, Case{0.9, 0.0, false}, Case{0.9, 0.1, false},
                 Case{0.9, 0.0, true}}) {
    for (bool clip : {false, true}) {
      const std::string name = "sgd momentum " + std::to_string(c.momentum) + " dampening " +
                               std::to_string(c.dampening) + (c.nesterov ? " nesterov" : "") +
                               (clip ? " clip" : "");
      check_rule<SgdRule>(name, c.momentum != 0.0 ? 1 : 0, [&](SgdRule& r, std::int64_t step) {
        r.momentum = c.momentum;
        r.dampening = c.dampening;
        r.nesterov = c.nesterov;
        load(r, step, clip, 1.0f / 256.0f);
      });
    }
  }
}

TEST(CpuLoops, UnscaleCheckSumsqMatchesScalar) {
  std::uint64_t seed = 500;
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (std::int64_t n : kSizes) {
      // Clean gradients, then one inf, one NaN, one -inf at positions inside and after the blocks.
      for (int poison = 0; poison < 4; ++poison) {
        Tensor grad = random(n, dtype, 100.0, seed += 3);
        if (poison > 0) {
          Tensor f = grad.to(DType::F32);
          float* p = f.data<float>();
          const float bad[] = {std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::quiet_NaN(),
                               -std::numeric_limits<float>::infinity()};
          p[(n * poison) / 4] = bad[poison - 1];
          grad = f.to(dtype);
        }
        for (bool write : {false, true}) {
          const std::string what = std::string(dtype_name(dtype)) + " n " + std::to_string(n) +
                                   " poison " + std::to_string(poison) + (write ? " write" : "");
          auto run = [&](CpuLoops loops, Tensor* out, bool* found_inf) {
            *out = Tensor::zeros({n}, dtype);
            TensorEntry e;
            e.grad = grad.data();
            e.grad_dtype = static_cast<std::int32_t>(dtype);
            e.value = out->data();
            e.value_dtype = e.grad_dtype;
            e.numel = n;
            return cpu_unscale_check_sumsq({e, e}, 1.0 / 3.0, write, found_inf, loops);
          };
          Tensor ref_out;
          bool ref_inf = false;
          const double ref = run(CpuLoops::kScalar, &ref_out, &ref_inf);
          EXPECT_EQ(ref_inf, poison > 0) << what;
          for (CpuLoops loops : vector_loops()) {
            Tensor out;
            bool found_inf = false;
            const double sumsq = run(loops, &out, &found_inf);
            EXPECT_EQ(std::memcmp(&sumsq, &ref, sizeof ref), 0)
                << what << " " << cpu_loops_name(loops) << ": " << sumsq << " vs " << ref;
            EXPECT_EQ(found_inf, ref_inf) << what << " " << cpu_loops_name(loops);
            EXPECT_TRUE(same_bytes(out, ref_out)) << what << " " << cpu_loops_name(loops);
          }
        }
      }
    }
  }
}

TEST(CpuLoops, ScaleGradsMatchesScalar) {
  std::uint64_t seed = 900;
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (std::int64_t n : kSizes) {
      const Tensor grad = random(n, dtype, 10.0, seed += 2);
      auto run = [&](CpuLoops loops) {
        Tensor g = grad.clone();
        TensorEntry e;
        e.grad = g.data();
        e.grad_dtype = static_cast<std::int32_t>(dtype);
        e.numel = n;
        cpu_scale_grads({e}, 0.123456789, loops);
        return g;
      };
      const Tensor ref = run(CpuLoops::kScalar);
      for (CpuLoops loops : vector_loops()) {
        EXPECT_TRUE(same_bytes(run(loops), ref))
            << dtype_name(dtype) << " n " << n << " " << cpu_loops_name(loops);
      }
    }
  }
}

TEST(CpuLoops, BestIsOneThisProcessorRuns) {
  const std::string best = cpu_loops_name(CpuLoops::kBest);
  EXPECT_TRUE(best == "avx512" || best == "avx2" || best == "baseline") << best;
  EXPECT_TRUE(cpu_loops_supported(CpuLoops::kBaseline));
  std::cout << "[          ] best CPU loops here: " << best << "\n";
}

}  // namespace
}  // namespace kiln::optim::detail
