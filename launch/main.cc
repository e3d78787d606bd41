// The `kiln` program: dispatches to a sub-command and turns errors into messages and exit codes
// (2 for bad input, 1 for everything else), never a stack trace.

#include <boost/program_options/errors.hpp>

#include <cstring>
#include <iostream>
#include <map>

#include "configs/experiment.h"
#include "core/check.h"
#include "core/system_info.h"
#include "kiln_git_commit.h"
#include "launch/commands.h"

namespace {

struct Command {
  int (*run)(const kiln::launch::Arguments&);
  const char* summary;
};

const std::map<std::string, Command>& commands() {
  static const std::map<std::string, Command> table = {
      {"info", {kiln::launch::run_info, "versions of Kiln and its libraries, and the GPUs"}},
      {"config", {kiln::launch::run_config, "print the effective experiment (file + --set)"}},
      {"model", {kiln::launch::run_model, "layers, parameters and FLOPs of a model"}},
      {"train", {kiln::launch::run_train, "train an experiment (under mpirun for many GPUs)"}},
      {"eval", {kiln::launch::run_eval, "evaluate a checkpoint on the eval split"}},
      {"bench", {kiln::launch::run_bench, "training throughput on synthetic data"}},
      {"autobatch", {kiln::launch::run_autobatch, "the largest per-GPU batch that fits"}},
      {"plan", {kiln::launch::run_plan, "per-GPU memory by ZeRO stage and recompute"}},
      {"replay", {kiln::launch::run_replay, "steps on a fixed batch (framework comparisons)"}},
      {"export", {kiln::launch::run_export, "the eval-mode model as ONNX (docs/deploy.md)"}},
      {"sample", {kiln::launch::run_sample, "generate from a GPT-2 model (docs/sample.md)"}},
      {"doctor", {kiln::launch::run_doctor, "check a (multi-node) job: GPUs, links, disk"}},
      {"tokenize", {kiln::launch::run_tokenize, "text into llm.c token shards (docs/data.md)"}},
  };
  return table;
}

void usage(std::ostream& os) {
  os << "usage: kiln <command> [options]   (kiln <command> --help for its options; kiln --version)"
        "\n\ncommands:\n";
  for (const auto& [name, command] : commands()) {
    os << "  " << name << std::string(12 - name.size(), ' ') << command.summary << "\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--version") == 0) {
    // The project's VERSION (CMakeLists.txt) and the commit the binary was built from.
    const std::string commit = KILN_GIT_COMMIT;
    std::cout << "kiln " << kiln::kiln_version()
              << (commit.empty() ? std::string(" (no git commit: not built from a checkout)")
                                 : " (git " + commit + ")")
              << "\n";
    return 0;
  }
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    usage(argc < 2 ? std::cerr : std::cout);
    return argc < 2 ? 2 : 0;
  }
  auto it = commands().find(argv[1]);
  if (it == commands().end()) {
    std::cerr << "kiln: unknown command '" << argv[1] << "'\n";
    usage(std::cerr);
    return 2;
  }
  kiln::launch::Arguments args(argv + 2, argv + argc);
  try {
    return it->second.run(args);
  } catch (const boost::program_options::error& e) {
    std::cerr << "kiln " << argv[1] << ": " << e.what() << " (see kiln " << argv[1] << " --help)\n";
    return 2;
  } catch (const kiln::config::ConfigError& e) {
    std::cerr << "kiln " << argv[1] << ": " << e.what() << "\n";
    return 2;
  } catch (const kiln::InputError& e) {
    std::cerr << "kiln " << argv[1] << ": " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "kiln " << argv[1] << ": " << e.what() << "\n";
    return 1;
  }
}
