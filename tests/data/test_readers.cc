// Every reader on small files written here: the good case, and each kind of bad file giving a
// clean InputError that names the file and, where it helps, the offset or record.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>

#include "data/factory.h"
#include "data/file_io.h"
#include "data/image_datasets.h"
#include "data/loader.h"
#include "data/token_dataset.h"
#include "tests/data/test_util.h"

namespace kiln::data {
namespace {

using testing::expect_input_error;
using testing::ScratchDir;

void put_be32(std::vector<std::uint8_t>* out, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8)
    out->push_back(static_cast<std::uint8_t>(v >> shift));
}

std::vector<std::uint8_t> idx_file(std::uint32_t magic, const std::vector<std::uint32_t>& dims,
                                   const std::vector<std::uint8_t>& payload) {
  std::vector<std::uint8_t> out;
  put_be32(&out, magic);
  for (std::uint32_t d : dims) put_be32(&out, d);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

void write_bytes(const std::string& path, const std::vector<std::uint8_t>& bytes,
                 bool gzip = false) {
  write_file(path, bytes.data(), bytes.size(), gzip);
}

// Five 4x3 images whose pixel (n, y, x) is 10 n + 3 y + x, labels n % 3.
struct IdxFiles {
  std::vector<std::uint8_t> images, labels;
  IdxFiles() {
    std::vector<std::uint8_t> pixels;
    for (int n = 0; n < 5; ++n)
      for (int y = 0; y < 4; ++y)
        for (int x = 0; x < 3; ++x) pixels.push_back(static_cast<std::uint8_t>(10 * n + 3 * y + x));
    images = idx_file(0x803, {5, 4, 3}, pixels);
    labels = idx_file(0x801, {5}, {0, 1, 2, 0, 1});
  }
};

TEST(IdxReader, PlainAndGzipFilesReadTheSame) {
  ScratchDir dir;
  IdxFiles f;
  write_bytes(dir.file("img"), f.images);
  write_bytes(dir.file("lbl"), f.labels);
  write_bytes(dir.file("img.gz"), f.images, true);
  write_bytes(dir.file("lbl.gz"), f.labels, true);
  auto plain = load_idx_dataset(dir.file("img"), dir.file("lbl"), 3, ImageAugment());
  auto gz = load_idx_dataset(dir.file("img.gz"), dir.file("lbl.gz"), 3, ImageAugment());
  ASSERT_EQ(plain->size(), 5);
  ASSERT_EQ(gz->size(), 5);
  EXPECT_EQ(plain->spec().input_shape, (Shape{1, 4, 3}));
  EXPECT_EQ(plain->spec().input_dtype, DType::F32);
  EXPECT_EQ(plain->spec().target_dtype, DType::I64);
  for (int n = 0; n < 5; ++n) {
    EXPECT_EQ(plain->label(n), n % 3);
    EXPECT_EQ(gz->label(n), n % 3);
    EXPECT_EQ(0, std::memcmp(plain->pixels(n), gz->pixels(n), 12));
    EXPECT_EQ(plain->pixels(n)[7], 10 * n + 3 * 2 + 1);
  }
  // get() scales to [0, 1] when the normalisation is the identity.
  std::vector<float> input(12);
  std::int64_t target = -1;
  SampleContext context;
  context.train = false;
  ASSERT_TRUE(plain->get(4, context, input.data(), &target));
  EXPECT_EQ(target, 1);
  EXPECT_FLOAT_EQ(input[5], (40 + 3 + 2) / 255.0f);
}

TEST(IdxReader, TruncatedImagesNameFileAndOffset) {
  ScratchDir dir;
  IdxFiles f;
  f.images.resize(16 + 3 * 12 + 5);  // three whole records and part of the fourth
  write_bytes(dir.file("img"), f.images);
  write_bytes(dir.file("lbl"), f.labels);
  expect_input_error([&] { load_idx_dataset(dir.file("img"), dir.file("lbl"), 3, {}); },
                     {dir.file("img"), "truncated", "claims 5 records", "holds 3",
                      "at byte " + std::to_string(16 + 3 * 12)});
}

TEST(IdxReader, HeaderClaimingMoreRecordsThanHeld) {
  ScratchDir dir;
  IdxFiles f;
  f.labels = idx_file(0x801, {9}, {0, 1, 2, 0, 1});
  write_bytes(dir.file("img"), f.images);
  write_bytes(dir.file("lbl"), f.labels, true);
  expect_input_error([&] { load_idx_dataset(dir.file("img"), dir.file("lbl"), 3, {}); },
                     {dir.file("lbl"), "claims 9 records", "holds 5", "at byte 13"});
}

TEST(IdxReader, WrongMagicEmptyAndMissing) {
  ScratchDir dir;
  IdxFiles f;
  write_bytes(dir.file("lbl"), f.labels);
  write_bytes(dir.file("magic"), idx_file(0x0d03, {5, 4, 3}, std::vector<std::uint8_t>(60)));
  expect_input_error([&] { load_idx_dataset(dir.file("magic"), dir.file("lbl"), 3, {}); },
                     {dir.file("magic"), "wrong magic 0x00000d03", "at byte 0"});
  // An image file given where labels belong: a magic of the wrong rank.
  write_bytes(dir.file("img"), f.images);
  expect_input_error([&] { load_idx_dataset(dir.file("img"), dir.file("img"), 3, {}); },
                     {dir.file("img"), "wrong magic 0x00000803, expected 0x00000801"});
  write_bytes(dir.file("huge"), idx_file(0x803, {5, 70000, 3}, std::vector<std::uint8_t>(60)));
  expect_input_error([&] { load_idx_dataset(dir.file("huge"), dir.file("lbl"), 3, {}); },
                     {dir.file("huge"), "implausible image dimension 70000", "at byte 8"});
  write_bytes(dir.file("empty"), {});
  expect_input_error([&] { load_idx_dataset(dir.file("empty"), dir.file("lbl"), 3, {}); },
                     {dir.file("empty"), "empty file"});
  write_bytes(dir.file("short"), {0, 0, 8});
  expect_input_error([&] { load_idx_dataset(dir.file("short"), dir.file("lbl"), 3, {}); },
                     {dir.file("short"), "truncated idx header"});
  expect_input_error([&] { load_idx_dataset(dir.file("absent"), dir.file("lbl"), 3, {}); },
                     {dir.file("absent"), "cannot open"});
  // What is not a regular file is refused before it is read (/dev/zero would never end).
  expect_input_error([&] { load_idx_dataset("/dev/zero", dir.file("lbl"), 3, {}); },
                     {"/dev/zero", "must be a regular file, but it is a character device"});
  expect_input_error([&] { load_idx_dataset(dir.path(), dir.file("lbl"), 3, {}); },
                     {dir.path(), "must be a regular file, but it is a directory"});
  expect_input_error([&] { load_mnist_dir(dir.path(), "train", {}); },
                     {"train-images-idx3-ubyte[.gz]", "no such file"});
}

TEST(IdxReader, LabelOutOfRangeNamesRecord) {
  ScratchDir dir;
  IdxFiles f;
  f.labels = idx_file(0x801, {5}, {0, 1, 7, 0, 1});
  write_bytes(dir.file("img"), f.images);
  write_bytes(dir.file("lbl"), f.labels);
  expect_input_error([&] { load_idx_dataset(dir.file("img"), dir.file("lbl"), 3, {}); },
                     {dir.file("lbl"), "label 7 of record 2", "[0, 3)", "at byte 10"});
}

TEST(IdxReader, CountMismatchAndTrailingBytes) {
  ScratchDir dir;
  IdxFiles f;
  write_bytes(dir.file("img"), f.images);
  write_bytes(dir.file("lbl4"), idx_file(0x801, {4}, {0, 1, 2, 0}));
  expect_input_error([&] { load_idx_dataset(dir.file("img"), dir.file("lbl4"), 3, {}); },
                     {"holds 5 images", "holds 4 labels"});
  std::vector<std::uint8_t> extra = f.labels;
  extra.push_back(0);
  write_bytes(dir.file("lbl"), extra);
  expect_input_error([&] { load_idx_dataset(dir.file("img"), dir.file("lbl"), 3, {}); },
                     {dir.file("lbl"), "1 unexpected bytes", "at byte 13"});
}

TEST(GzipReader, CorruptAndTruncatedStreams) {
  ScratchDir dir;
  std::vector<std::uint8_t> data(200000);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::uint8_t>(i * 7 % 251);
  write_bytes(dir.file("good.gz"), data, true);
  EXPECT_EQ(read_file(dir.file("good.gz")), data);
  std::ifstream in(dir.file("good.gz"), std::ios::binary);
  std::vector<std::uint8_t> compressed((std::istreambuf_iterator<char>(in)),
                                       std::istreambuf_iterator<char>());
  ASSERT_GT(compressed.size(), 100u);

  std::vector<std::uint8_t> cut(compressed.begin(), compressed.begin() + compressed.size() / 2);
  write_bytes(dir.file("cut.gz"), cut);
  expect_input_error([&] { read_file(dir.file("cut.gz")); }, {dir.file("cut.gz"), "gzip"});

  std::vector<std::uint8_t> corrupt = compressed;
  for (std::size_t i = 20; i < 60; ++i) corrupt[i] ^= 0x5a;
  write_bytes(dir.file("corrupt.gz"), corrupt);
  expect_input_error([&] { read_file(dir.file("corrupt.gz")); },
                     {dir.file("corrupt.gz"), "gzip", "at byte"});

  // A damaged trailer (CRC) is caught too.
  std::vector<std::uint8_t> crc = compressed;
  crc[crc.size() - 6] ^= 0xff;
  write_bytes(dir.file("crc.gz"), crc);
  expect_input_error([&] { read_file(dir.file("crc.gz")); }, {dir.file("crc.gz"), "gzip"});
}

// ---------------------------------------------------------------------------------------------

std::vector<std::uint8_t> cifar_records(int count, int bad_label_record = -1) {
  std::vector<std::uint8_t> out;
  for (int r = 0; r < count; ++r) {
    out.push_back(static_cast<std::uint8_t>(r == bad_label_record ? 11 : (r * 3) % 10));
    for (int i = 0; i < 3072; ++i) out.push_back(static_cast<std::uint8_t>((r + i) % 256));
  }
  return out;
}

TEST(CifarReader, ReadsRecordsInOrder) {
  ScratchDir dir;
  for (int b = 1; b <= 5; ++b) {
    write_bytes(dir.file("data_batch_" + std::to_string(b) + ".bin"), cifar_records(b));
  }
  write_bytes(dir.file("test_batch.bin"), cifar_records(4));
  auto train = load_cifar10_dir(dir.path(), "train", {});
  auto test = load_cifar10_dir(dir.path(), "test", {});
  EXPECT_EQ(train->size(), 1 + 2 + 3 + 4 + 5);
  EXPECT_EQ(test->size(), 4);
  EXPECT_EQ(train->spec().input_shape, (Shape{3, 32, 32}));
  // Record 2 of data_batch_2 is sample 1 + 1 = 2; channel 1 (green) starts at byte 1024.
  EXPECT_EQ(train->label(2), 3);
  EXPECT_EQ(train->pixels(2)[1024], (1 + 1024) % 256);
  EXPECT_EQ(test->label(3), 9);
}

TEST(CifarReader, BadFilesNameFileAndRecord) {
  ScratchDir dir;
  std::vector<std::uint8_t> bytes = cifar_records(3);
  bytes.resize(bytes.size() + 100);
  write_bytes(dir.file("trunc.bin"), bytes);
  expect_input_error([&] { load_cifar10_files({dir.file("trunc.bin")}, {}); },
                     {dir.file("trunc.bin"), "truncated", "record 3", "at byte 9219"});
  write_bytes(dir.file("label.bin"), cifar_records(3, 1));
  expect_input_error([&] { load_cifar10_files({dir.file("label.bin")}, {}); },
                     {dir.file("label.bin"), "label 11 of record 1", "at byte 3073"});
  write_bytes(dir.file("empty.bin"), {});
  expect_input_error([&] { load_cifar10_files({dir.file("empty.bin")}, {}); },
                     {dir.file("empty.bin"), "empty file"});
  expect_input_error([&] { load_cifar10_dir(dir.path(), "train", {}); },
                     {"data_batch_1.bin", "no such file"});
  expect_input_error([&] { load_cifar10_dir(dir.path(), "dev", {}); }, {"unknown split 'dev'"});
}

// ---------------------------------------------------------------------------------------------

std::vector<std::uint8_t> read_raw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<std::uint8_t>((std::istreambuf_iterator<char>(in)),
                                   std::istreambuf_iterator<char>());
}

TEST(TokenFile, RoundTripsBothWidths) {
  ScratchDir dir;
  std::vector<std::uint32_t> tokens = {0, 5, 65535, 7, 1};
  write_token_file(dir.file("a.tok"), tokens, 65536, 2);
  TokenFile a = read_token_file(dir.file("a.tok"));
  EXPECT_EQ(a.tokens, tokens);
  EXPECT_EQ(a.token_width, 2u);
  EXPECT_EQ(read_raw(dir.file("a.tok")).size(), 32u + 2 * tokens.size());
  tokens.push_back(100000);
  write_token_file(dir.file("b.tok"), tokens, 200000, 4);
  TokenFile b = read_token_file(dir.file("b.tok"));
  EXPECT_EQ(b.tokens, tokens);
  EXPECT_EQ(b.vocab_size, 200000u);
}

TEST(TokenFile, EveryBadFieldNamesFileAndOffset) {
  ScratchDir dir;
  write_token_file(dir.file("good.tok"), {1, 2, 3, 4}, 10, 4);
  const std::vector<std::uint8_t> good = read_raw(dir.file("good.tok"));
  auto variant = [&](const std::string& name,
                     const std::function<void(std::vector<std::uint8_t>*)>& edit) {
    std::vector<std::uint8_t> bytes = good;
    edit(&bytes);
    write_bytes(dir.file(name), bytes);
    return dir.file(name);
  };
  std::string magic = variant("magic.tok", [](auto* b) { (*b)[0] = 'X'; });
  expect_input_error([&] { read_token_file(magic); }, {magic, "wrong magic", "at byte 0"});
  std::string version = variant("version.tok", [](auto* b) { (*b)[8] = 9; });
  expect_input_error([&] { read_token_file(version); }, {version, "version 9", "at byte 8"});
  std::string width = variant("width.tok", [](auto* b) { (*b)[12] = 3; });
  expect_input_error([&] { read_token_file(width); }, {width, "token width 3", "at byte 12"});
  std::string vocab = variant("vocab.tok", [](auto* b) { (*b)[16] = 0; });
  expect_input_error([&] { read_token_file(vocab); }, {vocab, "vocabulary size 0", "at byte 16"});
  std::string beyond = variant("beyond.tok", [](auto* b) { (*b)[32 + 2 * 4] = 10; });
  expect_input_error([&] { read_token_file(beyond); },
                     {beyond, "token 2 has id 10", "beyond the vocabulary size 10", "at byte 40"});
  std::string more = variant("more.tok", [](auto* b) { (*b)[24] = 6; });
  expect_input_error([&] { read_token_file(more); },
                     {more, "truncated", "claims 6 tokens", "holds 4"});
  std::string trailing = variant("trailing.tok", [](auto* b) { b->push_back(0); });
  expect_input_error([&] { read_token_file(trailing); },
                     {trailing, "1 unexpected bytes", "at byte 48"});
  std::string header = variant("header.tok", [](auto* b) { b->resize(20); });
  expect_input_error([&] { read_token_file(header); }, {header, "truncated header"});
  std::string empty = variant("empty.tok", [](auto* b) { b->clear(); });
  expect_input_error([&] { read_token_file(empty); }, {empty, "empty file"});
  // A 16-bit file cannot claim a vocabulary beyond 65536.
  write_token_file(dir.file("u16.tok"), {1, 2}, 70000, 4);
  std::string u16 = variant("u16.tok", [&](auto* b) {
    *b = read_raw(dir.file("u16.tok"));
    (*b)[12] = 2;
    b->resize(32 + 4);
    (*b)[24] = 2;
  });
  expect_input_error([&] { read_token_file(u16); }, {u16, "vocabulary size 70000"});
}

TEST(TokenFile, CausalWindowsAreShiftedByOne) {
  ScratchDir dir;
  std::vector<std::uint32_t> tokens(41);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::uint32_t>(i % 17);
  write_token_file(dir.file("t.tok"), tokens, 17, 2);
  DatasetOptions options;
  options.seq_len = 8;
  auto clm = make_dataset("tokens_clm", dir.file("t.tok"), "train", options);
  ASSERT_EQ(clm->size(), 5);  // (41 - 1) / 8
  EXPECT_EQ(clm->spec().input_shape, (Shape{8}));
  std::vector<std::int64_t> input(8), target(8);
  ASSERT_TRUE(clm->get(4, SampleContext(), input.data(), target.data()));
  for (int t = 0; t < 8; ++t) {
    EXPECT_EQ(input[t], (32 + t) % 17);
    EXPECT_EQ(target[t], (33 + t) % 17);
  }
  options.seq_len = 64;
  expect_input_error([&] { make_dataset("tokens_clm", dir.file("t.tok"), "train", options); },
                     {"fewer than one window"});
  // A directory resolves to <split>.tok.
  expect_input_error([&] { make_dataset("tokens_clm", dir.path(), "val", options); },
                     {"val.tok", "no such token file"});
}

TEST(TokenFile, MaskedLmFollowsBertRates) {
  ScratchDir dir;
  const std::uint32_t vocab = 1000, mask_id = 3;
  std::vector<std::uint32_t> tokens(256 * 400);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<std::uint32_t>(5 + (i * 7919) % (vocab - 5));
  }
  tokens[0] = 1;  // a [CLS] that must never be selected
  write_token_file(dir.file("m.tok"), tokens, vocab, 2);
  DatasetOptions options;
  options.seq_len = 256;
  options.masking.mask_token_id = mask_id;
  options.masking.never_mask = {0, 1, 2};
  auto mlm = make_dataset("tokens_mlm", dir.file("m.tok"), "train", options);
  ASSERT_EQ(mlm->size(), 400);
  std::int64_t positions = 0, selected = 0, masked = 0, kept = 0, replaced = 0;
  std::vector<std::int64_t> input(256), labels(256);
  for (std::int64_t s = 0; s < mlm->size(); ++s) {
    SampleContext context{7, 0, static_cast<std::uint64_t>(s), true};
    ASSERT_TRUE(mlm->get(s, context, input.data(), labels.data()));
    for (int t = 0; t < 256; ++t) {
      std::int64_t original = tokens[s * 256 + t];
      ++positions;
      if (labels[t] == kIgnoreIndex) {
        EXPECT_EQ(input[t], original);  // unselected positions are untouched
        continue;
      }
      ASSERT_EQ(labels[t], original);
      ++selected;
      if (input[t] == mask_id) {
        ++masked;
      } else if (input[t] == original) {
        ++kept;
      } else {
        ++replaced;
        EXPECT_GE(input[t], 0);
        EXPECT_LT(input[t], vocab);
      }
    }
    if (s == 0) {
      EXPECT_EQ(labels[0], kIgnoreIndex);
    }
  }
  // 102400 positions: 15 % selected +- 0.5 %, then 80/10/10 +- 1.5 %.
  EXPECT_NEAR(static_cast<double>(selected) / positions, 0.15, 0.005);
  EXPECT_NEAR(static_cast<double>(masked) / selected, 0.80, 0.015);
  EXPECT_NEAR(static_cast<double>(kept) / selected, 0.10, 0.015);
  EXPECT_NEAR(static_cast<double>(replaced) / selected, 0.10, 0.015);

