#include "launch/doctor/probes.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sstream>

#include "comm/watchdog.h"
#include "core/device.h"
#include "core/system_info.h"

namespace kiln::launch::doctor {
namespace {

// ---- network interfaces ----------------------------------------------------------------------

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

// ---- checkpoint directory write test -----------------------------------------------------------

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

// The directory to write-test: checkpoint.dir from a config may not exist yet, so its nearest
// existing parent stands in.
std::string directory_to_test(const DoctorOptions& o) {
  std::string dir = o.dir;
  if (o.dir_from_config) {
    while (!is_directory(dir) && dir != "/" && dir != "." && !dir.empty()) {
      std::size_t slash = dir.find_last_of('/');
      dir = slash == std::string::npos ? "." : slash == 0 ? "/" : dir.substr(0, slash);
    }
  }
  return dir;
}

std::optional<std::string> environment(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::nullopt : std::optional<std::string>(value);
}

// Peer access among this host's GPUs, counted over directed pairs of distinct GPUs.
PeerAccessFacts host_peer_access(const SystemInfo& info) {
  PeerAccessFacts peer;
  std::vector<std::vector<bool>> access = gpu_peer_access();
  for (std::size_t a = 0; a < access.size(); ++a) {
    for (std::size_t b = 0; b < access.size(); ++b) {
      if (a == b) continue;
      ++peer.pairs;
      peer.with_access += access[a][b] ? 1 : 0;
    }
  }
  for (const GpuInfo& g : info.gpus) {
    peer.gpu_names += (peer.gpu_names.empty() ? "" : ", ") + g.name;
  }
  return peer;
}

}  // namespace

// The interface NCCL's socket transport most likely takes: NCCL_SOCKET_IFNAME's first match, else
// (NCCL's own order) an InfiniBand "ib" one, else any but docker and loopback, else docker, else
// loopback.
std::string likely_nccl_interface(const std::vector<Interface>& interfaces,
                                  const char* socket_ifname) {
  auto first = [&](const std::function<bool(const std::string&)>& ok) -> std::string {
    for (const Interface& i : interfaces) {
      if (i.up && ok(i.name)) return i.name;
    }
    return "";
  };
  if (socket_ifname != nullptr && *socket_ifname != '\0') {
    return first([&](const std::string& n) { return ifname_spec_matches(socket_ifname, n); });
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

RankFacts gather_local_facts(const World& world, const DoctorOptions& o) {
  RankFacts f;
  f.rank = world.rank;
  f.host = world.host;
  f.local_rank = world.local_rank;
  f.local_size = world.local_size;
  f.gpu_count = o.use_cuda ? cuda_device_count() : 0;
  if (f.gpu_count > 0) {
    SystemInfo info = collect_system_info();
    if (world.local_rank < static_cast<int>(info.gpus.size())) {
      const GpuInfo& g = info.gpus[world.local_rank];
      f.gpu =
          GpuFacts{g.index,         g.name,    g.pci_bus_id,    g.nvml,         info.nvml_status,
                   g.temperature_c, g.power_w, g.power_limit_w, g.sm_clock_mhz, g.sm_clock_max_mhz};
    }
    if (world.local_rank == 0) f.peer_access = host_peer_access(info);
  }
  f.interfaces = host_interfaces();
  f.nccl_socket_ifname = environment("NCCL_SOCKET_IFNAME");
  f.nccl_p2p_disable = environment("NCCL_P2P_DISABLE");
  f.nccl_ib_disable = environment("NCCL_IB_DISABLE");
  f.nccl_interface = likely_nccl_interface(
      f.interfaces, f.nccl_socket_ifname ? f.nccl_socket_ifname->c_str() : nullptr);
  if (world.local_rank == 0) {
    // One writer per host: ranks of a host share its disks.
    std::string dir = directory_to_test(o);
    f.write = is_directory(dir)
                  ? measure_write(dir, o.write_mb, world.host)
                  : WriteResult{dir, 0, 0, "the directory " + dir + " does not exist"};
  }
  return f;
}

}  // namespace kiln::launch::doctor
