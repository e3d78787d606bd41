// kiln doctor: what is wrong with this cluster job's world, links and disks. Every rank gathers
// its facts (host, GPU, PCI bus id, peer access, NVML, network interfaces, a write test of the
// checkpoint directory), rank 0 prints one report with a verdict (ok / warn / fail) and a fix for
// each check, and the exit code is 1 when any check failed. Every collective runs under the
// communicators' watchdog and every measurement is bounded, so the doctor itself cannot hang.

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/program_options.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "comm/bandwidth.h"
#include "comm/communicator.h"
#include "comm/watchdog.h"
#include "comm/world.h"
#include "configs/experiment.h"
#include "core/check.h"
#include "core/json_writer.h"
#include "core/system_info.h"
#include "launch/commands.h"
#include "launch/run_ranks.h"

#if KILN_WITH_CUDA
#include <nccl.h>

#include "comm/nccl_check.h"
#include "comm/nccl_communicator.h"
#endif

namespace po = boost::program_options;

namespace kiln::launch {
namespace {

constexpr double kCollectiveTimeoutS = 120;  // any collective of the doctor
constexpr double kWriteTimeoutS = 300;       // the checkpoint directory's write test
constexpr double kSlowWriteMbS = 200;        // below: warn
constexpr double kSlowBusGbS = 1.0;          // NCCL bus bandwidth at the largest size below: warn
constexpr double kHotC = 85;                 // GPU temperature at or above: warn

struct DoctorOptions {
  bool json = false;
  std::string dir;
  bool dir_from_config = false;  // checkpoint.dir may not exist yet: test its nearest parent
  int write_mb = 128;
  int max_mb = 0;  // 0: 1024 on CUDA, 4 on the CPU
  bool use_cuda = true;
};

enum class Verdict { Ok, Warn, Fail };

const char* verdict_name(Verdict v) {
  return v == Verdict::Ok ? "ok" : v == Verdict::Warn ? "warn" : "fail";
}

struct Check {
  explicit Check(std::string check_name) : name(std::move(check_name)) {}
  std::string name;
  Verdict verdict = Verdict::Ok;
  std::string detail;
  std::string fix;
  std::function<void(JsonWriter&)> data;  // extra JSON fields of the check

  void raise(Verdict v) { verdict = std::max(verdict, v); }
  static void add(std::string& text, const std::string& more) {
    text += (text.empty() ? "" : "; ") + more;
  }
};

// One rank's facts, as key=value lines (what travels in all_gather_strings).
using Facts = std::map<std::string, std::string>;

std::string encode(const Facts& facts) {
  std::string out;
  for (const auto& [k, v] : facts) {
    std::string value = v;
    std::replace(value.begin(), value.end(), '\n', ' ');
    out += k + "=" + value + "\n";
  }
  return out;
}

Facts decode(const std::string& text) {
  Facts facts;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::size_t eq = line.find('=');
    if (eq != std::string::npos) facts[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return facts;
}

std::string get(const Facts& f, const std::string& key) {
  auto it = f.find(key);
  return it == f.end() ? std::string() : it->second;
}

double number(const Facts& f, const std::string& key) {
  std::string v = get(f, key);
  return v.empty() ? 0.0 : std::strtod(v.c_str(), nullptr);
}

std::string fmt(const char* format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, value);
  return buf;
}

std::string size_text(std::size_t bytes) {
  if (bytes >= (1u << 30) && bytes % (1u << 30) == 0) return std::to_string(bytes >> 30) + " GiB";
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= (1u << 10) && bytes % (1u << 10) == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

// ---- network interfaces ----------------------------------------------------------------------

struct Interface {
  std::string name;
  std::string address;
  bool up = false;
};

std::vector<Interface> host_interfaces() {
  std::vector<Interface> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr) continue;
    int family = a->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    char text[INET6_ADDRSTRLEN] = {0};
    const void* where =
        family == AF_INET
            ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr)
            : static_cast<const void*>(
                  &reinterpret_cast<const sockaddr_in6*>(a->ifa_addr)->sin6_addr);
    if (inet_ntop(family, where, text, sizeof(text)) == nullptr) continue;
    bool known = std::any_of(out.begin(), out.end(),
                             [&](const Interface& i) { return i.name == a->ifa_name; });
    if (known) continue;  // one address per interface (IPv4 comes first on Linux)
    out.push_back({a->ifa_name, text, (a->ifa_flags & IFF_UP) != 0});
  }
  freeifaddrs(list);
  return out;
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// NCCL_SOCKET_IFNAME's syntax: a comma-separated list of prefixes; "^" before the list excludes
// them, "=" before the list asks for exact names.
bool ifname_spec_matches(std::string spec, const std::string& name) {
  bool exclude = false, exact = false;
  if (!spec.empty() && spec[0] == '^') {
    exclude = true;
    spec.erase(0, 1);
  }
  if (!spec.empty() && spec[0] == '=') {
    exact = true;
    spec.erase(0, 1);
  }
  bool listed = false;
  std::istringstream in(spec);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty() && (exact ? name == item : starts_with(name, item))) listed = true;
  }
  return exclude ? !listed : listed;
}