  // Reproducible for the same (seed, epoch, index); different in another epoch.
  std::vector<std::int64_t> a(256), b(256), c(256), la(256), lb(256), lc(256);
  mlm->get(9, SampleContext{7, 2, 9, true}, a.data(), la.data());
  mlm->get(9, SampleContext{7, 2, 9, true}, b.data(), lb.data());
  mlm->get(9, SampleContext{7, 3, 9, true}, c.data(), lc.data());
  EXPECT_EQ(a, b);
  EXPECT_EQ(la, lb);
  EXPECT_NE(la, lc);

  options.masking.mask_token_id = -1;
  expect_input_error([&] { make_dataset("tokens_mlm", dir.file("m.tok"), "train", options); },
                     {"mask_token_id"});
}

// ---------------------------------------------------------------------------------------------

std::vector<std::uint8_t> solid_rgb(int width, int height, std::uint8_t r, std::uint8_t g,
                                    std::uint8_t b) {
  std::vector<std::uint8_t> rgb(static_cast<std::size_t>(width) * height * 3);
  for (std::size_t i = 0; i < rgb.size(); i += 3) {
    rgb[i] = r;
    rgb[i + 1] = g;
    rgb[i + 2] = b;
  }
  return rgb;
}

void write_jpeg(const std::string& path, int width, int height, std::uint8_t r, std::uint8_t g,
                std::uint8_t b) {
  std::vector<std::uint8_t> rgb = solid_rgb(width, height, r, g, b);
  std::vector<std::uint8_t> jpeg = encode_jpeg_rgb(rgb.data(), width, height, 95);
  write_bytes(path, jpeg);
}

