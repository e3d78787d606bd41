#include "comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <atomic>
#include <memory>

#include "comm/mpi_check.h"
#include "comm/nccl_check.h"
#include "comm/watchdog.h"
#include "core/cuda/cuda_check.h"
#include "core/stream.h"

namespace kiln {

std::string nccl_error_string(ncclResult_t status, ncclComm_t comm) {
  std::string text = ncclGetErrorString(status);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') text += ": " + std::string(last);
  return text;
}

std::string nccl_error_hint(ncclResult_t status) {
  switch (status) {
    case ncclUnhandledCudaError:
      return "a CUDA call inside NCCL failed: check for an earlier CUDA error, and that each rank "
             "uses its own GPU (one rank per GPU)";
    case ncclSystemError:
      return "a system call failed (sockets, shared memory): check /dev/shm size in containers "
             "(--shm-size), NCCL_SOCKET_IFNAME, and that every host can reach the others; rerun "
             "with NCCL_DEBUG=INFO";
    case ncclInternalError:
      return "rerun with NCCL_DEBUG=INFO (NCCL_DEBUG_SUBSYS=INIT,NET) for NCCL's own account";
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return "ranks may have called different collectives or sizes, or two ranks share a GPU; "
             "rerun with NCCL_DEBUG=WARN";
    case ncclRemoteError:
      return "another rank or the network failed; look for the first error in every rank's log";
    default:
      return "";
  }
}

namespace {

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return ncclFloat32;
    case DType::F64:
      return ncclFloat64;
    case DType::F16:
      return ncclFloat16;
    case DType::BF16:
      return ncclBfloat16;
    case DType::I32:
      return ncclInt32;
    case DType::I64:
      return ncclInt64;
    case DType::U8:
      return ncclUint8;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  return op == ReduceOp::Sum ? ncclSum : op == ReduceOp::Average ? ncclAvg : ncclMax;
}

// A CUDA event owned by the watch that polls it; destroyed by whichever side lets go last.
struct WatchEvent {
  cudaEvent_t event = nullptr;
  ~WatchEvent() {
    if (event != nullptr) KILN_IGNORE_ERROR(cudaEventDestroy(event));
  }
};

}  // namespace

NcclCommunicator::NcclCommunicator(const World& world, Device device, CommunicatorOptions options)
    : Communicator(world, options), device_(device) {
  KILN_CHECK(device.is_cuda(), "NcclCommunicator needs a CUDA device, got " + device.str());
  DeviceGuard guard(device);
  int least = 0, greatest = 0;
  KILN_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t stream = nullptr;
  KILN_CUDA_CHECK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest));
  stream_ = stream;
  cudaEvent_t ready = nullptr, done = nullptr;
  KILN_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  KILN_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  ready_event_ = ready;
  done_event_ = done;

  ncclUniqueId id;
  if (rank() == 0) KILN_NCCL_CHECK(ncclGetUniqueId(&id));
  MPI_Comm mpi = *static_cast<MPI_Comm*>(mpi_comm_handle());
  {
    WatchdogScope watch("NCCL bootstrap MPI_Bcast", 0, options.timeout_s);
    KILN_MPI_CHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, mpi));
  }
  ncclComm_t comm = nullptr;
  {
    WatchdogScope watch("ncclCommInitRank", 0, options.timeout_s);
    KILN_NCCL_CHECK(ncclCommInitRank(&comm, size(), id, rank()));
  }
  comm_ = comm;
  barrier_scratch_ = Tensor::zeros({1}, DType::F32, device);

  health_check_id_ = Watchdog::instance().add_health_check([comm]() -> std::string {
    ncclResult_t async = ncclSuccess;
    ncclResult_t status = ncclCommGetAsyncError(comm, &async);
    if (status != ncclSuccess) return "ncclCommGetAsyncError failed: " + nccl_error_string(status);
    if (async != ncclSuccess && async != ncclInProgress) {
      return "NCCL reported an asynchronous error: " + nccl_error_string(async, comm) +
             "; a rank may have died or the network failed";
    }
    return "";
  });
  abort_hook_id_ =
      Watchdog::instance().add_abort_hook([comm]() { KILN_IGNORE_ERROR(ncclCommAbort(comm)); });
}

