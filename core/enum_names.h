#pragma once
// Enum <-> name tables. One table per enum gives the name of a value, the value of a name and the
// "known:" list of the error for an unknown name, so the three cannot drift apart.

#include <cstddef>
#include <string>

#include "core/check.h"

namespace kiln {

template <typename E>
struct EnumName {
  E value;
  const char* name;
};

// The name of `value` ("?" for a value the table lacks).
template <typename E, std::size_t N>
const char* enum_name(const EnumName<E> (&table)[N], E value) {
  for (const EnumName<E>& entry : table) {
    if (entry.value == value) return entry.name;
  }
  return "?";
}

// The value named `name`: false when no entry has that name.
template <typename E, std::size_t N>
bool find_enum(const EnumName<E> (&table)[N], const std::string& name, E* value) {
  for (const EnumName<E>& entry : table) {
    if (name == entry.name) {
      *value = entry.value;
      return true;
    }
  }
  return false;
}

// The value named `name`, or an InputError "unknown <what> '<name>' (known: a, b, c)".
template <typename E, std::size_t N>
E parse_enum(const EnumName<E> (&table)[N], const std::string& name, const char* what) {
  E value{};
  if (find_enum(table, name, &value)) return value;
  std::string known;
  for (const EnumName<E>& entry : table)
    known += (known.empty() ? "" : ", ") + std::string(entry.name);
  throw InputError("unknown " + std::string(what) + " '" + name + "' (known: " + known + ")");
}

}  // namespace kiln
