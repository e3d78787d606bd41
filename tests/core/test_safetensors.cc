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

// A safetensors file from its header text and data bytes, as another writer could make it.
std::string write_raw(const std::string& name, const std::string& header, const std::string& data) {
  std::string bytes;
  for (int i = 0; i < 8; ++i) bytes += static_cast<char>((header.size() >> (8 * i)) & 0xff);
  bytes += header + data;
  std::string p = temp_path(name);
  std::ofstream(p, std::ios::binary) << bytes;
  return p;
}

void expect_refused(const std::string& path, const std::string& part) {
  const std::string m = expect_input_error(path);
  EXPECT_NE(m.find(path), std::string::npos) << m;
  EXPECT_NE(m.find(part), std::string::npos) << m;
  std::remove(path.c_str());
}

// The byte ranges tile the data buffer (the safetensors format): overlap, holes and bytes that
// belong to no tensor are refused, naming the tensors.
TEST(Safetensors, DataOffsetsMustTileTheBuffer) {
  const std::string eight(8, '\0');
  expect_refused(write_raw("overlap",
                           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                           eight),
                 "overlap those of 'a' [0, 8)");
  expect_refused(
      write_raw("hole", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", eight),
      "leaving bytes [0, 4) of the data buffer to no tensor");
  expect_refused(
      write_raw("tail", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", eight),
      "the tensors cover 4 of the 8 data bytes");
  expect_refused(write_raw("offsets", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":["0",4]}})",
                           std::string(4, '\0')),
                 "data_offsets needs two numbers");
  // Two tensors in the order of their names but not of their bytes: valid.
  const std::string path = write_raw("order",
                                     R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},)"
                                     R"("b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                                     eight);
  EXPECT_EQ(load_safetensors(path).tensors.size(), 2u);
  std::remove(path.c_str());
}

TEST(Safetensors, NamesAreUniqueJsonStrings) {
  const std::string four(4, '\0');
  expect_refused(write_raw("duplicate",
                           R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                           R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                           std::string(8, '\0')),
                 "the name 'w' appears twice");
  // \u escapes decode to UTF-8 (surrogate pairs too), never masked to 7 bits.
  std::string path = write_raw(
      "escapes",
      R"({"weigh\u00f4.\ud83d\ude00\t\/":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", four);
  SafetensorsFile f = load_safetensors(path);
  ASSERT_EQ(f.tensors.size(), 1u);
  EXPECT_EQ(f.tensors.begin()->first, "weigh\xc3\xb4.\xf0\x9f\x98\x80\t/");
  EXPECT_EQ(f.tensors.count("weight"), 0u);
  std::remove(path.c_str());
  expect_refused(
      write_raw("lone", R"({"w\ud800":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", four),
      "high surrogate without its low surrogate");
  expect_refused(
      write_raw("low", R"({"w\udc00":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", four),
      "lone low surrogate");
  expect_refused(
      write_raw("escape", R"({"w\q":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", four),
      "unknown escape '\\q'");
  expect_refused(write_raw("control",
                           "{\"w\x01\":{\"dtype\":\"F32\",\"shape\":[1],"
                           "\"data_offsets\":[0,4]}}",
                           four),
                 "a control character inside a string");
  expect_refused(write_raw("metadata", R"({"__metadata__":{"format":1}})", ""),
                 "__metadata__ 'format' is not a string");
  // Kiln's writer escapes what the reader refuses raw: names round-trip.
  path = temp_path("roundtrip-names.safetensors");
  const std::string odd = "tab\there \"quoted\" back\\slash \x01 caf\xc3\xa9";
  save_safetensors(path, {{odd, Tensor::full({1}, 1.0, DType::F32)}}, {{"note", "line\nbreak"}});
  f = load_safetensors(path);
  EXPECT_EQ(f.tensors.count(odd), 1u);
  EXPECT_EQ(f.metadata.at("note"), "line\nbreak");
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
