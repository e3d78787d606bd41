#pragma once
// NcclCommunicator: collectives on CUDA tensors of one device through NCCL, enqueued on a
// dedicated communication stream of the highest priority (so bucket all-reduces are not starved
// by backward's kernels). Rank 0 creates the ncclUniqueId and sends it with MPI_Bcast. Each
// collective is watched: an event recorded after it is polled by the watchdog thread, which also
// polls ncclCommGetAsyncError; a timeout or an asynchronous error aborts the communicator
// (ncclCommAbort) and exits the process. Built only with CUDA.

#include "comm/communicator.h"

struct ncclComm;

namespace kiln {

class NcclCommunicator : public Communicator {
 public:
  // Collective over the world; `device` is this rank's GPU (select_local_device()).
  NcclCommunicator(const World& world, Device device, CommunicatorOptions options = {});
  ~NcclCommunicator() override;

  std::string backend_name() const override { return "nccl"; }
  Device device() const override { return device_; }
  void* comm_stream() const override;
  void comm_stream_wait_for_current() override;
  void current_stream_wait_for_comm() override;
  void synchronize() override;
  ncclComm* nccl_comm() const { return comm_; }

 protected:
  void do_all_reduce(Tensor& t, ReduceOp op) override;
  void do_broadcast(Tensor& t, int root) override;
  void do_all_gather(const Tensor& in, Tensor& out) override;
  void do_reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) override;
  void do_barrier() override;

 private:
  // Registers the collective just enqueued with the watchdog.
  void watch(const char* op, std::uint64_t sequence);

  Device device_;
  ncclComm* comm_ = nullptr;
  void* stream_ = nullptr;       // cudaStream_t, owned
  void* ready_event_ = nullptr;  // cudaEvent_t: recorded on the caller's stream
  void* done_event_ = nullptr;   // cudaEvent_t: recorded on the comm stream
  Tensor barrier_scratch_;       // (1,) f32
  std::uint64_t health_check_id_ = 0;
  std::uint64_t abort_hook_id_ = 0;
};

}  // namespace kiln
