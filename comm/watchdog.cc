#include "comm/watchdog.h"

#include <unistd.h>

#include <cstdio>
#include <sstream>
#include <vector>

#include "core/check.h"

namespace kiln {
namespace {

std::string format_seconds(double s) {
  char buf[32];
  if (s == static_cast<double>(static_cast<long long>(s))) {
    std::snprintf(buf, sizeof(buf), "%.0f", s);
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f", s);
  }
  return buf;
}

// write(2) directly: safe while other threads may hold stdio locks. A failed write has nowhere
// better to go.
void write_stderr(const char* text, std::size_t size) {
  ssize_t written = ::write(STDERR_FILENO, text, size);
  static_cast<void>(written);
}

}  // namespace

Watchdog& Watchdog::instance() {
  // Never destroyed: the thread may still be polling while static destructors run at exit.
  static Watchdog* watchdog = new Watchdog();
  return *watchdog;
}

Watchdog::Watchdog(WatchdogOptions options) : options_(options) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (probe_thread_.joinable()) probe_thread_.join();
}

void Watchdog::set_options(const WatchdogOptions& options) {
  KILN_CHECK(
      options.default_timeout_s > 0 && options.poll_interval_s > 0 && options.abort_grace_s >= 0,
      "watchdog timeouts must be positive");
  std::lock_guard<std::mutex> lock(mutex_);
  options_ = options;
}

WatchdogOptions Watchdog::options() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return options_;
}

void Watchdog::set_rank(int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  rank_ = rank;
}

void Watchdog::ensure_thread_locked() {
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  if (!probe_thread_.joinable()) probe_thread_ = std::thread([this] { run_probes(); });
}

std::uint64_t Watchdog::begin(const std::string& what, std::uint64_t sequence, double timeout_s,
                              std::function<bool()> done, const std::string& hint) {
  std::lock_guard<std::mutex> lock(mutex_);
  ensure_thread_locked();
  std::uint64_t id = next_id_++;
  Watch w{what,
          sequence,
          timeout_s > 0 ? timeout_s : options_.default_timeout_s,
          std::chrono::steady_clock::now(),
          done ? std::make_shared<std::function<bool()>>(std::move(done)) : nullptr,
          hint};
  watches_.emplace(id, std::move(w));
  return id;
}

void Watchdog::end(std::uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  watches_.erase(id);
}

std::size_t Watchdog::in_flight() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return watches_.size();
}

std::uint64_t Watchdog::add_health_check(std::function<std::string()> check) {
  std::lock_guard<std::mutex> callbacks(callback_mutex_);
  std::lock_guard<std::mutex> lock(mutex_);
  ensure_thread_locked();
  std::uint64_t id = next_id_++;
  health_checks_.emplace(id, std::move(check));
  return id;
}

std::uint64_t Watchdog::add_abort_hook(std::function<void()> hook) {
  std::lock_guard<std::mutex> callbacks(callback_mutex_);
  std::lock_guard<std::mutex> lock(mutex_);
  std::uint64_t id = next_id_++;
  abort_hooks_.emplace(id, std::move(hook));
  return id;
}

void Watchdog::remove(std::uint64_t id) {
  std::lock_guard<std::mutex> callbacks(callback_mutex_);
  std::lock_guard<std::mutex> lock(mutex_);
  health_checks_.erase(id);
  abort_hooks_.erase(id);
}

void Watchdog::set_fire_handler_for_testing(FireHandler handler) {
  std::lock_guard<std::mutex> lock(mutex_);
  fire_handler_ = std::move(handler);
  fired_ = false;
  health_failure_.clear();
}

