#include "launch/doctor/collective_checks.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/bandwidth.h"
#include "core/check.h"

#if KILN_WITH_CUDA
#include <nccl.h>

#include "comm/nccl_check.h"
#include "comm/nccl_communicator.h"
#endif

namespace kiln::launch::doctor {
namespace {

constexpr double kSlowBusGbS = 1.0;  // NCCL bus bandwidth at the largest size below: warn

std::string size_text(std::size_t bytes) {
  if (bytes >= (1u << 30) && bytes % (1u << 30) == 0) return std::to_string(bytes >> 30) + " GiB";
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= (1u << 10) && bytes % (1u << 10) == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

}  // namespace

Check check_agree(Communicator& comm, const World& world) {
  Check c{"mpi_nccl_agree"};
  const std::int64_t n = world.size, expected_sum = n * (n - 1) / 2;
  std::int64_t mpi_sum =
      comm.all_reduce_host(static_cast<std::int64_t>(world.rank), HostReduceOp::Sum);
  std::int64_t mpi_count = comm.all_reduce_host(std::int64_t{1}, HostReduceOp::Sum);
  Tensor ids = Tensor::from_vector<double>({static_cast<double>(world.rank), 1.0}, {2});  // (2,)
  ids = ids.to(comm.device());
  comm.all_reduce(ids);
  std::vector<double> sums = ids.to(Device::cpu()).to_vector<double>();
  std::int64_t mismatched = 0;
  std::string backend = comm.backend_name();
#if KILN_WITH_CUDA
  if (auto* nccl = dynamic_cast<NcclCommunicator*>(&comm)) {
    int count = 0, rank = 0;
    KILN_NCCL_CHECK(ncclCommCount(nccl->nccl_comm(), &count));
    KILN_NCCL_CHECK(ncclCommUserRank(nccl->nccl_comm(), &rank));
    mismatched = count != world.size || rank != world.rank ? 1 : 0;
  }
#endif
  mismatched = comm.all_reduce_host(mismatched, HostReduceOp::Sum);
  c.detail = "MPI: " + std::to_string(mpi_count) + " rank(s), sum of ids " +
             std::to_string(mpi_sum) + "; " + backend +
             " all-reduce: " + format_number("%.0f", sums[1]) + " rank(s), sum of ids " +
             format_number("%.0f", sums[0]) + "; expected " + std::to_string(n) + " and " +
             std::to_string(expected_sum);
  if (backend != "nccl") c.detail += " (NCCL is not used on the CPU)";
  bool agree = mpi_count == n && mpi_sum == expected_sum && sums[1] == static_cast<double>(n) &&
               sums[0] == static_cast<double>(expected_sum) && mismatched == 0;
  if (mismatched > 0) {
    c.add_detail(std::to_string(mismatched) +
                 " rank(s) where NCCL's rank or size differs from MPI's");
  }
  if (!agree) {
    c.raise(Verdict::Fail);
    c.fix =
        "the ranks do not form one world: start every rank with the same mpirun, and check "
        "that no rank's environment sets NCCL_COMM_ID or a different NCCL version";
  }
  finish_check(c);
  return c;
}

Check check_bandwidth(Communicator& comm, const DoctorOptions& o, const std::string& note) {
  Check c{"all_reduce_bandwidth"};
  const bool cuda = comm.device().is_cuda();
  if (comm.size() < 2) {
    c.detail = "one rank: no all-reduce to measure (run under mpirun with 2 or more ranks)";
    finish_check(c);
    return c;
  }
  const std::size_t min_bytes = cuda ? std::size_t{1} << 20 : std::size_t{1} << 10;
  const std::size_t max_bytes = o.max_mb > 0 ? static_cast<std::size_t>(o.max_mb) << 20
                                : cuda       ? std::size_t{1} << 30
                                             : std::size_t{4} << 20;
  // Enough iterations for a stable figure, few enough to stay bounded at the largest size.
  const std::size_t budget = cuda ? std::size_t{256} << 20 : std::size_t{16} << 20;
  auto results = std::make_shared<std::vector<AllReduceBandwidth>>();
  std::int64_t wrong = 0;
  for (std::size_t bytes : all_reduce_sizes(min_bytes, max_bytes)) {
    int iterations = static_cast<int>(std::clamp<std::size_t>(budget / bytes, 2, 20));
    results->push_back(measure_all_reduce(comm, bytes, iterations));
    wrong += results->back().wrong;
  }
  const AllReduceBandwidth& largest = results->back();
  c.detail = comm.backend_name() + ", " + std::to_string(comm.size()) + " ranks: bus bandwidth " +
             format_number("%.2f", results->front().busbw_gbs) + " GB/s at " +
             size_text(results->front().bytes) + ", " + format_number("%.2f", largest.busbw_gbs) +
             " GB/s at " + size_text(largest.bytes);
  if (!note.empty()) c.add_detail(note);
  if (wrong > 0) {
    c.raise(Verdict::Fail);
    c.add_detail(std::to_string(wrong) + " wrong elements in the all-reduce sums");
    c.fix = cuda ? "all-reduce sums are wrong: set NCCL_P2P_DISABLE=1 (peer-to-peer that the "
                   "driver reports but the hardware does not do, as on RTX 4090s), and check the "
                   "GPUs' memory (nvidia-smi -q -d ECC)"
                 : "all-reduce sums are wrong over MPI: check the MPI installation";
  } else if (cuda && largest.busbw_gbs < kSlowBusGbS) {
    c.raise(Verdict::Warn);
    c.fix = "NCCL bus bandwidth below " + format_number("%.0f", kSlowBusGbS) +
            " GB/s: check the network check above (NCCL_SOCKET_IFNAME), that NCCL_IB_DISABLE=1 "
            "is set where there is no InfiniBand, and that nothing else loads the link";
  }
  if (!note.empty() && c.verdict == Verdict::Ok) {
    c.raise(Verdict::Warn);
    c.fix = "fix the world check first; NCCL was not measured";
  }
  c.data = [results](JsonWriter& j) {
    j.key("sizes");
    j.begin_array();
    for (const AllReduceBandwidth& r : *results) {
      j.begin_object();
      j.field("bytes", r.bytes);
      j.field("iterations", r.iterations);
      j.field("time_us", r.seconds * 1e6);
      j.field("algbw_gbs", r.algbw_gbs);
      j.field("busbw_gbs", r.busbw_gbs);
      j.field("wrong", static_cast<long long>(r.wrong));
      j.end_object();
    }
    j.end_array();
  };
  finish_check(c);
  return c;
}

}  // namespace kiln::launch::doctor
