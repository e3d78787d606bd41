#include "comm/mpi_communicator.h"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "comm/mpi_check.h"
#include "comm/mpi_internal.h"
#include "comm/watchdog.h"
#include "core/cpu/element.h"
#include "core/stream.h"

namespace kiln {
namespace {

// Elements moved per MPI call: keeps int counts valid and the fold's scratch bounded.
constexpr std::int64_t kChunkElements = std::int64_t{1} << 22;

MPI_Comm comm_of(void* handle) {
  return *static_cast<MPI_Comm*>(handle);
}

// out[i] = in[0][i] + in[1][i] + ... in rank order, in the element type's compute type (f32 for
// half and f32, f64 for f64, i64 for integers); Average divides the sum by the rank count; Max
// keeps the largest (NaN where any rank has one, as NCCL's max).
template <typename T>
void fold_in_rank_order(const T* in, std::int64_t n, int ranks, ReduceOp op, T* out) {
  for (std::int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_integral_v<T>) {
      std::int64_t acc = in[i];
      for (int r = 1; r < ranks; ++r) {
        acc =
            op == ReduceOp::Max ? std::max<std::int64_t>(acc, in[r * n + i]) : acc + in[r * n + i];
      }
      out[i] = static_cast<T>(acc);  // integers: Sum and Max
    } else {
      using Acc = typename cpu::Compute<T>::type;
      Acc acc = cpu::load(in[i]);
      for (int r = 1; r < ranks; ++r) {
        const Acc v = cpu::load(in[r * n + i]);
        if (op != ReduceOp::Max) {
          acc += v;
        } else if (std::isnan(v) || v > acc) {
          acc = std::isnan(acc) ? acc : v;
        }
      }
      if (op == ReduceOp::Average) acc = acc / static_cast<Acc>(ranks);
      if constexpr (std::is_same_v<T, Half>) {
        out[i] = to_half(acc);
      } else if constexpr (std::is_same_v<T, BFloat16>) {
        out[i] = to_bf16(acc);
      } else {
        out[i] = acc;
      }
    }
  }
}

void fold(DType dtype, const void* in, std::int64_t n, int ranks, ReduceOp op, void* out) {
  switch (dtype) {
    case DType::F32:
      return fold_in_rank_order(static_cast<const float*>(in), n, ranks, op,
                                static_cast<float*>(out));
    case DType::F64:
      return fold_in_rank_order(static_cast<const double*>(in), n, ranks, op,
                                static_cast<double*>(out));
    case DType::F16:
      return fold_in_rank_order(static_cast<const Half*>(in), n, ranks, op,
                                static_cast<Half*>(out));
    case DType::BF16:
      return fold_in_rank_order(static_cast<const BFloat16*>(in), n, ranks, op,
                                static_cast<BFloat16*>(out));
    case DType::I32:
      return fold_in_rank_order(static_cast<const std::int32_t*>(in), n, ranks, op,
                                static_cast<std::int32_t*>(out));
    case DType::I64:
      return fold_in_rank_order(static_cast<const std::int64_t*>(in), n, ranks, op,
                                static_cast<std::int64_t*>(out));
    case DType::U8:
      return fold_in_rank_order(static_cast<const std::uint8_t*>(in), n, ranks, op,
                                static_cast<std::uint8_t*>(out));
  }
}

int int_count(std::int64_t n, const char* op) {
  KILN_CHECK(n <= INT_MAX, std::string(op) + " of " + std::to_string(n) +
                               " elements: the MPI backend takes at most INT_MAX per rank");
  return static_cast<int>(n);
}

// A host copy of a device tensor: Tensor::copy_from to the host waits for the current stream (so
// the values are complete), the copy back is queued on it (so later work sees the result).
Tensor to_host(const Tensor& t) {
  Tensor host = Tensor::empty(t.shape(), t.dtype(), Device::cpu());
  host.copy_from(t);
  return host;
}

}  // namespace

MpiCommunicator::MpiCommunicator(const World& world, CommunicatorOptions options)
    : MpiCommunicator(world, Device::cpu(), options) {}

MpiCommunicator::MpiCommunicator(const World& world, Device device, CommunicatorOptions options)
    : Communicator(world, options), device_(device) {}

void MpiCommunicator::do_all_reduce(Tensor& t, ReduceOp op) {
  if (device_.is_cpu() || size() == 1) return host_all_reduce(t, op);
  Tensor host = to_host(t);
  host_all_reduce(host, op);
  t.copy_from(host);
}

void MpiCommunicator::do_broadcast(Tensor& t, int root) {
  if (device_.is_cpu() || size() == 1) return host_broadcast(t, root);
  Tensor host = to_host(t);
  host_broadcast(host, root);
  t.copy_from(host);
}

void MpiCommunicator::do_all_gather(const Tensor& in, Tensor& out) {
  if (device_.is_cpu()) return host_all_gather(in, out);
  Tensor host_out = Tensor::empty(out.shape(), out.dtype(), Device::cpu());
  host_all_gather(to_host(in), host_out);
  out.copy_from(host_out);
}

