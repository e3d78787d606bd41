#pragma once
// MpiCommunicator: collectives on CPU tensors over MPI, blocking. Sums fold each element in rank
// order (an MPI_Alltoallv of slices, a local fold, an MPI_Allgatherv), so every rank gets the
// same bits and the result does not depend on how tensors are split into buckets.

#include "comm/communicator.h"

namespace kiln {

class MpiCommunicator : public Communicator {
 public:
  // Collective over the world.
  explicit MpiCommunicator(const World& world, CommunicatorOptions options = {});
  std::string backend_name() const override { return "mpi"; }
  Device device() const override { return Device::cpu(); }

 protected:
  void do_all_reduce(Tensor& t, ReduceOp op) override;
  void do_broadcast(Tensor& t, int root) override;
  void do_all_gather(const Tensor& in, Tensor& out) override;
  void do_reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) override;
  void do_barrier() override;
};

}  // namespace kiln
