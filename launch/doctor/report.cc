#include "launch/doctor/report.h"

#include <cstdio>
#include <iostream>

#include "core/json_writer.h"

namespace kiln::launch::doctor {
namespace {

// One rank's facts under "per_rank". Keys come in alphabetical order and a fact a rank lacks is
// left out, as the reports before typed facts had them; "nvml" stays the string "1" or "0".
void write_rank_facts(JsonWriter& j, const RankFacts& f) {
  const GpuFacts* gpu = f.gpu ? &*f.gpu : nullptr;
  const PeerAccessFacts* peer = f.peer_access ? &*f.peer_access : nullptr;
  const WriteResult* write = f.write ? &*f.write : nullptr;
  j.begin_object();
  if (f.nccl_ib_disable) j.field("env_NCCL_IB_DISABLE", *f.nccl_ib_disable);
  if (f.nccl_p2p_disable) j.field("env_NCCL_P2P_DISABLE", *f.nccl_p2p_disable);
  if (f.nccl_socket_ifname) j.field("env_NCCL_SOCKET_IFNAME", *f.nccl_socket_ifname);
  j.field("gpu", gpu ? gpu->index : -1);
  j.field("gpu_count", f.gpu_count);
  if (gpu) j.field("gpu_name", gpu->name);
  if (peer) j.field("gpu_names", peer->gpu_names);
  j.field("host", f.host);
  j.field("interfaces", interface_list(f.interfaces));
  j.field("local_rank", f.local_rank);
  j.field("local_size", f.local_size);
  j.field("nccl_interface", f.nccl_interface);
  if (gpu) {
    j.field("nvml", gpu->nvml ? "1" : "0");
    j.field("nvml_status", gpu->nvml_status);
  }
  if (peer) {
    j.field("p2p_pairs", peer->pairs);
    j.field("p2p_yes", peer->with_access);
  }
  if (gpu) {
    j.field("pci_bus_id", gpu->pci_bus_id);
    j.field("power_limit_w", gpu->power_limit_w);
    j.field("power_w", gpu->power_w);
  }
  j.field("rank", f.rank);
  if (gpu) {
    j.field("sm_clock_max_mhz", gpu->sm_clock_max_mhz);
    j.field("sm_clock_mhz", gpu->sm_clock_mhz);
    j.field("temperature_c", gpu->temperature_c);
  }
  if (write) {
    j.field("write_bytes", write->bytes);
    j.field("write_dir", write->dir);
    j.field("write_error", write->error);
    j.field("write_seconds", write->seconds);
  }
  j.end_object();
}

}  // namespace

Verdict overall_verdict(const std::vector<Check>& checks) {
  Verdict overall = Verdict::Ok;
  for (const Check& c : checks) overall = std::max(overall, c.verdict);
  return overall;
}

void print_json(const std::vector<Check>& checks, const std::vector<RankFacts>& ranks,
                const std::string& device) {
  JsonWriter j;
  j.begin_object();
  j.field("verdict", verdict_name(overall_verdict(checks)));
  j.field("ranks", static_cast<int>(ranks.size()));
  j.field("hosts", host_count(ranks));
  j.field("device", device);
  j.key("checks");
  j.begin_array();
  for (const Check& c : checks) {
    j.begin_object();
    j.field("name", c.name);
    j.field("verdict", verdict_name(c.verdict));
    j.field("detail", c.detail);
    j.field("fix", c.fix);
    if (c.data) c.data(j);
    j.end_object();
  }
  j.end_array();
  j.key("per_rank");
  j.begin_array();
  for (const RankFacts& f : ranks) write_rank_facts(j, f);
  j.end_array();
  j.end_object();
  std::cout << j.str() << std::endl;
}

void print_table(const std::vector<Check>& checks, const std::vector<RankFacts>& ranks,
                 const std::string& device) {
  std::cout << "kiln doctor: " << ranks.size() << " rank" << (ranks.size() == 1 ? "" : "s")
            << ", device " << device << "\n\n";
  std::printf("%5s  %-16s %-6s %-7s %-17s %s\n", "rank", "host", "local", "gpu", "pci bus id",
              "name");
  for (const RankFacts& f : ranks) {
    std::string local = std::to_string(f.local_rank) + "/" + std::to_string(f.local_size);
    std::string gpu = f.gpu ? "cuda:" + std::to_string(f.gpu->index) : "-";
    std::string bus = f.gpu && !f.gpu->pci_bus_id.empty() ? f.gpu->pci_bus_id : "-";
    std::string name = f.gpu && !f.gpu->name.empty() ? f.gpu->name : "-";
    std::printf("%5d  %-16s %-6s %-7s %-17s %s\n", f.rank, f.host.c_str(), local.c_str(),
                gpu.c_str(), bus.c_str(), name.c_str());
  }
  std::printf("\n");
  for (const Check& c : checks) {
    std::printf("%-5s %-21s %s\n", verdict_name(c.verdict), c.name.c_str(), c.detail.c_str());
    std::printf("%-5s %-21s %s\n", "", "FIX", c.fix.c_str());
  }
  int counts[3] = {0, 0, 0};
  for (const Check& c : checks) ++counts[static_cast<int>(c.verdict)];
  std::printf("\nVERDICT %s: %d ok, %d warn, %d fail\n", verdict_name(overall_verdict(checks)),
              counts[0], counts[1], counts[2]);
  std::fflush(stdout);
}

}  // namespace kiln::launch::doctor
