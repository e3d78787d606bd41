// config.json of transformers' LlamaConfig, Qwen2Config and GPT2Config, read into model.llama /
// model.gpt, compared with an experiment's model and written back (configs/hf_config.h).
#include "configs/hf_config.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <utility>

#include "configs/internal.h"
#include "configs/schema.h"

namespace kiln::config {
namespace {

namespace pb = google::protobuf;
using detail::number_text;
using detail::PathKind;
using detail::quote;

// A config.json is a few kB and an index of a 70B model's shards tens of kB.
constexpr std::uintmax_t kMaxJsonBytes = 64u << 20;

// The text of `file`, which must be a regular file (a FIFO or a device is never opened: reading
// it could block or never end).
std::string read_json_text(const std::string& file, const std::string& field) {
  std::string kind;
  const PathKind found = detail::path_kind(file, &kind);
  if (found == PathKind::kMissing) {
    throw ConfigError(field + ": " + file + ": no such file");
  }
  if (found != PathKind::kRegular) {
    throw ConfigError(field + ": " + file + " is " + kind + ", not a JSON file");
  }
  std::error_code error;
  const std::uintmax_t size = std::filesystem::file_size(file, error);
  if (error || size > kMaxJsonBytes) {
    throw ConfigError(field + ": " + file + ": " +
                      (error ? error.message() : "larger than 64 MiB, not a transformers JSON"));
  }
  std::ifstream in(file, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in) throw ConfigError(field + ": " + file + ": cannot be read");
  return text.str();
}

// protobuf's JSON parser into a Struct (every JSON object is one). Its message is a line saying
// what is wrong, the line of text around it and a caret under the place: kept on one line.
pb::Struct parse_json(const std::string& file, const std::string& field) {
  const std::string text = read_json_text(file, field);
  pb::Struct root;
  const auto status = pb::util::JsonStringToMessage(text, &root);
  if (status.ok()) return root;
  std::string message(status.message().data(), status.message().size());
  std::vector<std::string> lines;
  std::istringstream in(message);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::string what = lines.empty() ? "unreadable" : detail::trim(lines[0]);
  if (what.rfind(": ", 0) == 0) what = what.substr(2);
  const std::string excerpt = lines.size() >= 3 ? detail::trim(lines[1].substr(0, 60)) : "";
  what += excerpt.empty() ? " (at the end of the text)" : " at '" + excerpt + "'";
  throw ConfigError(file + " (" + field + "): not valid JSON: " + what);
}

// One JSON object of a file, its keys read with the file and the key named in every error.
class JsonObject {
 public:
  JsonObject(const pb::Struct& s, std::string file, std::string prefix = "")
      : s_(&s), file_(std::move(file)), prefix_(std::move(prefix)) {}