// The interface NCCL's socket transport most likely takes: NCCL_SOCKET_IFNAME's first match, else
// (NCCL's own order) an InfiniBand "ib" one, else any but docker and loopback, else docker, else
// loopback.
std::string likely_nccl_interface(const std::vector<Interface>& interfaces, const char* spec) {
  auto first = [&](const std::function<bool(const std::string&)>& ok) -> std::string {
    for (const Interface& i : interfaces) {
      if (i.up && ok(i.name)) return i.name;
    }
    return "";
  };
  if (spec != nullptr && *spec != '\0') {
    return first([&](const std::string& n) { return ifname_spec_matches(spec, n); });
  }
  for (const auto& rule : std::vector<std::function<bool(const std::string&)>>{
           [](const std::string& n) { return starts_with(n, "ib"); },
           [](const std::string& n) { return !starts_with(n, "docker") && !starts_with(n, "lo"); },
           [](const std::string& n) { return starts_with(n, "docker"); },
           [](const std::string& n) { return starts_with(n, "lo"); }}) {
    std::string name = first(rule);
    if (!name.empty()) return name;
  }
  return "";
}

// ---- checkpoint directory write test -----------------------------------------------------------

struct WriteResult {
  std::string dir;  // the directory written
  double bytes = 0;
  double seconds = 0;
  std::string error;  // empty when it worked
};

bool is_directory(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Writes `mb` MiB into a temporary file of `dir`, fsyncs, and deletes it. Never throws; a write
// that hangs (a dead network file system) ends the process through the watchdog after
// kWriteTimeoutS with a message naming the directory.
WriteResult measure_write(const std::string& dir, int mb, const std::string& host) {
  WriteResult r;
  r.dir = dir;
  std::string path = dir + "/.kiln-doctor-" + host + "-" + std::to_string(getpid()) + ".tmp";
  std::uint64_t watch =
      Watchdog::instance().begin("write test of " + dir, 0, kWriteTimeoutS, {},
                                 "the file system of " + dir + " is hung or very slow");
  auto start = std::chrono::steady_clock::now();
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    r.error = "cannot create a file in " + dir + ": " + std::strerror(errno);
    Watchdog::instance().end(watch);
    return r;
  }
  // Bytes that do not compress, so a compressing file system is measured too.
  std::vector<unsigned char> chunk(std::size_t{4} << 20);
  std::uint32_t x = 2463534242u;
  for (unsigned char& c : chunk) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    c = static_cast<unsigned char>(x);
  }
  const double total = static_cast<double>(mb) * (1 << 20);
  while (r.bytes < total && r.error.empty()) {
    std::size_t want = static_cast<std::size_t>(std::min<double>(chunk.size(), total - r.bytes));
    ssize_t wrote = write(fd, chunk.data(), want);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote <= 0) {
      r.error = "writing to " + dir + " failed: " + std::strerror(errno);
      break;
    }
    r.bytes += static_cast<double>(wrote);
  }
  if (r.error.empty() && fsync(fd) != 0) {
    r.error = "fsync in " + dir + " failed: " + std::strerror(errno);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (close(fd) != 0 && r.error.empty()) {
    r.error = "closing the file in " + dir + " failed: " + std::strerror(errno);
  }
  if (unlink(path.c_str()) != 0 && r.error.empty()) {
    r.error = "cannot delete " + path + ": " + std::strerror(errno);
  }
  Watchdog::instance().end(watch);
  return r;
}