struct JpegTree {
  ScratchDir dir;
  JpegTree() {
    std::filesystem::create_directories(dir.file("train/cat"));
    std::filesystem::create_directories(dir.file("train/dog"));
    write_jpeg(dir.file("train/cat/a.jpg"), 64, 48, 200, 100, 50);
    write_jpeg(dir.file("train/cat/b.JPEG"), 40, 80, 10, 20, 30);
    write_jpeg(dir.file("train/dog/c.jpg"), 50, 50, 255, 255, 255);
    write_bytes(dir.file("train/dog/notes.txt"), {'h', 'i'});
  }
  void add_corrupt() {
    std::vector<std::uint8_t> jpeg = read_raw(dir.file("train/dog/c.jpg"));
    jpeg.resize(jpeg.size() / 2);  // truncated scan
    write_bytes(dir.file("train/dog/d.jpg"), jpeg);
    write_bytes(dir.file("train/dog/e.jpg"), {0xff, 0xd8, 0x00, 0x01, 0x02});
  }
};

// ImageNet's layout, train/<class>/ beside val/<class>/ (docs/data.md): the eval split ("test" in
// the config) reads val/ (or test/), and split folders are never taken for classes.
TEST(JpegFolder, SplitFoldersValTestAndFlat) {
  JpegTree tree;
  DatasetOptions options;
  options.jpeg.image_size = 16;
  auto classes = [&](const std::string& path, const std::string& split) {
    auto dataset = make_dataset("jpeg_folder", path, split, options);
    auto* jpeg = dynamic_cast<JpegFolderDataset*>(dataset.get());
    EXPECT_NE(jpeg, nullptr);
    return std::make_pair(jpeg->class_names(), jpeg->size());
  };
  const std::string root = tree.dir.path();
  // Only train/: the eval split is refused naming what is there, not read as classes train/.
  try {
    make_dataset("jpeg_folder", root, "test", options);
    ADD_FAILURE() << "an eval split read the root's split folders as classes";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("has split folders (train/) but none for the test split "
                                         "(looked for val/ and test/)"),
              std::string::npos)
        << e.what();
  }
  std::filesystem::create_directories(tree.dir.file("val/cat"));
  std::filesystem::create_directories(tree.dir.file("val/dog"));
  write_jpeg(tree.dir.file("val/cat/v1.jpg"), 30, 30, 1, 2, 3);
  write_jpeg(tree.dir.file("val/dog/v2.jpg"), 30, 30, 4, 5, 6);
  const std::vector<std::string> cat_dog = {"cat", "dog"};
  EXPECT_EQ(classes(root, "train"), std::make_pair(cat_dog, std::int64_t{3}));
  EXPECT_EQ(classes(root, "test"), std::make_pair(cat_dog, std::int64_t{2}));
  EXPECT_EQ(classes(root, "val"), std::make_pair(cat_dog, std::int64_t{2}));
  EXPECT_EQ(jpeg_split_dir(root, "test"), root + "/val");
  EXPECT_NE(make_dataset("jpeg_folder", root, "test", options)->describe().find(root + "/val"),
            std::string::npos);
  // test/ where there is no val/.
  std::filesystem::rename(tree.dir.file("val"), tree.dir.file("test"));
  EXPECT_EQ(jpeg_split_dir(root, "test"), root + "/test");
  EXPECT_EQ(classes(root, "test"), std::make_pair(cat_dog, std::int64_t{2}));
  // No split level at all: root/<class>/ serves every split.
  EXPECT_EQ(jpeg_split_dir(tree.dir.file("train"), "test"), tree.dir.file("train"));
  EXPECT_EQ(classes(tree.dir.file("train"), "test"), std::make_pair(cat_dog, std::int64_t{3}));
  EXPECT_THROW(make_dataset("jpeg_folder", tree.dir.file("nothing"), "train", options), InputError);
}

