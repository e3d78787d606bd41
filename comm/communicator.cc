#include "comm/communicator.h"

#include <mpi.h>

#include <cinttypes>
#include <cstdio>
#include <sstream>

#include "comm/mpi_check.h"
#include "comm/mpi_communicator.h"
#include "comm/mpi_internal.h"
#include "comm/watchdog.h"
#include "core/check.h"

#if KILN_WITH_CUDA
#include "comm/nccl_communicator.h"
#endif

namespace kiln {

namespace detail {

MPI_Datatype mpi_transport_type(DType dtype) {
  switch (dtype_size(dtype)) {
    case 1:
      return MPI_UINT8_T;
    case 2:
      return MPI_UINT16_T;
    case 4:
      return MPI_UINT32_T;
    case 8:
      return MPI_UINT64_T;
    default:
      KILN_CHECK(false, std::string("no MPI transport type for ") + dtype_name(dtype));
  }
  return MPI_DATATYPE_NULL;
}

}  // namespace detail

const char* comm_backend_name(CommBackend backend) {
  switch (backend) {
    case CommBackend::Auto:
      return "auto";
    case CommBackend::Nccl:
      return "nccl";
    case CommBackend::Mpi:
      return "mpi";
  }
  return "?";
}

const char* reduce_op_name(ReduceOp op) {
  return op == ReduceOp::Sum ? "sum" : op == ReduceOp::Average ? "average" : "max";
}

struct Communicator::MpiGroup {
  MPI_Comm comm = MPI_COMM_NULL;
};

Communicator::Communicator(const World& world, CommunicatorOptions options)
    : world_(world), options_(options), group_(std::make_unique<MpiGroup>()) {
  KILN_CHECK(options.timeout_s > 0, "communicator timeout must be positive");
  KILN_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &group_->comm));
  KILN_MPI_CHECK(MPI_Comm_set_errhandler(group_->comm, MPI_ERRORS_RETURN));
}

Communicator::~Communicator() {
  int finalised = 1;
  KILN_IGNORE_ERROR(MPI_Finalized(&finalised));
  if (!finalised && group_->comm != MPI_COMM_NULL) KILN_IGNORE_ERROR(MPI_Comm_free(&group_->comm));
}

void* Communicator::mpi_comm_handle() const {
  return &group_->comm;
}

void Communicator::check_tensor(const Tensor& t, const char* op) const {
  KILN_CHECK(t.defined(), std::string(op) + ": undefined tensor");
  KILN_CHECK(t.is_contiguous(), std::string(op) + " needs a contiguous tensor, got " + t.str());
  KILN_CHECK(t.device() == device(), std::string(op) + " on the " + backend_name() +
                                         " communicator of " + device().str() + " got " + t.str());
}

void Communicator::all_reduce(Tensor& t, ReduceOp op) {
  comm_stream_wait_for_current();
  all_reduce_on_comm_stream(t, op);
  current_stream_wait_for_comm();
}

void Communicator::all_reduce_on_comm_stream(Tensor& t, ReduceOp op) {
  check_tensor(t, "all_reduce");
  KILN_CHECK(
      op != ReduceOp::Average || is_floating(t.dtype()),
      std::string("all_reduce average of ") + dtype_name(t.dtype()) + " (integers sum or max)");
  do_all_reduce(t, op);
}

void Communicator::broadcast(Tensor& t, int root) {
  comm_stream_wait_for_current();
  broadcast_on_comm_stream(t, root);
  current_stream_wait_for_comm();
}

void Communicator::broadcast_on_comm_stream(Tensor& t, int root) {
  check_tensor(t, "broadcast");
  KILN_CHECK(root >= 0 && root < size(), "broadcast from rank " + std::to_string(root) +
                                             " of a world of " + std::to_string(size()));
  do_broadcast(t, root);
}

void Communicator::all_gather(const Tensor& in, Tensor& out) {
  comm_stream_wait_for_current();
  all_gather_on_comm_stream(in, out);
  current_stream_wait_for_comm();
}

void Communicator::all_gather_on_comm_stream(const Tensor& in, Tensor& out) {
  check_tensor(in, "all_gather");
  check_tensor(out, "all_gather");
  KILN_CHECK(
      in.dtype() == out.dtype() && out.numel() == in.numel() * size(),
      "all_gather of " + in.str() + " over " + std::to_string(size()) + " ranks into " + out.str());
  do_all_gather(in, out);
}

void Communicator::reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) {
  comm_stream_wait_for_current();
  reduce_scatter_on_comm_stream(in, out, op);
  current_stream_wait_for_comm();
}

