#include "infer/generation.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <sstream>
#include <string>

#include "core/check.h"
#include "core/random.h"
#include "layers/attention.h"

namespace kiln::infer {
namespace {

std::string number(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

void check_sampling_options(const SamplingOptions& options, const std::string& temperature_name,
                            const std::string& top_k_name) {
  if (!(options.temperature >= 0) || !std::isfinite(options.temperature)) {
    throw InputError(temperature_name + " " + number(options.temperature) +
                     ": must be a finite number >= 0 (0 = greedy)");
  }
  if (options.top_k < 0) {
    throw InputError(top_k_name + " " + std::to_string(options.top_k) + ": must be >= 0 (0 = off)");
  }
}

std::int64_t choose_token(const std::vector<float>& logits, const SamplingOptions& options,
                          std::uint64_t draw) {
  check_sampling_options(options);
  KILN_CHECK(!logits.empty(), "choose_token: no logits");
  for (float v : logits) {
    if (std::isnan(v) || v == INFINITY) {
      throw Error("the model produced non-finite logits (" + std::to_string(v) +
                  "): the weights are broken");
    }
  }
  const std::size_t vocab = logits.size();
  const auto argmax = static_cast<std::int64_t>(std::max_element(logits.begin(), logits.end()) -
                                                logits.begin());  // the first maximum
  if (options.temperature == 0) return argmax;

  std::vector<double> scaled(vocab);
  for (std::size_t i = 0; i < vocab; ++i) scaled[i] = logits[i] / options.temperature;
  // Top-k as nanoGPT's sample.py: everything below the k-th largest value is dropped.
  double threshold = -INFINITY;
  if (options.top_k > 0 && static_cast<std::size_t>(options.top_k) < vocab) {
    std::vector<double> sorted = scaled;
    const auto kth = sorted.begin() + (options.top_k - 1);
    std::nth_element(sorted.begin(), kth, sorted.end(), std::greater<double>());
    threshold = *kth;
  }
  const double top = scaled[static_cast<std::size_t>(argmax)];
  std::vector<double> weights(vocab, 0.0);
  double total = 0;
  for (std::size_t i = 0; i < vocab; ++i) {
    if (scaled[i] >= threshold) weights[i] = std::exp(scaled[i] - top);
    total += weights[i];
  }
  // Inverse CDF in index order; the argmax's weight is 1, so total >= 1.
  const double u = philox_uniform(philox(draw, options.seed).v[0]) * total;
  double cumulative = 0;
  std::int64_t last_kept = argmax;
  for (std::size_t i = 0; i < vocab; ++i) {
    if (weights[i] == 0) continue;
    cumulative += weights[i];
    last_kept = static_cast<std::int64_t>(i);
    if (u < cumulative) return last_kept;
  }
  return last_kept;  // rounding left u at the very top
}

const char* stop_reason_name(StopReason reason) {
  switch (reason) {
    case StopReason::MaxPositions:
      return "max_positions";
    case StopReason::StopToken:
      return "stop_token";
    case StopReason::MaxNewTokens:
      break;
  }
  return "max_new_tokens";
}

TokenGenerator::TokenGenerator(Model& model, Device device) : model_(model), device_(device) {
  if (model_.task != Task::CausalLM) {
    throw InputError(
        "generation needs a causal language model (GPT-2, the llama family); this model is not "
        "one");
  }
  model_.net->set_training(false);
}

std::vector<float> TokenGenerator::last_logits(Context& ctx, const std::vector<std::int64_t>& ids) {
  const auto t = static_cast<std::int64_t>(ids.size());
  Tensor input = Tensor::from_vector(ids, {1, t}).to(device_);  // (1, T)
  Tensor logits = model_.net->forward(ctx, input);              // (1, T, V)
  return logits.select(1, t - 1).to_vector<float>();            // (1, V) on the host
}

Generation TokenGenerator::generate(const std::vector<std::int64_t>& prompt,
                                    const GenerationOptions& options) {
  const std::int64_t vocab = model_.num_outputs, limit = model_.max_positions;
  const auto prompt_len = static_cast<std::int64_t>(prompt.size());
  if (prompt.empty()) throw InputError("the prompt is empty: give at least one token");
  for (std::int64_t id : prompt) {
    if (id < 0 || id >= vocab) {
      throw InputError("prompt token " + std::to_string(id) +
                       " is outside the model's vocabulary "
                       "[0, " +
                       std::to_string(vocab) + ")");
    }
  }
  if (prompt_len > limit) {
    throw InputError("the prompt has " + std::to_string(prompt_len) +
                     " tokens, more than the model's max_positions " + std::to_string(limit));
  }
  if (options.max_new_tokens < 0) {
    throw InputError("max_new_tokens " + std::to_string(options.max_new_tokens) + ": must be >= 0");
  }
  check_sampling_options(options.sampling);

  Generation g;
  const std::int64_t budget = std::min(options.max_new_tokens, limit - prompt_len);
  g.stop = budget < options.max_new_tokens ? StopReason::MaxPositions : StopReason::MaxNewTokens;
  KvCache cache;
  cache.capacity = limit;
  Context ctx;
  ctx.run.device = device_;
  ctx.training = false;
  if (options.kv_cache) ctx.call.kv_cache = &cache;
  std::vector<std::int64_t> sequence = prompt;
  auto start = std::chrono::steady_clock::now();
  for (std::int64_t i = 0; i < budget; ++i) {
    std::vector<float> logits;
    if (options.kv_cache) {
      // The prompt in one forward, then only the newest token at the next position.
      const std::vector<std::int64_t> input =
          i == 0 ? prompt : std::vector<std::int64_t>{sequence.back()};
      logits = last_logits(ctx, input);
      cache.past += static_cast<std::int64_t>(input.size());
      g.positions += static_cast<std::int64_t>(input.size());
    } else {
      logits = last_logits(ctx, sequence);
      g.positions += static_cast<std::int64_t>(sequence.size());
    }
    ++g.forwards;
    const std::int64_t token =
        choose_token(logits, options.sampling, static_cast<std::uint64_t>(i));
    sequence.push_back(token);
    g.tokens.push_back(token);
    if (i == 0) {
      g.prompt_seconds = seconds_since(start);
      start = std::chrono::steady_clock::now();
    }
    if (std::find(options.stop_tokens.begin(), options.stop_tokens.end(), token) !=
        options.stop_tokens.end()) {
      g.stop = StopReason::StopToken;
      break;
    }
  }
  if (g.tokens.size() > 1) g.generate_seconds = seconds_since(start);
  return g;
}

}  // namespace kiln::infer
