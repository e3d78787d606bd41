#include "core/cpu/parallel.h"

#include <cstdlib>
#include <string>

namespace kiln::cpu {

int host_threads() {
  static const int threads = [] {
    if (const char* env = std::getenv("KILN_CPU_THREADS")) {
      try {
        const int n = std::stoi(env);
        if (n >= 1) return n;
      } catch (const std::exception&) {
      }
    }
    return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  }();
  return threads;
}

}  // namespace kiln::cpu