TEST(JpegFolder, ListsClassesAndDecodes) {
  JpegTree tree;
  DatasetOptions options;
  options.jpeg.image_size = 16;
  options.jpeg.normalization = Normalization{};  // identity: outputs in [0, 1]
  auto dataset = make_dataset("jpeg_folder", tree.dir.path(), "train", options);
  auto* jpeg = dynamic_cast<JpegFolderDataset*>(dataset.get());
  ASSERT_NE(jpeg, nullptr);
  EXPECT_EQ(jpeg->size(), 3);
  EXPECT_EQ(jpeg->class_names(), (std::vector<std::string>{"cat", "dog"}));
  EXPECT_EQ(jpeg->label(0), 0);
  EXPECT_EQ(jpeg->label(2), 1);
  EXPECT_EQ(jpeg->spec().input_shape, (Shape{3, 16, 16}));
  std::vector<float> image(3 * 16 * 16);
  std::int64_t label = -1;
  for (bool train : {true, false}) {
    SampleContext context{1, 0, 0, train};
    ASSERT_TRUE(jpeg->get(0, context, image.data(), &label));
    EXPECT_EQ(label, 0);
    // A solid colour survives crop, resize and JPEG within a few levels.
    EXPECT_NEAR(image[0], 200 / 255.0, 0.03);
    EXPECT_NEAR(image[256 + 77], 100 / 255.0, 0.03);
    EXPECT_NEAR(image[512 + 255], 50 / 255.0, 0.03);
  }
}

