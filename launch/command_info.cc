// kiln info [--json]: versions of Kiln and the libraries it runs on, and every GPU.

#include <google/protobuf/stubs/common.h>
#include <mpi.h>
#include <boost/program_options.hpp>
#include <boost/version.hpp>

#include <cstdio>
#include <iostream>
#include <sstream>

#include "core/json_writer.h"
#include "core/system_info.h"
#include "launch/commands.h"

#if KILN_WITH_CUDA
#include <nccl.h>
#endif

namespace po = boost::program_options;

namespace kiln::launch {
namespace {

std::string mpi_library_version() {
  char version[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int length = 0;
  // MPI_Get_library_version may be called before MPI_Init.
  if (MPI_Get_library_version(version, &length) != MPI_SUCCESS) return "unknown";
  std::string v(version, static_cast<std::size_t>(length));
  std::size_t comma = v.find(',');
  if (comma != std::string::npos) v = v.substr(0, comma);
  while (!v.empty() && (v.back() == '\n' || v.back() == ' ' || v.back() == '\0')) v.pop_back();
  return v;
}

std::string nccl_version() {
#if KILN_WITH_CUDA
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  return std::to_string(v / 10000) + "." + std::to_string((v % 10000) / 100) + "." +
         std::to_string(v % 100);
#else
  return "";
#endif
}

std::string boost_version() {
  return std::to_string(BOOST_VERSION / 100000) + "." + std::to_string(BOOST_VERSION / 100 % 1000) +
         "." + std::to_string(BOOST_VERSION % 100);
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

}  // namespace

int run_info(const Arguments& args) {
  po::options_description options("kiln info: versions of Kiln and its libraries, and the GPUs");
  options.add_options()("help,h", "show this help")("json", "print JSON");
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(options).run(), vm);
  if (vm.count("help")) {
    std::cout << "usage: kiln info [--json]\n\n" << options << "\n";
    return 0;
  }
  SystemInfo info = collect_system_info();
  std::string protobuf = google::protobuf::internal::VersionString(GOOGLE_PROTOBUF_VERSION);
  std::string mpi = mpi_library_version(), nccl = nccl_version(), boost = boost_version();
  if (vm.count("json")) {
    JsonWriter j;
    j.begin_object();
    j.field("kiln", info.kiln_version);
    j.field("cuda_built", info.cuda_built);
    j.field("cuda_runtime", info.cuda_runtime);
    j.field("cuda_driver", info.cuda_driver);
    j.field("nvidia_driver", info.nvidia_driver);
    j.field("cudnn", info.cudnn);
    j.field("cublas", info.cublas);
    j.field("nccl", nccl);
    j.field("mpi", mpi);
    j.field("protobuf", protobuf);
    j.field("boost", boost);
    j.field("nvml", info.nvml_status);
    j.field("gpu_status", info.gpu_status);
    j.key("gpus");
    j.begin_array();
    for (const GpuInfo& g : info.gpus) {
      j.begin_object();
      j.field("index", g.index);
      j.field("name", g.name);
      j.field("compute_capability",
              std::to_string(g.compute_major) + "." + std::to_string(g.compute_minor));
      j.field("memory_bytes", g.memory_bytes);
      j.field("multiprocessors", g.multiprocessors);
      if (g.nvml) {
        j.field("temperature_c", g.temperature_c);
        j.field("power_w", g.power_w);
        j.field("power_limit_w", g.power_limit_w);
      }
      j.end_object();
    }
    j.end_array();
    j.end_object();
    std::cout << j.str() << "\n";
    return 0;
  }
  auto line = [](const std::string& name, const std::string& value) {
    std::cout << "  " << name << std::string(name.size() < 14 ? 14 - name.size() : 1, ' ')
              << (value.empty() ? "-" : value) << "\n";
  };
  std::cout << "Kiln " << info.kiln_version << "\n";
  line("CUDA backend", info.cuda_built ? "built" : "not built (CPU only)");
  line("CUDA runtime", info.cuda_runtime);
  line("CUDA driver", info.cuda_driver);
  line("NVIDIA driver", info.nvidia_driver);
  line("cuDNN", info.cudnn);
  line("cuBLAS", info.cublas);
  line("NCCL", nccl);
  line("MPI", mpi);
  line("protobuf", protobuf);
  line("Boost", boost);
  line("NVML", info.nvml_status);
  if (info.gpus.empty()) {
    std::cout << "GPUs: none (" << info.gpu_status << ")\n";
  } else {
    std::cout << "GPUs:\n";
    for (const GpuInfo& g : info.gpus) {
      std::cout << "  cuda:" << g.index << "  " << g.name << ", sm_" << g.compute_major
                << g.compute_minor << ", " << gib(g.memory_bytes) << ", " << g.multiprocessors
                << " SMs";
      if (g.nvml) {
        std::printf(", %.0f C, %.0f W of %.0f W", g.temperature_c, g.power_w, g.power_limit_w);
        std::cout.flush();
      }
      std::cout << "\n";
    }
  }
  return 0;
}

}  // namespace kiln::launch
