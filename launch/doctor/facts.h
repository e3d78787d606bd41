#pragma once
// What one rank of `kiln doctor` knows about itself (its host, GPU, network interfaces and, on a
// host's first rank, the host's peer access and a write test of the checkpoint directory), and
// the one encoding that carries these facts to every rank in all_gather_strings.

#include <optional>
#include <string>
#include <vector>

namespace kiln::launch::doctor {

struct Interface {
  std::string name;
  std::string address;
  bool up = false;
};

// The GPU this rank would train on (the visible GPU of its local rank) as NVML sees it.
struct GpuFacts {
  int index = 0;
  std::string name;
  std::string pci_bus_id;
  bool nvml = false;
  std::string nvml_status;
  double temperature_c = 0;
  double power_w = 0;
  double power_limit_w = 0;
  double sm_clock_mhz = 0;
  double sm_clock_max_mhz = 0;
};

// cudaDeviceCanAccessPeer among all GPUs of the host, reported by its local rank 0.
struct PeerAccessFacts {
  int pairs = 0;          // directed pairs of distinct GPUs
  int with_access = 0;    // pairs where the first can read the second's memory
  std::string gpu_names;  // "NVIDIA H100, NVIDIA H100"
};

// The write test of a checkpoint directory, run by a host's local rank 0.
struct WriteResult {
  std::string dir;  // the directory written
  double bytes = 0;
  double seconds = 0;
  std::string error;  // empty when it worked
};

struct RankFacts {
  int rank = 0;
  std::string host;
  int local_rank = 0;
  int local_size = 1;
  int gpu_count = 0;            // visible GPUs (0 under --device cpu)
  std::optional<GpuFacts> gpu;  // none when the local rank has no GPU of its own
  std::optional<PeerAccessFacts> peer_access;
  std::vector<Interface> interfaces;
  std::string nccl_interface;  // the interface NCCL's socket transport most likely takes
  // NCCL's environment as this rank sees it; unset differs from set to "".
  std::optional<std::string> nccl_socket_ifname;
  std::optional<std::string> nccl_p2p_disable;
  std::optional<std::string> nccl_ib_disable;
  std::optional<WriteResult> write;
};

// Bytes that decode() turns back into the same facts, numbers bit for bit.
std::string encode(const RankFacts& facts);
// Throws kiln::Error on bytes that encode() did not write (truncated, another version).
RankFacts decode(const std::string& bytes);

// "eth0 10.0.0.1, lo 127.0.0.1 (down)": how messages and the JSON report list interfaces.
std::string interface_list(const std::vector<Interface>& interfaces);
// The number of distinct hosts among the ranks.
int host_count(const std::vector<RankFacts>& ranks);

}  // namespace kiln::launch::doctor
