#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "core/ops.h"
#include "train/checkpoint.h"

namespace kiln::train {
namespace {

std::string fresh_dir(const std::string& name) {
  std::string d = ::testing::TempDir() + "kiln_ckpt_" + std::to_string(::getpid()) + "_" + name;
  std::string cmd = "rm -rf '" + d + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  return d;
}

NamedTensors some_weights(std::uint64_t seed) {
  Tensor w = Tensor::empty({4, 3}, DType::F32);
  ops::fill_normal(w, 0, 1, seed);
  return {{"fc.weight", w}, {"fc.bias", Tensor::full({4}, 0.5, DType::F32)}};
}

config::CheckpointState state_at(std::int64_t step) {
  config::CheckpointState s;
  s.set_step(step);
  s.set_model_name("mlp");
  s.mutable_loss_scaler()->set_scale(32768);
  s.mutable_data()->set_epoch(2);
  s.mutable_data()->set_next_batch(17);
  return s;
}

TEST(CheckpointStore, SaveLoadRoundTrip) {
  CheckpointStore store(fresh_dir("roundtrip"), 3);
  std::string path = store.save(
      some_weights(1), {{"fc.weight.exp_avg", Tensor::zeros({4, 3}, DType::F32)}}, state_at(500));
  EXPECT_EQ(path, store.dir() + "/step-000500");
  Checkpoint c = CheckpointStore::load(path);
  EXPECT_EQ(c.state.step(), 500);
  EXPECT_EQ(c.state.data().next_batch(), 17);
  EXPECT_EQ(c.state.loss_scaler().scale(), 32768);
  EXPECT_EQ(c.model.tensors.at("fc.weight").to_vector<float>(),
            some_weights(1)[0].second.to_vector<float>());
  EXPECT_EQ(c.optimizer.tensors.count("fc.weight.exp_avg"), 1u);
}

TEST(CheckpointStore, PowerSgdStateIsOptionalAndChecksummed) {
  CheckpointStore store(fresh_dir("compression"), 3);
  EXPECT_FALSE(CheckpointStore::load(store.save(some_weights(1), {}, state_at(1))).compression);
  NamedTensors compression = {{"rank0.bucket0.error", Tensor::full({6}, 0.25, DType::F32)},
                              {"rank1.bucket0.error", Tensor::full({6}, -0.5, DType::F32)}};
  const std::string path = store.save(some_weights(2), {}, state_at(2), compression);
  Checkpoint c = CheckpointStore::load(path);
  ASSERT_TRUE(c.compression);
  EXPECT_EQ(c.compression->tensors.at("rank1.bucket0.error").to_vector<float>(),
            std::vector<float>(6, -0.5f));
  // A flipped byte in it is caught like one in any other file.
  std::fstream f(path + "/compression.safetensors",
                 std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(-1, std::ios::end);
  f.put('\x7f');
  f.close();
  try {
    CheckpointStore::load(path);
    ADD_FAILURE() << "a corrupt compression.safetensors was loaded";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("compression.safetensors: checksum mismatch"),
              std::string::npos)
        << e.what();
  }
}

TEST(CheckpointStore, KeepsTheLastKAndFindsTheLatest) {
  CheckpointStore store(fresh_dir("keep"), 2);
  for (int step : {100, 200, 300, 400}) store.save(some_weights(step), {}, state_at(step));
  auto all = store.list();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0], store.dir() + "/step-000300");
  EXPECT_EQ(*store.latest(), store.dir() + "/step-000400");
}

// Names widen past step-999999 (%06lld), so "step-1000000" sorts before it as a string: the
// newest checkpoint must still be the latest, and pruning must keep it.
TEST(CheckpointStore, OrdersByStepNumberPastAMillion) {
  CheckpointStore store(fresh_dir("million"), 2);
  for (int step : {999998, 999999, 1000000}) store.save(some_weights(step), {}, state_at(step));
  auto all = store.list();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0], store.dir() + "/step-999999");
  EXPECT_EQ(all[1], store.dir() + "/step-1000000");
  EXPECT_EQ(*store.latest(), store.dir() + "/step-1000000");
  EXPECT_EQ(checkpoint_step("step-1000000"), 1000000);
  EXPECT_FALSE(checkpoint_step("step-12x"));
  EXPECT_FALSE(checkpoint_step("step-"));
}

