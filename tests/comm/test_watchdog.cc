// The watchdog (timeouts, health checks, abort hooks, the bounded exit) and the GPU-count check
// of world discovery, in one process (label cpu). Exits are checked with death tests.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "comm/watchdog.h"
#include "comm/world.h"
#include "core/check.h"

namespace kiln {
namespace {

WatchdogOptions fast_options(double grace_s = 1.0) {
  WatchdogOptions o;
  o.poll_interval_s = 0.01;
  o.abort_grace_s = grace_s;
  return o;
}

void sleep_s(double s) {
  std::this_thread::sleep_for(std::chrono::duration<double>(s));
}

TEST(WatchdogDeathTest, TimeoutNamesOpSequenceAndTimeWaited) {
  EXPECT_EXIT(
      {
        Watchdog w(fast_options());
        w.set_rank(0);
        w.begin("collective all_reduce", 123, 0.5);
        sleep_s(10);
      },
      ::testing::ExitedWithCode(1),
      "collective all_reduce #123 on rank 0 did not finish within 0.5 s \\(waited 0.[5-9] "
      "s\\); a rank may be hung or dead");
}

TEST(WatchdogDeathTest, AbortHooksRunBeforeExit) {
  EXPECT_EXIT(
      {
        Watchdog w(fast_options());
        w.add_abort_hook([] { std::fprintf(stderr, "abort hook ran\n"); });
        w.begin("training step", 7, 0.2, {}, "no heartbeat");
        sleep_s(10);
      },
      ::testing::ExitedWithCode(1), "training step #7 .*no heartbeat(.|\n)*abort hook ran");
}

TEST(WatchdogDeathTest, ExitsAfterTheGraceEvenIfAnAbortHookBlocks) {
  EXPECT_EXIT(
      {
        Watchdog w(fast_options(0.5));
        w.add_abort_hook([] { sleep_s(60); });  // a wedged ncclCommAbort
        w.begin("collective broadcast", 1, 0.2);
        sleep_s(60);
      },
      ::testing::ExitedWithCode(1), "abort hooks did not return in time");
}

TEST(WatchdogDeathTest, AHealthCheckErrorFails) {
  EXPECT_EXIT(
      {
        Watchdog w(fast_options());
        w.add_health_check([] { return std::string("NCCL reported an asynchronous error"); });
        sleep_s(10);
      },
      ::testing::ExitedWithCode(1), "NCCL reported an asynchronous error");
}

TEST(Watchdog, FinishedWatchesDoNotFire) {
  std::atomic<int> fired{0};
  std::atomic<bool> done{false};  // before the watchdog, whose threads read it
  Watchdog w(fast_options());
  w.set_fire_handler_for_testing([&](const std::string&) { ++fired; });
  std::uint64_t ended = w.begin("collective all_reduce", 1, 0.2);
  w.end(ended);
  w.end(ended);  // a second end is a no-op
  w.begin("collective all_reduce", 2, 0.3, [&] { return done.load(); });
  { WatchdogScope scope("training step", 3, 0.3, w); }
  done = true;
  sleep_s(0.6);
  EXPECT_EQ(fired.load(), 0);
  EXPECT_EQ(w.in_flight(), 0u);
}

TEST(Watchdog, LateWatchFiresOnceWithItsMessage) {
  Watchdog w(fast_options());
  std::atomic<int> fired{0};
  std::string message;
  std::mutex m;
  w.set_fire_handler_for_testing([&](const std::string& text) {
    std::lock_guard<std::mutex> lock(m);
    message = text;
    ++fired;
  });
  w.set_rank(2);
  w.begin("collective all_gather", 9, 0.1);
  sleep_s(0.5);
  EXPECT_EQ(fired.load(), 1);
  std::lock_guard<std::mutex> lock(m);
  EXPECT_NE(message.find("collective all_gather #9 on rank 2 did not finish within 0.1 s"),
            std::string::npos)
      << message;
}

// A CUDA event query or ncclCommGetAsyncError can block behind a hung peer: the timer must
// fire anyway (seen on two GPUs: a rank stopped with SIGSTOP left rank 0 silent).
TEST(Watchdog, FiresWhileAProbeOrHealthCheckBlocks) {
  // Declared before the watchdog: its threads (joined by its destructor) use them to the end.
  std::atomic<int> fired{0};
  std::mutex m;
  std::string message;
  std::atomic<bool> release{false};
  auto block = [&] {
    while (!release.load()) sleep_s(0.01);
  };
  Watchdog w(fast_options());
  w.set_fire_handler_for_testing([&](const std::string& text) {
    std::lock_guard<std::mutex> lock(m);
    message = text;
    ++fired;
  });
  std::uint64_t check = w.add_health_check([&] {
    block();
    return std::string();
  });
  w.begin("collective all_reduce", 4, 0.2, [&] {
    block();
    return true;
  });
  for (int i = 0; i < 300 && fired.load() == 0; ++i) sleep_s(0.01);  // 0.2 s, or a loaded CI
  EXPECT_EQ(fired.load(), 1);
  {
    std::lock_guard<std::mutex> lock(m);
    EXPECT_NE(message.find("collective all_reduce #4"), std::string::npos) << message;
  }
  release = true;
  w.remove(check);
}

TEST(Watchdog, RemovedHealthCheckIsNotCalled) {
  Watchdog w(fast_options());
  std::atomic<int> calls{0};
  std::uint64_t id = w.add_health_check([&] {
    ++calls;
    return std::string();
  });
  sleep_s(0.1);
  EXPECT_GT(calls.load(), 0);
  w.remove(id);
  int after = calls.load();
  sleep_s(0.1);
  EXPECT_EQ(calls.load(), after);
}

TEST(World, MoreLocalRanksThanGpusIsAClearError) {
  EXPECT_NO_THROW(check_local_gpu_count(2, 2, "gpu07"));
  try {
    check_local_gpu_count(3, 2, "gpu07");
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("3 ranks on host gpu07 but only 2 GPUs visible: "),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kiln
