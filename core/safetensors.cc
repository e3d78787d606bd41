#include "core/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/enum_names.h"
#include "core/file_kind.h"
#include "core/json_value.h"

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
  const JsonValue root = parse_json(header, [&path](std::size_t at, const std::string& what) {
    throw InputError(path + ": corrupt safetensors header at byte " + std::to_string(at + 8) +
                     ": " + what);
  });
  if (root.kind != JsonValue::Kind::Object)
    throw InputError(path + ": safetensors header is not an object");
  std::size_t data_start = 8 + n, data_size = bytes.size() - data_start;
  SafetensorsFile out;
  struct Range {
    long long begin, end;
    std::string name;
  };
  std::vector<Range> ranges;
  for (std::size_t member = 0; member < root.items.size(); ++member) {
    const std::string& name = root.names[member];
    const JsonValue& entry = root.items[member];
    if (name == "__metadata__") {
      if (entry.kind != JsonValue::Kind::Object) {
        throw InputError(path + ": safetensors __metadata__ is not an object of strings");
      }
      for (std::size_t i = 0; i < entry.items.size(); ++i) {
        if (entry.items[i].kind != JsonValue::Kind::String) {
          throw InputError(path + ": safetensors __metadata__ '" + entry.names[i] +
                           "' is not a string");
        }
        out.metadata[entry.names[i]] = entry.items[i].string;
      }
      continue;
    }
    auto bad = [&](const std::string& what) {
      return InputError(path + ": tensor '" + name + "': " + what);
    };
    if (entry.kind != JsonValue::Kind::Object) throw bad("entry is not an object");
    const JsonValue *dt = entry.find("dtype"), *sh = entry.find("shape"),
                    *off = entry.find("data_offsets");
    if (dt == nullptr || sh == nullptr || off == nullptr) {
      throw bad("needs dtype, shape and data_offsets");
    }
    DType dtype;
    if (dt->kind != JsonValue::Kind::String || !dtype_from_safetensors(dt->string, &dtype)) {
      throw bad("unsupported dtype '" + dt->string + "' (F32, F64, F16, BF16, I32, I64, U8)");
    }
    if (sh->kind != JsonValue::Kind::Array) throw bad("shape is not an array");
    Shape shape;
    for (const JsonValue& d : sh->items) {
      if (!d.is_integer || d.integer < 0) throw bad("bad shape");
      shape.push_back(d.integer);
    }
    if (off->kind != JsonValue::Kind::Array || off->items.size() != 2 ||
        !off->items[0].is_integer || !off->items[1].is_integer) {
      throw bad("data_offsets needs two numbers");
    }
    long long begin = off->items[0].integer, end = off->items[1].integer;
    if (begin < 0 || end < begin || static_cast<std::size_t>(end) > data_size) {
      throw bad("data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                ") outside the " + std::to_string(data_size) + " data bytes (truncated file?)");
    }
    long double numel = 1;  // no overflow before the comparison with the file's size
    for (std::int64_t d : shape) numel *= static_cast<long double>(d);
    if (numel * dtype_size(dtype) > static_cast<long double>(data_size)) {
      throw bad("shape " + shape_str(shape) + " of " + dt->string + " needs more than the " +
                std::to_string(data_size) + " data bytes of the file");
    }
    std::size_t expected = static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype);
    if (static_cast<std::size_t>(end - begin) != expected) {
      throw bad("shape " + shape_str(shape) + " of " + dt->string + " needs " +
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
