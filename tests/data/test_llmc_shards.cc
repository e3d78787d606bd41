// llm.c's token shards (data/llmc_shards.h) on shards written here: the header and tokens, the
// windows over a glob of shards, the loader's shuffled order over them (by seed and epoch,
// split over ranks, resumed exactly), and every kind of bad shard naming its file.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>

#include "data/factory.h"
#include "data/file_io.h"
#include "data/llmc_shards.h"
#include "data/loader.h"
#include "tests/data/test_util.h"

namespace kiln::data {
namespace {

using testing::expect_input_error;
using testing::ScratchDir;

constexpr std::int64_t kVocab = 50257;  // GPT-2's

// Token i of shard s: a value that says where it came from, below the vocabulary.
std::uint16_t token_of(int shard, std::int64_t i) {
  return static_cast<std::uint16_t>(10000 * shard + i);
}

std::vector<std::uint16_t> shard_tokens(int shard, std::int64_t count) {
  std::vector<std::uint16_t> tokens;
  for (std::int64_t i = 0; i < count; ++i) tokens.push_back(token_of(shard, i));
  return tokens;
}

// An llm.c shard's bytes with the header fields given (for the bad cases).
std::vector<std::uint8_t> shard_bytes(const std::vector<std::uint16_t>& tokens,
                                      std::int32_t magic = kLlmcShardMagic,
                                      std::int32_t version = kLlmcShardVersion,
                                      std::int64_t claimed = -1) {
  return testing::llmc_layout_bytes(
      magic, version,
      static_cast<std::int32_t>(claimed < 0 ? static_cast<std::int64_t>(tokens.size()) : claimed),
      tokens.data(), 2 * tokens.size());
}

void write_bytes(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  write_file(path, bytes.data(), bytes.size());
}

// Shards 1..3 of `dir` named as llm.c names them, with `counts[s - 1]` tokens each, plus a
// validation shard the training glob must not match.
std::string write_training_shards(const ScratchDir& dir, const std::vector<std::int64_t>& counts) {
  for (std::size_t s = counts.size(); s >= 1; --s) {  // written out of order: the glob sorts
    char name[64];
    std::snprintf(name, sizeof(name), "tiny_train_%06zu.bin", s);
    write_llmc_shard(dir.file(name), shard_tokens(static_cast<int>(s), counts[s - 1]));
  }
  write_llmc_shard(dir.file("tiny_val_000000.bin"), shard_tokens(9, 100));
  return dir.file("tiny_train_*.bin");
}

TEST(LlmcShard, WriterAndReaderAgreeOnTheFormat) {
  ScratchDir dir;
  const std::string path = dir.file("a.bin");
  write_llmc_shard(path, shard_tokens(2, 300));
  EXPECT_EQ(std::filesystem::file_size(path), 1024u + 600u);
  const std::vector<std::uint8_t> bytes = read_file(path);
  std::int32_t header[3];
  std::memcpy(header, bytes.data(), sizeof(header));
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 300);
  LlmcShard shard(path, kVocab);
  EXPECT_EQ(shard.path(), path);
  ASSERT_EQ(shard.token_count(), 300);
  for (std::int64_t i = 0; i < 300; ++i) ASSERT_EQ(shard.token(i), token_of(2, i));
  // Ids up to 65535 read back whole (both bytes).
  write_llmc_shard(path, std::vector<std::uint16_t>{0, 255, 256, 65535});
  LlmcShard wide(path, 65536);
  EXPECT_EQ(wide.token(1), 255);
  EXPECT_EQ(wide.token(2), 256);
  EXPECT_EQ(wide.token(3), 65535);
}

TEST(LlmcShard, Uint32ShardsOfLargeVocabulariesReadBack) {
  // llm.c's llama3-branch format: magic 20240801, version 7, uint32 tokens (Qwen2.5's vocabulary
  // of 152064, Llama 3's of 128256).
  ScratchDir dir;
  const std::string path = dir.file("qwen_train_000001.bin");
  std::vector<std::uint32_t> tokens;
  for (std::uint32_t i = 0; i < 500; ++i) tokens.push_back((i * 7919u) % 152064u);
  tokens[3] = 152063;
  tokens[4] = 65536;  // past uint16
  write_llmc_shard(path, tokens);
  EXPECT_EQ(std::filesystem::file_size(path), 1024u + 4u * 500u);
  const std::vector<std::uint8_t> bytes = read_file(path);
  std::int32_t header[3];
  std::memcpy(header, bytes.data(), sizeof(header));
  EXPECT_EQ(header[0], 20240801);
  EXPECT_EQ(header[1], 7);
  EXPECT_EQ(header[2], 500);
  LlmcShard shard(path, 152064);
  EXPECT_EQ(shard.token_bytes(), 4);
  ASSERT_EQ(shard.token_count(), 500);
  for (std::int64_t i = 0; i < 500; ++i) ASSERT_EQ(shard.token(i), tokens[i]) << i;
  // Windows over a glob of them, as over uint16 shards.
  write_llmc_shard(dir.file("qwen_train_000002.bin"), std::vector<std::uint32_t>(65, 151643));
  LlmcShardDataset dataset(dir.file("qwen_train_*.bin"), 64, 152064);
  EXPECT_EQ(dataset.size(), 499 / 64 + 1);
  std::vector<std::int64_t> input(64), target(64);
  ASSERT_TRUE(dataset.get(0, SampleContext{}, input.data(), target.data()));
  EXPECT_EQ(input[3], 152063);
  EXPECT_EQ(target[3], 65536);
  ASSERT_TRUE(dataset.get(dataset.size() - 1, SampleContext{}, input.data(), target.data()));
  EXPECT_EQ(input[0], 151643);
}

TEST(LlmcShardErrors, BadUint32ShardsNameTheFile) {
  ScratchDir dir;
  const std::string path = dir.file("bad_train_000001.bin");
  auto open = [&] { LlmcShard shard(path, 128256); };
  std::vector<std::uint32_t> tokens(64, 128000);
  tokens[9] = 128256;  // one past Llama 3's vocabulary
  write_llmc_shard(path, tokens);
  expect_input_error(open, {path, "token 9 has id 128256", "vocabulary size 128256",
                            "at byte " + std::to_string(1024 + 4 * 9)});
  // The uint16 format's version under the uint32 magic, and a size of 2-byte tokens.
  std::vector<std::uint8_t> bytes = read_file(path);
  bytes[4] = 1;
  write_bytes(path, bytes);
  expect_input_error(open, {path, "unsupported version 1 for magic 20240801", "uint32 tokens"});
  bytes[4] = 7;
  bytes.resize(1024 + 2 * 64);
  write_bytes(path, bytes);
  expect_input_error(open, {path, "truncated: the header claims 64 tokens", "1280 bytes"});
}

TEST(LlmcShardDataset, WindowsAreNextTokenPairsOverTheSortedShards) {
  ScratchDir dir;
  // T = 4: floor((n - 1) / 4) windows: 2, 3 and 1.
  const std::string glob = write_training_shards(dir, {10, 13, 5});
  LlmcShardDataset data(glob, 4, kVocab);
  ASSERT_EQ(data.shard_count(), 3);
  EXPECT_EQ(data.shard(0).path(), dir.file("tiny_train_000001.bin"));
  EXPECT_EQ(data.shard(2).path(), dir.file("tiny_train_000003.bin"));
  ASSERT_EQ(data.size(), 6);
  EXPECT_EQ(data.num_classes(), kVocab);
  EXPECT_EQ(data.spec().input_shape, (Shape{4}));
  EXPECT_EQ(data.spec().input_dtype, DType::I64);
  EXPECT_EQ(data.spec().target_shape, (Shape{4}));
  EXPECT_EQ(data.spec().target_dtype, DType::I64);
  EXPECT_NE(data.describe().find("3 shards, 6 windows of 4"), std::string::npos) << data.describe();

  const std::int64_t shard_of[6] = {0, 0, 1, 1, 1, 2}, window_of[6] = {0, 1, 0, 1, 2, 0};
  for (std::int64_t index = 0; index < 6; ++index) {
    SCOPED_TRACE(index);
    const LlmcShardDataset::Position where = data.position(index);
    EXPECT_EQ(where.shard, shard_of[index]);
    EXPECT_EQ(where.window, window_of[index]);
    std::int64_t input[4], target[4];
    ASSERT_TRUE(data.get(index, SampleContext(), input, target));
    for (std::int64_t t = 0; t < 4; ++t) {
      // Stride T: window w starts at token w·T of its shard (shards are numbered from 1).
      const std::int64_t at = window_of[index] * 4 + t;
      EXPECT_EQ(input[t], token_of(static_cast<int>(shard_of[index] + 1), at));
      EXPECT_EQ(target[t], token_of(static_cast<int>(shard_of[index] + 1), at + 1));
    }
  }
}

TEST(LlmcShardDataset, FactoryTakesTheGlobForEverySplit) {
  ScratchDir dir;
  const std::string glob = write_training_shards(dir, {9, 9, 9});
  DatasetOptions options;
  options.seq_len = 4;
  options.vocab_size = kVocab;
  EXPECT_EQ(make_dataset("llmc_shards", glob, "train", options)->size(), 6);
  // Evaluation passes the validation glob; the split names nothing in it.
  auto val = make_dataset("llmc_shards", dir.file("tiny_val_*.bin"), "test", options);
  EXPECT_EQ(val->size(), 24);  // floor(99 / 4)
  EXPECT_NE(val->describe().find("llmc_shards"), std::string::npos);
  const std::vector<std::string> kinds = dataset_kinds();
  EXPECT_NE(std::find(kinds.begin(), kinds.end(), "llmc_shards"), kinds.end());
}

// ---------------------------------------------------------------------------------------------
// The loader's order over the shards.

// 40 windows of T = 4 in shards of 12, 20 and 8 windows.
struct FortyWindows {
  ScratchDir dir;
  std::shared_ptr<LlmcShardDataset> data;
  FortyWindows() {
    data = std::make_shared<LlmcShardDataset>(write_training_shards(dir, {49, 81, 33}), 4, kVocab);
  }
};

LoaderOptions loader_options(std::uint64_t seed, int rank = 0, int world_size = 1,
                             int workers = 2) {
  LoaderOptions options;
  options.batch_size = 4;
  options.workers = workers;
  options.seed = seed;
  options.rank = rank;
  options.world_size = world_size;
  return options;
}

// The window indices of one epoch, in reading order, checking each row's tokens.
std::vector<std::int64_t> read_epoch(DataLoader& loader, const LlmcShardDataset& data) {
  std::vector<std::int64_t> order;
  for (;;) {
    Batch batch = loader.next();
    const auto* inputs = static_cast<const std::int64_t*>(batch.inputs.data());
    const auto* targets = static_cast<const std::int64_t*>(batch.targets.data());
    for (std::int64_t row = 0; row < batch.size(); ++row) {
      const std::int64_t index = batch.sample_indices[static_cast<std::size_t>(row)];
      const LlmcShardDataset::Position where = data.position(index);
      for (std::int64_t t = 0; t < 4; ++t) {
        EXPECT_EQ(inputs[row * 4 + t],
                  token_of(static_cast<int>(where.shard + 1), where.window * 4 + t));
        EXPECT_EQ(targets[row * 4 + t],
                  token_of(static_cast<int>(where.shard + 1), where.window * 4 + t + 1));
      }
      order.push_back(index);
    }
    if (batch.last_in_epoch) return order;
  }
}

TEST(LlmcShardLoader, ShuffleIsFixedBySeedAndEpochAndMixesShards) {
  FortyWindows f;
  ASSERT_EQ(f.data->size(), 40);
  DataLoader a(f.data, loader_options(1));
  const std::vector<std::int64_t> epoch0 = read_epoch(a, *f.data);
  const std::vector<std::int64_t> epoch1 = read_epoch(a, *f.data);
  std::vector<std::int64_t> sorted = epoch0;
  std::sort(sorted.begin(), sorted.end());
  for (std::int64_t i = 0; i < 40; ++i) ASSERT_EQ(sorted[static_cast<std::size_t>(i)], i);
  EXPECT_NE(epoch0, epoch1);
  // The same seed gives the same order whatever the worker count; another seed another one.
  DataLoader same(f.data, loader_options(1, 0, 1, 0));
  EXPECT_EQ(read_epoch(same, *f.data), epoch0);
  EXPECT_EQ(read_epoch(same, *f.data), epoch1);
  DataLoader other(f.data, loader_options(2));
  EXPECT_NE(read_epoch(other, *f.data), epoch0);
  // Windows of different shards follow each other: the first eight are not all from one shard.
  std::set<std::int64_t> shards;
  for (std::size_t i = 0; i < 8; ++i) shards.insert(f.data->position(epoch0[i]).shard);
  EXPECT_GT(shards.size(), 1u);
}

TEST(LlmcShardLoader, TwoRanksReadEachWindowOncePerEpoch) {
  FortyWindows f;
  for (std::int64_t epoch = 0; epoch < 2; ++epoch) {
    SCOPED_TRACE(epoch);
    std::vector<std::int64_t> all;
    for (int rank = 0; rank < 2; ++rank) {
      DataLoader loader(f.data, loader_options(5, rank, 2));
      loader.set_epoch(epoch);
      const std::vector<std::int64_t> mine = read_epoch(loader, *f.data);
      EXPECT_EQ(mine.size(), 20u);
      all.insert(all.end(), mine.begin(), mine.end());
    }
    std::sort(all.begin(), all.end());
    ASSERT_EQ(all.size(), 40u);
    for (std::int64_t i = 0; i < 40; ++i) EXPECT_EQ(all[static_cast<std::size_t>(i)], i);
  }
}

TEST(LlmcShardLoader, RestoredStateGivesTheSameFollowingBatches) {
  FortyWindows f;
  for (std::int64_t taken : {3, 9}) {  // mid-epoch, and close enough to cross into epoch 1
    SCOPED_TRACE(taken);
    DataLoader first(f.data, loader_options(7, 1, 2));
    for (std::int64_t i = 0; i < taken; ++i) first.next();
    const LoaderState state = first.state();
    DataLoader resumed(f.data, loader_options(0, 1, 2, 1));  // the state's seed wins
    resumed.restore(state);
    for (int i = 0; i < 6; ++i) {
      SCOPED_TRACE(i);
      Batch want = first.next(), got = resumed.next();
      EXPECT_EQ(got.epoch, want.epoch);
      EXPECT_EQ(got.index, want.index);
      EXPECT_EQ(got.sample_indices, want.sample_indices);
      ASSERT_EQ(got.inputs.nbytes(), want.inputs.nbytes());
      EXPECT_EQ(0, std::memcmp(got.inputs.data(), want.inputs.data(), want.inputs.nbytes()));
      EXPECT_EQ(0, std::memcmp(got.targets.data(), want.targets.data(), want.targets.nbytes()));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Bad shards: each an InputError naming the file.

TEST(LlmcShardErrors, EachBadShardNamesTheFile) {
  ScratchDir dir;
  const std::vector<std::uint16_t> tokens = shard_tokens(1, 64);
  const std::string path = dir.file("bad_train_000001.bin");
  auto open = [&] { LlmcShard shard(path, kVocab); };

  write_bytes(path, shard_bytes(tokens, 20240521));
  expect_input_error(open, {path, "wrong magic 20240521", "expected 20240520", "at byte 0"});
  write_bytes(path, shard_bytes(tokens, kLlmcShardMagic, 2));
  expect_input_error(open, {path, "unsupported version 2", "at byte 4"});
  write_bytes(path, shard_bytes(tokens, kLlmcShardMagic, kLlmcShardVersion, 65));
  expect_input_error(open, {path, "truncated: the header claims 65 tokens", "1154 bytes"});
  write_bytes(path, shard_bytes(tokens, kLlmcShardMagic, kLlmcShardVersion, 63));
  expect_input_error(open, {path, "2 unexpected bytes after the last token", "at byte 1150"});
  write_bytes(path, shard_bytes(tokens, kLlmcShardMagic, kLlmcShardVersion, 0));
  expect_input_error(open, {path, "claims 0 tokens"});
  std::vector<std::uint8_t> short_header = shard_bytes(tokens);
  short_header.resize(500);
  write_bytes(path, short_header);
  expect_input_error(open, {path, "truncated header: 500 bytes", "1024-byte header"});
  write_bytes(path, {});
  expect_input_error(open, {path, "truncated header: 0 bytes"});

  std::vector<std::uint16_t> beyond = tokens;
  beyond[17] = 50257;
  write_bytes(path, shard_bytes(beyond));
  expect_input_error(open, {path, "token 17 has id 50257", "vocabulary size 50257",
                            "at byte " + std::to_string(1024 + 2 * 17)});
  // A smaller model vocabulary: the same file fails at the first id beyond it.
  write_bytes(path, shard_bytes(tokens));
  expect_input_error([&] { LlmcShard shard(path, 10005); }, {path, "token 5 has id 10005"});

  std::filesystem::create_directory(dir.file("a_directory"));
  expect_input_error([&] { LlmcShard shard(dir.file("a_directory"), kVocab); },
                     {dir.file("a_directory"), "regular file"});
}

// A shard truncated (or rewritten with out-of-vocabulary ids) after the dataset validated it:
// reading a window is an InputError naming the shard, never SIGBUS (shards are not mapped).
TEST(LlmcShardErrors, AShardChangedWhileInUseNamesTheFile) {
  ScratchDir dir;
  const std::string path = dir.file("s_000000.bin");
  write_llmc_shard(path, shard_tokens(1, 1000));
  LlmcShardDataset dataset(path, 10, kVocab);
  std::vector<std::int64_t> ids(10), next(10);
  SampleContext context;
  ASSERT_TRUE(dataset.get(98, context, ids.data(), next.data()));  // the last window
  EXPECT_EQ(next[9], token_of(1, 990));
  std::filesystem::resize_file(path, kLlmcShardHeaderBytes + 2 * 500);
  ASSERT_TRUE(dataset.get(10, context, ids.data(), next.data()));  // still inside the file
  expect_input_error([&] { dataset.get(98, context, ids.data(), next.data()); },
                     {path, "the file ends before bytes [2984, 3006)",
                      "it had 3024 bytes when opened and is now 2024 bytes",
                      "truncated or rewritten while in use"});
  std::filesystem::resize_file(path, 0);
  expect_input_error([&] { dataset.get(0, context, ids.data(), next.data()); },
                     {path, "is now 0 bytes"});
  // Rewritten in place with an id beyond the vocabulary.
  write_llmc_shard(path, std::vector<std::uint16_t>(1000, 60000));
  expect_input_error([&] { dataset.get(0, context, ids.data(), next.data()); },
                     {path, "has id 60000, not below the model's vocabulary size 50257"});
}

TEST(LlmcShardErrors, TheDatasetNamesThePatternOrTheBadShard) {
  ScratchDir dir;
  const std::string glob = dir.file("none_train_*.bin");
  expect_input_error([&] { LlmcShardDataset data(glob, 4, kVocab); }, {glob, "matches no file"});
  expect_input_error([&] { make_dataset("llmc_shards", glob, "train"); },
                     {glob, "matches no file"});

  // The second of three shards is bad: the message names it, not the glob or the first.
  const std::string good = write_training_shards(dir, {9, 9, 9});
  std::vector<std::uint16_t> tokens = shard_tokens(2, 9);
  tokens[8] = 60000;
  write_bytes(dir.file("tiny_train_000002.bin"), shard_bytes(tokens));
  expect_input_error([&] { LlmcShardDataset data(good, 4, kVocab); },
                     {dir.file("tiny_train_000002.bin"), "token 8 has id 60000"});

  // A shard too short for one window of T plus the next token.
  write_llmc_shard(dir.file("tiny_train_000002.bin"), shard_tokens(2, 4));
  expect_input_error(
      [&] { LlmcShardDataset data(good, 4, kVocab); },
      {dir.file("tiny_train_000002.bin"), "4 tokens, fewer than one window of seq_len 4"});
}

TEST(PackedDocuments, StartsAreTheLastBoundaryAtOrBeforeEachToken) {
  Tensor ids = Tensor::from_vector<std::int64_t>({3, 7, 1, 7, 7, 2, 5, 6,  //
                                                  7, 1, 2, 3, 4, 5, 6, 7},
                                                 {2, 8});
  Tensor starts = Tensor::empty({2, 8}, DType::I32);
  fill_document_starts(ids, 7, starts);
  EXPECT_EQ(starts.to_vector<std::int32_t>(), (std::vector<std::int32_t>{0, 1, 1, 3, 4, 4, 4, 4,  //
                                                                         0, 0, 0, 0, 0, 0, 0, 7}));
}

// A shard whose documents each begin with the separator 50256 (as kiln tokenize and llm.c write
// them): the loader's batches carry document starts (B, T) I32 computed from their windows, the
// same after a restore, and llmc_first_token finds the separator.
TEST(PackedDocuments, LoaderDeliversDocumentStartsWithEachBatch) {
  ScratchDir dir;
  const std::uint16_t sep = 50256;
  // Windows of 8: [sep a b sep c d e f] [g sep h i j k l m] [n o p q r s t sep] + 1 target.
  std::vector<std::uint16_t> tokens = {sep, 1,  2,  sep, 3,  4,  5,  6,  7,  sep, 8,   9, 10,
                                       11,  12, 13, 14,  15, 16, 17, 18, 19, 20,  sep, 21};
  write_llmc_shard(dir.file("docs_train_000001.bin"), tokens);
  const std::string glob = dir.file("docs_train_*.bin");
  EXPECT_EQ(llmc_first_token(glob), sep);
  auto dataset = std::make_shared<LlmcShardDataset>(glob, 8, kVocab);
  LoaderOptions options;
  options.batch_size = 3;
  options.workers = 0;
  options.shuffle = false;
  options.document_boundary_token = sep;
  DataLoader loader(dataset, options);
  const LoaderState start = loader.state();
  Batch batch = loader.next();
  ASSERT_TRUE(batch.document_starts.defined());
  EXPECT_EQ(batch.document_starts.dtype(), DType::I32);
  EXPECT_EQ(batch.document_starts.shape(), (Shape{3, 8}));
  const std::vector<std::int32_t> want = {0, 0, 0, 3, 3, 3, 3, 3,  //
                                          0, 1, 1, 1, 1, 1, 1, 1,  //
                                          0, 0, 0, 0, 0, 0, 0, 7};
  EXPECT_EQ(batch.document_starts.to_vector<std::int32_t>(), want);
  loader.restore(start);
  EXPECT_EQ(loader.next().document_starts.to_vector<std::int32_t>(), want);

  options.document_boundary_token.reset();
  DataLoader plain(dataset, options);
  EXPECT_FALSE(plain.next().document_starts.defined());
  expect_input_error([&] { llmc_first_token(dir.file("none_*.bin")); }, {"matches no file"});
}

}  // namespace
}  // namespace kiln::data