  // Absent and null are the same to transformers: the default applies.
  const pb::Value* find(const std::string& key) const {
    const auto it = s_->fields().find(key);
    if (it == s_->fields().end() || it->second.kind_case() == pb::Value::kNullValue) return nullptr;
    return &it->second;
  }
  bool has(const std::string& key) const { return find(key) != nullptr; }

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw ConfigError(file_ + ": " + quote(prefix_ + key) + " " + what);
  }
  const pb::Value& require(const std::string& key, const std::string& fills) const {
    const pb::Value* v = find(key);
    if (v == nullptr) fail(key, "is missing (" + fills + " comes from it)");
    return *v;
  }
  std::int32_t integer(const std::string& key, const std::string& fills) const {
    const pb::Value& v = require(key, fills);
    const double x = v.number_value();
    if (v.kind_case() != pb::Value::kNumberValue || x != std::floor(x) || x < 1 ||
        x > std::numeric_limits<std::int32_t>::max()) {
      fail(key, "is " + text_of(v) + ", expected a whole number >= 1 (for " + fills + ")");
    }
    return static_cast<std::int32_t>(x);
  }
  double number(const std::string& key, const std::string& fills) const {
    const pb::Value& v = require(key, fills);
    if (v.kind_case() != pb::Value::kNumberValue) {
      fail(key, "is " + text_of(v) + ", expected a number (for " + fills + ")");
    }
    return v.number_value();
  }
  bool boolean(const std::string& key, const std::string& fills) const {
    const pb::Value& v = require(key, fills);
    if (v.kind_case() != pb::Value::kBoolValue) {
      fail(key, "is " + text_of(v) + ", expected true or false (for " + fills + ")");
    }
    return v.bool_value();
  }
  std::string text(const std::string& key, const std::string& fills) const {
    const pb::Value& v = require(key, fills);
    if (v.kind_case() != pb::Value::kStringValue) {
      fail(key, "is " + text_of(v) + ", expected a string (for " + fills + ")");
    }
    return v.string_value();
  }
  JsonObject object(const std::string& key, const std::string& fills) const {
    const pb::Value& v = require(key, fills);
    if (v.kind_case() != pb::Value::kStructValue) {
      fail(key, "is " + text_of(v) + ", expected an object (for " + fills + ")");
    }
    return JsonObject(v.struct_value(), file_, prefix_ + key + ".");
  }
  // A key whose value must be `want` for Kiln to build the same network (an unsupported option).
  void expect_value(const std::string& key, const std::string& want, const std::string& why) const {
    const pb::Value* v = find(key);
    if (v != nullptr && text_of(*v) != want) fail(key, "is " + text_of(*v) + ": " + why);
  }

  static std::string text_of(const pb::Value& v) {
    switch (v.kind_case()) {
      case pb::Value::kNumberValue:
        return number_text(v.number_value());
      case pb::Value::kStringValue:
        return quote(v.string_value());
      case pb::Value::kBoolValue:
        return v.bool_value() ? "true" : "false";
      case pb::Value::kStructValue:
        return "an object";
      case pb::Value::kListValue:
        return "a list";
      default:
        return "null";
    }
  }