// The timer: only clocks and flags, never a call into CUDA, NCCL or MPI, so that it fires even
// when a probe or health check blocks (a CUDA or NCCL call can wait for a peer that hangs).
void Watchdog::run() {
  for (;;) {
    std::string failure;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait_for(lock, std::chrono::duration<double>(options_.poll_interval_s),
                     [this] { return stop_; });
      if (stop_) return;
      if (fired_) continue;
      failure = health_failure_;
      auto now = std::chrono::steady_clock::now();
      for (auto& [id, w] : watches_) {
        if (!failure.empty()) break;
        double waited = std::chrono::duration<double>(now - w.start).count();
        if (waited < w.timeout_s) continue;
        std::ostringstream os;
        os << w.what << " #" << w.sequence << " on ";
        if (rank_ >= 0) {
          os << "rank " << rank_;
        } else {
          os << process_identity();
        }
        char waited_text[32];
        std::snprintf(waited_text, sizeof(waited_text), "%.1f",
                      static_cast<double>(static_cast<long long>(waited * 10)) / 10);
        os << " did not finish within " << format_seconds(w.timeout_s) << " s (waited "
           << waited_text << " s)";
        if (!w.hint.empty()) os << "; " << w.hint;
        failure = os.str();
      }
    }
    if (!failure.empty()) fire(failure);
  }
}

// The prober: polls the watches' completion probes (CUDA event queries) and the health checks
// (ncclCommGetAsyncError). If one blocks, only this thread waits; the timer still fires.
void Watchdog::run_probes() {
  for (;;) {
    std::vector<std::pair<std::uint64_t, std::shared_ptr<std::function<bool()>>>> probes;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait_for(lock, std::chrono::duration<double>(options_.poll_interval_s),
                     [this] { return stop_; });
      if (stop_) return;
      for (auto& [id, w] : watches_) {
        if (w.done) probes.emplace_back(id, w.done);
      }
    }
    // Probes run outside the lock: a CUDA event query must not hold up begin()/end().
    std::vector<std::uint64_t> finished;
    for (auto& [id, probe] : probes) {
      if ((*probe)()) finished.push_back(id);
    }
    std::string failure;
    {
      std::lock_guard<std::mutex> callbacks(callback_mutex_);
      std::vector<std::function<std::string()>*> checks;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        for (auto& [id, check] : health_checks_) checks.push_back(&check);
      }
      for (auto* check : checks) {
        failure = (*check)();
        if (!failure.empty()) break;
      }
    }
    std::lock_guard<std::mutex> lock(mutex_);
    for (std::uint64_t id : finished) watches_.erase(id);
    if (!failure.empty() && health_failure_.empty()) health_failure_ = failure;
  }
}

void Watchdog::fire(const std::string& message) {
  FireHandler handler;
  double grace_s;
  int exit_code;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (fired_) return;
    fired_ = true;
    handler = fire_handler_;
    grace_s = options_.abort_grace_s;
    exit_code = options_.exit_code;
  }
  if (handler) {
    handler(message);
    return;
  }
  std::string text = "kiln watchdog: " + message + "\n  (" + process_identity() +
                     "; aborting communicators and exiting with code " + std::to_string(exit_code) +
                     ")\n";
  write_stderr(text.data(), text.size());
  std::fflush(stdout);
  // An abort hook can block (ncclCommAbort on a wedged GPU): exit after the grace regardless.
  std::thread([grace_s, exit_code] {
    std::this_thread::sleep_for(std::chrono::duration<double>(grace_s));
    const char note[] = "kiln watchdog: abort hooks did not return in time; exiting\n";
    write_stderr(note, sizeof(note) - 1);
    ::_exit(exit_code);
  }).detach();
  {
    std::lock_guard<std::mutex> callbacks(callback_mutex_);
    std::vector<std::function<void()>*> hooks;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& [id, hook] : abort_hooks_) hooks.push_back(&hook);
    }
    for (auto* hook : hooks) (*hook)();
  }
  ::_exit(exit_code);
}

WatchdogScope::WatchdogScope(const std::string& what, std::uint64_t sequence, double timeout_s,
                             Watchdog& watchdog)
    : watchdog_(watchdog), id_(watchdog.begin(what, sequence, timeout_s)) {}

WatchdogScope::~WatchdogScope() {
  watchdog_.end(id_);
}

}  // namespace kiln
