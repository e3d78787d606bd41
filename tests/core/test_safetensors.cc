#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "core/ops.h"
#include "core/safetensors.h"

namespace kiln {
namespace {

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "kiln_st_" + std::to_string(::getpid()) + "_" + name;
}

TEST(Safetensors, RoundTripEveryDtype) {
  NamedTensors tensors;
  for (DType dt : {DType::F32, DType::F64, DType::F16, DType::BF16}) {
    Tensor t = Tensor::empty({3, 5}, dt);
    ops::fill_normal(t, 0, 1, 42 + static_cast<int>(dt));
    tensors.emplace_back(std::string("w.") + dtype_name(dt), t);
  }
  tensors.emplace_back("ids", Tensor::from_vector<std::int64_t>({1, -2, 3}, {3}));
  tensors.emplace_back("scalar", Tensor::scalar(2.5));
  tensors.emplace_back("empty", Tensor::empty({0, 4}, DType::F32));
  std::string path = temp_path("roundtrip.safetensors");
  save_safetensors(path, tensors, {{"format", "pt"}});
  SafetensorsFile f = load_safetensors(path);
  EXPECT_EQ(f.metadata.at("format"), "pt");
  ASSERT_EQ(f.tensors.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    const Tensor& got = f.tensors.at(name);
    EXPECT_EQ(got.shape(), t.shape()) << name;
    EXPECT_EQ(got.dtype(), t.dtype()) << name;
    ASSERT_EQ(got.nbytes(), t.nbytes());
    if (t.nbytes()) {
      EXPECT_EQ(std::memcmp(got.data(), t.data(), t.nbytes()), 0) << name;
    }
  }
  std::remove(path.c_str());
}

std::string expect_input_error(const std::string& path) {
  try {
    load_safetensors(path);
  } catch (const InputError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no InputError for " << path;
  return "";
}

TEST(Safetensors, CorruptFilesAreRefusedWithTheFileNamed) {
  std::string path = temp_path("good.safetensors");
  save_safetensors(path, {{"a", Tensor::full({4, 4}, 1.0, DType::F32)}});
  std::string bytes = read_file(path);
  auto write = [&](const std::string& name, const std::string& content) {
    std::string p = temp_path(name);
    std::ofstream(p, std::ios::binary) << content;
    return p;
  };
  std::string m = expect_input_error(write("short", bytes.substr(0, 5)));
  EXPECT_NE(m.find("truncated"), std::string::npos) << m;
  m = expect_input_error(write("truncated", bytes.substr(0, bytes.size() - 10)));
  EXPECT_NE(m.find("outside"), std::string::npos) << m;
  std::string flipped = bytes;
  flipped[8] = '#';
  m = expect_input_error(write("flipped", flipped));
  EXPECT_NE(m.find("corrupt safetensors header"), std::string::npos) << m;
  std::string huge = bytes;
  huge[5] = 0x7f;
  m = expect_input_error(write("huge", huge));
  EXPECT_NE(m.find("header claims"), std::string::npos) << m;
  m = expect_input_error(temp_path("missing"));
  EXPECT_NE(m.find("cannot open"), std::string::npos) << m;
  // Not a file: an endless device is refused before a byte is read, a directory said to be one.
  m = expect_input_error("/dev/zero");
  EXPECT_NE(m.find("must be a regular file, but it is a character device"), std::string::npos) << m;
  m = expect_input_error("/tmp");
  EXPECT_NE(m.find("must be a regular file, but it is a directory"), std::string::npos) << m;
  // A FIFO without a writer: refused, not waited on.
  const std::string fifo = temp_path("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  m = expect_input_error(fifo);
  EXPECT_NE(m.find("must be a regular file, but it is a FIFO (named pipe)"), std::string::npos)
      << m;
  std::remove(fifo.c_str());
  std::remove(path.c_str());
}

TEST(Safetensors, AtomicWriteLeavesNoTemporaryFiles) {
  std::string path = temp_path("atomic.bin");
  write_file_atomically(path, "hello");
  write_file_atomically(path, "world!");
  EXPECT_EQ(read_file(path), "world!");
  EXPECT_THROW(write_file_atomically("/nonexistent-dir/x", "a"), Error);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace kiln