// Red rising left to right, green top to bottom, a constant blue: a smooth image.
std::vector<std::uint8_t> gradient_rgb(int width, int height, int blue) {
  std::vector<std::uint8_t> rgb(static_cast<std::size_t>(width) * height * 3);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      std::uint8_t* p = &rgb[(static_cast<std::size_t>(y) * width + x) * 3];
      p[0] = static_cast<std::uint8_t>(255 * x / (width - 1));
      p[1] = static_cast<std::uint8_t>(255 * y / (height - 1));
      p[2] = static_cast<std::uint8_t>(blue);
    }
  }
  return rgb;
}

TEST(JpegDctScaling, TheSmallestEighthThatCoversTheCrop) {
  EXPECT_EQ(jpeg_decode_eighths({0, 0, 448, 448}, 224, 224), 4);
  EXPECT_EQ(jpeg_decode_eighths({0, 0, 300, 500}, 224, 224), 8);  // 6/8 would do, but is slow
  EXPECT_EQ(jpeg_decode_eighths({0, 0, 700, 900}, 224, 224), 4);  // 3/8 rounds up to 1/2
  EXPECT_EQ(jpeg_decode_eighths({0, 0, 900, 1000}, 224, 224), 2);
  EXPECT_EQ(jpeg_decode_eighths({0, 0, 2000, 1800}, 224, 224), 1);
  EXPECT_EQ(jpeg_decode_eighths({0, 0, 224, 100}, 224, 224), 8);  // an enlargement: full size
  const CropBox half = scale_crop_box({10, 21, 100, 51}, 4, 250, 188);
  EXPECT_EQ(half.x, 5);
  EXPECT_EQ(half.y, 10);
  EXPECT_EQ(half.width, 50);
  EXPECT_EQ(half.height, 26);  // the scaled box covers the original: ceil(72 / 2) - 10
  const CropBox edge = scale_crop_box({400, 300, 100, 75}, 1, 63, 47);
  EXPECT_EQ(edge.x + edge.width, 63);
  EXPECT_EQ(edge.y + edge.height, 47);
}

