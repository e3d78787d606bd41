#pragma once
// A watchdog per process. Nothing ends a job whose rank hangs (mpirun only notices ranks that
// exit), so every operation that could wait forever on another rank — a collective, a training
// step — is registered here with a timeout. A prober thread polls every watched operation's
// completion (CUDA event queries) and the health checks (ncclCommGetAsyncError); a timer thread,
// which calls into no library, fires when an operation is late or a check reported an error, so
// a probe that blocks inside CUDA or NCCL cannot hold it up. Firing prints what happened and
// where, runs the abort hooks (ncclCommAbort), and _exit()s the process after a bounded wait even
// if an abort hook blocks. mpirun then ends the other ranks.
//
// Message on timeout:
//   collective all_reduce #123 on rank 0 did not finish within 30 s (waited 30.2 s); a rank may
//   be hung or dead

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace kiln {

struct WatchdogOptions {
  double default_timeout_s = 600.0;  // for watches that give none
  double poll_interval_s = 0.05;
  double abort_grace_s = 10.0;  // how long abort hooks may run before _exit anyway
  int exit_code = 1;
};

class Watchdog {
 public:
  // The process's watchdog; its thread starts with the first watch or health check.
  static Watchdog& instance();

  explicit Watchdog(WatchdogOptions options = {});
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void set_options(const WatchdogOptions& options);
  WatchdogOptions options() const;
  // The rank named in messages (-1: messages name the host only). Set by init_world().
  void set_rank(int rank);

  // Starts watching an operation. `what` reads "collective all_reduce" or "training step";
  // `sequence` is its number; timeout_s <= 0 takes the default. `done` (optional) is polled by
  // the watchdog thread: when it returns true the watch ends by itself (a CUDA event query for
  // work queued on a stream). Returns an id for end().
  std::uint64_t begin(const std::string& what, std::uint64_t sequence, double timeout_s = 0,
                      std::function<bool()> done = {},
                      const std::string& hint = "a rank may be hung or dead");
  void end(std::uint64_t id);  // ending an id that already ended is a no-op
  std::size_t in_flight() const;

  // A check polled each tick; a non-empty result is an error description that fails the process.
  std::uint64_t add_health_check(std::function<std::string()> check);
  // Run (in registration order) when the watchdog fires, before _exit.
  std::uint64_t add_abort_hook(std::function<void()> hook);
  // Removes a health check or abort hook; after it returns the function is no longer called.
  void remove(std::uint64_t id);

  // For tests: what fired last ("" if nothing), and a replacement for print-and-_exit.
  using FireHandler = std::function<void(const std::string& message)>;
  void set_fire_handler_for_testing(FireHandler handler);

 private:
  struct Watch {
    std::string what;
    std::uint64_t sequence;
    double timeout_s;
    std::chrono::steady_clock::time_point start;
    std::shared_ptr<std::function<bool()>> done;
    std::string hint;
  };
  void ensure_thread_locked();
  void run();         // the timer
  void run_probes();  // the prober
  void fire(const std::string& message);

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  // Serialises calls of health checks and abort hooks with remove(), so a removed function is
  // never called after remove() returns.
  std::mutex callback_mutex_;
  WatchdogOptions options_;
  int rank_ = -1;
  std::uint64_t next_id_ = 1;
  std::map<std::uint64_t, Watch> watches_;
  std::map<std::uint64_t, std::function<std::string()>> health_checks_;
  std::map<std::uint64_t, std::function<void()>> abort_hooks_;
  FireHandler fire_handler_;
  std::string health_failure_;  // the first failed health check, for the timer to fire
  bool fired_ = false;
  bool stop_ = false;
  std::thread thread_, probe_thread_;
};

// Watches the enclosing scope: begin() on construction, end() on destruction.
class WatchdogScope {
 public:
  WatchdogScope(const std::string& what, std::uint64_t sequence, double timeout_s = 0,
                Watchdog& watchdog = Watchdog::instance());
  ~WatchdogScope();
  WatchdogScope(const WatchdogScope&) = delete;
  WatchdogScope& operator=(const WatchdogScope&) = delete;

 private:
  Watchdog& watchdog_;
  std::uint64_t id_;
};

}  // namespace kiln
