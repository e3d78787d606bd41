#include "train/preemption.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/check.h"

namespace kiln::train {
namespace {

std::atomic<bool> g_stop{false};
std::atomic<int> g_signal{0};
std::atomic<bool> g_interrupted{false};

extern "C" void on_stop_signal(int signal_number) {
  if (signal_number == SIGINT) {
    if (g_interrupted.exchange(true)) {
      // The second Ctrl-C: the user will not wait for the checkpoint. Only async-signal-safe
      // calls here; a checkpoint being written stays a temporary directory that is never loaded.
      static const char kMessage[] =
          "\nkiln: second SIGINT: exiting at once, without a checkpoint of this step\n";
      const ssize_t ignored = ::write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
      (void)ignored;
      ::_exit(kExitInterrupted);
    }
  }
  g_signal = signal_number;
  g_stop = true;
}

}  // namespace

void install_preemption_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  const auto install = [&](int signal_number, const char* name) {
    if (sigaction(signal_number, &action, nullptr) != 0) {
      throw Error(std::string("sigaction(") + name + "): " + std::strerror(errno));
    }
  };
  install(SIGTERM, "SIGTERM");
  install(SIGUSR1, "SIGUSR1");
  struct sigaction previous {};
  if (sigaction(SIGINT, nullptr, &previous) != 0) {
    throw Error(std::string("sigaction(SIGINT): ") + std::strerror(errno));
  }
  if (previous.sa_handler != SIG_IGN) install(SIGINT, "SIGINT");
}

bool interrupt_requested() {
  return g_interrupted.load();
}

std::atomic<bool>& stop_requested() {
  return g_stop;
}

int stop_signal() {
  return g_signal.load();
}

std::string stop_signal_name() {
  return signal_name(stop_signal());
}

std::string signal_name(int signal_number) {
  switch (signal_number) {
    case SIGTERM:
      return "SIGTERM";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGINT:
      return "SIGINT";
    case 0:
      return "";
    default:
      return "signal " + std::to_string(signal_number);
  }
}

PreemptionDeadline::PreemptionDeadline(int grace_s)
    : grace_s_(grace_s), thread_([this] { watch(); }) {}

PreemptionDeadline::~PreemptionDeadline() {
  finish();
  thread_.join();
}

void PreemptionDeadline::finish() {
  std::lock_guard<std::mutex> lock(mutex_);
  finished_ = true;
  wake_.notify_all();
}

void PreemptionDeadline::watch() {
  using namespace std::chrono_literals;
  std::unique_lock<std::mutex> lock(mutex_);
  // A signal handler cannot notify a condition variable: poll the flag a few times a second.
  while (!finished_ && !g_stop.load()) wake_.wait_for(lock, 100ms);
  if (finished_) return;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(grace_s_);
  wake_.wait_until(lock, deadline, [this] { return finished_; });
  if (finished_) return;
  std::fprintf(stderr,
               "kiln: %s: the step and its checkpoint did not finish within "
               "train.preemption_grace_s = %d s; exiting without a new checkpoint (the last "
               "complete one is kept). Raise train.preemption_grace_s, or send the signal "
               "earlier (sbatch --signal=USR1@SECONDS)\n",
               stop_signal_name().c_str(), grace_s_);
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(1);
}

StopRequest agreed_stop_request(Communicator& comm, int world_size) {
  // 0: go on, else the signal number, + kInterruptFlag where a SIGINT came: the maximum over
  // ranks stops every rank at the same step, interrupted if any rank was, and tells rank 0 the
  // signal even where only another rank received it.
  constexpr std::int64_t kInterruptFlag = 256;
  std::int64_t stop =
      stop_requested().load() ? stop_signal() + (interrupt_requested() ? kInterruptFlag : 0) : 0;
  if (world_size > 1) stop = comm.all_reduce_host(stop, HostReduceOp::Max);
  return {static_cast<int>(stop % kInterruptFlag), stop >= kInterruptFlag};
}

}  // namespace kiln::train