// The same crop decoded at m/8 in the DCT domain and at full size then resized: a smooth image
// gives the same pixels within a few levels, from a smaller decode.
TEST(JpegDctScaling, ScaledDecodeGivesTheFullDecodesCrop) {
  ScratchDir dir;
  std::filesystem::create_directories(dir.file("train/a"));
  const int width = 512, height = 384;
  const std::vector<std::uint8_t> rgb = gradient_rgb(width, height, 90);
  const std::vector<std::uint8_t> jpeg = encode_jpeg_rgb(rgb.data(), width, height, 95);
  write_bytes(dir.file("train/a/0.jpg"), jpeg);
  std::vector<std::uint8_t> decoded;
  int w = 0, h = 0;
  std::string error;
  ASSERT_TRUE(decode_jpeg_rgb(jpeg.data(), jpeg.size(), &decoded, &w, &h, &error, 3)) << error;
  EXPECT_EQ(w, 192);  // ceil(512 * 3 / 8)
  EXPECT_EQ(h, 144);
  EXPECT_EQ(decoded.size(), 192u * 144 * 3);
  ASSERT_TRUE(decode_jpeg_rgb(jpeg.data(), jpeg.size(), &decoded, &w, &h, &error, 1)) << error;
  EXPECT_EQ(w, 64);
  EXPECT_EQ(h, 48);
  auto image = [&](bool dct_scaling, bool train) {
    DatasetOptions options;
    options.jpeg.image_size = 32;
    options.jpeg.normalization = Normalization{};  // outputs in [0, 1]
    options.jpeg.dct_scaling = dct_scaling;
    auto dataset = make_dataset("jpeg_folder", dir.path(), "train", options);
    std::vector<float> out(3 * 32 * 32);
    std::int64_t label = -1;
    SampleContext context{5, 0, 0, train};
    EXPECT_TRUE(dataset->get(0, context, out.data(), &label));
    return out;
  };
  for (bool train : {false, true}) {
    const std::vector<float> full = image(false, train), scaled = image(true, train);
    double worst = 0;
    for (std::size_t i = 0; i < full.size(); ++i)
      worst = std::max(worst, static_cast<double>(std::abs(full[i] - scaled[i])));
    EXPECT_GT(worst, 0.0) << "train " << train << ": no scaled decode happened";
    EXPECT_LT(worst, 6 / 255.0) << "train " << train;
  }
}