bool exists_no_follow(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

std::string folder_with_a_file(const std::string& name) {
  std::string d = fresh_dir(name);
  EXPECT_EQ(::mkdir(d.c_str(), 0755), 0);
  std::ofstream(d + "/keep.txt") << "archived\n";
  return d;
}

// Deleting never follows a symbolic link: pruning, re-saving a step and removing `.tmp-*`
// leftovers remove the link, never the files of what it points to.
TEST(CheckpointStore, DeletingNeverFollowsSymbolicLinks) {
  CheckpointStore archive(fresh_dir("archive"), 5);
  const std::string archived = archive.save(some_weights(1), {}, state_at(100));
  CheckpointStore store(fresh_dir("links"), 2);
  store.save(some_weights(2), {}, state_at(50));
  ASSERT_EQ(::symlink(archived.c_str(), (store.dir() + "/step-000100").c_str()), 0);
  // A folder linked into a checkpoint, and a leftover temporary name that is a link.
  const std::string inside = folder_with_a_file("linked_inside");
  ASSERT_EQ(::symlink(inside.c_str(), (store.dir() + "/step-000050/linked").c_str()), 0);
  const std::string tmp_target = folder_with_a_file("linked_tmp");
  ASSERT_EQ(::symlink(tmp_target.c_str(), (store.dir() + "/.tmp-step-000300-1").c_str()), 0);

  store.save(some_weights(3), {}, state_at(200));  // prunes step-000050
  EXPECT_FALSE(exists_no_follow(store.dir() + "/step-000050"));
  EXPECT_TRUE(exists_no_follow(inside + "/keep.txt")) << "pruning emptied a linked folder";
  store.save(some_weights(4), {}, state_at(100));  // a re-save of the linked step
  EXPECT_TRUE(exists_no_follow(archived + "/model.safetensors")) << "re-saving emptied the archive";
  store.save(some_weights(5), {}, state_at(300));  // prunes the (now real) step-000100
  store.save(some_weights(5), {}, state_at(400));
  EXPECT_TRUE(exists_no_follow(archived + "/MANIFEST"));

  ASSERT_EQ(::symlink(archived.c_str(), (store.dir() + "/step-000001").c_str()), 0);
  store.save(some_weights(6), {}, state_at(500));  // prunes the linked step-000001 and 300
  EXPECT_FALSE(exists_no_follow(store.dir() + "/step-000001"));
  EXPECT_TRUE(exists_no_follow(archived + "/model.safetensors")) << "pruning emptied the archive";
  store.remove_partial();
  EXPECT_FALSE(exists_no_follow(store.dir() + "/.tmp-step-000300-1"));
  EXPECT_TRUE(exists_no_follow(tmp_target + "/keep.txt")) << "removing .tmp-* followed a link";
  EXPECT_EQ(store.list().size(), 2u);
}

TEST(CheckpointStore, PartialDirectoriesAreNeverListed) {
  CheckpointStore store(fresh_dir("partial"), 5);
  store.save(some_weights(1), {}, state_at(100));
  // An interrupted write: a temporary directory, and a final-named directory without MANIFEST.
  ASSERT_EQ(::mkdir((store.dir() + "/.tmp-step-000200-999").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((store.dir() + "/step-000300").c_str(), 0755), 0);
  EXPECT_EQ(*store.latest(), store.dir() + "/step-000100");
  // The final-named one is reported, for resume to name it; the temporary one is not.
  EXPECT_EQ(store.unmanifested(), std::vector<std::string>{store.dir() + "/step-000300"});
  store.remove_partial();
  store.save(some_weights(2), {}, state_at(400));
  EXPECT_TRUE(exists_no_follow(store.dir() + "/step-000300")) << "pruned a directory it never read";
  struct stat st {};
  EXPECT_NE(::stat((store.dir() + "/.tmp-step-000200-999").c_str(), &st), 0);
  EXPECT_THROW(CheckpointStore::load(store.dir() + "/step-000300"), InputError);
}

std::string load_error(const std::string& path) {
  try {
    CheckpointStore::load(path);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(loaded without error)";
}

void rewrite(const std::string& file, const std::function<void(std::string&)>& edit) {
  std::ifstream in(file, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  edit(bytes);
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(CheckpointStore, FlippedByteTruncationAndMissingFilesAreRefused) {
  CheckpointStore store(fresh_dir("corrupt"), 5);
  std::string a = store.save(some_weights(1), {}, state_at(1));
  rewrite(a + "/model.safetensors", [](std::string& b) { b[b.size() - 3] ^= 0x10; });
  std::string m = load_error(a);
  EXPECT_NE(m.find("model.safetensors: checksum mismatch"), std::string::npos) << m;

  std::string b = store.save(some_weights(2), {}, state_at(2));
  rewrite(b + "/optimizer.safetensors", [](std::string& s) { s.resize(s.size() / 2); });
  m = load_error(b);
  EXPECT_NE(m.find("optimizer.safetensors: size"), std::string::npos) << m;

  std::string c = store.save(some_weights(3), {}, state_at(3));
  std::remove((c + "/state.pbtxt").c_str());
  m = load_error(c);
  EXPECT_NE(m.find("state.pbtxt: missing"), std::string::npos) << m;

  std::string d = store.save(some_weights(4), {}, state_at(4));
  rewrite(d + "/MANIFEST", [](std::string& s) { s[0] = s[0] == 'a' ? 'b' : 'a'; });
  m = load_error(d);
  EXPECT_NE(m.find("corrupt manifest"), std::string::npos) << m;
}

// ZeRO: every rank's optimizer shard in one directory, listed by the manifest; a checkpoint
// missing a shard is refused.
TEST(CheckpointStore, ShardedOptimizerFilesRoundTrip) {
  CheckpointStore store(fresh_dir("sharded"), 5);
  auto save_two_shards = [&](std::int64_t step) {
    store.prepare_staging(step);
    for (int r = 0; r < 2; ++r) {
      save_safetensors(store.staging_dir(step) + "/" + optimizer_shard_name(r, 2),
                       {{"fc.bias.exp_avg", Tensor::full({2}, r + 1.0, DType::F32)}},
                       {{"zero_world_size", "2"}, {"zero_rank", std::to_string(r)}});
    }
    return store.save_sharded(
        some_weights(1), {optimizer_shard_name(0, 2), optimizer_shard_name(1, 2)}, state_at(step));
  };
  EXPECT_EQ(optimizer_shard_name(1, 2), "optimizer-rank-00001-of-00002.safetensors");
  std::string a = save_two_shards(10);
  Checkpoint c = CheckpointStore::load(a);
  ASSERT_EQ(c.optimizer_shards.size(), 2u);
  EXPECT_TRUE(c.optimizer.tensors.empty());
  EXPECT_EQ(c.optimizer_shards[1].tensors.at("fc.bias.exp_avg").to_vector<float>()[0], 2.0f);
  EXPECT_EQ(c.optimizer_shards[1].metadata.at("zero_rank"), "1");
  EXPECT_EQ(c.model.tensors.size(), 2u);

  std::string b = save_two_shards(20);
  std::remove((b + "/" + optimizer_shard_name(1, 2)).c_str());
  std::string m = load_error(b);
  EXPECT_NE(m.find(optimizer_shard_name(1, 2) + ": missing"), std::string::npos) << m;
}

TEST(CheckpointStore, UnwritableDirectoryIsAClearError) {
  CheckpointStore store("/proc/kiln-cannot-write-here", 1);
  try {
    store.save(some_weights(1), {}, state_at(1));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/proc/kiln-cannot-write-here"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kiln::train
