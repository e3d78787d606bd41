#include <gtest/gtest.h>

#include "core/ops.h"
#include "core/tensor.h"

namespace kiln {
namespace {

Tensor iota(const Shape& shape, DType dtype = DType::F32) {
  std::vector<double> v(shape_numel(shape));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i);
  return Tensor::from_vector(v, shape).to(dtype);
}

TEST(Tensor, ShapeStridesAndContiguity) {
  Tensor t = Tensor::empty({2, 3, 4}, DType::F32);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.data()) % 256, 0u);
  EXPECT_FALSE(t.transpose(0, 2).is_contiguous());
  EXPECT_EQ(t.size(-1), 4);
}

TEST(Tensor, ViewsShareStorage) {
  Tensor t = iota({4, 5});
  Tensor row = t.select(0, 2);
  EXPECT_EQ(row.to_vector<float>(), (std::vector<float>{10, 11, 12, 13, 14}));
  Tensor col = t.select(1, 3);
  EXPECT_EQ(col.to_vector<float>(), (std::vector<float>{3, 8, 13, 18}));
  Tensor block = t.slice(0, 1, 3).slice(1, 2, 4);
  EXPECT_EQ(block.to_vector<float>(), (std::vector<float>{7, 8, 12, 13}));
  block.fill(-1);  // writes through the view
  EXPECT_EQ(t.select(0, 1).to_vector<float>(), (std::vector<float>{5, 6, -1, -1, 9}));
  Tensor v = t.view({5, 4});
  EXPECT_EQ(v.data(), t.data());
  EXPECT_EQ(t.view({-1}).size(0), 20);
}

TEST(Tensor, TransposePermuteContiguous) {
  Tensor t = iota({2, 3});
  Tensor tt = t.transpose(0, 1).contiguous();
  EXPECT_EQ(tt.shape(), (Shape{3, 2}));
  EXPECT_EQ(tt.to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  Tensor p = iota({2, 3, 4}).permute({2, 0, 1}).contiguous();
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  // p[k][i][j] == original[i][j][k] == i*12 + j*4 + k
  auto v = p.to_vector<float>();
  for (int k = 0; k < 4; ++k)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j) EXPECT_EQ(v[k * 6 + i * 3 + j], i * 12 + j * 4 + k);
  EXPECT_EQ(iota({2, 3}).transpose(0, 1).reshape({6}).to_vector<float>(),
            (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(iota({3}).unsqueeze(0).shape(), (Shape{1, 3}));
}

// reshape of a row-strided tensor (the first 5 of 8 columns) views it where the rows stay rows,
// and copies where elements of different rows would have to be adjacent.
TEST(Tensor, ReshapeViewsStridedRowsWithoutACopy) {
  Tensor base = iota({6, 8});
  Tensor rows = base.slice(1, 0, 5);  // (6, 5), row stride 8
  Tensor split = rows.reshape({2, 3, 5});
  EXPECT_EQ(split.data(), rows.data());
  EXPECT_EQ(split.stride(0), 24);
  EXPECT_EQ(split.stride(1), 8);
  EXPECT_EQ(split.to_vector<float>(), rows.contiguous().to_vector<float>());
  Tensor merged = split.reshape({-1, 5});
  EXPECT_EQ(merged.data(), rows.data());
  EXPECT_EQ(merged.shape(), (Shape{6, 5}));
  EXPECT_EQ(merged.stride(0), 8);
  Tensor flat = rows.reshape({30});
  EXPECT_NE(flat.data(), rows.data());
  EXPECT_TRUE(flat.is_contiguous());
  EXPECT_EQ(flat.to_vector<float>(), rows.contiguous().to_vector<float>());
  EXPECT_EQ(rows.reshape({6, 1, 5}).stride(0), 8);
}

TEST(Tensor, DtypeRoundTrips) {
  Tensor t = Tensor::from_vector<float>({1.0f, -2.5f, 3.140625f, 65504.0f}, {4});
  EXPECT_EQ(t.to(DType::F16).to(DType::F32).to_vector<float>(), t.to_vector<float>());
  EXPECT_EQ(t.to(DType::F64).to(DType::F32).to_vector<float>(), t.to_vector<float>());
  Tensor b = Tensor::from_vector<float>({1.0f, 1.00390625f, 1.01171875f}, {3});  // bf16 ties
  EXPECT_EQ(b.to(DType::BF16).to(DType::F32).to_vector<float>(),
            (std::vector<float>{1.0f, 1.0f, 1.015625f}));
  Tensor i = Tensor::from_vector<std::int64_t>({-3, 7, 1000}, {3});
  EXPECT_EQ(i.to(DType::I32).to(DType::F64).to_vector<double>(),
            (std::vector<double>{-3, 7, 1000}));
  EXPECT_EQ(Tensor::full({2}, 200, DType::U8).to_vector<std::int32_t>(),
            (std::vector<std::int32_t>{200, 200}));
}

TEST(Tensor, CopyFromStridedAndCasting) {
  Tensor src = iota({3, 4}, DType::F64).transpose(0, 1);  // (4, 3) non-contiguous
  Tensor dst = Tensor::zeros({4, 3}, DType::F16);
  dst.copy_from(src);
  auto v = dst.to_vector<float>();
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j) EXPECT_EQ(v[i * 3 + j], j * 4 + i);
  Tensor wrong = Tensor::zeros({3, 4}, DType::F16);
  EXPECT_THROW(wrong.copy_from(src), Error);
}

TEST(Tensor, WrapDoesNotOwn) {
  std::vector<float> buffer = {1, 2, 3, 4};
  {
    Tensor t = Tensor::wrap(buffer.data(), {2, 2}, DType::F32, Device::cpu());
    t.fill(7);
  }
  EXPECT_EQ(buffer, (std::vector<float>{7, 7, 7, 7}));
}

TEST(Tensor, UndefinedAndErrors) {
  Tensor t;
  EXPECT_FALSE(t.defined());
  EXPECT_THROW(t.data(), Error);
  Tensor u = iota({2, 3});
  EXPECT_THROW(u.view({4, 2}), Error);
  EXPECT_THROW(u.slice(0, 1, 5), Error);
  EXPECT_THROW(u.data<double>(), Error);
  EXPECT_THROW(u.transpose(0, 1).view({6}), Error);
}

}  // namespace
}  // namespace kiln