// A JPEG folder of smooth gradients (so crops, flips and shifts all change pixels), read as one
// training batch through the loader.
struct GradientJpegTree {
  ScratchDir dir;
  GradientJpegTree() {
    for (int i = 0; i < 4; ++i) {
      std::string cls = i < 2 ? "train/a" : "train/b";
      std::filesystem::create_directories(dir.file(cls));
      int width = 64 + 8 * i, height = 48;
      std::vector<std::uint8_t> rgb = gradient_rgb(width, height, 40 * i + 20);
      write_bytes(dir.file(cls + "/" + std::to_string(i) + ".jpg"),
                  encode_jpeg_rgb(rgb.data(), width, height, 95));
    }
  }
  // Every image of the folder as one (4, 3, 16, 16) batch; the loader's `train` switch.
  std::vector<float> batch(const DatasetOptions& options, bool train = true,
                           std::int64_t epoch = 0) const {
    auto dataset = make_dataset("jpeg_folder", dir.path(), "train", options);
    LoaderOptions loader_options;
    loader_options.batch_size = 4;
    loader_options.workers = 1;
    loader_options.shuffle = false;
    loader_options.seed = 7;
    loader_options.train = train;
    DataLoader loader(dataset, loader_options);
    loader.set_epoch(epoch);
    Batch b = loader.next();
    const float* data = b.inputs.data<float>();
    return std::vector<float>(data, data + b.inputs.numel());
  }
};

DatasetOptions jpeg16(std::optional<ImageAugment> augment) {
  DatasetOptions options;
  options.jpeg.image_size = 16;
  options.image_augment = std::move(augment);
  return options;
}

std::size_t count_differences(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  std::size_t n = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) n += a[i] != b[i];
  return n;
}

TEST(JpegFolder, ExperimentAugmentationReplacesTheImageNetDefaults) {
  GradientJpegTree tree;
  // Everything off: training reads the eval's central crop, unnormalised, whatever the epoch.
  std::vector<float> plain = tree.batch(jpeg16(ImageAugment{}));
  ASSERT_EQ(plain.size(), 4u * 3 * 16 * 16);
  EXPECT_EQ(count_differences(plain, tree.batch(jpeg16(ImageAugment{}), false)), 0u);
  EXPECT_EQ(count_differences(plain, tree.batch(jpeg16(ImageAugment{}), true, 3)), 0u);
  for (float v : plain) ASSERT_TRUE(v >= 0.0f && v <= 1.0f) << v;

  // Normalisation alone: exactly (x - mean) / std of the plain values, channel by channel.
  ImageAugment normalize;
  normalize.normalization = Normalization{{0.5f, 0.25f, 0.125f}, {0.5f, 2.0f, 0.25f}};
  std::vector<float> normalized = tree.batch(jpeg16(normalize));
  const float mean[3] = {0.5f, 0.25f, 0.125f}, inv_std[3] = {2.0f, 0.5f, 4.0f};
  for (std::size_t i = 0; i < plain.size(); ++i) {
    int c = static_cast<int>(i / 256 % 3);
    ASSERT_NEAR(normalized[i], (plain[i] - mean[c]) * inv_std[c], 1e-5) << "element " << i;
  }

  // Each random part changes the training batch; the eval batch stays the plain one.
  ImageAugment crop;
  crop.resized_crop_scale_min = 0.08;
  crop.resized_crop_scale_max = 0.5;
  ImageAugment flip;
  flip.horizontal_flip = true;
  ImageAugment pad;
  pad.crop_padding = 4;
  for (const ImageAugment& augment : {crop, flip, pad}) {
    std::size_t changed = 0;
    for (std::int64_t epoch = 0; epoch < 4; ++epoch) {
      changed += count_differences(plain, tree.batch(jpeg16(augment), true, epoch));
    }
    EXPECT_GT(changed, plain.size() / 4);
    EXPECT_EQ(count_differences(plain, tree.batch(jpeg16(augment), false)), 0u);
  }

  // A flip is a mirror of the plain image, a padded crop brings in black (0 after no
  // normalisation) from outside.
  std::vector<float> flipped = tree.batch(jpeg16(flip), true, 1);
  std::vector<float> padded = tree.batch(jpeg16(pad), true, 1);
  int zeros = 0;
  for (int n = 0; n < 4; ++n) {
    bool mirrored = true, same = true;
    for (int row = 0; row < 3 * 16; ++row) {
      for (int x = 0; x < 16; ++x) {
        std::size_t at = (static_cast<std::size_t>(n) * 3 * 16 + row) * 16;
        mirrored = mirrored && flipped[at + x] == plain[at + 15 - x];
        same = same && flipped[at + x] == plain[at + x];
        zeros += padded[at + x] == 0.0f;
      }
    }
    EXPECT_TRUE(mirrored || same) << "sample " << n;
  }
  EXPECT_GT(zeros, 0);

  // Unset: the folder's own ImageNet recipe (random resized crop, flip, ImageNet statistics).
  std::vector<float> imagenet_eval = tree.batch(jpeg16(std::nullopt), false);
  for (std::size_t i = 0; i < plain.size(); ++i) {
    const float m[3] = {0.485f, 0.456f, 0.406f}, sd[3] = {0.229f, 0.224f, 0.225f};
    int c = static_cast<int>(i / 256 % 3);
    ASSERT_NEAR(imagenet_eval[i], (plain[i] - m[c]) / sd[c], 1e-4) << "element " << i;
  }
}

