#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "train/metrics.h"

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

TEST(FormatDuration, Readable) {
  EXPECT_EQ(format_duration(12.4), "12s");
  EXPECT_EQ(format_duration(185), "3m05s");
  EXPECT_EQ(format_duration(3725), "1h02m");
}

}  // namespace
}  // namespace kiln::train