 private:
  const pb::Struct* s_;  // a pointer: a JsonObject is assigned (std::optional)
  std::string file_, prefix_;
};

// The keys that map one to one onto a shape field, compared field by field. kRequired: read by
// type (int32, double, bool) and config.json must have it (save_pretrained always writes it);
// kDefaulted: read by type where present, transformers' default otherwise (read_llama, read_gpt);
// kByHand: read by read_rope or read_llama (several keys or transformers versions give them).
enum Read { kRequired, kDefaulted, kByHand };
struct Key {
  const char* json;
  const char* field;  // in the shape message; "rope_scaling.factor" in its sub-message
  Read read;
};
constexpr Key kLlamaKeys[] = {
    {"vocab_size", "vocab_size", kRequired},
    {"hidden_size", "hidden_size", kRequired},
    {"num_hidden_layers", "num_layers", kRequired},
    {"num_attention_heads", "num_heads", kRequired},
    {"num_key_value_heads", "num_kv_heads", kDefaulted},
    {"head_dim", "head_dim", kDefaulted},
    {"intermediate_size", "intermediate_size", kRequired},
    {"max_position_embeddings", "max_positions", kRequired},
    {"rms_norm_eps", "rms_norm_eps", kRequired},
    {"tie_word_embeddings", "tie_embeddings", kDefaulted},
    {"rope_theta", "rope_theta", kByHand},
    {"attention_bias", "qkv_bias", kByHand},
    {"rope_scaling.factor", "rope_scaling.factor", kByHand},
    {"rope_scaling.low_freq_factor", "rope_scaling.low_freq_factor", kByHand},
    {"rope_scaling.high_freq_factor", "rope_scaling.high_freq_factor", kByHand},
    {"rope_scaling.original_max_position_embeddings", "rope_scaling.original_max_positions",
     kByHand},
};
constexpr Key kGptKeys[] = {
    {"vocab_size", "vocab_size", kRequired},      {"n_embd", "hidden_size", kRequired},
    {"n_layer", "num_layers", kRequired},         {"n_head", "num_heads", kRequired},
    {"n_inner", "intermediate_size", kDefaulted}, {"n_positions", "max_positions", kRequired},
};

// The message and field a Key's `field` path names inside `shape` (an absent sub-message reads
// as its default instance, every field unset).
std::pair<const pb::Message*, const pb::FieldDescriptor*> locate(const pb::Message& shape,
                                                                 const std::string& path) {
  const std::size_t dot = path.find('.');
  if (dot == std::string::npos) {
    return {&shape, shape.GetDescriptor()->FindFieldByName(path)};
  }
  const pb::FieldDescriptor* sub = shape.GetDescriptor()->FindFieldByName(path.substr(0, dot));
  const pb::Message& m = shape.GetReflection()->GetMessage(shape, sub);
  return locate(m, path.substr(dot + 1));
}

void read_plain_keys(const JsonObject& j, const Key* begin, const Key* end,
                     const std::string& shape_path, pb::Message& shape) {
  const pb::Reflection* r = shape.GetReflection();
  for (const Key* k = begin; k != end; ++k) {
    if (k->read == kByHand || (k->read == kDefaulted && !j.has(k->json))) continue;
    const pb::FieldDescriptor* f = shape.GetDescriptor()->FindFieldByName(k->field);
    const std::string fills = shape_path + k->field;
    switch (f->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_INT32:
        r->SetInt32(&shape, f, j.integer(k->json, fills));
        break;
      case pb::FieldDescriptor::CPPTYPE_DOUBLE:
        r->SetDouble(&shape, f, j.number(k->json, fills));
        break;
      default:
        r->SetBool(&shape, f, j.boolean(k->json, fills));
    }
  }
}

// rope_theta and rope_scaling, in transformers 4's keys (rope_theta, rope_scaling {rope_type or
// type, factor, ...}) or 5's (rope_parameters {rope_type, rope_theta, factor, ...}); where both
// are given, transformers 5 takes rope_scaling's type and factors and rope_parameters' theta.
void read_rope(const JsonObject& j, LlamaShape& s) {
  const std::string at = "model.llama.";
  std::optional<JsonObject> parameters;
  if (j.has("rope_parameters")) parameters = j.object("rope_parameters", at + "rope_theta");
  if (parameters && parameters->has("rope_theta")) {
    s.set_rope_theta(parameters->number("rope_theta", at + "rope_theta"));
  } else {
    s.set_rope_theta(j.has("rope_theta") ? j.number("rope_theta", at + "rope_theta") : 10000.0);
  }
  std::optional<JsonObject> scaling = parameters;
  if (j.has("rope_scaling")) scaling = j.object("rope_scaling", at + "rope_scaling");
  if (!scaling) return;
  const std::string type_key = scaling->has("rope_type") ? "rope_type" : "type";
  const std::string type =
      scaling->has(type_key) ? scaling->text(type_key, at + "rope_scaling") : "default";
  if (type == "default") return;
  if (type != "llama3") {
    scaling->fail(type_key, "is " + quote(type) +
                                ": Kiln's rotary positions take Llama 3.1's scaling (\"llama3\") "
                                "or none (\"default\")");
  }
  RopeScaling& r = *s.mutable_rope_scaling();
  r.set_factor(scaling->number("factor", at + "rope_scaling.factor"));
  r.set_low_freq_factor(scaling->number("low_freq_factor", at + "rope_scaling.low_freq_factor"));
  r.set_high_freq_factor(scaling->number("high_freq_factor", at + "rope_scaling.high_freq_factor"));
  r.set_original_max_positions(scaling->integer("original_max_position_embeddings",
                                                at + "rope_scaling.original_max_positions"));
}

void read_llama(const JsonObject& j, const std::string& type, LlamaShape& s) {
  read_plain_keys(j, std::begin(kLlamaKeys), std::end(kLlamaKeys), "model.llama.", s);
  if (!s.has_num_kv_heads()) s.set_num_kv_heads(s.num_heads());
  if (!s.has_head_dim()) s.set_head_dim(s.hidden_size() / s.num_heads());
  if (!s.has_tie_embeddings()) s.set_tie_embeddings(false);  // both classes' default
  read_rope(j, s);
  j.expect_value("hidden_act", "\"silu\"", "Kiln's llama family has the SwiGLU MLP (silu)");
  if (type == "qwen2") {
    s.set_qkv_bias(true);  // Qwen2's attention always has q/k/v biases
    j.expect_value("use_sliding_window", "false",
                   "Kiln's attention is causal over the whole sequence, never a sliding window");
    return;
  }
  j.expect_value("mlp_bias", "false", "Kiln's SwiGLU MLP has no biases");
  // LlamaConfig's attention_bias puts a bias on o_proj too; Qwen2's q/k/v biases alone are
  // model_type qwen2.
  j.expect_value("attention_bias", "false",
                 "a bias on o_proj as well as q/k/v, which Kiln's llama does not have (Qwen2's "
                 "q/k/v biases alone are model_type \"qwen2\")");
  s.set_qkv_bias(false);
}

void read_gpt(const JsonObject& j, GptShape& s) {
  read_plain_keys(j, std::begin(kGptKeys), std::end(kGptKeys), "model.gpt.", s);
  if (!s.has_intermediate_size()) s.set_intermediate_size(4 * s.hidden_size());
  const std::string activation =
      j.has("activation_function") ? j.text("activation_function", "the MLP") : "gelu_new";
  if (activation != "gelu_new" && activation != "gelu_pytorch_tanh") {
    j.fail("activation_function",
           "is " + quote(activation) + ": Kiln's GPT-2 has the tanh GELU (gelu_new)");
  }
  const double eps =
      j.has("layer_norm_epsilon") ? j.number("layer_norm_epsilon", "LayerNorm") : 1e-5;
  if (eps != 1e-5) {
    j.fail("layer_norm_epsilon", "is " + number_text(eps) + ": Kiln's GPT-2 has 1e-05");
  }
  j.expect_value("tie_word_embeddings", "true",
                 "Kiln's GPT-2 ties lm_head to transformer.wte, as GPT2LMHeadModel does");
  j.expect_value("scale_attn_weights", "true", "Kiln's attention scales by 1/sqrt(head width)");
  j.expect_value("scale_attn_by_inverse_layer_idx", "false",
                 "Kiln's attention scales every layer alike");
}

// The experiment's field a mismatch names, and config.json's key ("qkv_bias" of Qwen2 is the
// model type itself).
std::string key_label(const Key& k, const HfConfig& hf) {
  if (std::string(k.field) == "qkv_bias" && hf.model_type == "qwen2") {
    return "model_type qwen2: q/k/v biases";
  }
  if (std::string(k.field) == "intermediate_size" && hf.model_type == "gpt2") {
    return "n_inner; null: 4 * n_embd";
  }
  return k.json;
}

std::string field_text(const pb::Message* m, const pb::FieldDescriptor* f) {
  if (m == nullptr || !m->GetReflection()->HasField(*m, f)) return "none";
  const pb::Reflection* r = m->GetReflection();
  switch (f->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_INT32:
      return std::to_string(r->GetInt32(*m, f));
    case pb::FieldDescriptor::CPPTYPE_DOUBLE:
      return number_text(r->GetDouble(*m, f));
    default:
      return r->GetBool(*m, f) ? "true" : "false";
  }
}

bool same_value(const pb::Message* a, const pb::Message* b, const pb::FieldDescriptor* f) {
  const bool has_a = a->GetReflection()->HasField(*a, f);
  const bool has_b = b->GetReflection()->HasField(*b, f);
  if (!has_a || !has_b) return has_a == has_b;
  if (f->cpp_type() != pb::FieldDescriptor::CPPTYPE_DOUBLE)
    return field_text(a, f) == field_text(b, f);
  const double x = a->GetReflection()->GetDouble(*a, f), y = b->GetReflection()->GetDouble(*b, f);
  return std::abs(x - y) <= 1e-9 * std::max(std::abs(x), std::abs(y));
}

// Sets every field of `to` that `from` has and `to` has not, sub-messages field by field.
void fill_unset(const pb::Message& from, pb::Message& to) {
  const pb::Reflection* rf = from.GetReflection();
  const pb::Reflection* rt = to.GetReflection();
  std::vector<const pb::FieldDescriptor*> fields;
  rf->ListFields(from, &fields);
  for (const pb::FieldDescriptor* f : fields) {
    if (f->is_repeated()) continue;
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      fill_unset(rf->GetMessage(from, f), *rt->MutableMessage(&to, f));
      continue;
    }
    if (rt->HasField(to, f)) continue;
    switch (f->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_INT32:
        rt->SetInt32(&to, f, rf->GetInt32(from, f));
        break;
      case pb::FieldDescriptor::CPPTYPE_DOUBLE:
        rt->SetDouble(&to, f, rf->GetDouble(from, f));
        break;
      case pb::FieldDescriptor::CPPTYPE_BOOL:
        rt->SetBool(&to, f, rf->GetBool(from, f));
        break;
      default:
        break;  // the shapes hold numbers and flags only
    }
  }
}

