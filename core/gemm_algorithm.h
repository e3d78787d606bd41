#pragma once
// How cuBLASLt GEMMs choose their algorithm (core/cuda/cublaslt_gemm.h): the heuristic's first
// choice, or the fastest of its first candidates, timed once per shape (torch's
// cudnn.benchmark, for GEMMs). Process-wide, like default_conv_algorithm_options (layers/conv2d.h).

namespace kiln {

enum class GemmAlgorithmSearch {
  Heuristic,  // the heuristic's first choice: no time spent searching
  Benchmark,  // time up to 8 of the heuristic's candidates once per shape (deterministic runs
              // keep Heuristic)
};

struct GemmAlgorithmOptions {
  GemmAlgorithmSearch search = GemmAlgorithmSearch::Heuristic;
};

// The options new GEMM plans are made with: those last set, or, while none are set, the
// convolutions' search mode (GEMMs followed cudnn.benchmark before they had their own switch).
GemmAlgorithmOptions default_gemm_algorithm_options();
void set_default_gemm_algorithm_options(const GemmAlgorithmOptions& options);
// Forgets the options set, so that GEMMs follow the convolutions' search mode again.
void clear_default_gemm_algorithm_options();
// The convolutions' search mode, which GEMMs follow while no options are set. Called by
// set_default_conv_algorithm_options (core does not know layers/).
void follow_conv_algorithm_search(GemmAlgorithmSearch conv_search);

}  // namespace kiln
