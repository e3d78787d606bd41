#include "core/check.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <sstream>

namespace kiln {
namespace {

std::atomic<int> g_rank{-1};
std::atomic<int> g_world_size{0};
std::atomic<CurrentDeviceQuery> g_device_query{nullptr};

std::string host_name() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

}  // namespace

void set_process_identity(int rank, int world_size) {
  g_rank = rank;
  g_world_size = world_size;
}

std::string process_identity() {
  std::ostringstream os;
  if (g_rank >= 0) os << "rank " << g_rank << "/" << g_world_size << " on ";
  os << "host " << host_name();
  return os.str();
}

void set_current_device_query(CurrentDeviceQuery query) {
  g_device_query = query;
}

std::string format_bytes(std::size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

void report_failure(const char* library, const std::string& error_string, const SourceSite& site,
                    const std::string& hint) {
  std::ostringstream os;
  os << library << " error: " << error_string << "\n  in " << site.expression << "\n  at "
     << site.function << " (" << site.file << ":" << site.line << ")\n  on " << process_identity();
  CurrentDeviceQuery query = g_device_query.load();
  if (query != nullptr) {
    int device = query();
    if (device >= 0) os << ", CUDA device " << device;
  }
  if (!hint.empty()) os << "\n  hint: " << hint;
  throw Error(os.str());
}

}  // namespace kiln