bool same_family(const std::string& model_type, const std::string& name) {
  return model_type == "gpt2" ? is_gpt_model(name) : is_llama_model(name);
}

// JSON text of the writer: a number of a float-typed key keeps a decimal point ("1.0", never
// "1"), so Python reads a float where transformers annotates one.
std::string float_json(double v) {
  if (v == std::floor(v) && std::abs(v) < 1e15) {
    return std::to_string(static_cast<long long>(v)) + ".0";  // 500000.0, not 5e+05
  }
  std::string text = number_text(v);
  if (text.find_first_of(".eEn") == std::string::npos) text += ".0";
  return text;
}

using JsonEntries = std::vector<std::pair<std::string, std::string>>;

// Sorted keys, two-space indents: what transformers' save_pretrained writes.
std::string json_object(JsonEntries entries, const std::string& indent) {
  std::sort(entries.begin(), entries.end());
  std::string out = "{\n";
  for (std::size_t i = 0; i < entries.size(); ++i) {
    out += indent + "  " + quote(entries[i].first) + ": " + entries[i].second +
           (i + 1 < entries.size() ? ",\n" : "\n");
  }
  return out + indent + "}";
}

}  // namespace

HfConfig read_hf_config(const std::string& path, const std::string& field) {
  std::string kind;
  const PathKind found = detail::path_kind(path, &kind);
  const std::string file =
      found == PathKind::kDirectory ? (std::filesystem::path(path) / "config.json").string() : path;
  if (found == PathKind::kDirectory && detail::path_kind(file, nullptr) == PathKind::kMissing) {
    throw ConfigError(field + " " + quote(path) +
                      ": no config.json in the directory (a transformers model folder, as "
                      "save_pretrained writes it, or its config.json)");
  }
  if (found == PathKind::kMissing) {
    throw ConfigError(field + " " + quote(path) +
                      ": no such file or directory (a transformers model folder, or its "
                      "config.json)");
  }
  const pb::Struct root = parse_json(file, field);
  const JsonObject j(root, file + " (" + field + ")");
  HfConfig hf;
  hf.file = file;
  hf.model_type = j.text("model_type", "model.name");
  hf.model.set_name(hf.model_type);
  if (hf.model_type == "llama" || hf.model_type == "qwen2") {
    read_llama(j, hf.model_type, *hf.model.mutable_llama());
  } else if (hf.model_type == "gpt2") {
    read_gpt(j, *hf.model.mutable_gpt());
  } else {
    j.fail("model_type", "is " + quote(hf.model_type) +
                             ": Kiln builds transformers' \"llama\", \"qwen2\" and \"gpt2\"");
  }
  return hf;
}

