#pragma once
// The sub-commands of the `kiln` program. Each takes the arguments after its name and returns
// the process exit code (0 success, 1 failure, 2 bad input).

#include <string>
#include <vector>

namespace kiln::launch {

using Arguments = std::vector<std::string>;

int run_info(const Arguments& args);
int run_config(const Arguments& args);
int run_model(const Arguments& args);
int run_train(const Arguments& args);
int run_eval(const Arguments& args);
int run_bench(const Arguments& args);
int run_autobatch(const Arguments& args);
int run_plan(const Arguments& args);
int run_replay(const Arguments& args);
int run_export(const Arguments& args);
int run_sample(const Arguments& args);
int run_tokenize(const Arguments& args);
int run_doctor(const Arguments& args);

}  // namespace kiln::launch
