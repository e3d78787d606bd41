#pragma once
// PowerSGD gradient compression (Vogels et al. 2019), as PyTorch DDP's powerSGD_hook: rank-r
// approximation with error feedback and warm start, one PowerSgdBucket per gradient bucket.
//
// One all_reduce():
//   tensors with one dimension, or too small to gain (PyTorch's rule: (n + m) r * 2 >= n m), are
//   averaged uncompressed, through one staging buffer;
//   each other gradient, viewed as M (n, m) = (shape[0], numel / shape[0]) (conv weights
//   flattened), gets M += e (error feedback), then
//     P (n, r) = M Q;      all-reduce the bucket's Ps (sum); orthonormalise P's columns
//     Q (m, r) = Mᵀ P;     all-reduce the bucket's Qs (average)
//     e = M − P Qᵀ;  M = P Qᵀ  (the averaged, compressed gradient)
//   Q is kept for the next step (warm start); it starts as seeded normal values, the same on every
//   rank, orthonormalised. r = min(rank, n, m).
//
// State (error e and Q) is per rank: e differs between ranks. Half gradients (O2, O3) are
// compressed in f32 through an f32 copy of the matrices; e, P and Q are f32 then (f64 for f64
// gradients); the vectors of a half bucket travel in half. Every op runs on the current
// stream; the collectives are enqueued with all_reduce_on_comm_stream, so the caller runs this on
// the communication stream (DataParallel does) or on an MPI communicator.

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/safetensors.h"
#include "core/tensor.h"

namespace kiln {

struct PowerSgdOptions {
  int rank = 4;            // r: columns of P and Q (PyTorch's matrix_approximation_rank)
  std::uint64_t seed = 0;  // of Q's initial values; the same on every rank
};

// Orthonormalises the columns of a contiguous (rows, cols) f32/f64 matrix in place, by modified
// Gram-Schmidt with f64 sums; a column with no norm left becomes zero (instead of NaN).
// CPU or CUDA (on the current stream).
void orthogonalize_columns(Tensor& matrix);

class PowerSgdBucket {
 public:
  // grads: views of the bucket's gradients (contiguous, one floating dtype), in layout order.
  PowerSgdBucket(std::vector<Tensor> grads, PowerSgdOptions options);
  PowerSgdBucket(const PowerSgdBucket&) = delete;
  PowerSgdBucket& operator=(const PowerSgdBucket&) = delete;

  // Whether any gradient of the bucket is compressed (else a plain all-reduce does better).
  static bool compresses_any(const std::vector<Tensor>& grads, int rank);

  // Averages the gradients over comm's ranks, compressing the matrices (see above).
  void all_reduce(Communicator& comm);
  // Zero error, fresh Q: after a step whose gradients were not finite (the loss scaler skipped
  // it), whose NaN reached both.
  void reset();

  // "error" and "q", flat (on the gradients' device); load_state takes tensors of the same sizes.
  NamedTensors state() const;
  void load_state(const Tensor& error, const Tensor& q, const std::string& where);

  std::int64_t compressed_elements() const { return error_.defined() ? error_.numel() : 0; }
  std::int64_t uncompressed_elements() const { return rest_.defined() ? rest_.numel() : 0; }

 private:
  struct Matrix {
    Tensor grad;   // (n, m) view of the gradient
    Tensor m;      // (n, m): grad itself, or its view in work_ for half gradients
    Tensor error;  // (n, m) view into error_
    Tensor p;      // (n, r) view into p_
    Tensor q;      // (m, r) view into q_
  };
  void initialise_q();

  PowerSgdOptions options_;
  std::vector<Matrix> matrices_;
  std::vector<Tensor> uncompressed_;  // gradients all-reduced as they are
  Tensor rest_;                       // (sum of their numel,) staging
  Tensor work_;                       // (sum n m,) f32 copy of half gradients
  Tensor error_;                      // (sum n m,)
  Tensor p_;                          // (sum n r,)
  Tensor q_;                          // (sum m r,)
};

namespace detail {
// CUDA launcher (comm/powersgd.cu, present when KILN_WITH_CUDA): orthogonalize_columns.
void cuda_orthogonalize_columns(void* data, DType dtype, std::int64_t rows, std::int64_t cols,
                                void* stream);
}  // namespace detail

}  // namespace kiln
