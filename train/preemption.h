#pragma once
// Stopping early on a cluster's request: SIGTERM (preemption) or SIGUSR1 (Slurm's warning before
// the time limit) asks the trainer to finish its step, write a checkpoint and stop. The request
// comes with a deadline, train.preemption_grace_s: a process that has not finished by then exits
// on its own, so the scheduler's SIGKILL never lands in the middle of a checkpoint it trusts.
// After that checkpoint `kiln train` exits with kExitPreempted, so that a batch script can tell
// "stopped early, resumable" from "finished" and requeue itself (launch/slurm/kiln.sbatch).
// SIGINT (Ctrl-C) is the user's own stop: the same step-and-checkpoint, but the process exits
// with kExitInterrupted; a second SIGINT exits at once.

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "comm/communicator.h"

namespace kiln::train {

// `kiln train`'s exit code after a SIGINT (the shells' 128 + SIGINT), with or without a checkpoint.
constexpr int kExitInterrupted = 130;
// `kiln train`'s exit code after SIGTERM or SIGUSR1 stopped it before its last step and a
// checkpoint was committed: sysexits.h's EX_TEMPFAIL ("try again later"); resume continues it.
constexpr int kExitPreempted = 75;

// Installs the SIGTERM, SIGUSR1 and SIGINT handlers (idempotent). A SIGINT the parent ignores
// (a background job of a script) stays ignored, as the shells expect.
void install_preemption_handlers();

// Set by the handlers; the trainer reads it once per step.
std::atomic<bool>& stop_requested();
// A SIGINT has arrived (stays true whatever signal follows).
bool interrupt_requested();
// The signal that asked (SIGTERM, SIGUSR1, SIGINT), or 0 when none has.
int stop_signal();
// "SIGTERM", "SIGUSR1", "SIGINT", "signal N"; "" for 0.
std::string signal_name(int signal_number);
// signal_name(stop_signal()), for messages.
std::string stop_signal_name();

// Watches for a stop request while alive. From the moment one arrives, the process has
// `grace_s` seconds until finish() is called; past that it prints why and exits with code 1.
// grace_s = 0 exits at once (no checkpoint is attempted).
// A stop (signal) requested on any rank, agreed by every rank at the same step (collective over
// `comm` with several ranks): the signal, and whether any rank saw a SIGINT. signal 0: go on.
struct StopRequest {
  int signal = 0;
  bool interrupted = false;
};
StopRequest agreed_stop_request(Communicator& comm, int world_size);

class PreemptionDeadline {
 public:
  explicit PreemptionDeadline(int grace_s);
  ~PreemptionDeadline();
  PreemptionDeadline(const PreemptionDeadline&) = delete;
  PreemptionDeadline& operator=(const PreemptionDeadline&) = delete;

  // The checkpoint is written (or the run ended): the deadline no longer applies.
  void finish();

 private:
  void watch();
  int grace_s_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool finished_ = false;
  std::thread thread_;
};

}  // namespace kiln::train