NcclCommunicator::~NcclCommunicator() {
  Watchdog::instance().remove(health_check_id_);
  Watchdog::instance().remove(abort_hook_id_);
  DeviceGuard guard(device_);
  if (stream_ != nullptr) {
    KILN_IGNORE_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)));
  }
  if (comm_ != nullptr) KILN_IGNORE_ERROR(ncclCommDestroy(comm_));
  if (ready_event_ != nullptr) {
    KILN_IGNORE_ERROR(cudaEventDestroy(static_cast<cudaEvent_t>(ready_event_)));
  }
  if (done_event_ != nullptr) {
    KILN_IGNORE_ERROR(cudaEventDestroy(static_cast<cudaEvent_t>(done_event_)));
  }
  if (stream_ != nullptr) KILN_IGNORE_ERROR(cudaStreamDestroy(static_cast<cudaStream_t>(stream_)));
}

void* NcclCommunicator::comm_stream() const {
  return stream_;
}

void NcclCommunicator::comm_stream_wait_for_current() {
  // Reusing one event is safe: a wait captures the event's most recent record at call time.
  cudaEvent_t event = static_cast<cudaEvent_t>(ready_event_);
  KILN_CUDA_CHECK(cudaEventRecord(event, static_cast<cudaStream_t>(current_stream(device_))));
  KILN_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream_), event, 0));
}

void NcclCommunicator::current_stream_wait_for_comm() {
  cudaEvent_t event = static_cast<cudaEvent_t>(done_event_);
  KILN_CUDA_CHECK(cudaEventRecord(event, static_cast<cudaStream_t>(stream_)));
  KILN_CUDA_CHECK(
      cudaStreamWaitEvent(static_cast<cudaStream_t>(current_stream(device_)), event, 0));
}

void NcclCommunicator::synchronize() {
  WatchdogScope watch("synchronize with the communication stream", sequence(), options().timeout_s);
  KILN_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)));
}

void NcclCommunicator::watch(const char* op, std::uint64_t sequence) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_);
  // Inside CUDA graph capture nothing runs yet: there is nothing to watch.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  KILN_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return;
  auto event = std::make_shared<WatchEvent>();
  KILN_CUDA_CHECK(cudaEventCreateWithFlags(&event->event, cudaEventDisableTiming));
  KILN_CUDA_CHECK(cudaEventRecord(event->event, stream));
  Watchdog::instance().begin(std::string("collective ") + op, sequence, options().timeout_s,
                             [event, device = device_.index]() {
                               // The watchdog thread would otherwise create a context on GPU 0.
                               KILN_IGNORE_ERROR(cudaSetDevice(device));
                               // Finished, or failed: an error surfaces on the main thread.
                               return cudaEventQuery(event->event) != cudaErrorNotReady;
                             });
}

void NcclCommunicator::do_all_reduce(Tensor& t, ReduceOp op) {
  DeviceGuard guard(device_);
  const std::uint64_t seq = next_sequence();
  KILN_NCCL_CHECK(ncclAllReduce(t.data(), t.data(), static_cast<std::size_t>(t.numel()),
                                nccl_type(t.dtype()), nccl_op(op), comm_,
                                static_cast<cudaStream_t>(stream_)));
  watch("all_reduce", seq);
}

void NcclCommunicator::do_broadcast(Tensor& t, int root) {
  DeviceGuard guard(device_);
  const std::uint64_t seq = next_sequence();
  KILN_NCCL_CHECK(ncclBroadcast(t.data(), t.data(), static_cast<std::size_t>(t.numel()),
                                nccl_type(t.dtype()), root, comm_,
                                static_cast<cudaStream_t>(stream_)));
  watch("broadcast", seq);
}

void NcclCommunicator::do_all_gather(const Tensor& in, Tensor& out) {
  DeviceGuard guard(device_);
  const std::uint64_t seq = next_sequence();
  KILN_NCCL_CHECK(ncclAllGather(in.data(), out.data(), static_cast<std::size_t>(in.numel()),
                                nccl_type(in.dtype()), comm_, static_cast<cudaStream_t>(stream_)));
  watch("all_gather", seq);
}

void NcclCommunicator::do_reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) {
  DeviceGuard guard(device_);
  const std::uint64_t seq = next_sequence();
  KILN_NCCL_CHECK(ncclReduceScatter(in.data(), out.data(), static_cast<std::size_t>(out.numel()),
                                    nccl_type(in.dtype()), nccl_op(op), comm_,
                                    static_cast<cudaStream_t>(stream_)));
  watch("reduce_scatter", seq);
}

void NcclCommunicator::do_barrier() {
  DeviceGuard guard(device_);
  comm_stream_wait_for_current();
  const std::uint64_t seq = next_sequence();
  KILN_NCCL_CHECK(ncclAllReduce(barrier_scratch_.data(), barrier_scratch_.data(), 1, ncclFloat32,
                                ncclSum, comm_, static_cast<cudaStream_t>(stream_)));
  watch("barrier", seq);
  synchronize();
}

}  // namespace kiln
