#include "comm/bandwidth.h"

#include <algorithm>
#include <chrono>

#include "core/check.h"

namespace kiln {

double all_reduce_bus_factor(int ranks) {
  return ranks > 1 ? 2.0 * (ranks - 1) / ranks : 0.0;
}

std::vector<std::size_t> all_reduce_sizes(std::size_t min_bytes, std::size_t max_bytes) {
  auto round = [](std::size_t b) { return std::max<std::size_t>(4, b / 4 * 4); };
  std::vector<std::size_t> sizes;
  for (std::size_t b = min_bytes; b < max_bytes; b *= 4) sizes.push_back(round(b));
  sizes.push_back(round(max_bytes));
  return sizes;
}

AllReduceBandwidth measure_all_reduce(Communicator& comm, std::size_t bytes, int iterations,
                                      int warmup) {
  KILN_CHECK(iterations > 0 && bytes >= 4, "measure_all_reduce: no work to time");
  const std::int64_t n = static_cast<std::int64_t>(bytes / 4);
  Tensor buffer = Tensor::full({n}, comm.rank() + 1.0, DType::F32, comm.device());  // (n,)
  for (int i = 0; i < warmup; ++i) comm.all_reduce(buffer);
  comm.barrier();
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) comm.all_reduce(buffer);
  comm.synchronize();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  AllReduceBandwidth r;
  r.bytes = bytes;
  r.iterations = iterations;
  r.seconds = comm.all_reduce_host(seconds, HostReduceOp::Max) / iterations;
  r.algbw_gbs = r.seconds > 0 ? static_cast<double>(bytes) / r.seconds / 1e9 : 0;
  r.busbw_gbs = r.algbw_gbs * all_reduce_bus_factor(comm.size());

  buffer.fill(comm.rank() + 1.0);
  comm.all_reduce(buffer);
  Tensor host = buffer.to(Device::cpu());
  const float expected = static_cast<float>(comm.size() * (comm.size() + 1) / 2);
  const float* p = host.data<float>();
  std::int64_t wrong = 0;
  for (std::int64_t i = 0; i < n; ++i) wrong += p[i] != expected ? 1 : 0;
  r.wrong = comm.all_reduce_host(wrong, HostReduceOp::Sum);
  return r;
}

}  // namespace kiln
