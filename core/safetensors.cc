#include "core/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/enum_names.h"
#include "core/file_kind.h"
#include "core/json_string.h"

namespace kiln {
namespace {

constexpr EnumName<DType> kSafetensorsDTypes[] = {
    {DType::F32, "F32"}, {DType::F64, "F64"}, {DType::F16, "F16"}, {DType::BF16, "BF16"},
    {DType::I32, "I32"}, {DType::I64, "I64"}, {DType::U8, "U8"}};

const char* safetensors_dtype(DType t) {
  return enum_name(kSafetensorsDTypes, t);
}

bool dtype_from_safetensors(const std::string& s, DType* out) {
  return find_enum(kSafetensorsDTypes, s, out);
}

std::string json_quote(const std::string& s) {
  std::string r = "\"";
  for (char c : s) {
    if (static_cast<unsigned char>(c) < 0x20) {  // JSON strings hold no raw control characters
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\u%04x", static_cast<unsigned>(c));
      r += escaped;
      continue;
    }
    if (c == '"' || c == '\\') r += '\\';
    r += c;
  }
  return r + "\"";
}

// A minimal JSON reader for safetensors headers: objects, arrays, strings, integers.
struct JsonValue {
  enum Kind { Object, Array, String, Number } kind = Number;
  std::map<std::string, JsonValue> object;
  std::vector<JsonValue> array;
  std::string string;
  long long number = 0;
};

class JsonReader {
 public:
  JsonReader(const std::string& text, const std::string& file) : text_(text), file_(file) {}
  JsonValue parse() {
    JsonValue v = value();
    skip_space();
    if (pos_ != text_.size()) fail("trailing characters after the header object");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) {
    throw InputError(file_ + ": corrupt safetensors header at byte " + std::to_string(pos_ + 8) +
                     ": " + what);
  }
  void skip_space() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  char peek() {
    skip_space();
    if (pos_ >= text_.size()) fail("unexpected end of header");
    return text_[pos_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  // A JSON string, strictly (core/json_string.h).
  std::string string_literal() {
    expect('"');
    return read_json_string(text_, pos_, [this](std::size_t at, const std::string& what) {
      pos_ = at;
      fail(what);
    });
  }
  JsonValue value() {
    if (++depth_ > 16) fail("nesting too deep");
    JsonValue v;
    char c = peek();
    if (c == '{') {
      v.kind = JsonValue::Object;
      ++pos_;
      if (peek() == '}') {
        ++pos_;
      } else {
        while (true) {
          const std::size_t key_at = pos_;
          std::string k = string_literal();
          expect(':');
          if (v.object.count(k) != 0) {
            pos_ = key_at;
            fail("the name '" + k + "' appears twice (names must be unique)");
          }
          v.object[k] = value();
          if (peek() == ',') {
            ++pos_;
            continue;
          }
          expect('}');
          break;
        }
      }
    } else if (c == '[') {
      v.kind = JsonValue::Array;
      ++pos_;
      if (peek() == ']') {
        ++pos_;
      } else {
        while (true) {
          v.array.push_back(value());
          if (peek() == ',') {
            ++pos_;
            continue;
          }
          expect(']');
          break;
        }
      }
    } else if (c == '"') {
      v.kind = JsonValue::String;
      v.string = string_literal();
    } else if (c == '-' || std::isdigit(static_cast<unsigned char>(c))) {
      v.kind = JsonValue::Number;
      std::size_t start = pos_;
      if (text_[pos_] == '-') ++pos_;
      std::size_t digits = pos_;
      while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) ++pos_;
      if (pos_ == digits) fail("a number without digits");
      if (pos_ - start > 18) fail("number too large");
      v.number = std::stoll(text_.substr(start, pos_ - start));
    } else {
      fail(std::string("unexpected character '") + c + "'");
    }
    --depth_;
    return v;
  }
  const std::string& text_;
  const std::string& file_;
  std::size_t pos_ = 0;
  int depth_ = 0;
};

[[noreturn]] void io_failure(const std::string& path, const std::string& what) {
  std::string reason = std::strerror(errno);
  std::string hint = errno == ENOSPC ? " (the disk is full: free space or point checkpoint.dir "
                                       "elsewhere)"
                                     : "";
  throw Error("cannot " + what + " " + path + ": " + reason + hint);
}

}  // namespace

void write_file_atomically(const std::string& path, const std::string& bytes) {
  require_replaceable_file(path, "the output file");
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  // A fresh file of our own: a link or a leftover at the temporary name is never written through.
  ::unlink(tmp.c_str());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) io_failure(tmp, "create");
  std::size_t written = 0;
  while (written < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      int saved = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      errno = saved;
      io_failure(tmp, "write");
    }
    written += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    int saved = errno;
    ::unlink(tmp.c_str());
    errno = saved;
    io_failure(tmp, "flush");
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int saved = errno;
    ::unlink(tmp.c_str());
    errno = saved;
    io_failure(path, "rename into place");
  }
}

