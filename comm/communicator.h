#pragma once
// Communicator: collectives over the ranks of the world on tensors of one device.
//
// Two implementations with one interface: NcclCommunicator (CUDA tensors; NCCL bootstrapped over
// MPI; ops enqueued on a dedicated high-priority communication stream) and MpiCommunicator (CPU
// tensors, or CUDA tensors staged through host memory; blocking MPI). make_communicator() picks by
// CommunicatorOptions::backend and the device.
//
// Ordering. all_reduce/broadcast/all_gather/reduce_scatter are ordered with the caller's
// current stream: they start after work already queued there and work queued there afterwards
// sees their result, without a host synchronisation. The *_on_comm_stream variants only enqueue
// on the communication stream; the caller orders them with comm_stream_wait_for_current() /
// current_stream_wait_for_comm() (DataParallel overlaps bucket all-reduces with backward so).
// On the MPI backend every op has finished when it returns.
//
// Determinism. Every rank receives bitwise the same result. The MPI backend sums each element
// in rank order (rank 0 + rank 1 + ...) whatever the tensor's size or split, so results do not
// depend on bucket sizes; half types are summed in f32 and rounded once.
//
// Failure. Each collective has a sequence number and is watched by the process's Watchdog: one
// that does not finish within options.timeout_s ends the process with a message naming the op,
// its number and the time waited; NCCL asynchronous errors do too (after ncclCommAbort).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/world.h"
#include "core/tensor.h"

namespace kiln {

// Max: the elementwise largest (FP8 amax histories); exact in any order.
enum class ReduceOp { Sum, Average, Max };
enum class HostReduceOp { Sum, Average, Max, Min };
const char* reduce_op_name(ReduceOp op);

// parallel.backend of the experiment.
enum class CommBackend {
  Auto,  // NCCL for CUDA tensors, MPI for CPU ones
  Nccl,  // CUDA tensors only
  Mpi,   // any device; CUDA tensors travel through host memory
};
const char* comm_backend_name(CommBackend backend);  // "auto", "nccl", "mpi"

struct CommunicatorOptions {
  double timeout_s = 600.0;  // a collective not finished by then ends the process
  CommBackend backend = CommBackend::Auto;
};

class Communicator {
 public:
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return world_.rank; }
  int size() const { return world_.size; }
  const World& world() const { return world_; }
  const CommunicatorOptions& options() const { return options_; }
  virtual std::string backend_name() const = 0;  // "nccl", "mpi"
  virtual Device device() const = 0;

  // Tensors are contiguous, on device(); f32, f64, f16, bf16 (Average: floating types only;
  // Sum also i32, i64, u8). In place on every rank.
  void all_reduce(Tensor& t, ReduceOp op = ReduceOp::Sum);
  // Every rank receives root's values.
  void broadcast(Tensor& t, int root = 0);
  // out holds size() * in.numel() elements; rank r's `in` lands at [r * n, (r + 1) * n).
  void all_gather(const Tensor& in, Tensor& out);
  // in holds size() * out.numel() elements; rank r's `out` = reduction over ranks of
  // in[r * n, (r + 1) * n).
  void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op = ReduceOp::Sum);
  // Host-blocking: returns when every rank has reached it and this rank's queued ops finished.
  void barrier();

  // The communication stream (cudaStream_t; nullptr for MPI) and the cross-stream orderings.
  virtual void* comm_stream() const { return nullptr; }
  virtual void comm_stream_wait_for_current() {}
  virtual void current_stream_wait_for_comm() {}
  // Enqueues on the communication stream only; the caller orders it (see above).
  void all_reduce_on_comm_stream(Tensor& t, ReduceOp op = ReduceOp::Sum);
  void broadcast_on_comm_stream(Tensor& t, int root = 0);
  void all_gather_on_comm_stream(const Tensor& in, Tensor& out);
  void reduce_scatter_on_comm_stream(const Tensor& in, Tensor& out, ReduceOp op = ReduceOp::Sum);
  // The host waits for everything queued on the communication stream.
  virtual void synchronize() {}
  // Collectives issued so far (the sequence number of the next one).
  std::uint64_t sequence() const { return sequence_; }

  // Small host-side collectives over MPI on both backends, blocking: the found-inf flag, metrics.
  // Every rank gets bitwise the same result (values are gathered and folded in rank order).
  double all_reduce_host(double value, HostReduceOp op);
  std::int64_t all_reduce_host(std::int64_t value, HostReduceOp op);
  void all_reduce_host(std::vector<double>& values, HostReduceOp op);
  // Every rank passes its value (a config hash); when they differ every rank throws an Error
  // naming `what` and the ranks whose value differs from rank 0's.
  void check_same_on_all_ranks(std::uint64_t value, const std::string& what);

 protected:
  // Collective over the world (duplicates MPI_COMM_WORLD with MPI_ERRORS_RETURN).
  Communicator(const World& world, CommunicatorOptions options);
  // Enqueue on the communication stream (NCCL) or run to completion (MPI); arguments checked.
  virtual void do_all_reduce(Tensor& t, ReduceOp op) = 0;
  virtual void do_broadcast(Tensor& t, int root) = 0;
  virtual void do_all_gather(const Tensor& in, Tensor& out) = 0;
  virtual void do_reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) = 0;
  virtual void do_barrier() = 0;
  std::uint64_t next_sequence() { return sequence_++; }
  // The duplicated MPI communicator, as MPI_Comm (an opaque handle here to keep mpi.h out).
  void* mpi_comm_handle() const;

 private:
  void check_tensor(const Tensor& t, const char* op) const;
  struct MpiGroup;
  World world_;
  CommunicatorOptions options_;
  std::unique_ptr<MpiGroup> group_;
  std::uint64_t sequence_ = 0;
};

// A communicator over the world for tensors on `device`, of options.backend (Auto: NCCL for CUDA,
// MPI for the CPU). InputError for NCCL on the CPU; Error for NCCL in a build without CUDA.
// Collective: every rank calls it, in the same order as its other communicators.
std::unique_ptr<Communicator> make_communicator(const World& world, Device device,
                                                CommunicatorOptions options = {});

}  // namespace kiln
