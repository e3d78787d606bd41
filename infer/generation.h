#pragma once
// Autoregressive generation from a causal language model (Task::CausalLM: GPT-2), one sequence at
// a time, as `kiln sample` runs it (docs/sample.md).
//
// With the KV cache (the default): one forward over the prompt, ids (1, P), with
// Context::kv_cache set, then one forward per new token, ids (1, 1), each at the next position;
// the attention layers keep the keys and values of everything before (layers/attention.h).
// Without it: a forward over the whole sequence so far for each new token (what the cache must
// reproduce, token for token under greedy decoding; the slow reference).
// The model runs in eval mode (no dropout). The sequence, prompt included, never grows past the
// model's max_positions: generation stops there, so every token sees its whole context (no
// sliding window, which positions learned from 0 would not support).
//
// Choosing a token happens on the host, from the last position's logits copied there:
// logits / temperature -> keep the top_k largest -> softmax (double) -> inverse CDF of a uniform
// from Philox (core/random.h) keyed by the seed, counter = the token's index among the new ones.
// The same logits and seed give the same token on every machine; CPU and CUDA logits differ in
// their last bits, so only nearly tied candidates can go different ways.

#include <cstdint>
#include <string>
#include <vector>

#include "core/device.h"
#include "layers/models/model.h"

namespace kiln::infer {

struct SamplingOptions {
  double temperature = 1.0;  // 0: greedy (argmax; the first of equal maxima)
  std::int64_t top_k = 0;    // keep the k most likely tokens (ties at the k-th kept too); 0: all
  std::uint64_t seed = 0;
};

// InputError for a negative or non-finite temperature or a negative top_k, naming them as the
// caller's user knows them (`kiln sample` says "--temperature" and "--top-k").
void check_sampling_options(const SamplingOptions& options,
                            const std::string& temperature_name = "temperature",
                            const std::string& top_k_name = "top_k");

// The next token from one position's logits (vocab); `draw` is the token's index among the
// generated ones. InputError for a negative or non-finite temperature or a negative top_k.
std::int64_t choose_token(const std::vector<float>& logits, const SamplingOptions& options,
                          std::uint64_t draw);

struct GenerationOptions {
  std::int64_t max_new_tokens = 64;
  bool kv_cache = true;
  SamplingOptions sampling;
  // Generation ends after any of these (kept as the last token): a chat turn's end token.
  std::vector<std::int64_t> stop_tokens;
};

enum class StopReason { MaxNewTokens, MaxPositions, StopToken };
// "max_new_tokens", "max_positions", "stop_token"
const char* stop_reason_name(StopReason reason);

struct Generation {
  std::vector<std::int64_t> tokens;  // the new tokens, after the prompt
  StopReason stop = StopReason::MaxNewTokens;
  std::int64_t forwards = 0;    // forward passes run
  std::int64_t positions = 0;   // positions those forwards computed (the work done)
  double prompt_seconds = 0;    // the first forward (the prompt's)
  double generate_seconds = 0;  // every forward after it, and the choices
};

class TokenGenerator {
 public:
  // `model`: a causal LM whose parameters are on `device`; it is put in eval mode.
  TokenGenerator(Model& model, Device device);

  // Throws InputError for an empty prompt, a prompt id outside [0, vocab), a prompt longer than
  // max_positions, a negative max_new_tokens, or bad sampling options.
  Generation generate(const std::vector<std::int64_t>& prompt, const GenerationOptions& options);

 private:
  // The logits (vocab) of the last position of the forward over `ids` at positions starting at
  // the cache's `past` (0 without a cache).
  std::vector<float> last_logits(Context& ctx, const std::vector<std::int64_t>& ids);

  Model& model_;
  Device device_;
};

}  // namespace kiln::infer