std::string read_file(const std::string& path) {
  return read_regular_file(path, "a file Kiln reads");
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::string header = "{";
  std::vector<Tensor> host;
  std::size_t offset = 0;
  bool first = true;
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first_meta = true;
    for (const auto& [k, v] : metadata) {
      header += (first_meta ? "" : ",") + json_quote(k) + ":" + json_quote(v);
      first_meta = false;
    }
    header += "}";
    first = false;
  }
  for (const auto& [name, tensor] : tensors) {
    Tensor h = tensor.to(Device::cpu()).contiguous();
    std::string shape;
    for (std::int64_t d : h.shape()) shape += (shape.empty() ? "" : ",") + std::to_string(d);
    header += (first ? "" : ",") + json_quote(name) + ":{\"dtype\":\"" +
              safetensors_dtype(h.dtype()) + "\",\"shape\":[" + shape + "],\"data_offsets\":[" +
              std::to_string(offset) + "," + std::to_string(offset + h.nbytes()) + "]}";
    first = false;
    offset += h.nbytes();
    host.push_back(h);
  }
  header += "}";
  while ((header.size() + 8) % 8 != 0) header += ' ';  // align the data to 8 bytes
  std::string bytes;
  bytes.reserve(8 + header.size() + offset);
  std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) bytes += static_cast<char>((n >> (8 * i)) & 0xff);
  bytes += header;
  for (const Tensor& h : host) bytes.append(static_cast<const char*>(h.data()), h.nbytes());
  write_file_atomically(path, bytes);
}