void MpiCommunicator::do_reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) {
  if (device_.is_cpu()) return host_reduce_scatter(in, out, op);
  Tensor host_out = Tensor::empty(out.shape(), out.dtype(), Device::cpu());
  host_reduce_scatter(to_host(in), host_out, op);
  out.copy_from(host_out);
}

void MpiCommunicator::host_all_reduce(Tensor& t, ReduceOp op) {
  WatchdogScope watch("collective all_reduce", next_sequence(), options().timeout_s);
  const int ranks = size();
  const std::int64_t n = t.numel();
  const std::size_t elem = dtype_size(t.dtype());
  if (ranks == 1 || n == 0) return;  // sum and average of one rank are the identity
  MPI_Comm comm = comm_of(mpi_comm_handle());
  MPI_Datatype type = detail::mpi_transport_type(t.dtype());
  char* data = static_cast<char*>(t.data());
  std::vector<int> send_counts(ranks), send_offsets(ranks), recv_counts(ranks), recv_offsets(ranks);
  std::vector<char> gathered;
  std::vector<char> folded;
  for (std::int64_t start = 0; start < n; start += kChunkElements) {
    const std::int64_t m = std::min(kChunkElements, n - start);
    char* chunk = data + start * elem;
    // Rank s folds slice s of the chunk: it receives slice s from every rank.
    const std::int64_t mine =
        detail::slice_offset(m, ranks, rank() + 1) - detail::slice_offset(m, ranks, rank());
    for (int s = 0; s < ranks; ++s) {
      send_offsets[s] = static_cast<int>(detail::slice_offset(m, ranks, s));
      send_counts[s] = static_cast<int>(detail::slice_offset(m, ranks, s + 1)) - send_offsets[s];
      recv_counts[s] = static_cast<int>(mine);
      recv_offsets[s] = static_cast<int>(mine * s);
    }
    gathered.resize(static_cast<std::size_t>(mine * ranks) * elem);
    folded.resize(static_cast<std::size_t>(mine) * elem);
    KILN_MPI_CHECK(MPI_Alltoallv(chunk, send_counts.data(), send_offsets.data(), type,
                                 gathered.data(), recv_counts.data(), recv_offsets.data(), type,
                                 comm));
    fold(t.dtype(), gathered.data(), mine, ranks, op, folded.data());
    // A chunk smaller than the world leaves some ranks no slice (a one-element flag on 2 ranks).
    if (!folded.empty())
      std::memcpy(chunk + send_offsets[rank()] * elem, folded.data(), folded.size());
    KILN_MPI_CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, chunk, send_counts.data(),
                                  send_offsets.data(), type, comm));
  }
}

void MpiCommunicator::host_broadcast(Tensor& t, int root) {
  WatchdogScope watch("collective broadcast", next_sequence(), options().timeout_s);
  if (size() == 1) return;
  MPI_Comm comm = comm_of(mpi_comm_handle());
  MPI_Datatype type = detail::mpi_transport_type(t.dtype());
  char* data = static_cast<char*>(t.data());
  const std::int64_t n = t.numel();
  for (std::int64_t start = 0; start < n; start += kChunkElements) {
    const int m = static_cast<int>(std::min(kChunkElements, n - start));
    KILN_MPI_CHECK(MPI_Bcast(data + start * dtype_size(t.dtype()), m, type, root, comm));
  }
}

void MpiCommunicator::host_all_gather(const Tensor& in, Tensor& out) {
  WatchdogScope watch("collective all_gather", next_sequence(), options().timeout_s);
  MPI_Datatype type = detail::mpi_transport_type(in.dtype());
  const int n = int_count(in.numel(), "all_gather");
  int_count(out.numel(), "all_gather");
  KILN_MPI_CHECK(
      MPI_Allgather(in.data(), n, type, out.data(), n, type, comm_of(mpi_comm_handle())));
}

void MpiCommunicator::host_reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) {
  WatchdogScope watch("collective reduce_scatter", next_sequence(), options().timeout_s);
  const int ranks = size();
  const int n = int_count(out.numel(), "reduce_scatter");
  int_count(in.numel(), "reduce_scatter");
  MPI_Datatype type = detail::mpi_transport_type(in.dtype());
  std::vector<char> gathered(static_cast<std::size_t>(in.numel()) * dtype_size(in.dtype()));
  // Rank r receives block r of every rank, then folds them in rank order.
  KILN_MPI_CHECK(
      MPI_Alltoall(in.data(), n, type, gathered.data(), n, type, comm_of(mpi_comm_handle())));
  fold(in.dtype(), gathered.data(), n, ranks, op, out.data());
}

void MpiCommunicator::do_barrier() {
  // "This rank's queued ops finished": the staged copies back to a GPU run on its streams.
  if (device_.is_cuda()) device_synchronize(device_);
  WatchdogScope watch("collective barrier", next_sequence(), options().timeout_s);
  KILN_MPI_CHECK(MPI_Barrier(comm_of(mpi_comm_handle())));
}

}  // namespace kiln
