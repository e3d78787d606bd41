// The host optimizer step (what train.offload HOST_CORES runs): N parameters of O2's shape (bf16
// weights and gradients, fp32 masters made by MixedPrecisionOptimizer) in tensors of 4M elements,
// timed through the public API on 1 thread and on all cores: one AdamW step with fp32 and with bf16
// moments, SGD with momentum, the unscale + finiteness check + norm pass, and gradient clipping's
// scaling. Prints ns per element, the memory traffic in GB/s, and a projection to 1.54 B parameters
// on 16 cores (this machine's 1-thread time divided by 16, as if the cores scaled perfectly and the
// memory kept up).
//
//   optim_host_bench [--params N] [--repeats R]

#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/cpu/parallel.h"
#include "core/dtype.h"
#include "core/random.h"
#include "optim/amp/amp.h"
#include "optim/optimizer.h"

namespace {

using namespace kiln;
using namespace kiln::optim;
using Clock = std::chrono::steady_clock;

constexpr std::int64_t kTensorElements = std::int64_t{1} << 22;
constexpr double kProjectedParams = 1.54e9;
constexpr int kProjectedCores = 16;

// O2's parameters: bf16 weights and gradients, split into tensors of kTensorElements.
struct Model {
  std::vector<Parameter> params;
  std::vector<Parameter*> list() {
    std::vector<Parameter*> out;
    for (Parameter& p : params) out.push_back(&p);
    return out;
  }
};

// Values in [-scale, scale) from a hash of the element's index (cheap, and the same every run).
Tensor hashed_bf16(std::int64_t count, std::uint32_t seed, float scale) {
  Tensor t = Tensor::empty({count}, DType::BF16);
  BFloat16* out = t.data<BFloat16>();
  for (std::int64_t i = 0; i < count; ++i) {
    const std::uint32_t h = mix32(static_cast<std::uint32_t>(i) ^ mix32(seed));
    out[i] = to_bf16(scale * (static_cast<float>(h >> 8) * (2.0f / 16777216.0f) - 1.0f));
  }
  return t;
}

Model make_model(std::int64_t n) {
  Model m;
  for (std::int64_t start = 0, t = 0; start < n; start += kTensorElements, ++t) {
    const std::int64_t count = std::min(kTensorElements, n - start);
    Parameter p;
    p.name = "layer" + std::to_string(t) + ".weight";
    p.value = hashed_bf16(count, static_cast<std::uint32_t>(2 * t), 0.05f);
    p.grad = hashed_bf16(count, static_cast<std::uint32_t>(2 * t + 1), 1e-3f);
    m.params.push_back(std::move(p));
  }
  return m;
}

// The best of `repeats` timings of f (after one untimed call).
double best_seconds(int repeats, const std::function<void()>& f) {
  f();
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const Clock::time_point start = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return best;
}

void report(const char* what, double seconds, std::int64_t n, double bytes_per_element,
            int threads) {
  const double ns = seconds * 1e9 / static_cast<double>(n);
  const double gbs = bytes_per_element * static_cast<double>(n) / seconds / 1e9;
  std::printf("  %-34s %8.3f s  %6.2f ns/elem  %6.2f GB/s", what, seconds, ns, gbs);
  if (threads == 1) {
    std::printf("  -> %.2f s for 1.54 B on 16 cores",
                ns * 1e-9 * kProjectedParams / kProjectedCores);
  }
  std::printf("\n");
}

OptimizerOptions adamw(MomentsDtype moments) {
  OptimizerOptions o;
  o.kind = OptimizerKind::AdamW;
  o.lr = 1e-4;
  o.weight_decay = 0.1;
  o.moments_dtype = moments;
  return o;
}

// One optimizer configuration: a MixedPrecisionOptimizer at O2 (bf16), its unscale pass run
// before the timed step so that the step times only the update.
void bench_step(const char* what, const OptimizerOptions& o, std::int64_t n, double bytes,
                int repeats, int threads) {
  Model m = make_model(n);
  AmpOptions a;
  a.level = OptLevel::O2;
  a.half = HalfType::BF16;
  MixedPrecisionOptimizer opt(m.list(), o, a);
  double best = 1e30;
  for (int r = 0; r <= repeats; ++r) {  // the first step (state allocation) is not counted
    opt.unscale_and_check();
    const Clock::time_point start = Clock::now();
    opt.step();
    if (r > 0) best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  report(what, best, n, bytes, threads);
}

void bench_passes(std::int64_t n, int repeats, int threads) {
  Model m = make_model(n);
  AmpOptions a;
  a.level = OptLevel::O2;
  a.half = HalfType::BF16;
  MixedPrecisionOptimizer opt(m.list(), adamw(MomentsDtype::FP32), a);
  report("unscale + check + norm (O2)", best_seconds(repeats, [&] { opt.unscale_and_check(); }), n,
         2, threads);
  std::vector<Tensor> grads;
  for (Parameter& p : m.params) grads.push_back(p.grad);
  const double norm_s = best_seconds(repeats, [&] { (void)global_norm(grads); });
  // A max_norm above any norm these gradients reach except by scaling: every call scales by
  // just under 1 (norm + 1e-6 > norm), so the gradients shrink by a few ulps per repeat.
  const double norm = global_norm(grads);
  const double clip_s = best_seconds(repeats, [&] { (void)clip_grad_norm(grads, norm * 0.999); });
  report("gradient scaling (clip - norm)", std::max(clip_s - norm_s, 1e-9), n, 4, threads);
}

void run_all(std::int64_t n, int repeats, int threads) {
  std::printf("threads %d (KILN_CPU_THREADS), %lld parameters\n", threads,
              static_cast<long long>(n));
  // Bytes per element moved: masters 4+4, bf16 grad 2, bf16 copy 2, each moment read + written.
  bench_step("AdamW fp32 moments", adamw(MomentsDtype::FP32), n, 12 + 16, repeats, threads);
  bench_step("AdamW bf16 moments", adamw(MomentsDtype::BF16), n, 12 + 8, repeats, threads);
  OptimizerOptions sgd;
  sgd.kind = OptimizerKind::SGD;
  sgd.lr = 1e-2;
  sgd.momentum = 0.9;
  sgd.weight_decay = 1e-4;
  bench_step("SGD momentum (fp32 buffer)", sgd, n, 12 + 8, repeats, threads);
  bench_passes(n, repeats, threads);
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t n = 100'000'000;
  int repeats = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--params" && i + 1 < argc) {
      n = std::atoll(argv[++i]);
    } else if (arg == "--repeats" && i + 1 < argc) {
      repeats = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: optim_host_bench [--params N] [--repeats R]\n");
      return 2;
    }
  }
  if (n <= 0 || repeats <= 0) {
    std::fprintf(stderr, "optim_host_bench: --params and --repeats must be > 0\n");
    return 2;
  }
  // host_threads() reads KILN_CPU_THREADS once: each thread count runs in a child process.
  if (std::getenv("KILN_CPU_THREADS") != nullptr) {
    run_all(n, repeats, cpu::host_threads());
    return 0;
  }
  const int cores = cpu::host_threads();
  for (int threads : {1, cores}) {
    const std::string cmd = "KILN_CPU_THREADS=" + std::to_string(threads) + " '" + argv[0] +
                            "' --params " + std::to_string(n) + " --repeats " +
                            std::to_string(repeats);
    if (std::system(cmd.c_str()) != 0) return 1;
    if (cores == 1) break;
  }
  return 0;
}