SafetensorsFile load_safetensors(const std::string& path) {
  std::string bytes = read_file(path);
  if (bytes.size() < 8) {
    throw InputError(path + ": truncated safetensors file (" + std::to_string(bytes.size()) +
                     " bytes, the header length alone needs 8)");
  }
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<std::uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  if (n > bytes.size() - 8) {
    throw InputError(path + ": safetensors header claims " + std::to_string(n) +
                     " bytes but the file has " + std::to_string(bytes.size() - 8) +
                     " after the length (truncated or not a safetensors file)");
  }
  std::string header = bytes.substr(8, n);
  JsonValue root = JsonReader(header, path).parse();
  if (root.kind != JsonValue::Object)
    throw InputError(path + ": safetensors header is not an object");
  std::size_t data_start = 8 + n, data_size = bytes.size() - data_start;
  SafetensorsFile out;
  struct Range {
    long long begin, end;
    std::string name;
  };
  std::vector<Range> ranges;
  for (const auto& item : root.object) {
    const std::string& name = item.first;  // (a structured binding cannot be captured in C++17)
    const JsonValue& entry = item.second;
    if (name == "__metadata__") {
      if (entry.kind != JsonValue::Object) {
        throw InputError(path + ": safetensors __metadata__ is not an object of strings");
      }
      for (const auto& [k, v] : entry.object) {
        if (v.kind != JsonValue::String) {
          throw InputError(path + ": safetensors __metadata__ '" + k + "' is not a string");
        }
        out.metadata[k] = v.string;
      }
      continue;
    }
    auto bad = [&](const std::string& what) {
      return InputError(path + ": tensor '" + name + "': " + what);
    };
    if (entry.kind != JsonValue::Object) throw bad("entry is not an object");
    auto dt = entry.object.find("dtype"), sh = entry.object.find("shape"),
         off = entry.object.find("data_offsets");
    if (dt == entry.object.end() || sh == entry.object.end() || off == entry.object.end()) {
      throw bad("needs dtype, shape and data_offsets");
    }
    DType dtype;
    if (dt->second.kind != JsonValue::String ||
        !dtype_from_safetensors(dt->second.string, &dtype)) {
      throw bad("unsupported dtype '" + dt->second.string +
                "' (F32, F64, F16, BF16, I32, I64, U8)");
    }
    if (sh->second.kind != JsonValue::Array) throw bad("shape is not an array");
    Shape shape;
    for (const JsonValue& d : sh->second.array) {
      if (d.kind != JsonValue::Number || d.number < 0) throw bad("bad shape");
      shape.push_back(d.number);
    }
    if (off->second.kind != JsonValue::Array || off->second.array.size() != 2 ||
        off->second.array[0].kind != JsonValue::Number ||
        off->second.array[1].kind != JsonValue::Number) {
      throw bad("data_offsets needs two numbers");
    }
    long long begin = off->second.array[0].number, end = off->second.array[1].number;
    if (begin < 0 || end < begin || static_cast<std::size_t>(end) > data_size) {
      throw bad("data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                ") outside the " + std::to_string(data_size) + " data bytes (truncated file?)");
    }
    long double numel = 1;  // no overflow before the comparison with the file's size
    for (std::int64_t d : shape) numel *= static_cast<long double>(d);
    if (numel * dtype_size(dtype) > static_cast<long double>(data_size)) {
      throw bad("shape " + shape_str(shape) + " of " + dt->second.string + " needs more than the " +
                std::to_string(data_size) + " data bytes of the file");
    }
    std::size_t expected = static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype);
    if (static_cast<std::size_t>(end - begin) != expected) {
      throw bad("shape " + shape_str(shape) + " of " + dt->second.string + " needs " +
                std::to_string(expected) + " bytes, offsets give " + std::to_string(end - begin));
    }
    Tensor t = Tensor::empty(shape, dtype);
    if (expected > 0) std::memcpy(t.data(), bytes.data() + data_start + begin, expected);
    out.tensors[name] = t;
    ranges.push_back({begin, end, name});
  }
  // The safetensors format: the tensors' byte ranges tile the data buffer, no overlap, no hole.
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  long long covered = 0;
  const Range* previous = nullptr;
  for (const Range& r : ranges) {
    if (r.begin < covered) {
      throw InputError(
          path + ": tensor '" + r.name + "': data_offsets [" + std::to_string(r.begin) + ", " +
          std::to_string(r.end) + ") overlap those of '" + previous->name + "' [" +
          std::to_string(previous->begin) + ", " + std::to_string(previous->end) + ")");
    }
    if (r.begin > covered) {
      throw InputError(path + ": tensor '" + r.name + "': data_offsets start at " +
                       std::to_string(r.begin) + ", leaving bytes [" + std::to_string(covered) +
                       ", " + std::to_string(r.begin) + ") of the data buffer to no tensor");
    }
    covered = r.end;
    previous = &r;
  }
  if (static_cast<std::size_t>(covered) != data_size) {
    throw InputError(path + ": the tensors cover " + std::to_string(covered) + " of the " +
                     std::to_string(data_size) +
                     " data bytes; the rest belongs to no tensor (a corrupt or padded file)");
  }
  return out;
}

}  // namespace kiln
