// kiln doctor: what is wrong with this cluster job's world, links and disks. Every rank gathers
// its facts (host, GPU, PCI bus id, peer access, NVML, network interfaces, a write test of the
// checkpoint directory), rank 0 prints one report with a verdict (ok / warn / fail) and a fix for
// each check, and the exit code is 1 when any check failed. Every collective runs under the
// communicators' watchdog and every measurement is bounded, so the doctor itself cannot hang.
// The parts live in launch/doctor/: probes gather the facts, checks judge them, report prints.

#include <boost/program_options.hpp>

#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "comm/world.h"
#include "configs/experiment.h"
#include "core/check.h"
#include "launch/commands.h"
#include "launch/doctor/checks.h"
#include "launch/doctor/collective_checks.h"
#include "launch/doctor/facts.h"
#include "launch/doctor/probes.h"
#include "launch/doctor/report.h"
#include "launch/run_ranks.h"

namespace po = boost::program_options;

namespace kiln::launch::doctor {
namespace {

constexpr double kCollectiveTimeoutS = 120;  // any collective of the doctor

int run_doctor_on_rank(const World& world, const DoctorOptions& o) {
  std::vector<RankFacts> ranks;
  // Ranks wait here for the write tests of the slowest host.
  for (const std::string& bytes : all_gather_strings(world, encode(gather_local_facts(world, o)),
                                                     kWriteTimeoutS + kCollectiveTimeoutS)) {
    ranks.push_back(decode(bytes));
  }
  const JobFacts job = job_facts(std::move(ranks), world.rank, o);
  const std::vector<CheckEntry>& table = fact_checks();
  std::vector<Check> checks;
  for (std::size_t i = 0; i < kChecksBeforeCollectives; ++i) {
    checks.push_back(run_check(table[i], job, o));
  }
  Device device = Device::cpu();
  std::string note;
  if (gpus_usable(job, checks.front())) {
    device = select_local_device(world);
  } else if (job.cuda) {
    note = "measured over MPI on the CPU: the ranks do not have one GPU each";
  }
  CommunicatorOptions options;
  options.timeout_s = kCollectiveTimeoutS;
  std::unique_ptr<Communicator> comm = make_communicator(world, device, options);
  checks.push_back(check_agree(*comm, world));
  checks.push_back(check_bandwidth(*comm, o, note));
  comm.reset();
  for (std::size_t i = kChecksBeforeCollectives; i < table.size(); ++i) {
    checks.push_back(run_check(table[i], job, o));
  }
  if (world.rank == 0) {
    std::string device_name = device.is_cuda() ? "cuda" : "cpu";
    if (o.json) {
      print_json(checks, job.ranks, device_name);
    } else {
      print_table(checks, job.ranks, device_name);
    }
  }
  return overall_verdict(checks) == Verdict::Fail ? 1 : 0;
}

}  // namespace
}  // namespace kiln::launch::doctor

namespace kiln::launch {

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
  doctor::DoctorOptions o;
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
  o.cuda_build = KILN_WITH_CUDA != 0;
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
    code = doctor::run_doctor_on_rank(world, o);
    return 0;  // a failed check is a report, not an error that ends the job
  });
  return run != 0 ? run : code;
}

}  // namespace kiln::launch
