#include "launch/doctor/checks.h"

#include <cstdio>
#include <map>
#include <memory>
#include <set>

#include "core/check.h"

namespace kiln::launch::doctor {
namespace {

constexpr double kSlowWriteMbS = 200;  // below: warn
constexpr double kHotC = 85;           // GPU temperature at or above: warn

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

// One rank per GPU: every rank has a GPU of its own, and no two ranks of a host share a PCI bus id.
void check_world(Check& c, const JobFacts& job, const DoctorOptions& options) {
  const std::size_t ranks = job.ranks.size();
  const int hosts = host_count(job.ranks);
  c.detail = std::to_string(ranks) + " rank" + (ranks == 1 ? "" : "s") + " on " +
             std::to_string(hosts) + " host" + (hosts == 1 ? "" : "s");
  if (!job.cuda && options.use_cuda && options.cuda_build) {
    // A CUDA build asked for GPUs (--device auto): a rank without one is a broken GPU job, not a
    // CPU job (kiln train would fall back to the CPU, or fail on train.device: CUDA).
    for (const RankFacts& f : job.ranks) {
      if (f.gpu_count > 0) continue;
      c.raise(Verdict::Fail);
      c.add_detail("rank " + std::to_string(f.rank) + " on " + f.host +
                   " sees no usable GPU (this kiln is built with CUDA)");
    }
    c.fix =
        "check the driver (nvidia-smi), CUDA_VISIBLE_DEVICES and the job's GPU request "
        "(--gpus-per-node); to check a CPU job instead, run kiln doctor --device cpu";
    return;
  }
  if (!job.cuda) {
    c.detail += ", on the CPU";
    return;
  }
  std::map<std::string, std::vector<int>> by_gpu;  // host + PCI bus id -> ranks
  for (const RankFacts& f : job.ranks) {
    if (!f.gpu) {
      c.raise(Verdict::Fail);
      c.add_detail("rank " + std::to_string(f.rank) + " on " + f.host +
                   " has no GPU of its own (local rank " + std::to_string(f.local_rank) + " of " +
                   std::to_string(f.local_size) + ", " + std::to_string(f.gpu_count) +
                   " GPUs visible)");
      continue;
    }
    by_gpu[f.host + " " + f.gpu->pci_bus_id].push_back(f.rank);
  }
  for (const auto& [gpu, on] : by_gpu) {
    if (on.size() > 1) {
      c.raise(Verdict::Fail);
      c.add_detail("ranks " + rank_list(on) + " share one GPU (host and PCI bus id " + gpu + ")");
    }
  }
  if (c.verdict == Verdict::Fail) {
    c.fix =
        "one rank per GPU: start at most as many ranks per host as it has GPUs (mpirun "
        "--map-by ppr:GPUS:node, or -npernode GPUS), and do not give ranks the same "
        "CUDA_VISIBLE_DEVICES (unset it: Kiln picks the GPU by local rank)";
  } else {
    c.add_detail("one GPU per rank");
  }
}

// Peer access among each host's GPUs, as its local rank 0 found it.
void check_peer_access(Check& c, const JobFacts& job, const DoctorOptions&) {
  const std::optional<std::string>& disable = job.ranks.at(job.self).nccl_p2p_disable;
  const bool p2p_disabled = disable && *disable == "1";
  for (const RankFacts& f : job.ranks) {
    if (f.local_rank != 0) continue;
    const PeerAccessFacts peer = f.peer_access.value_or(PeerAccessFacts{});
    bool rtx4090 = peer.gpu_names.find("4090") != std::string::npos;
    std::string line = f.host + ": " + std::to_string(f.gpu_count) + " GPU(s)";
    if (peer.pairs == 0) {
      c.add_detail(line + ", nothing to connect");
    } else if (peer.with_access == 0) {
      c.add_detail(line + ", no peer access between them: NCCL goes through host memory" +
                   (rtx4090 ? " (normal for RTX 4090s, which have none)" : ""));
    } else {
      c.add_detail(line + ", peer access on " + std::to_string(peer.with_access) + " of " +
                   std::to_string(peer.pairs) + " directed pairs");
      if (rtx4090) {
        c.raise(Verdict::Warn);
        c.fix =
            "RTX 4090s have no working peer-to-peer access, yet the driver reports some: if "
            "all-reduces hang or give wrong sums, set NCCL_P2P_DISABLE=1";
      } else if (p2p_disabled) {
        c.raise(Verdict::Warn);
        c.fix =
            "NCCL_P2P_DISABLE=1 turns off working peer access (slower all-reduces): unset it "
            "unless peer-to-peer is broken on these GPUs";
      }
    }
  }
  if (p2p_disabled) c.add_detail("NCCL_P2P_DISABLE=1");
}

// The interface NCCL would take on each host, judged against NCCL_SOCKET_IFNAME and the hosts.
void check_network(Check& c, const JobFacts& job, const DoctorOptions&) {
  const int hosts = host_count(job.ranks);
  std::set<std::string> seen;
  for (const RankFacts& f : job.ranks) {
    if (!seen.insert(f.host).second) continue;
    const std::string spec = f.nccl_socket_ifname.value_or("");
    const std::string& chosen = f.nccl_interface;
    const std::string interfaces = interface_list(f.interfaces);
    c.add_detail(f.host + ": " +
                 (spec.empty() ? "NCCL would likely use " : "NCCL_SOCKET_IFNAME=" + spec + " -> ") +
                 (chosen.empty() ? "no interface" : chosen) + " (interfaces: " + interfaces + ")");
    if (chosen.empty() && !spec.empty()) {
      c.raise(Verdict::Fail);
      c.add_fix("NCCL_SOCKET_IFNAME=" + spec + " matches no interface that is up on " + f.host +
                ": set it to the interface that connects the hosts (one of: " + interfaces +
                "), or unset it");
    } else if (chosen.compare(0, 2, "lo") == 0 && hosts > 1) {
      c.raise(Verdict::Warn);
      c.add_fix(f.host + " has only the loopback interface for NCCL, yet the ranks span " +
                std::to_string(hosts) +
                " hosts: set NCCL_SOCKET_IFNAME to the interface that connects them");
    }
    const std::string ib = f.nccl_ib_disable.value_or("");
    if (!ib.empty()) c.add_detail(f.host + ": NCCL_IB_DISABLE=" + ib);
  }
  if (!job.cuda) c.add_detail("NCCL is not used on the CPU; MPI picks its own transport");
}

// Each host's write test of the checkpoint directory: an error fails, a slow disk warns.
void check_write(Check& c, const JobFacts& job, const DoctorOptions& o) {
  struct HostWrite {
    std::string host;
    WriteResult write;
    double mb_per_s;
  };
  auto hosts = std::make_shared<std::vector<HostWrite>>();
  for (const RankFacts& f : job.ranks) {
    if (f.local_rank != 0) continue;
    const WriteResult w = f.write.value_or(WriteResult{});
    hosts->push_back({f.host, w, w.seconds > 0 ? w.bytes / w.seconds / 1e6 : 0});
    const double mb_per_s = hosts->back().mb_per_s;
    if (!w.error.empty()) {
      c.raise(Verdict::Fail);
      c.add_detail(f.host + ": " + w.error);
      c.add_fix("make " + w.dir + " an existing directory this user can write on " + f.host +
                " (or pass --dir, or set checkpoint.dir)");
      continue;
    }
    c.add_detail(f.host + ": " + w.dir + " " + format_number("%.0f", mb_per_s) + " MB/s (" +
                 format_number("%.0f", w.bytes / (1 << 20)) + " MiB written and fsynced)");
    if (mb_per_s < kSlowWriteMbS) {
      c.raise(Verdict::Warn);
      c.add_fix(f.host + ": " + w.dir + " writes below " + format_number("%.0f", kSlowWriteMbS) +
                " MB/s: checkpoints will stall training; put checkpoint.dir on a local "
                "disk or a faster file system");
    }
  }
  if (o.dir_from_config && !hosts->empty() && hosts->front().write.dir != o.dir) {
    c.add_detail("checkpoint.dir " + o.dir +
                 " does not exist yet: its nearest existing parent "
                 "was tested");
  }
  c.data = [hosts](JsonWriter& j) {
    j.key("hosts");
    j.begin_array();
    for (const HostWrite& h : *hosts) {
      j.begin_object();
      j.field("host", h.host);
      j.field("dir", h.write.dir);
      j.field("bytes", h.write.bytes);
      j.field("seconds", h.write.seconds);
      j.field("mb_per_s", h.mb_per_s);
      j.field("error", h.write.error);
      j.end_object();
    }
    j.end_array();
  };
}

// NVML's temperature, power and clocks of every rank's GPU; a hot GPU warns.
void check_gpu_health(Check& c, const JobFacts& job, const DoctorOptions&) {
  for (const RankFacts& f : job.ranks) {
    if (!f.gpu) continue;
    const GpuFacts& gpu = *f.gpu;
    std::string who =
        "rank " + std::to_string(f.rank) + " " + f.host + " cuda:" + std::to_string(gpu.index);
    if (!gpu.nvml) {
      c.add_detail(who + ": NVML not available (" + gpu.nvml_status + ")");
      continue;
    }
    c.add_detail(who + ": " + format_number("%.0f", gpu.temperature_c) + " C, " +
                 format_number("%.0f", gpu.power_w) + " W of " +
                 format_number("%.0f", gpu.power_limit_w) + " W, SM clock " +
                 format_number("%.0f", gpu.sm_clock_mhz) + " of " +
                 format_number("%.0f", gpu.sm_clock_max_mhz) + " MHz");
    if (gpu.temperature_c >= kHotC) {
      c.raise(Verdict::Warn);
      c.fix = "a GPU at " + format_number("%.0f", kHotC) +
              " C or more throttles its clock: check the fans and the airflow of the case";
    }
  }
}

}  // namespace

const char* verdict_name(Verdict v) {
  return v == Verdict::Ok ? "ok" : v == Verdict::Warn ? "warn" : "fail";
}

std::string format_number(const char* format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, value);
  return buf;
}

