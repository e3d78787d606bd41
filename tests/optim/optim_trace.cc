// Writes optimizer traces for optim/reference/torch_optim_check.py: for each configuration, the
// initial parameters, then per step the gradients fed and the parameters after the step, all
// fp32, run through Kiln's optimizers on the chosen device.
//
//   optim_trace OUT_DIR [cpu|cuda] [steps]
//
// OUT_DIR/<config>.bin: int32 magic 0x4b4f5054 ("KOPT"), int32 version 1, int32 tensors,
// int32 steps, int64 numel per tensor, int32 no_weight_decay flag per tensor, then float32:
// initial params (all tensors concatenated), and per step: grads, params after the step.
// OUT_DIR/<config>.json: the hyper-parameters.

#include <cstdio>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "core/ops.h"
#include "optim/optimizer.h"

using namespace kiln;
using namespace kiln::optim;

namespace {

struct Config {
  std::string name;
  OptimizerOptions options;
};

std::vector<Config> configs() {
  std::vector<Config> out;
  OptimizerOptions sgd;
  sgd.kind = OptimizerKind::SGD;
  sgd.lr = 0.05;
  sgd.momentum = 0.9;
  sgd.weight_decay = 0.01;
  out.push_back({"sgd_momentum", sgd});
  sgd.nesterov = true;
  out.push_back({"sgd_nesterov", sgd});
  OptimizerOptions adamw;
  adamw.kind = OptimizerKind::AdamW;
  adamw.lr = 1e-3;
  adamw.weight_decay = 0.01;
  out.push_back({"adamw", adamw});
  adamw.amsgrad = true;
  out.push_back({"adamw_amsgrad", adamw});
  OptimizerOptions lamb;
  lamb.kind = OptimizerKind::LAMB;
  lamb.lr = 2e-3;
  lamb.eps = 1e-6;
  lamb.weight_decay = 0.01;
  lamb.max_grad_norm = 1.0;
  out.push_back({"lamb", lamb});
  return out;
}

void write_floats(std::ofstream& f, const std::vector<Tensor>& tensors) {
  for (const Tensor& t : tensors) {
    auto v = t.to_vector<float>();
    f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: optim_trace OUT_DIR [cpu|cuda] [steps]\n";
    return 2;
  }
  try {
    std::string dir = argv[1];
    Device device = parse_device(argc > 2 ? argv[2] : "cpu");
    int steps = argc > 3 ? std::stoi(argv[3]) : 100;
    const std::vector<std::int64_t> sizes = {1000, 37, 40000, 1};
    const std::vector<int> no_wd = {0, 1, 0, 1};
    for (const Config& c : configs()) {
      std::vector<std::unique_ptr<Parameter>> params;
      std::vector<Parameter*> list;
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        auto p = std::make_unique<Parameter>();
        p->name = "p" + std::to_string(i);
        p->no_weight_decay = no_wd[i] != 0;
        Tensor v = Tensor::empty({sizes[i]}, DType::F32);
        ops::fill_normal(v, 0.0, 1.0, 100 + i);
        p->value = v.to(device);
        p->grad = Tensor::zeros({sizes[i]}, DType::F32, device);
        list.push_back(p.get());
        params.push_back(std::move(p));
      }
      auto opt = make_optimizer(list, c.options);
      std::ofstream f(dir + "/" + c.name + ".bin", std::ios::binary);
      if (!f) throw InputError("cannot write " + dir + "/" + c.name + ".bin");
      std::int32_t header[4] = {0x4b4f5054, 1, static_cast<std::int32_t>(sizes.size()), steps};
      f.write(reinterpret_cast<const char*>(header), sizeof(header));
      f.write(reinterpret_cast<const char*>(sizes.data()),
              static_cast<std::streamsize>(sizes.size() * 8));
      std::vector<std::int32_t> flags(no_wd.begin(), no_wd.end());
      f.write(reinterpret_cast<const char*>(flags.data()),
              static_cast<std::streamsize>(flags.size() * 4));
      std::vector<Tensor> values, grads;
      for (Parameter* p : list) {
        values.push_back(p->value);
        grads.push_back(p->grad);
      }
      write_floats(f, values);
      for (int s = 0; s < steps; ++s) {
        for (std::size_t i = 0; i < list.size(); ++i) {
          Tensor g = Tensor::empty({sizes[i]}, DType::F32);
          // Gradients of varying scale so that LAMB's clipping acts on some steps only.
          ops::fill_normal(g, 0.0, s % 3 == 0 ? 0.5 : 0.005, 1000 + s, 100000 * i);
          list[i]->grad.copy_from(g);
        }
        write_floats(f, grads);
        opt->step();
        write_floats(f, values);
      }
      const OptimizerOptions& o = c.options;
      std::ofstream j(dir + "/" + c.name + ".json");
      j << std::setprecision(17);
      j << "{\"kind\": \"" << optimizer_kind_name(o.kind) << "\", \"lr\": " << o.lr
        << ", \"weight_decay\": " << o.weight_decay << ", \"momentum\": " << o.momentum
        << ", \"dampening\": " << o.dampening
        << ", \"nesterov\": " << (o.nesterov ? "true" : "false") << ", \"beta1\": " << o.beta1
        << ", \"beta2\": " << o.beta2 << ", \"eps\": " << o.eps
        << ", \"amsgrad\": " << (o.amsgrad ? "true" : "false")
        << ", \"bias_correction\": " << (o.bias_correction ? "true" : "false")
        << ", \"max_grad_norm\": " << o.max_grad_norm << ", \"device\": \"" << device.str()
        << "\"}\n";
      std::cout << "wrote " << dir << "/" << c.name << ".bin (" << steps << " steps on "
                << device.str() << ")\n";
    }
  } catch (const std::exception& e) {
    std::cerr << "optim_trace: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
