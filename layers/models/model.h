#pragma once
// Models: a network, what it takes as input, and what its loss is. Built by name through an
// explicit registry (models/registry.cc); an unknown name lists the known ones.

#include <memory>
#include <string>
#include <vector>

#include "layers/fp8_projection.h"
#include "layers/layer.h"
#include "layers/lora.h"

namespace kiln {

struct ModelOptions {
  std::string name = "mlp";
  int num_classes = 10;
  int image_size = 28;
  int image_channels = 1;
  bool cifar_stem = false;  // ResNet: 3x3 stride-1 stem without max-pool, for 32x32 images
  double dropout = 0.1;     // transformers
  // train.recompute: BLOCKS: transformer blocks and ResNet stages recompute their activations in
  // backward from their input (Layer::set_recompute).
  bool recompute_blocks = false;
  // train.recompute: KEEP_ALL: GPT-2's blocks keep their GELU output instead of recomputing it
  // (TransformerBlockConfig::recompute_mlp_activation).
  bool keep_mlp_activation = false;
  // ResNet: batch norm fused into cuDNN's convolutions in CUDA training
  // (model.fuse_conv_batch_norm; layers/conv_bn_chain.h).
  bool fuse_conv_batch_norm = false;
  // mlp: hidden widths (empty: none). Kiln's commands take them from the experiment, whose
  // default is declared once, in configs/kiln.proto (model.mlp_hidden).
  std::vector<int> mlp_hidden;
  // BERT (HuggingFace BertConfig defaults)
  int vocab_size = 30522;
  int seq_len = 128;
  int hidden_size = 768;
  int num_layers = 12;
  int num_heads = 12;
  int intermediate_size = 3072;
  int max_position_embeddings = 512;
  int type_vocab_size = 2;
  // GPT-2 takes its shape from the fields above (vocab_size, seq_len, hidden_size, num_layers,
  // num_heads, intermediate_size) and max_positions; the experiment's model.gpt fills them.
  int max_positions = 1024;
  // The llama family (Llama 3, Qwen2.5) takes the shared fields above too (vocab_size, seq_len,
  // hidden_size, num_layers, num_heads, intermediate_size, max_positions) and these; the
  // experiment's model.llama fills them.
  struct Llama {
    int num_kv_heads = 0;  // 0: num_heads
    int head_dim = 0;      // 0: hidden_size / num_heads
    double rope_theta = 10000.0;
    double rms_norm_eps = 1e-6;
    bool tie_embeddings = true;
    bool qkv_bias = false;            // Qwen2
    double rope_llama3_factor = 0.0;  // rope_scaling {rope_type: llama3}; 0: none
    double rope_low_freq_factor = 1.0;
    double rope_high_freq_factor = 4.0;
    int rope_original_max_positions = 8192;
  } llama;
  // The llama family: LoRA adapters (model.lora); with them every other parameter is frozen.
  LoraOptions lora;
  // precision.fp8: GPT-2's and the llama family's block projections in FP8 in training.
  Fp8Settings fp8;
};

enum class Task { Classification, MaskedLM, CausalLM };

// A causal language model whose last layer, the head, maps hidden states to vocabulary scores row
// by row (GPT-2, the llama family): training may run the head over chunks of rows together with
// the loss (train/loss_stage.h), so that the (B*T, V) logits never exist whole.
class HeadedLanguageModel : public Layer {
 public:
  Layer& head() { return *head_; }
  // The layers below the head: ids (B, T) -> the head's input (B, T, E).
  virtual Tensor forward_body(Context& ctx, const Tensor& ids) = 0;
  // Backward through them from the gradient of the head's input (the ids have none).
  virtual void backward_body(Context& ctx, const Tensor& dh) = 0;

 protected:
  Tensor forward_impl(Context& ctx, const Tensor& ids) final {
    return head_->forward(ctx, forward_body(ctx, ids));
  }
  Tensor backward_impl(Context& ctx, const Tensor& dy) final {
    backward_body(ctx, head_->backward(ctx, dy));
    return Tensor();
  }
  Layer* head_ = nullptr;  // set by the model, a child of it
};

struct Model {
  std::unique_ptr<Layer> net;
  Shape sample_shape;              // one input sample: (C, H, W), (features) or (T)
  DType input_dtype = DType::F32;  // F32 images and features, I64 token ids
  Task task = Task::Classification;
  int num_outputs = 0;  // classes, or the vocabulary for masked LM
  // Output of net for a batch: (B, num_outputs) or (B, T, vocab) for masked and causal LM.
  // Causal LM: the logits at position t predict the token at t + 1 (the dataset's target).
  std::int64_t max_positions = 0;  // causal LM: the longest context the positions cover
};

Model make_model(const ModelOptions& options);  // throws InputError for an unknown name
// The Model of a token network (BERT, GPT-2): (seq_len) I64 ids in, scores over the vocabulary
// out, its parameters initialised with seed 0.
Model token_model(std::unique_ptr<Layer> net, const ModelOptions& options, Task task);
// The Model of an image classifier (ResNet, ViT, the Fashion CNN): (C, H, W) f32 images in,
// num_classes scores out, its parameters initialised with seed 0.
Model image_model(std::unique_ptr<Layer> net, const ModelOptions& options);
const std::vector<std::string>& model_names();

// One per model family, implemented beside it.
Model make_mlp(const ModelOptions& options);
Model make_fashion_cnn(const ModelOptions& options);
Model make_resnet(const ModelOptions& options, int depth);  // 18 or 50
Model make_bert(const ModelOptions& options);
Model make_vit_b16(const ModelOptions& options);
// GPT-2 of options' shape: "gpt2" (124M), "gpt2_medium", "gpt2_large" and "gpt2_xl" differ only
// in the shape the experiment gives them (configs/defaults.cc holds the sizes).
Model make_gpt2(const ModelOptions& options);
// The llama family (models/llama.cc): transformers' LlamaForCausalLM and Qwen2ForCausalLM of
// options' shape; every preset name ("llama", "qwen2_5_0_5b", "llama3_2_1b", ...) differs only in
// the shape the experiment gives it (configs/defaults.cc holds the sizes).
Model make_llama(const ModelOptions& options);

}  // namespace kiln