JobFacts job_facts(std::vector<RankFacts> ranks, int self, const DoctorOptions& options) {
  JobFacts job;
  job.cuda = options.use_cuda;
  for (const RankFacts& f : ranks) job.cuda = job.cuda && f.gpu_count > 0;  // every rank agrees
  job.ranks = std::move(ranks);
  job.self = self;
  return job;
}

const std::vector<CheckEntry>& fact_checks() {
  static const std::vector<CheckEntry> table = {
      {"world", false, check_world},          {"peer_access", true, check_peer_access},
      {"network", false, check_network},      {"checkpoint_write", false, check_write},
      {"gpu_health", true, check_gpu_health},
  };
  return table;
}

const CheckEntry& fact_check(const std::string& name) {
  std::string known;
  for (const CheckEntry& entry : fact_checks()) {
    if (entry.name == name) return entry;
    known += (known.empty() ? "" : ", ") + std::string(entry.name);
  }
  throw Error("no check of facts named '" + name + "' (known: " + known + ")");
}

void finish_check(Check& check) {
  if (check.fix.empty()) check.fix = "nothing to do";
}

Check run_check(const CheckEntry& entry, const JobFacts& job, const DoctorOptions& options) {
  Check check{entry.name};
  if (entry.about_gpus && !job.cuda) {
    check.detail = "no GPU";
  } else {
    entry.body(check, job, options);
  }
  finish_check(check);
  return check;
}

bool gpus_usable(const JobFacts& job, const Check& world) {
  return job.cuda && world.verdict != Verdict::Fail;
}

}  // namespace kiln::launch::doctor