// ---- this rank's facts -------------------------------------------------------------------------

Facts local_facts(const World& world, const DoctorOptions& o) {
  Facts f;
  f["rank"] = std::to_string(world.rank);
  f["host"] = world.host;
  f["local_rank"] = std::to_string(world.local_rank);
  f["local_size"] = std::to_string(world.local_size);
  const int gpu_count = o.use_cuda ? cuda_device_count() : 0;
  f["gpu_count"] = std::to_string(gpu_count);
  f["gpu"] = "-1";
  if (gpu_count > 0) {
    SystemInfo info = collect_system_info();
    if (world.local_rank < static_cast<int>(info.gpus.size())) {
      const GpuInfo& g = info.gpus[world.local_rank];
      f["gpu"] = std::to_string(g.index);
      f["gpu_name"] = g.name;
      f["pci_bus_id"] = g.pci_bus_id;
      f["nvml"] = g.nvml ? "1" : "0";
      f["nvml_status"] = info.nvml_status;
      f["temperature_c"] = fmt("%.0f", g.temperature_c);
      f["power_w"] = fmt("%.0f", g.power_w);
      f["power_limit_w"] = fmt("%.0f", g.power_limit_w);
      f["sm_clock_mhz"] = fmt("%.0f", g.sm_clock_mhz);
      f["sm_clock_max_mhz"] = fmt("%.0f", g.sm_clock_max_mhz);
    }
    if (world.local_rank == 0) {
      // Peer access among this host's GPUs, reported once per host.
      std::vector<std::vector<bool>> access = gpu_peer_access();
      int pairs = 0, yes = 0;
      std::string names;
      for (std::size_t a = 0; a < access.size(); ++a) {
        for (std::size_t b = 0; b < access.size(); ++b) {
          if (a == b) continue;
          ++pairs;
          yes += access[a][b] ? 1 : 0;
        }
      }
      for (const GpuInfo& g : info.gpus) names += (names.empty() ? "" : ", ") + g.name;
      f["p2p_pairs"] = std::to_string(pairs);
      f["p2p_yes"] = std::to_string(yes);
      f["gpu_names"] = names;
    }
  }
  std::vector<Interface> interfaces = host_interfaces();
  std::string list;
  for (const Interface& i : interfaces) {
    list += (list.empty() ? "" : ", ") + i.name + " " + i.address + (i.up ? "" : " (down)");
  }
  const char* spec = std::getenv("NCCL_SOCKET_IFNAME");
  f["interfaces"] = list;
  f["nccl_interface"] = likely_nccl_interface(interfaces, spec);
  for (const char* name : {"NCCL_SOCKET_IFNAME", "NCCL_P2P_DISABLE", "NCCL_IB_DISABLE"}) {
    const char* v = std::getenv(name);
    if (v != nullptr) f[std::string("env_") + name] = v;
  }
  if (world.local_rank == 0) {
    // One writer per host: ranks of a host share its disks.
    std::string dir = o.dir;
    if (o.dir_from_config) {
      while (!is_directory(dir) && dir != "/" && dir != "." && !dir.empty()) {
        std::size_t slash = dir.find_last_of('/');
        dir = slash == std::string::npos ? "." : slash == 0 ? "/" : dir.substr(0, slash);
      }
    }
    WriteResult w = is_directory(dir)
                        ? measure_write(dir, o.write_mb, world.host)
                        : WriteResult{dir, 0, 0, "the directory " + dir + " does not exist"};
    f["write_dir"] = w.dir;
    f["write_bytes"] = fmt("%.0f", w.bytes);
    f["write_seconds"] = fmt("%.6f", w.seconds);
    f["write_error"] = w.error;
  }
  return f;
}

