// Where a field's value came from: the `--set` that wrote it, or FILE:LINE:COLUMN from the
// text-format parser's location tree, so a validation error points at the value to change.
#include <algorithm>
#include <fstream>
#include <sstream>

#include "configs/internal.h"

namespace kiln::config::detail {
namespace {

using pb::Descriptor;
using pb::FieldDescriptor;

bool starts_with_segment(const std::string& path, const std::string& prefix) {
  return path.size() > prefix.size() && path.compare(0, prefix.size(), prefix) == 0 &&
         (path[prefix.size()] == '.' || path[prefix.size()] == '[');
}

}  // namespace

FieldLocator::FieldLocator(const ValidationContext& context) : context_(context) {
  // Never open a FIFO or a device: reading one would block or never end.
  if (context.config_path.empty() ||
      path_kind(context.config_path, nullptr) != PathKind::kRegular) {
    return;
  }
  std::ifstream in(context.config_path, std::ios::binary);
  if (!in) return;
  std::ostringstream text;
  text << in.rdbuf();
  Experiment parsed;
  FirstErrorCollector errors;
  if (parse_text(text.str(), parsed, errors, &tree_)) have_tree_ = true;
}

Origin FieldLocator::locate(const std::string& path) const {
  // The last override that set this field, or a message containing it, wins.
  for (auto it = context_.overrides.rbegin(); it != context_.overrides.rend(); ++it) {
    const std::string set_path = trim(it->substr(0, it->find('=')));
    if (path == set_path || starts_with_segment(path, set_path) ||
        starts_with_segment(set_path, path)) {
      return {"--set " + *it, false};
    }
  }
  const std::string file = context_.config_path.empty() ? "<experiment>" : context_.config_path;
  std::vector<PathSegment> segments;
  std::string problem;
  if (!have_tree_ || !split_path(path, segments, problem)) return {file, true};
  // Falls back to the innermost enclosing message the file wrote, when the field itself
  // was left at its default.
  const pb::TextFormat::ParseInfoTree* tree = &tree_;
  const Descriptor* type = Experiment::descriptor();
  pb::TextFormat::ParseLocation found;
  std::size_t matched = 0;
  for (std::size_t i = 0; i < segments.size() && tree; ++i) {
    const FieldDescriptor* field = type->FindFieldByName(segments[i].name);
    if (!field) break;
    // A repeated field named without [i] is located at its first element.
    const int index = field->is_repeated() ? std::max(segments[i].index, 0) : -1;
    pb::TextFormat::ParseLocation location = tree->GetLocation(field, index);
    // `name: [a, b]` records one location for the whole list: use the latest recorded.
    for (int earlier = index - 1; location.line < 0 && earlier >= 0; --earlier) {
      location = tree->GetLocation(field, earlier);
    }
    if (location.line < 0) break;
    found = location;
    ++matched;
    if (i + 1 < segments.size()) {
      if (field->type() != FieldDescriptor::TYPE_MESSAGE) break;
      tree = tree->GetTreeForNested(field, index);
      type = field->message_type();
    }
  }
  if (found.line < 0) return {file, true};
  return {file + ":" + std::to_string(found.line + 1) + ":" + std::to_string(found.column + 1),
          matched != segments.size()};
}

}  // namespace kiln::config::detail