void apply_hf_config(ModelConfig& model) {
  if (model.from_hf_config().empty()) return;
  const HfConfig hf = read_hf_config(model.from_hf_config(), "model.from_hf_config");
  if (!model.has_name()) {
    model.set_name(hf.model_type);
  } else if (!same_family(hf.model_type, model.name())) {
    throw ConfigError("model.name " + quote(model.name()) + " and model.from_hf_config " +
                      quote(model.from_hf_config()) + " (model_type " + quote(hf.model_type) +
                      ") disagree: leave model.name out to take " + quote(hf.model_type) +
                      (hf.model_type == "gpt2" ? ", or name a gpt2* model"
                                               : ", or name one of the llama family"));
  }
  pb::Message& shape = hf.model_type == "gpt2" ? static_cast<pb::Message&>(*model.mutable_gpt())
                                               : *model.mutable_llama();
  fill_unset(
      hf.model_type == "gpt2" ? static_cast<const pb::Message&>(hf.model.gpt()) : hf.model.llama(),
      shape);
  // Not a key of config.json: the schema's default, within the positions the model has.
  const pb::FieldDescriptor* seq_len = shape.GetDescriptor()->FindFieldByName("seq_len");
  if (!shape.GetReflection()->HasField(shape, seq_len)) {
    apply_declared_default(shape, "seq_len");
    const pb::FieldDescriptor* max = shape.GetDescriptor()->FindFieldByName("max_positions");
    shape.GetReflection()->SetInt32(&shape, seq_len,
                                    std::min(shape.GetReflection()->GetInt32(shape, seq_len),
                                             shape.GetReflection()->GetInt32(shape, max)));
  }
}

