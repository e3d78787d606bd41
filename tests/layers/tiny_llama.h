#pragma once
// What the transformer layers' CPU tests share: the f64 context of a gradient check, and a tiny
// llama's shape (2 layers, 8 wide, grouped-query attention 4:2, vocabulary 19).

#include <cstdint>

#include "layers/layer.h"
#include "layers/models/model.h"

namespace kiln::llama_test {

// Layers compute in f64 on the CPU; dropout sees step 3 under seed 99.
inline Context f64_context() {
  Context ctx;
  ctx.run.precision.activation = DType::F64;
  ctx.run.precision.matmul = DType::F64;
  ctx.run.seed = 99;
  static const std::uint64_t kStep = 3;
  ctx.step.step = &kStep;
  return ctx;
}

// model `name` ("llama" or "qwen2"), T = 6 of max_positions 12, rope_theta 50.
inline ModelOptions tiny_llama_options(const char* name) {
  ModelOptions o;
  o.name = name;
  o.vocab_size = 19;
  o.hidden_size = 8;
  o.num_layers = 2;
  o.num_heads = 4;
  o.intermediate_size = 12;
  o.max_positions = 12;
  o.seq_len = 6;
  o.llama.num_kv_heads = 2;
  o.llama.rope_theta = 50.0;
  o.llama.rms_norm_eps = 1e-5;
  return o;
}

}  // namespace kiln::llama_test
