#include "core/gemm_algorithm.h"

#include <mutex>
#include <optional>

namespace kiln {
namespace {

struct Defaults {
  std::mutex mutex;
  std::optional<GemmAlgorithmOptions> set;
  GemmAlgorithmSearch conv_search = GemmAlgorithmSearch::Heuristic;
};

Defaults& defaults() {
  static Defaults d;
  return d;
}

}  // namespace

GemmAlgorithmOptions default_gemm_algorithm_options() {
  Defaults& d = defaults();
  std::lock_guard<std::mutex> lock(d.mutex);
  if (d.set) return *d.set;
  GemmAlgorithmOptions following;
  following.search = d.conv_search;
  return following;
}

void set_default_gemm_algorithm_options(const GemmAlgorithmOptions& options) {
  Defaults& d = defaults();
  std::lock_guard<std::mutex> lock(d.mutex);
  d.set = options;
}

void clear_default_gemm_algorithm_options() {
  Defaults& d = defaults();
  std::lock_guard<std::mutex> lock(d.mutex);
  d.set.reset();
}

void follow_conv_algorithm_search(GemmAlgorithmSearch conv_search) {
  Defaults& d = defaults();
  std::lock_guard<std::mutex> lock(d.mutex);
  d.conv_search = conv_search;
}

}  // namespace kiln
