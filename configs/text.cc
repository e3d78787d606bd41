// Small text helpers of configs/: case, trimming, numbers that round-trip, the list of a
// message's fields with a near-miss suggestion, and dotted field paths.
#include <glob.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <sstream>

#include "configs/internal.h"

namespace kiln::config::detail {
namespace {

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1] ? 1u : 0u)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::vector<std::string> field_names(const pb::Descriptor* type) {
  std::vector<std::string> names;
  for (int i = 0; i < type->field_count(); ++i) names.push_back(type->field(i)->name());
  return names;
}

}  // namespace

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

std::string trim(const std::string& text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return "";
  const auto last = text.find_last_not_of(" \t\r\n");
  return text.substr(first, last - first + 1);
}

std::string join(const std::vector<std::string>& items, const std::string& separator) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i) out += separator;
    out += items[i];
  }
  return out;
}

std::string number_text(double value) {
  std::ostringstream out;
  out.precision(std::numeric_limits<double>::max_digits10);
  out << value;
  std::string text = out.str();
  for (int precision = 1; precision <= 17; ++precision) {
    std::ostringstream shorter;
    shorter.precision(precision);
    shorter << value;
    if (std::strtod(shorter.str().c_str(), nullptr) == value) return shorter.str();
  }
  return text;
}

std::string number_text(float value) {
  for (int precision = 1; precision <= 9; ++precision) {
    std::ostringstream shorter;
    shorter.precision(precision);
    shorter << value;
    if (std::strtof(shorter.str().c_str(), nullptr) == value) return shorter.str();
  }
  return number_text(static_cast<double>(value));
}

std::string describe_fields(const pb::Descriptor* type, const std::string& level,
                            const std::string& unknown_name) {
  std::string text = "fields of " + (level.empty() ? std::string("the experiment") : level) + ": " +
                     join(field_names(type), ", ");
  std::string best;
  std::size_t best_distance = 3;  // suggest only near misses
  for (const std::string& name : field_names(type)) {
    const std::size_t distance = edit_distance(lower(unknown_name), name);
    if (distance < best_distance) {
      best_distance = distance;
      best = name;
    }
  }
  if (!best.empty()) text += " (did you mean " + best + "?)";
  return text;
}

std::string enum_names(const pb::EnumDescriptor* type) {
  std::vector<std::string> names;
  for (int i = 0; i < type->value_count(); ++i) names.push_back(type->value(i)->name());
  return join(names, ", ");
}

std::string quote(const std::string& text) {
  return "\"" + text + "\"";
}

std::string quoted_after(const std::string& message, const std::string& marker) {
  const auto at = message.find(marker);
  if (at == std::string::npos) return "";
  const auto open = message.find('"', at + marker.size());
  if (open == std::string::npos) return "";
  const auto close = message.find('"', open + 1);
  if (close == std::string::npos) return "";
  return message.substr(open + 1, close - open - 1);
}

bool split_path(const std::string& path, std::vector<PathSegment>& segments, std::string& problem) {
  segments.clear();
  std::stringstream stream(path);
  std::string part;
  while (std::getline(stream, part, '.')) {
    PathSegment segment;
    const auto bracket = part.find('[');
    segment.name = part.substr(0, bracket);
    if (bracket != std::string::npos) {
      const auto close = part.find(']', bracket);
      const std::string digits =
          close == std::string::npos ? "" : part.substr(bracket + 1, close - bracket - 1);
      if (close != part.size() - 1 || digits.empty() ||
          !std::all_of(digits.begin(), digits.end(), [](char c) { return std::isdigit(c); })) {
        problem = "bad index in '" + part + "' (write name[N] with N >= 0)";
        return false;
      }
      segment.index = std::stoi(digits);
    }
    if (segment.name.empty()) {
      problem = "empty field name in the path";
      return false;
    }
    segments.push_back(segment);
  }
  if (segments.empty() || path.back() == '.') {
    problem = "empty field path";
    return false;
  }
  return true;
}

std::string path_prefix(const std::vector<PathSegment>& segments, std::size_t count) {
  std::string text;
  for (std::size_t i = 0; i < count; ++i) {
    if (i) text += ".";
    text += segments[i].name;
    if (segments[i].index >= 0) text += "[" + std::to_string(segments[i].index) + "]";
  }
  return text;
}

PathKind path_kind(const std::string& path, std::string* description) {
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  std::string words;
  PathKind kind = PathKind::kOther;
  switch (status.type()) {
    case fs::file_type::regular:
      words = "a regular file";
      kind = PathKind::kRegular;
      break;
    case fs::file_type::directory:
      words = "a directory";
      kind = PathKind::kDirectory;
      break;
    case fs::file_type::character:
      words = "a character device";
      break;
    case fs::file_type::block:
      words = "a block device";
      break;
    case fs::file_type::fifo:
      words = "a FIFO (named pipe)";
      break;
    case fs::file_type::socket:
      words = "a socket";
      break;
    case fs::file_type::not_found:
      if (fs::is_symlink(fs::symlink_status(path, error))) {
        words = "a broken symbolic link";
      } else {
        words = "nothing (no such file or directory)";
        kind = PathKind::kMissing;
      }
      break;
    default:
      words = error ? "not accessible (" + error.message() + ")" : "not a regular file";
      break;
  }
  if (description) *description = words;
  return kind;
}

std::vector<std::string> glob_matches(const std::string& pattern) {
  glob_t found{};
  std::vector<std::string> paths;
  if (::glob(pattern.c_str(), 0, nullptr, &found) == 0) {
    for (std::size_t i = 0; i < found.gl_pathc; ++i) paths.emplace_back(found.gl_pathv[i]);
  }
  ::globfree(&found);
  return paths;
}

}  // namespace kiln::config::detail