void Communicator::reduce_scatter_on_comm_stream(const Tensor& in, Tensor& out, ReduceOp op) {
  check_tensor(in, "reduce_scatter");
  check_tensor(out, "reduce_scatter");
  KILN_CHECK(in.dtype() == out.dtype() && in.numel() == out.numel() * size(),
             "reduce_scatter of " + in.str() + " over " + std::to_string(size()) + " ranks into " +
                 out.str());
  KILN_CHECK(op != ReduceOp::Average || is_floating(in.dtype()),
             std::string("reduce_scatter average of ") + dtype_name(in.dtype()));
  do_reduce_scatter(in, out, op);
}

void Communicator::barrier() {
  do_barrier();
}

void Communicator::all_reduce_host(std::vector<double>& values, HostReduceOp op) {
  const int n = static_cast<int>(values.size());
  std::vector<double> gathered(static_cast<std::size_t>(n) * size());
  {
    WatchdogScope watch("collective all_reduce_host", next_sequence(), options_.timeout_s);
    KILN_MPI_CHECK(
        MPI_Allgather(values.data(), n, MPI_DOUBLE, gathered.data(), n, MPI_DOUBLE, group_->comm));
  }
  for (int i = 0; i < n; ++i) {
    double acc = gathered[i];
    for (int r = 1; r < size(); ++r) {
      double v = gathered[static_cast<std::size_t>(r) * n + i];
      switch (op) {
        case HostReduceOp::Sum:
        case HostReduceOp::Average:
          acc += v;
          break;
        case HostReduceOp::Max:
          acc = v > acc || v != v ? v : acc;  // NaN wins, so an inf/NaN flag reaches every rank
          break;
        case HostReduceOp::Min:
          acc = v < acc || v != v ? v : acc;
          break;
      }
    }
    if (op == HostReduceOp::Average) acc /= size();
    values[i] = acc;
  }
}

double Communicator::all_reduce_host(double value, HostReduceOp op) {
  std::vector<double> v{value};
  all_reduce_host(v, op);
  return v[0];
}

std::int64_t Communicator::all_reduce_host(std::int64_t value, HostReduceOp op) {
  std::vector<std::int64_t> gathered(size());
  {
    WatchdogScope watch("collective all_reduce_host", next_sequence(), options_.timeout_s);
    KILN_MPI_CHECK(
        MPI_Allgather(&value, 1, MPI_INT64_T, gathered.data(), 1, MPI_INT64_T, group_->comm));
  }
  std::int64_t acc = gathered[0];
  for (int r = 1; r < size(); ++r) {
    std::int64_t v = gathered[r];
    if (op == HostReduceOp::Sum || op == HostReduceOp::Average) acc += v;
    if (op == HostReduceOp::Max) acc = std::max(acc, v);
    if (op == HostReduceOp::Min) acc = std::min(acc, v);
  }
  if (op == HostReduceOp::Average) acc /= size();
  return acc;
}

void Communicator::check_same_on_all_ranks(std::uint64_t value, const std::string& what) {
  std::vector<std::uint64_t> gathered(size());
  {
    WatchdogScope watch("collective check_same_on_all_ranks", next_sequence(), options_.timeout_s);
    KILN_MPI_CHECK(
        MPI_Allgather(&value, 1, MPI_UINT64_T, gathered.data(), 1, MPI_UINT64_T, group_->comm));
  }
  std::vector<int> differing;
  for (int r = 1; r < size(); ++r) {
    if (gathered[r] != gathered[0]) differing.push_back(r);
  }
  if (differing.empty()) return;
  auto hex = [](std::uint64_t v) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "0x%016" PRIx64, v);
    return std::string(buf);
  };
  std::ostringstream os;
  os << what << " differs between ranks: rank 0 has " << hex(gathered[0]) << ", but ";
  for (std::size_t i = 0; i < differing.size(); ++i) {
    int r = differing[i];
    os << (i ? ", " : "") << "rank " << r << " has " << hex(gathered[r]);
  }
  os << ". Every rank must run the same configuration (same config file, --set overrides and "
        "Kiln build)";
  throw InputError(os.str());
}

std::unique_ptr<Communicator> make_communicator(const World& world, Device device,
                                                CommunicatorOptions options) {
  if (options.backend == CommBackend::Mpi ||
      (options.backend == CommBackend::Auto && device.is_cpu())) {
    return std::make_unique<MpiCommunicator>(world, device, options);
  }
  if (device.is_cpu()) {
    throw InputError(
        "the NCCL backend reduces CUDA tensors; training on the CPU needs the MPI "
        "backend (parallel.backend MPI or AUTO)");
  }
#if KILN_WITH_CUDA
  return std::make_unique<NcclCommunicator>(world, device, options);
#else
  throw Error("a communicator for " + device.str() +
              " needs the CUDA backend with NCCL; this Kiln was built without CUDA");
#endif
}

}  // namespace kiln