// ---- the checks --------------------------------------------------------------------------------

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

Check check_world(const std::vector<Facts>& ranks, bool cuda, bool* gpus_usable) {
  Check c{"world"};
  std::set<std::string> hosts;
  for (const Facts& f : ranks) hosts.insert(get(f, "host"));
  c.detail = std::to_string(ranks.size()) + " rank" + (ranks.size() == 1 ? "" : "s") + " on " +
             std::to_string(hosts.size()) + " host" + (hosts.size() == 1 ? "" : "s");
  *gpus_usable = cuda;
  if (!cuda) {
    c.detail += ", on the CPU";
    c.fix = "nothing to do";
    return c;
  }
  std::map<std::string, std::vector<int>> by_gpu;  // host + PCI bus id -> ranks
  for (const Facts& f : ranks) {
    int rank = static_cast<int>(number(f, "rank"));
    if (number(f, "gpu") < 0) {
      c.raise(Verdict::Fail);
      c.add(c.detail, "rank " + std::to_string(rank) + " on " + get(f, "host") +
                          " has no GPU of its own (local rank " + get(f, "local_rank") + " of " +
                          get(f, "local_size") + ", " + get(f, "gpu_count") + " GPUs visible)");
      continue;
    }
    by_gpu[get(f, "host") + " " + get(f, "pci_bus_id")].push_back(rank);
  }
  for (const auto& [gpu, on] : by_gpu) {
    if (on.size() > 1) {
      c.raise(Verdict::Fail);
      c.add(c.detail,
            "ranks " + rank_list(on) + " share one GPU (host and PCI bus id " + gpu + ")");
    }
  }
  if (c.verdict == Verdict::Fail) {
    *gpus_usable = false;
    c.fix =
        "one rank per GPU: start at most as many ranks per host as it has GPUs (mpirun "
        "--map-by ppr:GPUS:node, or -npernode GPUS), and do not give ranks the same "
        "CUDA_VISIBLE_DEVICES (unset it: Kiln picks the GPU by local rank)";
  } else {
    c.add(c.detail, "one GPU per rank");
    c.fix = "nothing to do";
  }
  return c;
}

