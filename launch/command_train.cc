// kiln train / kiln eval: run an experiment under mpirun (or alone as one rank).

#include <boost/program_options.hpp>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>

#include "comm/world.h"
#include "configs/experiment.h"
#include "core/check.h"
#include "core/device.h"
#include "core/json_writer.h"
#include "launch/commands.h"
#include "launch/run_ranks.h"
#include "train/metrics.h"
#include "train/parameter_loader.h"
#include "train/preemption.h"
#include "train/trainer.h"

namespace po = boost::program_options;

namespace kiln::launch {
namespace {

struct ExperimentArgs {
  std::string config;
  std::vector<std::string> overrides;
  std::string resume;
  bool quiet = false;
  bool json = false;
  po::variables_map vm;  // every option given, for a command's own options
};

// The options of both commands; `evaluate` picks the checkpoint option: train resumes from
// one (--resume), eval reads one without training (--checkpoint, with --resume as an alias).
po::options_description experiment_options(const std::string& title, bool evaluate) {
  po::options_description options(title);
  options.add_options()("help,h", "show this help")("config", po::value<std::string>()->required(),
                                                    "experiment file (protobuf text)")(
      "set", po::value<std::vector<std::string>>()->composing(),
      "override a field by its path: --set optimizer.lr=3e-4 (repeatable)");
  if (evaluate) {
    options.add_options()("checkpoint", po::value<std::string>()->default_value("latest"),
                          "the checkpoint to read: latest (the newest complete one in "
                          "checkpoint.dir), or a checkpoint directory")(
        "resume", po::value<std::string>(), "the same as --checkpoint");
  } else {
    options.add_options()("resume", po::value<std::string>(),
                          "continue from a checkpoint: latest, or a directory");
  }
  options.add_options()("quiet", "no per-interval log lines")("json",
                                                              "print the final result as JSON");
  return options;
}

bool parse(const Arguments& args, const po::options_description& options, const char* usage,
           ExperimentArgs* out) {
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(options).run(), vm);
  if (vm.count("help")) {
    std::cout << usage << "\n\n" << options << "\n";
    return false;
  }
  po::notify(vm);
  out->config = vm["config"].as<std::string>();
  if (vm.count("set")) out->overrides = vm["set"].as<std::vector<std::string>>();
  if (vm.count("resume")) out->resume = vm["resume"].as<std::string>();
  if (vm.count("checkpoint")) {
    if (vm.count("resume") && !vm["checkpoint"].defaulted()) {
      throw InputError("--resume is another name for --checkpoint: give one of the two");
    }
    if (!vm.count("resume")) out->resume = vm["checkpoint"].as<std::string>();
  }
  out->quiet = vm.count("quiet") > 0;
  out->json = vm.count("json") > 0;
  out->vm = vm;
  return true;
}

config::Experiment load_and_validate(const ExperimentArgs& a, const World& world) {
  config::Experiment e = config::load_experiment(a.config, a.overrides);
  config::validate(e, {world.size, cuda_device_count() > 0, a.config, a.overrides});
  return e;
}

// The command that continues an interrupted run: its config and overrides, --resume latest.
std::string resume_command(const ExperimentArgs& a) {
  const auto quoted = [](const std::string& word) {
    if (word.find_first_of(" \t'\"\\$`*?[]{}()<>|&;!#~") == std::string::npos) return word;
    std::string out = "'";
    for (char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
  };
  std::string command = "kiln train --config " + quoted(a.config);
  for (const std::string& o : a.overrides) command += " --set " + quoted(o);
  return command + " --resume latest";
}

}  // namespace

int run_train(const Arguments& args) {
  auto options = experiment_options("kiln train: train an experiment", false);
  ExperimentArgs a;
  if (!parse(args, options,
             "usage: kiln train --config FILE [--set path=value ...] [--resume latest|DIR]\n"
             "       mpirun -np N kiln train --config FILE ...   (one rank per GPU)",
             &a)) {
    return 0;
  }
  return run_on_all_ranks("train", [&](const World& world) {
    config::Experiment e = load_and_validate(a, world);
    train::install_preemption_handlers();
    train::TrainerOptions to;
    to.config_path = a.config;
    to.resume = a.resume;
    to.quiet = a.quiet;
    to.lock_directories = true;
    train::Trainer trainer(e, world, to);
    train::TrainResult r = trainer.train();
    if (world.rank == 0) {
      if (r.interrupted) {
        // To stderr, and with --json too: the user stopped the run and wants to know how to go on.
        std::fprintf(stderr,
                     "kiln train: interrupted (SIGINT) at step %lld after a checkpoint (%s); "
                     "resume with: %s\n",
                     static_cast<long long>(r.steps), r.last_checkpoint.c_str(),
                     resume_command(a).c_str());
      }
      if (a.json) {
        std::printf(
            "{\"steps\":%lld,\"skipped_steps\":%lld,\"final_loss\":%.6g,\"eval_loss\":%.6g,"
            "\"eval_accuracy\":%.6g,\"samples_per_s\":%.6g,\"preempted\":%s,"
            "\"interrupted\":%s}\n",
            static_cast<long long>(r.steps), static_cast<long long>(r.skipped_steps), r.final_loss,
            r.eval.loss, r.eval.accuracy, r.samples_per_s, r.preempted ? "true" : "false",
            r.interrupted ? "true" : "false");
      } else if (r.interrupted) {
        // The message above says it all.
      } else if (r.preempted) {
        std::printf(
            "stopped by %s at step %lld after a checkpoint (%s); exit code %d (preempted); "
            "resume with --resume latest\n",
            train::signal_name(r.stop_signal).c_str(), static_cast<long long>(r.steps),
            r.last_checkpoint.c_str(), train::kExitPreempted);
      } else if (r.eval.samples == 0) {
        std::printf("trained %lld steps (%.0f samples/s); no evaluation (data.eval_split: none)\n",
                    static_cast<long long>(r.steps), r.samples_per_s);
      } else {
        std::printf(
            "trained %lld steps (%.0f samples/s); final test accuracy: %.2f%% (loss %.4f, %lld "
            "samples)\n",
            static_cast<long long>(r.steps), r.samples_per_s, 100.0 * r.eval.accuracy, r.eval.loss,
            static_cast<long long>(r.eval.samples));
      }
    }
    if (world.rank == 0 && std::fflush(stdout) != 0 && r.log_write_failure.empty()) {
      r.log_write_failure = std::string("cannot write to stdout: ") + std::strerror(errno);
    }
    if (r.interrupted) return train::kExitInterrupted;
    if (r.preempted) return train::kExitPreempted;
    if (!r.log_write_failure.empty()) {
      // The checkpoints are whole (their writes stop the run when they fail); the logs are not.
      std::fprintf(stderr,
                   "kiln train: the run finished and its checkpoints are complete, but its logs "
                   "are not: %s; exit code %d\n",
                   r.log_write_failure.c_str(), train::kExitLogWriteFailed);
      return train::kExitLogWriteFailed;
    }
    return 0;
  });
}

int run_eval(const Arguments& args) {
  auto options = experiment_options("kiln eval: evaluate a checkpoint on the eval split", true);
  options.add_options()("dump-logits", po::value<std::string>(),
                        "write the eval split's logits to this .npy (f32; one rank only)")(
      "dump-inputs", po::value<std::string>(),
      "write the inputs the model saw to this .npy (f32 images or i64 token ids)");
  ExperimentArgs a;
  if (!parse(args, options, "usage: kiln eval --config FILE [--checkpoint latest|DIR] [--set ...]",
             &a)) {
    return 0;
  }
  train::EvalOptions eval_options;
  if (a.vm.count("dump-logits")) eval_options.dump_logits = a.vm["dump-logits"].as<std::string>();
  if (a.vm.count("dump-inputs")) eval_options.dump_inputs = a.vm["dump-inputs"].as<std::string>();
  return run_on_all_ranks("eval", [&](const World& world) {
    config::Experiment e = config::load_experiment(a.config, a.overrides);
    // The shapes the checkpoint was trained with, without typing its --set again.
    const std::string note =
        train::take_checkpoint_model(e, train::checkpoint_to_read(e, a.resume), a.overrides);
    if (!note.empty() && world.rank == 0) std::fprintf(stderr, "kiln eval: %s\n", note.c_str());
    config::validate(e, {world.size, cuda_device_count() > 0, a.config, a.overrides});
    train::TrainerOptions to;
    to.config_path = a.config;
    to.resume = a.resume;  // --checkpoint, "latest" unless given
    to.resume_flag = a.vm.count("resume") ? "--resume" : "--checkpoint";
    // Neither option typed: the newest checkpoint, else model.init_from's weights.
    to.init_from_fallback = !a.vm.count("resume") && a.vm["checkpoint"].defaulted();
    to.quiet = true;
    to.evaluate_only = true;
    train::Trainer trainer(e, world, to);
    train::EvalResult r = trainer.evaluate(eval_options);
    if (world.rank == 0) {
      const std::string weights = trainer.weights_source();
      if (a.json) {
        JsonWriter j;
        j.begin_object();
        j.field("eval_loss", r.loss);
        j.field("eval_accuracy", r.accuracy);
        j.field("samples", static_cast<long long>(r.samples));
        j.field("weights", weights);
        j.end_object();
        std::printf("%s\n", j.str().c_str());
      } else {
        std::printf("eval: %s: loss %.4f, accuracy %.2f%% over %lld samples\n", weights.c_str(),
                    r.loss, 100.0 * r.accuracy, static_cast<long long>(r.samples));
      }
    }
    return 0;
  });
}

}  // namespace kiln::launch