std::vector<std::string> hf_config_mismatches(const HfConfig& hf, const ModelConfig& model) {
  if (!same_family(hf.model_type, model.name())) {
    return {"model_type " + hf.model_type + " in config.json, " + quote(model.name()) +
            " in the experiment (model.name)"};
  }
  const bool gpt = hf.model_type == "gpt2";
  const pb::Message& theirs =
      gpt ? static_cast<const pb::Message&>(hf.model.gpt()) : hf.model.llama();
  const pb::Message& ours = gpt ? static_cast<const pb::Message&>(model.gpt()) : model.llama();
  const Key* begin = gpt ? std::begin(kGptKeys) : std::begin(kLlamaKeys);
  const Key* end = gpt ? std::end(kGptKeys) : std::end(kLlamaKeys);
  const bool scaled = !gpt && hf.model.llama().rope_scaling().has_factor();
  std::vector<std::string> out;
  for (const Key* k = begin; k != end; ++k) {
    const std::string field = k->field;
    if (!gpt && field == "max_positions") continue;
    // The scaling's other factors matter only where both sides scale (the factor compares).
    if (field.rfind("rope_scaling.", 0) == 0 && field != "rope_scaling.factor" &&
        (!scaled || !model.llama().rope_scaling().has_factor())) {
      continue;
    }
    const auto [a, f] = locate(theirs, field);
    const auto [b, g] = locate(ours, field);
    if (same_value(a, b, f)) continue;
    out.push_back(field + " " + field_text(a, f) + " in config.json (" + key_label(*k, hf) + "), " +
                  field_text(b, g) + " in the experiment (model." + (gpt ? "gpt." : "llama.") +
                  field + ")");
  }
  return out;
}

