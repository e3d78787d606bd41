#include "core/npy.h"

#include <cstdint>

#include "core/check.h"

namespace kiln {

std::string encode_npy(const Tensor& t) {
  const char* descr = nullptr;
  switch (t.dtype()) {
    case DType::F32:
      descr = "<f4";
      break;
    case DType::F64:
      descr = "<f8";
      break;
    case DType::F16:
      descr = "<f2";
      break;
    case DType::I32:
      descr = "<i4";
      break;
    case DType::I64:
      descr = "<i8";
      break;
    case DType::U8:
      descr = "|u1";
      break;
    default:
      throw InputError(std::string(".npy: no NumPy type for ") + dtype_name(t.dtype()));
  }
  std::string shape;
  for (std::int64_t d : t.shape()) shape += std::to_string(d) + ", ";
  if (t.dim() > 1) shape.resize(shape.size() - 1);  // (N,) keeps its comma, (N, C) loses it
  std::string header =
      std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (" + shape + "), }";
  // magic (6) + version (2) + length (2) + header + '\n', a multiple of 64 bytes.
  const std::size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>((header.size() >> 8) & 0xff);
  out += header;
  Tensor host = t.to(Device::cpu()).contiguous();
  out.append(static_cast<const char*>(host.data()), host.nbytes());
  return out;
}

}  // namespace kiln
