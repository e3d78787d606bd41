// Helpers shared by the sources of configs/ (parsing, overrides, the schema walker, the
// validator). Not part of the library's interface: include configs/experiment.h instead.
#pragma once

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/message.h>
#include <google/protobuf/text_format.h>

#include <string>
#include <vector>

#include "configs/experiment.h"

namespace kiln::config::detail {

namespace pb = google::protobuf;

// ---------------------------------------------------------------------------------------
// Text (text.cc).

std::string lower(std::string text);
std::string trim(const std::string& text);
std::string join(const std::vector<std::string>& items, const std::string& separator);
std::string quote(const std::string& text);  // "\"text\""

// Shortest textual form that round-trips ("0.001", "65536", "1e-08"); the float overload
// prints 0.1f as "0.1", not as its double expansion.
std::string number_text(double value);
std::string number_text(float value);

// "fields of optimizer: kind, lr, ... (did you mean lr?)"
std::string describe_fields(const pb::Descriptor* type, const std::string& level,
                            const std::string& unknown_name);
// "ADAMW, SGD, LAMB"
std::string enum_names(const pb::EnumDescriptor* type);
// The text between the first pair of double quotes after `marker`, or "".
std::string quoted_after(const std::string& message, const std::string& marker);

// Field paths: "optimizer.param_groups[1].lr_multiplier".
struct PathSegment {
  std::string name;
  int index = -1;  // -1: no [i]
};
// Splits a dotted path; returns false with `problem` set on bad syntax.
bool split_path(const std::string& path, std::vector<PathSegment>& segments, std::string& problem);
// The first `count` segments joined back into a path.
std::string path_prefix(const std::vector<PathSegment>& segments, std::size_t count);

// What a path is (std::filesystem: configs/ does not link core/, whose core/file_kind.h says it
// in the same words): kRegular, kDirectory, kMissing, or kOther; `description` (optional) gets
// "a regular file", "a directory", "a character device", "a FIFO (named pipe)", ...
enum class PathKind { kRegular, kDirectory, kMissing, kOther };
PathKind path_kind(const std::string& path, std::string* description);
// The paths a glob(3) pattern matches (data/file_io.h's glob_paths, for the same reason as
// path_kind); empty when none match or the pattern cannot be expanded.
std::vector<std::string> glob_matches(const std::string& pattern);

// ---------------------------------------------------------------------------------------
// Parsing (parse.cc).

// Keeps the first error protobuf reports.
class FirstErrorCollector : public pb::io::ErrorCollector {
 public:
  void AddError(int line, pb::io::ColumnNumber column, const std::string& message) override;
  void AddWarning(int, pb::io::ColumnNumber, const std::string&) override {}

  bool has_error = false;
  int line = -1;
  int column = -1;
  std::string message;
};

// Text format into `out`, unknown fields rejected; `locations` (optional) records where each
// field was written.
bool parse_text(const std::string& text, pb::Message& out, FirstErrorCollector& errors,
                pb::TextFormat::ParseInfoTree* locations);

// ---------------------------------------------------------------------------------------
// Values as `--set` writes them (override.cc).

// Sets one scalar (element `index` of a repeated field, index == size appends; -1 for a
// singular field). Returns false when `text` is not a value of the field's type.
bool set_scalar(pb::Message& message, const pb::FieldDescriptor* field, int index,
                const std::string& text);
// A comma list, brackets optional: "[0.9, 0.999]" or "0.9,0.999"; "" is the empty list.
std::vector<std::string> split_list(const std::string& text);
// "an integer (32-bit)", "one of ADAMW, SGD, LAMB", ...
std::string type_description(const pb::FieldDescriptor* field);

// ---------------------------------------------------------------------------------------
// Where a field's value came from, for validation errors (locate.cc).

struct Origin {
  std::string where;        // "exp.pbtxt:12:3", "--set a.b=1", or "exp.pbtxt"
  bool is_default = false;  // neither the file nor an override set it
};

class FieldLocator {
 public:
  explicit FieldLocator(const ValidationContext& context);
  // The last override that set `path` (or a message holding it), else the file's location of
  // the field, or of the innermost enclosing message the file wrote (then is_default).
  Origin locate(const std::string& path) const;

 private:
  const ValidationContext& context_;
  pb::TextFormat::ParseInfoTree tree_;
  bool have_tree_ = false;
};

}  // namespace kiln::config::detail