Check check_peer_access(const std::vector<Facts>& ranks, bool cuda) {
  Check c{"peer_access"};
  c.fix = "nothing to do";
  if (!cuda) {
    c.detail = "no GPU";
    return c;
  }
  const char* disabled = std::getenv("NCCL_P2P_DISABLE");
  bool p2p_disabled = disabled != nullptr && std::string(disabled) == "1";
  for (const Facts& f : ranks) {
    if (get(f, "local_rank") != "0") continue;
    int pairs = static_cast<int>(number(f, "p2p_pairs")),
        yes = static_cast<int>(number(f, "p2p_yes"));
    std::string host = get(f, "host"), names = get(f, "gpu_names");
    bool rtx4090 = names.find("4090") != std::string::npos;
    std::string line = host + ": " + get(f, "gpu_count") + " GPU(s)";
    if (pairs == 0) {
      c.add(c.detail, line + ", nothing to connect");
    } else if (yes == 0) {
      c.add(c.detail, line + ", no peer access between them: NCCL goes through host memory" +
                          (rtx4090 ? " (normal for RTX 4090s, which have none)" : ""));
    } else {
      c.add(c.detail, line + ", peer access on " + std::to_string(yes) + " of " +
                          std::to_string(pairs) + " directed pairs");
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
  if (p2p_disabled) c.add(c.detail, "NCCL_P2P_DISABLE=1");
  return c;
}

Check check_network(const std::vector<Facts>& ranks, bool cuda) {
  Check c{"network"};
  std::set<std::string> hosts;
  for (const Facts& f : ranks) hosts.insert(get(f, "host"));
  std::set<std::string> seen;
  for (const Facts& f : ranks) {
    std::string host = get(f, "host");
    if (!seen.insert(host).second) continue;
    std::string spec = get(f, "env_NCCL_SOCKET_IFNAME"), chosen = get(f, "nccl_interface");
    std::string line =
        host + ": " +
        (spec.empty() ? "NCCL would likely use " : "NCCL_SOCKET_IFNAME=" + spec + " -> ") +
        (chosen.empty() ? "no interface" : chosen) + " (interfaces: " + get(f, "interfaces") + ")";
    c.add(c.detail, line);
    if (chosen.empty() && !spec.empty()) {
      c.raise(Verdict::Fail);
      c.add(c.fix, "NCCL_SOCKET_IFNAME=" + spec + " matches no interface that is up on " + host +
                       ": set it to the interface that connects the hosts (one of: " +
                       get(f, "interfaces") + "), or unset it");
    } else if (starts_with(chosen, "lo") && hosts.size() > 1) {
      c.raise(Verdict::Warn);
      c.add(c.fix, host + " has only the loopback interface for NCCL, yet the ranks span " +
                       std::to_string(hosts.size()) +
                       " hosts: set NCCL_SOCKET_IFNAME to the interface that connects them");
    }
    std::string ib = get(f, "env_NCCL_IB_DISABLE");
    if (!ib.empty()) c.add(c.detail, host + ": NCCL_IB_DISABLE=" + ib);
  }
  if (!cuda) c.add(c.detail, "NCCL is not used on the CPU; MPI picks its own transport");
  if (c.fix.empty()) c.fix = "nothing to do";
  return c;
}

Check check_write(const std::vector<Facts>& ranks, const DoctorOptions& o) {
  Check c{"checkpoint_write"};
  struct HostWrite {
    std::string host, dir, error;
    double bytes, seconds, mb_per_s;
  };
  auto writes = std::make_shared<std::vector<HostWrite>>();
  for (const Facts& f : ranks) {
    if (get(f, "local_rank") != "0") continue;
    HostWrite w{get(f, "host"),           get(f, "write_dir"),        get(f, "write_error"),
                number(f, "write_bytes"), number(f, "write_seconds"), 0};
    w.mb_per_s = w.seconds > 0 ? w.bytes / w.seconds / 1e6 : 0;
    writes->push_back(w);
    if (!w.error.empty()) {
      c.raise(Verdict::Fail);
      c.add(c.detail, w.host + ": " + w.error);
      c.add(c.fix, "make " + w.dir + " an existing directory this user can write on " + w.host +
                       " (or pass --dir, or set checkpoint.dir)");
      continue;
    }
    c.add(c.detail, w.host + ": " + w.dir + " " + fmt("%.0f", w.mb_per_s) + " MB/s (" +
                        fmt("%.0f", w.bytes / (1 << 20)) + " MiB written and fsynced)");
    if (w.mb_per_s < kSlowWriteMbS) {
      c.raise(Verdict::Warn);
      c.add(c.fix, w.host + ": " + w.dir + " writes below " + fmt("%.0f", kSlowWriteMbS) +
                       " MB/s: checkpoints will stall training; put checkpoint.dir on a local "
                       "disk or a faster file system");
    }
  }
  if (o.dir_from_config && !writes->empty() && writes->front().dir != o.dir) {
    c.add(c.detail, "checkpoint.dir " + o.dir +
                        " does not exist yet: its nearest existing parent "
                        "was tested");
  }
  if (c.fix.empty()) c.fix = "nothing to do";
  c.data = [writes](JsonWriter& j) {
    j.key("hosts");
    j.begin_array();
    for (const HostWrite& w : *writes) {
      j.begin_object();
      j.field("host", w.host);
      j.field("dir", w.dir);
      j.field("bytes", w.bytes);
      j.field("seconds", w.seconds);
      j.field("mb_per_s", w.mb_per_s);
      j.field("error", w.error);
      j.end_object();
    }
    j.end_array();
  };
  return c;
}

Check check_gpu_health(const std::vector<Facts>& ranks, bool cuda) {
  Check c{"gpu_health"};
  c.fix = "nothing to do";
  if (!cuda) {
    c.detail = "no GPU";
    return c;
  }
  for (const Facts& f : ranks) {
    if (number(f, "gpu") < 0) continue;
    std::string who = "rank " + get(f, "rank") + " " + get(f, "host") + " cuda:" + get(f, "gpu");
    if (get(f, "nvml") != "1") {
      c.add(c.detail, who + ": NVML not available (" + get(f, "nvml_status") + ")");
      continue;
    }
    double temperature = number(f, "temperature_c");
    c.add(c.detail, who + ": " + get(f, "temperature_c") + " C, " + get(f, "power_w") + " W of " +
                        get(f, "power_limit_w") + " W, SM clock " + get(f, "sm_clock_mhz") +
                        " of " + get(f, "sm_clock_max_mhz") + " MHz");
    if (temperature >= kHotC) {
      c.raise(Verdict::Warn);
      c.fix = "a GPU at " + fmt("%.0f", kHotC) +
              " C or more throttles its clock: check the fans and the airflow of the case";
    }
  }
  return c;
}

// MPI and the collective backend (NCCL on GPUs) see the same world: each sums the rank ids and
// counts the ranks, and NCCL's own rank and size must be MPI's.
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
             std::to_string(mpi_sum) + "; " + backend + " all-reduce: " + fmt("%.0f", sums[1]) +
             " rank(s), sum of ids " + fmt("%.0f", sums[0]) + "; expected " + std::to_string(n) +
             " and " + std::to_string(expected_sum);
  if (backend != "nccl") c.detail += " (NCCL is not used on the CPU)";
  bool agree = mpi_count == n && mpi_sum == expected_sum && sums[1] == static_cast<double>(n) &&
               sums[0] == static_cast<double>(expected_sum) && mismatched == 0;
  if (mismatched > 0)
    c.add(c.detail,
          std::to_string(mismatched) + " rank(s) where NCCL's rank or size differs from MPI's");
  if (!agree) {
    c.raise(Verdict::Fail);
    c.fix =
        "the ranks do not form one world: start every rank with the same mpirun, and check "
        "that no rank's environment sets NCCL_COMM_ID or a different NCCL version";
  } else {
    c.fix = "nothing to do";
  }
  return c;
}

Check check_bandwidth(Communicator& comm, const DoctorOptions& o, const std::string& note) {
  Check c{"all_reduce_bandwidth"};
  const bool cuda = comm.device().is_cuda();
  if (comm.size() < 2) {
    c.detail = "one rank: no all-reduce to measure (run under mpirun with 2 or more ranks)";
    c.fix = "nothing to do";
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
             fmt("%.2f", results->front().busbw_gbs) + " GB/s at " +
             size_text(results->front().bytes) + ", " + fmt("%.2f", largest.busbw_gbs) +
             " GB/s at " + size_text(largest.bytes);
  if (!note.empty()) c.add(c.detail, note);
  c.fix = "nothing to do";
  if (wrong > 0) {
    c.raise(Verdict::Fail);
    c.add(c.detail, std::to_string(wrong) + " wrong elements in the all-reduce sums");
    c.fix = cuda ? "all-reduce sums are wrong: set NCCL_P2P_DISABLE=1 (peer-to-peer that the "
                   "driver reports but the hardware does not do, as on RTX 4090s), and check the "
                   "GPUs' memory (nvidia-smi -q -d ECC)"
                 : "all-reduce sums are wrong over MPI: check the MPI installation";
  } else if (cuda && largest.busbw_gbs < kSlowBusGbS) {
    c.raise(Verdict::Warn);
    c.fix = "NCCL bus bandwidth below " + fmt("%.0f", kSlowBusGbS) +
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
  return c;
}

// ---- the report --------------------------------------------------------------------------------

void print_json(const std::vector<Check>& checks, const std::vector<Facts>& ranks,
                const std::string& device, Verdict overall) {
  std::set<std::string> hosts;
  for (const Facts& f : ranks) hosts.insert(get(f, "host"));
  JsonWriter j;
  j.begin_object();
  j.field("verdict", verdict_name(overall));
  j.field("ranks", static_cast<int>(ranks.size()));
  j.field("hosts", static_cast<int>(hosts.size()));
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
  for (const Facts& f : ranks) {
    j.begin_object();
    for (const auto& [k, v] : f) {
      static const std::set<std::string> numeric_keys = {
          "rank",          "local_rank", "local_size",    "gpu_count",    "gpu",
          "temperature_c", "power_w",    "power_limit_w", "sm_clock_mhz", "sm_clock_max_mhz",
          "p2p_pairs",     "p2p_yes",    "write_bytes",   "write_seconds"};
      bool numeric = numeric_keys.count(k) > 0 && !v.empty();
      if (numeric) {
        j.field(k, std::strtod(v.c_str(), nullptr));
      } else {
        j.field(k, v);
      }
    }
    j.end_object();
  }
  j.end_array();
  j.end_object();
  std::cout << j.str() << std::endl;
}

void print_table(const std::vector<Check>& checks, const std::vector<Facts>& ranks,
                 const std::string& device, Verdict overall) {
  std::cout << "kiln doctor: " << ranks.size() << " rank" << (ranks.size() == 1 ? "" : "s")
            << ", device " << device << "\n\n";
  std::printf("%5s  %-16s %-6s %-7s %-17s %s\n", "rank", "host", "local", "gpu", "pci bus id",
              "name");
  for (const Facts& f : ranks) {
    std::string local = get(f, "local_rank") + "/" + get(f, "local_size");
    std::string gpu = get(f, "gpu") == "-1" ? "-" : "cuda:" + get(f, "gpu");
    std::string bus = get(f, "pci_bus_id").empty() ? "-" : get(f, "pci_bus_id");
    std::string name = get(f, "gpu_name").empty() ? "-" : get(f, "gpu_name");
    std::printf("%5s  %-16s %-6s %-7s %-17s %s\n", get(f, "rank").c_str(), get(f, "host").c_str(),
                local.c_str(), gpu.c_str(), bus.c_str(), name.c_str());
  }
  std::printf("\n");
  for (const Check& c : checks) {
    std::printf("%-5s %-21s %s\n", verdict_name(c.verdict), c.name.c_str(), c.detail.c_str());
    std::printf("%-5s %-21s %s\n", "", "FIX", c.fix.c_str());
  }
  int counts[3] = {0, 0, 0};
  for (const Check& c : checks) ++counts[static_cast<int>(c.verdict)];
  std::printf("\nVERDICT %s: %d ok, %d warn, %d fail\n", verdict_name(overall), counts[0],
              counts[1], counts[2]);
  std::fflush(stdout);
}

int doctor(const World& world, const DoctorOptions& o) {
  Facts mine = local_facts(world, o);
  std::vector<Facts> ranks;
  // Ranks wait here for the write tests of the slowest host.
  for (const std::string& text :
       all_gather_strings(world, encode(mine), kWriteTimeoutS + kCollectiveTimeoutS)) {
    ranks.push_back(decode(text));
  }
  bool cuda = o.use_cuda;
  for (const Facts& f : ranks) cuda = cuda && number(f, "gpu_count") > 0;  // every rank agrees
  std::vector<Check> checks;
  bool gpus_usable = false;
  checks.push_back(check_world(ranks, cuda, &gpus_usable));
  checks.push_back(check_peer_access(ranks, cuda));
  Device device = Device::cpu();
  std::string note;
  if (gpus_usable) {
    device = select_local_device(world);
  } else if (cuda) {
    note = "measured over MPI on the CPU: the ranks do not have one GPU each";
  }
  CommunicatorOptions options;
  options.timeout_s = kCollectiveTimeoutS;
  std::unique_ptr<Communicator> comm = make_communicator(world, device, options);
  checks.push_back(check_agree(*comm, world));
  checks.push_back(check_bandwidth(*comm, o, note));
  comm.reset();
  checks.push_back(check_network(ranks, cuda));
  checks.push_back(check_write(ranks, o));
  checks.push_back(check_gpu_health(ranks, cuda));
  Verdict overall = Verdict::Ok;
  for (const Check& c : checks) overall = std::max(overall, c.verdict);
  if (world.rank == 0) {
    std::string device_name = device.is_cuda() ? "cuda" : "cpu";
    if (o.json) {
      print_json(checks, ranks, device_name, overall);
    } else {
      print_table(checks, ranks, device_name, overall);
    }
  }
  return overall == Verdict::Fail ? 1 : 0;
}

}  // namespace

int run_doctor(const Arguments& args) {
  po::options_description options(
      "kiln doctor: checks of the world, GPUs, links and checkpoint disk of a (multi-node) job");
  options.add_options()("help,h", "show this help")("json", "print one JSON object")(
      "dir", po::value<std::string>(),
      "the checkpoint directory to write-test (default: checkpoint.dir of --config, else .)")(
      "write-mb", po::value<int>()->default_value(128), "MiB written (and fsynced) in the test")(
      "max-mb", po::value<int>(),
      "the largest all-reduce in MiB (default 1024 on GPUs, 4 on the CPU)")(
      "device", po::value<std::string>()->default_value("auto"),
      "auto (GPUs when there are any) or cpu")("config", po::value<std::string>(),
                                               "an experiment: its checkpoint.dir is tested")(
      "set", po::value<std::vector<std::string>>()->composing(), "override a config field");
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(options).run(), vm);
  po::notify(vm);
  if (vm.count("help")) {
    std::cout << "usage: kiln doctor [--json] [--dir DIR | --config FILE] [--write-mb N] "
                 "[--max-mb N] [--device cpu|auto]\n       mpirun -np N kiln doctor ...\n\n"
              << options << "\n";
    return 0;
  }
  DoctorOptions o;
  o.json = vm.count("json") > 0;
  o.write_mb = vm["write-mb"].as<int>();
  if (o.write_mb < 1 || o.write_mb > 16384) {
    throw InputError("--write-mb must be between 1 and 16384, got " + std::to_string(o.write_mb));
  }
  if (vm.count("max-mb")) {
    o.max_mb = vm["max-mb"].as<int>();
    if (o.max_mb < 1 || o.max_mb > 4096) {
      throw InputError("--max-mb must be between 1 and 4096, got " + std::to_string(o.max_mb));
    }
  }
  std::string device = vm["device"].as<std::string>();
  if (device != "auto" && device != "cpu") {
    throw InputError("--device must be auto or cpu, got '" + device + "'");
  }
  o.use_cuda = device == "auto";
  if (vm.count("dir") && vm.count("config")) {
    throw InputError("give --dir or --config, not both");
  }
  if (vm.count("dir")) {
    o.dir = vm["dir"].as<std::string>();
    if (o.dir.empty()) throw InputError("--dir is empty");
  } else if (vm.count("config")) {
    std::vector<std::string> sets;
    if (vm.count("set")) sets = vm["set"].as<std::vector<std::string>>();
    o.dir = config::load_experiment(vm["config"].as<std::string>(), sets).checkpoint().dir();
    o.dir_from_config = true;
  } else {
    o.dir = ".";
  }
  int code = 0;
  int run = run_on_all_ranks("doctor", [&](const World& world) {
    code = doctor(world, o);
    return 0;  // a failed check is a report, not an error that ends the job
  });
  return run != 0 ? run : code;
}

}  // namespace kiln::launch
