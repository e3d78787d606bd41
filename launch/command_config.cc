// kiln config --config FILE [--set path=value ...] [--world-size N] [--json]: the effective
// experiment, validated for the job it names (N ranks on train.device).

#include <boost/program_options.hpp>

#include <iostream>

#include "configs/experiment.h"
#include "core/device.h"
#include "launch/commands.h"

namespace po = boost::program_options;

namespace kiln::launch {

int run_config(const Arguments& args) {
  po::options_description options("kiln config: print the effective experiment");
  options.add_options()("help,h", "show this help")("config", po::value<std::string>()->required(),
                                                    "experiment file (protobuf text)")(
      "set", po::value<std::vector<std::string>>()->composing(),
      "override a field: --set optimizer.lr=3e-4 (repeatable)")("json", "print JSON")(
      "world-size", po::value<int>()->default_value(1),
      "ranks of the job to validate for (the batch plan)");
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(options).run(), vm);
  if (vm.count("help")) {
    std::cout << "usage: kiln config --config FILE [--set path=value ...] [--json]\n\n"
              << options << "\n";
    return 0;
  }
  po::notify(vm);
  std::string path = vm["config"].as<std::string>();
  std::vector<std::string> overrides;
  if (vm.count("set")) overrides = vm["set"].as<std::vector<std::string>>();
  config::Experiment experiment = config::load_experiment(path, overrides);
  int world_size = vm["world-size"].as<int>();
  // The job this describes may run elsewhere (a login node without a GPU describes a GPU job):
  // take the device the experiment names as present. `kiln train` checks it for real.
  config::ValidationContext context{world_size, cuda_device_count() > 0, path, overrides};
  config::fill_device_defaults(experiment, context.cuda_available);
  context.assume_named_device = true;
  config::validate(experiment, context);
  config::BatchPlan plan = config::plan_batches(experiment, world_size);
  if (vm.count("json")) {
    std::cout << config::to_json(experiment) << "\n";
  } else {
    std::cout << config::to_effective_text(experiment);
    std::cout << "# batch plan for " << world_size << " rank(s): " << plan.per_gpu << " per GPU x "
              << plan.accumulation << " accumulation x " << plan.world_size << " = " << plan.global
              << " global\n";
  }
  return 0;
}

}  // namespace kiln::launch
