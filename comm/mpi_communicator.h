#pragma once
// MpiCommunicator: collectives over MPI, blocking. Sums fold each element in rank order (an
// MPI_Alltoallv of slices, a local fold, an MPI_Allgatherv), so every rank gets the same bits and
// the result does not depend on how tensors are split into buckets.
//
// On a CUDA device (parallel.backend MPI on a GPU: no NCCL, or NCCL misbehaving on a machine)
// each collective stages its tensor through host memory: a device-to-host copy that waits for the
// caller's current stream, the host collective, and a host-to-device copy queued on that stream.
// Slower than NCCL (two copies and a host synchronisation per bucket, no overlap with backward)
// but it needs nothing beyond MPI, and the sums are the CPU backend's, bit for bit.

#include "comm/communicator.h"

namespace kiln {

class MpiCommunicator : public Communicator {
 public:
  // Collective over the world; CPU tensors.
  explicit MpiCommunicator(const World& world, CommunicatorOptions options = {});
  // Tensors on `device`: the CPU, or a GPU whose tensors are staged through host memory.
  MpiCommunicator(const World& world, Device device, CommunicatorOptions options);
  std::string backend_name() const override { return "mpi"; }
  Device device() const override { return device_; }

 protected:
  void do_all_reduce(Tensor& t, ReduceOp op) override;
  void do_broadcast(Tensor& t, int root) override;
  void do_all_gather(const Tensor& in, Tensor& out) override;
  void do_reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) override;
  void do_barrier() override;

 private:
  // The collectives on CPU tensors; the do_* overrides stage device tensors through them.
  void host_all_reduce(Tensor& t, ReduceOp op);
  void host_broadcast(Tensor& t, int root);
  void host_all_gather(const Tensor& in, Tensor& out);
  void host_reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op);
  Device device_;
};

}  // namespace kiln
