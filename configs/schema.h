// The declarations of configs/kiln_options.proto read back from the schema: one walker that
// fills declared defaults, one that checks declared ranges, and the words for both used by
// error messages and by the generated field reference (kiln_config_reference).
#pragma once

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <optional>
#include <string>
#include <vector>

namespace kiln::config {

// Writes the declared `(kiln.default)` into every unset field of `message` and of its
// sub-messages, except fields marked `(kiln.default_only_when)` (their rules in
// configs/defaults.cc apply them). A sub-message left empty stays unset.
void fill_declared_defaults(google::protobuf::Message& message);

// Writes the declared default of the field `field_name` of `message` if the field is unset (a
// list: empty). For the rules that apply a default only in some cases.
void apply_declared_default(google::protobuf::Message& message, const std::string& field_name);

// The declared default of `field` as `--set` writes it ("1e-3", "512,256"), or "" if none.
std::string declared_default(const google::protobuf::FieldDescriptor* field);

// A value outside its declared bounds or allowed values.
struct RangeProblem {
  std::string path;     // "optimizer.betas[1]"
  std::string value;    // "1", "\"resnet34\""
  std::string problem;  // "must be in [0, 1)"
};

// The first set field of `message` (depth first, in field order; `prefix` is the path of
// `message` itself, "" for the experiment) whose value breaks its declaration.
std::optional<RangeProblem> find_range_problem(const google::protobuf::Message& message,
                                               const std::string& prefix = "");

// The declared range in words: "> 0", "[0, 1)", ">= 1"; for a string, its allowed values
// "test, train, none"; "" when nothing is declared.
std::string describe_range(const google::protobuf::FieldDescriptor* field);

// The default in words for the reference: "`1e-3`; 0.1 for SGD", "`[512, 256]` for mlp",
// "runs/<experiment name>", the zero value of a field without one.
std::string describe_default(const google::protobuf::FieldDescriptor* field);

// The values `(kiln.allowed)` lists for a string field (empty: any string).
std::vector<std::string> allowed_values(const google::protobuf::FieldDescriptor* field);

// Problems with the declarations themselves (a default that does not parse, is out of its own
// range, or sits on a field that cannot tell unset from zero), one line each; empty when sound.
std::vector<std::string> check_declarations(const google::protobuf::Descriptor* root);

}  // namespace kiln::config
