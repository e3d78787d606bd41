// Tests of infer/hf_export.h: the shard plan (huggingface_hub's rule), --max-shard-size's sizes,
// and the folder written whole or not at all.
#include "infer/hf_export.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/check.h"

namespace kiln::infer {
namespace {

namespace fs = std::filesystem;

NamedTensors tensors_of(const std::vector<std::int64_t>& sizes) {  // f32 tensors of these sizes
  NamedTensors out;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    Tensor t = Tensor::empty({sizes[i]}, DType::F32);
    t.fill(static_cast<double>(i));
    out.emplace_back("t" + std::to_string(i), t);
  }
  return out;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("kiln_test_hf_export_" + name);
  fs::remove_all(dir);
  return dir;
}

TEST(HfExport, ShardsCloseBeforeTheTensorThatWouldOverfillThem) {
  // 40, 40, 80 bytes in 100-byte shards: [t0 t1] [t2]; a 400-byte tensor gets a shard alone.
  using Plan = std::vector<std::vector<std::size_t>>;
  EXPECT_EQ(plan_shards(tensors_of({10, 10, 20}), 100), (Plan{{0, 1}, {2}}));
  EXPECT_EQ(plan_shards(tensors_of({10, 100, 10, 10}), 100), (Plan{{0}, {1}, {2, 3}}));
  EXPECT_EQ(plan_shards(tensors_of({10, 10, 5}), 100), (Plan{{0, 1, 2}}));
}

TEST(HfExport, ByteSizes) {
  EXPECT_EQ(parse_byte_size("5GB", "--m"), 5000000000ull);
  EXPECT_EQ(parse_byte_size("2GiB", "--m"), 2147483648ull);
  EXPECT_EQ(parse_byte_size("500mb", "--m"), 500000000ull);
  EXPECT_EQ(parse_byte_size("10 kB", "--m"), 10000ull);
  EXPECT_EQ(parse_byte_size("4096", "--m"), 4096ull);
  EXPECT_EQ(parse_byte_size("1.5KiB", "--m"), 1536ull);
  for (const char* bad : {"", "GB", "5 parsecs", "0", "-1MB", "nan", "inf", "1e30TB"}) {
    EXPECT_THROW(parse_byte_size(bad, "--max-shard-size"), InputError) << bad;
  }
}

TEST(HfExport, ShardedFolderHasAnIndexOfEveryTensor) {
  const fs::path dir = fresh_dir("sharded");
  const HfFolderSummary summary = write_hf_folder(dir.string(), tensors_of({10, 10, 20}),
                                                  {"{\"model_type\": \"llama\"}\n", 100});
  EXPECT_EQ(summary.weight_files, (std::vector<std::string>{"model-00001-of-00002.safetensors",
                                                            "model-00002-of-00002.safetensors"}));
  EXPECT_EQ(summary.tensor_bytes, 160u);
  std::ifstream in(dir / "model.safetensors.index.json");
  const std::string index((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(index.find("\"total_size\": 160"), std::string::npos) << index;
  EXPECT_NE(index.find("\"t2\": \"model-00002-of-00002.safetensors\""), std::string::npos);
  const SafetensorsFile second = load_safetensors((dir / summary.weight_files[1]).string());
  EXPECT_EQ(second.tensors.size(), 1u);
  EXPECT_EQ(second.metadata.at("format"), "pt");
  EXPECT_TRUE(fs::exists(dir / "config.json"));
  // One shard: model.safetensors and no index, into an empty folder made for it.
  const fs::path one = fresh_dir("single");
  fs::create_directories(one);
  EXPECT_EQ(write_hf_folder(one.string() + "/", tensors_of({10}), {"{}", 5000}).weight_files,
            std::vector<std::string>{"model.safetensors"});
  EXPECT_FALSE(fs::exists(one / "model.safetensors.index.json"));
}

TEST(HfExport, AnExistingFolderIsNeverWrittenOver) {
  const fs::path dir = fresh_dir("existing");
  fs::create_directories(dir);
  std::ofstream(dir / "keep.txt") << "mine";
  try {
    write_hf_folder(dir.string(), tensors_of({10}), {"{}", 5000});
    ADD_FAILURE() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("the folder exists and is not empty"), std::string::npos);
  }
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
  // Nothing but the folders the tests made: no temporary folder left beside them.
  for (const auto& entry : fs::directory_iterator(dir.parent_path())) {
    EXPECT_EQ(entry.path().filename().string().find(".kiln_test_hf_export_existing.tmp"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace kiln::infer