TEST(JpegFolder, CorruptImagesFailOrAreSkippedAndCounted) {
  JpegTree tree;
  tree.add_corrupt();
  DatasetOptions options;
  options.jpeg.image_size = 8;
  auto strict = make_dataset("jpeg_folder", tree.dir.path(), "train", options);
  ASSERT_EQ(strict->size(), 5);
  std::vector<float> image(3 * 8 * 8);
  std::int64_t label = 0;
  expect_input_error([&] { strict->get(3, SampleContext(), image.data(), &label); },
                     {tree.dir.file("train/dog/d.jpg"), "corrupt JPEG", "sample 3"});
  expect_input_error([&] { strict->get(4, SampleContext(), image.data(), &label); },
                     {tree.dir.file("train/dog/e.jpg"), "corrupt JPEG"});

  options.jpeg.on_corrupt = CorruptImagePolicy::kSkip;
  auto lenient = make_dataset("jpeg_folder", tree.dir.path(), "train", options);
  EXPECT_FALSE(lenient->get(3, SampleContext(), image.data(), &label));
  EXPECT_EQ(lenient->skipped_samples(), 1);

  // Through the loader: every batch row is a good image, the two bad ones counted.
  auto skipping = make_dataset("jpeg_folder", tree.dir.path(), "train", options);
  LoaderOptions loader_options;
  loader_options.batch_size = 5;
  loader_options.workers = 2;
  loader_options.shuffle = false;
  DataLoader loader(skipping, loader_options);
  Batch batch = loader.next();
  ASSERT_EQ(batch.size(), 5);
  for (std::int64_t index : batch.sample_indices) EXPECT_LT(index, 3);
  // Row 3 tries d.jpg and e.jpg before a.jpg, row 4 tries e.jpg: three refusals.
  EXPECT_EQ(batch.skipped_samples, 3);
  EXPECT_EQ(loader.stats().skipped_samples, 3);
  EXPECT_GE(skipping->skipped_samples(), 3);  // the dataset also counts prefetched batches
  EXPECT_EQ(batch.sample_indices, (std::vector<std::int64_t>{0, 1, 2, 0, 0}));

  // The strict loader surfaces the InputError from the worker thread.
  DataLoader strict_loader(strict, loader_options);
  expect_input_error([&] { strict_loader.next(); }, {"corrupt JPEG"});
}

TEST(JpegFolder, EmptyOrMissingRoot) {
  ScratchDir dir;
  expect_input_error([&] { make_dataset("jpeg_folder", dir.file("none"), "train"); },
                     {dir.file("none"), "no such directory"});
  expect_input_error([&] { make_dataset("jpeg_folder", dir.path(), "train"); },
                     {"no class directories"});
  std::filesystem::create_directories(dir.file("a"));
  expect_input_error([&] { make_dataset("jpeg_folder", dir.path(), "train"); },
                     {"no .jpg/.jpeg files"});
}

// ---------------------------------------------------------------------------------------------

TEST(Factory, UnknownKindListsKnownOnes) {
  expect_input_error([] { make_dataset("imagenet22k", "/tmp", "train"); },
                     {"unknown dataset kind 'imagenet22k'", "fashion_mnist", "cifar10",
                      "jpeg_folder", "tokens_mlm", "synthetic_tokens"});
  expect_input_error([] { make_dataset("cifar10", "/tmp", "holdout"); },
                     {"unknown split 'holdout'"});
}

TEST(Factory, SyntheticDataIsDeterministicBySeed) {
  DatasetOptions options;
  options.synthetic_size = 10;
  options.height = options.width = 4;
  auto a = make_dataset("synthetic_images", "", "train", options);
  auto b = make_dataset("synthetic_images", "", "train", options);
  options.seed = 1;
  auto c = make_dataset("synthetic_images", "", "train", options);
  std::vector<float> xa(48), xb(48), xc(48);
  std::int64_t ya = 0, yb = 0, yc = 0;
  a->get(3, SampleContext(), xa.data(), &ya);
  b->get(3, SampleContext{5, 9, 3, true}, xb.data(), &yb);  // epoch does not matter
  c->get(3, SampleContext(), xc.data(), &yc);
  EXPECT_EQ(xa, xb);
  EXPECT_EQ(ya, yb);
  EXPECT_NE(xa, xc);
  EXPECT_GE(ya, 0);
  EXPECT_LT(ya, 10);

  options.seq_len = 16;
  options.vocab_size = 50;
  auto tokens = make_dataset("synthetic_tokens", "", "train", options);
  std::vector<std::int64_t> ids(16), next(16);
  tokens->get(2, SampleContext(), ids.data(), next.data());
  for (int t = 0; t + 1 < 16; ++t) EXPECT_EQ(next[t], ids[t + 1]);
  for (std::int64_t id : ids) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, 50);
  }
}

}  // namespace
}  // namespace kiln::data