std::string hf_config_json(const ModelConfig& model, const std::string& torch_dtype) {
  const auto integer = [](int v) { return std::to_string(v); };
  JsonEntries e = {
      {"torch_dtype", quote(torch_dtype)}, {"use_cache", "true"}, {"initializer_range", "0.02"}};
  if (is_gpt_model(model.name())) {
    const GptShape& g = model.gpt();
    const std::string dropout = float_json(model.dropout());
    e.insert(e.end(), {{"architectures", "[\"GPT2LMHeadModel\"]"},
                       {"model_type", "\"gpt2\""},
                       {"vocab_size", integer(g.vocab_size())},
                       {"n_embd", integer(g.hidden_size())},
                       {"n_layer", integer(g.num_layers())},
                       {"n_head", integer(g.num_heads())},
                       {"n_positions", integer(g.max_positions())},
                       {"n_inner", g.intermediate_size() == 4 * g.hidden_size()
                                       ? "null"
                                       : integer(g.intermediate_size())},
                       {"activation_function", "\"gelu_new\""},
                       {"layer_norm_epsilon", "1e-05"},
                       {"resid_pdrop", dropout},
                       {"embd_pdrop", dropout},
                       {"attn_pdrop", dropout},
                       {"scale_attn_weights", "true"},
                       {"tie_word_embeddings", "true"}});
    return json_object(e, "") + "\n";
  }
  if (!is_llama_model(model.name())) {
    throw ConfigError("model " + quote(model.name()) +
                      " has no transformers causal-LM class to export to: Hugging Face folders "
                      "are written for gpt2* and the llama family");
  }
  const LlamaShape& l = model.llama();
  // Qwen2 is Llama with q/k/v biases: the class follows the biases, whatever the preset's name.
  const bool qwen2 = l.qkv_bias();
  e.insert(e.end(), {{"architectures", qwen2 ? "[\"Qwen2ForCausalLM\"]" : "[\"LlamaForCausalLM\"]"},
                     {"model_type", qwen2 ? "\"qwen2\"" : "\"llama\""},
                     {"vocab_size", integer(l.vocab_size())},
                     {"hidden_size", integer(l.hidden_size())},
                     {"num_hidden_layers", integer(l.num_layers())},
                     {"num_attention_heads", integer(l.num_heads())},
                     {"num_key_value_heads", integer(l.num_kv_heads())},
                     {"head_dim", integer(l.head_dim())},
                     {"intermediate_size", integer(l.intermediate_size())},
                     {"max_position_embeddings", integer(l.max_positions())},
                     {"rms_norm_eps", float_json(l.rms_norm_eps())},
                     {"tie_word_embeddings", l.tie_embeddings() ? "true" : "false"},
                     {"hidden_act", "\"silu\""},
                     {"attention_dropout", "0.0"},
                     {"rope_theta", float_json(l.rope_theta())}});
  if (qwen2) {
    e.push_back({"use_sliding_window", "false"});
  } else {
    e.push_back({"attention_bias", "false"});
    e.push_back({"mlp_bias", "false"});
  }
  // transformers 4 reads rope_theta and rope_scaling, 5 rope_parameters (and the 4 keys, which
  // it converts): both are written, with the same values.
  JsonEntries rope = {{"rope_type", "\"default\""}, {"rope_theta", float_json(l.rope_theta())}};
  if (l.rope_scaling().has_factor()) {
    const RopeScaling& r = l.rope_scaling();
    JsonEntries scaling = {
        {"rope_type", "\"llama3\""},
        {"factor", float_json(r.factor())},
        {"low_freq_factor", float_json(r.low_freq_factor())},
        {"high_freq_factor", float_json(r.high_freq_factor())},
        {"original_max_position_embeddings", integer(r.original_max_positions())}};
    e.push_back({"rope_scaling", json_object(scaling, "  ")});
    rope = scaling;
    rope.push_back({"rope_theta", float_json(l.rope_theta())});
  } else {
    e.push_back({"rope_scaling", "null"});
  }
  e.push_back({"rope_parameters", json_object(rope, "  ")});
  return json_object(e, "") + "\n";
}

HfWeightIndex read_hf_weight_index(const std::string& file) {
  const std::string field = "model.init_from";
  const pb::Struct root = parse_json(file, field);
  const JsonObject j(root, file + " (" + field + ")");
  HfWeightIndex index;
  if (j.has("metadata")) {
    const JsonObject metadata = j.object("metadata", "the shards' total size");
    if (metadata.has("total_size")) {
      const double total = metadata.number("total_size", "the shards' total size");
      if (total >= 0 && total == std::floor(total)) {
        index.total_size = static_cast<std::uint64_t>(total);
      }
    }
  }
  const JsonObject map = j.object("weight_map", "the tensors' shard files");
  for (const auto& entry : root.fields().at("weight_map").struct_value().fields()) {
    const std::string& tensor = entry.first;
    const std::string shard = map.text(tensor, "the shard holding " + quote(tensor));
    if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..") {
      map.fail(tensor,
               "is " + quote(shard) + ": a shard is a file name in the index's folder (no '/')");
    }
    index.weight_map[tensor] = shard;
  }
  if (index.weight_map.empty()) j.fail("weight_map", "is empty: the index names no tensor");
  return index;
}

}  // namespace kiln::config
