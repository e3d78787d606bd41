#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "core/check.h"
#include "train/metrics.h"
#include "train/metrics_sink.h"
#include "train/run_lock.h"

namespace kiln::train {
namespace {

TEST(Crc32c, KnownAnswers) {
  // RFC 3720 test vectors.
  std::string zeros(32, '\0');
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8a9136aau);
  std::string ones(32, '\xff');
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62a8ab43u);
  EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u);
}

TEST(JsonlWriter, OneObjectPerLine) {
  std::string path = ::testing::TempDir() + "kiln_metrics_" + std::to_string(::getpid()) + ".jsonl";
  {
    JsonlWriter w(path, false);
    w.write({{"step", 1}, {"loss", 2.5}, {"lr", 1e-3}});
    w.write({{"step", 2}, {"loss", 2.25}, {"eval_accuracy", 0.5}});
  }
  std::ifstream in(path);
  std::string line1, line2, line3;
  std::getline(in, line1);
  std::getline(in, line2);
  EXPECT_FALSE(std::getline(in, line3));
  EXPECT_EQ(line1, "{\"step\":1,\"loss\":2.5,\"lr\":0.001}");
  EXPECT_EQ(line2, "{\"step\":2,\"loss\":2.25,\"eval_accuracy\":0.5}");
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A symbolic link planted at metrics.jsonl or .kiln-lock is refused (InputError naming it); the
// file it points to is neither truncated nor written.
TEST(RunDirectoryWrites, NeverWriteThroughASymbolicLink) {
  const std::string dir = ::testing::TempDir() + "kiln_links_" + std::to_string(::getpid());
  ASSERT_EQ(std::system(("rm -rf '" + dir + "' && mkdir -p '" + dir + "'").c_str()), 0);
  const std::string victim = dir + "/victim.txt";
  std::ofstream(victim) << "precious\n";
  ASSERT_EQ(::symlink(victim.c_str(), (dir + "/metrics.jsonl").c_str()), 0);
  ASSERT_EQ(::symlink(victim.c_str(), (dir + "/.kiln-lock").c_str()), 0);
  for (bool append : {false, true}) {
    try {
      JsonlWriter w(dir + "/metrics.jsonl", append);
      w.write({{"step", 1}});
      ADD_FAILURE() << "wrote metrics.jsonl through a link (append " << append << ")";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(dir + "/metrics.jsonl is a symbolic link"),
                std::string::npos)
          << e.what();
    }
  }
  try {
    RunLock lock(dir, "logging.dir");
    ADD_FAILURE() << "locked through a link";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/.kiln-lock is a symbolic link"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(read_all(victim), "precious\n");
}

TEST(IntervalReport, SaysWhenTheStepWaitsForData) {
  IntervalFigures f;
  f.step = 10;
  f.total_steps = 20;
  f.samples_per_s = 1100;
  f.step_ms = 232.7;
  f.wait_fraction = 0.004;  // below the 1 % worth showing
  EXPECT_EQ(interval_report(f).line.find("data wait"), std::string::npos);
  f.wait_fraction = 0.8;
  const IntervalReport r = interval_report(f);
  EXPECT_NE(r.line.find(" 232.7 ms/step data wait 80% elapsed "), std::string::npos) << r.line;
  bool recorded = false;
  for (const auto& [key, value] : r.record)
    recorded = recorded || (key == "data_wait_fraction" && value == 0.8);
  EXPECT_TRUE(recorded);
}

TEST(IntervalReport, CountsFp8Overflows) {
  IntervalFigures f;
  f.step = 5;
  f.total_steps = 10;
  auto recorded = [](const IntervalReport& r) {
    for (const auto& [key, value] : r.record)
      if (key == "fp8_overflows") return value;
    return -1.0;
  };
  EXPECT_EQ(recorded(interval_report(f)), -1.0);  // no FP8: no field
  f.fp8_overflows = 0;
  IntervalReport r = interval_report(f);
  EXPECT_EQ(recorded(r), 0.0);
  EXPECT_EQ(r.line.find("FP8"), std::string::npos) << r.line;
  f.fp8_overflows = 3;
  r = interval_report(f);
  EXPECT_EQ(recorded(r), 3.0);
  EXPECT_NE(r.line.find("(FP8 overflows so far: 3)"), std::string::npos) << r.line;
}

TEST(FormatDuration, Readable) {
  EXPECT_EQ(format_duration(12.4), "12s");
  EXPECT_EQ(format_duration(185), "3m05s");
  EXPECT_EQ(format_duration(3725), "1h02m");
}

}  // namespace
}  // namespace kiln::train
