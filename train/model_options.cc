#include "train/model_options.h"

namespace kiln::train {

ModelOptions default_model_options(const std::string& name) {
  ModelOptions o;
  o.name = name;
  if (name == "mlp" || name == "fashion_cnn") {
    o.num_classes = 10;
    o.image_size = 28;
    o.image_channels = 1;
    o.dropout = 0.0;
  } else {
    o.num_classes = 1000;
    o.image_size = 224;
    o.image_channels = 3;
    // BERT's hidden dropout is 0.1 (BertConfig); torchvision's vit_b_16 uses none.
    o.dropout = name == "bert_base" ? 0.1 : 0.0;
  }
  return o;
}

ModelOptions model_options_from(const config::Experiment& e) {
  const config::ModelConfig& m = e.model();
  ModelOptions o = default_model_options(m.name());
  if (m.has_num_classes()) o.num_classes = m.num_classes();
  if (m.has_image_size()) o.image_size = m.image_size();
  if (m.has_image_channels()) o.image_channels = m.image_channels();
  if (m.has_dropout()) o.dropout = m.dropout();
  o.cifar_stem = m.cifar_stem();
  if (m.mlp_hidden_size() > 0) o.mlp_hidden.assign(m.mlp_hidden().begin(), m.mlp_hidden().end());
  const config::BertShape& b = m.bert();
  if (b.has_vocab_size()) o.vocab_size = b.vocab_size();
  if (b.has_seq_len()) o.seq_len = b.seq_len();
  if (b.has_hidden_size()) o.hidden_size = b.hidden_size();
  if (b.has_num_layers()) o.num_layers = b.num_layers();
  if (b.has_num_heads()) o.num_heads = b.num_heads();
  o.intermediate_size = b.has_intermediate_size() ? b.intermediate_size() : 4 * o.hidden_size;
  return o;
}

}  // namespace kiln::train
