// Fused attention for half q, k, v with head dimension 64 (FlashAttention-2's scheme): forward
// keeps scores only in registers, a tile of 64 keys at a time, with an online softmax. Tensor
// cores through mma.sync m16n8k16 (fp32 accumulation). Backward is two kernels so that every
// gradient element is written by one thread in a fixed order: bitwise reproducible, no atomics.
// The dK/dV kernel (per key tile, over every query tile) recomputes P from the saved log-sum-exp
// and also writes dS^T, rounded to the input type, into a (B*H, T64, T64) workspace (T64: T
// rounded up to 64, 2 B*H T64^2 bytes); the dQ kernel (per query tile) is then a plain GEMM
// dQ = scale dS K over it, with no second recomputation of S, P and dP.
// Dropout draws Dropout's mask at the same element index as the unfused path, (bh*T + q)*T + k;
// forward and dK/dV are compiled with and without it, so that p = 0 costs no draws or registers.
// The kernels read q, k and v where the input projection wrote them, the packed rows
// [q (H 64) | k (H_kv 64) | v (H_kv 64)] with head h at columns h*64.. of each part, and write the
// context as (B*T, H 64) rows and the gradients into the packed layout: no head-layout copies.
// Grouped-query attention (H_kv < H, group = H / H_kv): query head h reads key/value head
// h / group where it stands, K and V never replicated. The dK/dV kernel has one block per key
// tile of a key/value head and loops over the group's query heads in order inside it, so dK and
// dV sum over the group in one fixed order and are written once; with H_kv = H an instantiation
// without the loop makes the one pass, the multi-head arithmetic unchanged (bit for bit).
// Causal (query i attends keys j <= i): query and key tiles are the same 64 positions, so a
// query tile's key tiles after its own are wholly above the diagonal and never loaded or
// computed (forward and dQ stop at the diagonal tile; dK/dV starts at it), and only the diagonal
// tile masks key > query. dS^T of the skipped tiles is neither written nor read.
// Packed documents (document starts (B, T), CallInputs::document_starts): query i also attends no
// key before its document's start s(i). Starts never decrease along a row, so a query tile's
// earliest start is its first query's: forward and dQ begin at that start's key tile, and dK/dV
// stops before the first query tile wholly after the next document start past its keys (the dQ
// kernel reads no dS^T it did not write); each element compares the key with its query's start.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "core/cuda/cuda_check.h"
#include "core/cuda/element.cuh"
#include "core/stream.h"
#include "layers/cuda/attention_cuda.h"
#include "layers/cuda/mma_fragments.cuh"
#include "layers/dropout.h"

namespace kiln::cuda {
namespace {

using namespace mma_fragments;  // pack, mma, ldmatrix_x4(_trans)

constexpr int kDim = 64;       // head dimension
constexpr int kTile = 64;      // queries per block and keys per tile (and the reverse in dK/dV)
constexpr int kPad = 72;       // shared row stride in halves: fragment loads hit 32 distinct banks
constexpr int kThreads = 128;  // 4 warps of 16 rows
constexpr int kWarp = 32;

struct FlashArgs {
  const void* q;  // packed rows: q, k, v, dq, dk, dv step ld_qkv elements per token
  const void* k;
  const void* v;
  const void* dout;  // backward: the output's gradient; out and dout step ld_out per token
  void* dq;
  void* dk;
  void* dv;
  void* out;          // forward: the output
  float* lse;         // (BH, T), log2 domain of the scaled scores; +inf for a fully masked row
  float* delta;       // (BH, T) rowsum(dout * out)
  void* ds;           // backward: dS^T, (BH, ld_ds, ld_ds) [key][query], rounded to the input type
  int ld_ds;          // T rounded up to kTile: whole tiles of the workspace are in bounds
  int bh_first;       // the grid's first (batch * query head): backward runs in chunks of the
                      // workspace, whole groups each
  const float* mask;  // (B, T) key mask, 1 attend, 0 padding; null for none
  const std::int32_t* starts;  // (B, T) packed documents' starts; null for none
  bool causal;                 // query i attends keys j <= i only
  int t;
  int heads;         // H, query heads
  int group;         // H / H_kv: query heads per key/value head
  int ld_qkv;        // (H + 2 H_kv) 64
  int ld_out;        // H 64
  float scale;       // 1/sqrt(d)
  float scale_log2;  // scale * log2(e)
  double p;          // dropout probability, 0 for none
  float keep_scale;  // 1 / (1 - p)
  std::uint64_t key;
  std::uint64_t stream;
  // When not null, the dropout stream (the step) is read here as the kernel runs, not `stream`:
  // a captured CUDA graph replays with the current step.
  const std::uint64_t* stream_source;
};

// The A fragments (16 rows x 64 dims, 4 k-steps) of rows r0 and r0 + 8 of a (T, 64) matrix in
// global memory whose rows are ld elements apart; rows past T are zero.
template <typename T>
__device__ __forceinline__ void load_rows_a(const T* m, int ld, int r0, int t, int c,
                                            std::uint32_t a[4][4]) {
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      int row = r0 + 8 * half;
#pragma unroll
      for (int hi = 0; hi < 2; ++hi) {
        int col = ks * 16 + hi * 8 + 2 * c;
        a[ks][half + 2 * hi] = row < t ? *reinterpret_cast<const std::uint32_t*>(
                                             m + static_cast<std::int64_t>(row) * ld + col)
                                       : 0u;
      }
    }
  }
}

// Rows [first, first + 64) of a (T, 64) matrix (rows ld elements apart) into a padded shared
// tile, zero past T, by cp.async: the copy overlaps the previous tile's arithmetic (commit, then
// wait for the group).
template <typename T>
__device__ __forceinline__ void load_tile_async(const T* m, int ld, int first, int t, T* tile) {
  for (int i = threadIdx.x; i < kTile * (kDim / 8); i += kThreads) {
    int row = i / (kDim / 8), chunk = i % (kDim / 8);
    bool in = first + row < t;
    const T* src = m + static_cast<std::int64_t>(in ? first + row : 0) * ld + chunk * 8;
    unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(tile + row * kPad + chunk * 8));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(in ? 16 : 0));
  }
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}

// Waits until at most one committed group (the tile being prefetched) is still in flight.
__device__ __forceinline__ void cp_async_wait_previous() {
  asm volatile("cp.async.wait_group 1;\n" ::);
}

// Token i's document start, clamped into [0, i] (bad input must not widen the tiles visited); 0
// without packed documents.
__device__ __forceinline__ int document_start(const std::int32_t* starts, int i) {
  return starts == nullptr ? 0 : min(max(starts[i], 0), i);
}

__device__ __forceinline__ bool key_attended(const float* mask, int key, int t) {
  return key < t && (mask == nullptr || mask[key] != 0.0f);
}

// The start of the step over tile `first` of a loop over tiles that ends before `end`: the next
// tile's copy is issued (into the other buffer, which every warp is done with), this tile's
// awaited.
template <typename Fetch>
__device__ __forceinline__ void next_tile(int first, int end, Fetch fetch) {
  __syncthreads();
  if (first + kTile < end) fetch(first + kTile);
  cp_async_commit();
  cp_async_wait_previous();
  __syncthreads();
}

// Double-buffered tiles of keys and values, and which of the tile's keys are attended.
template <typename T>
struct KeyValueTiles {
  T k[2][kTile * kPad];
  T v[2][kTile * kPad];
  float key_ok[2][kTile];
};

template <typename T>
__device__ __forceinline__ void fetch_keys(KeyValueTiles<T>& s, const T* k, const T* v, int ld,
                                           const float* mask, int k0, int t) {
  const int b = (k0 / kTile) & 1;
  load_tile_async(k, ld, k0, t, s.k[b]);
  load_tile_async(v, ld, k0, t, s.v[b]);
  if (threadIdx.x < kTile) s.key_ok[b][threadIdx.x] = key_attended(mask, k0 + threadIdx.x, t);
}

// acc (16 x 64) += A (16 x 64 over 4 k-steps) * tile^T, where the tile holds 64 rows of 64
// (the B operand's column n is tile row n): scores against keys, or dP against values. Tile
// rows from `valid` on are past T: their columns of acc are left alone.
template <typename T>
__device__ __forceinline__ void mma_rows_t(const std::uint32_t a[4][4], const T* tile, int valid,
                                           int lane, float acc[8][4]) {
  const int m = lane / 8, r = lane % 8;
#pragma unroll
  for (int nt = 0; nt < 8; nt += 2) {
    if (nt * 8 >= valid) break;
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      std::uint32_t b[4];
      ldmatrix_x4(b, tile + ((nt + (m >> 1)) * 8 + r) * kPad + ks * 16 + (m & 1) * 8);
      mma<T>(acc[nt], a[ks], b[0], b[1]);
      mma<T>(acc[nt + 1], a[ks], b[2], b[3]);
    }
  }
}

// The A fragment of k-step kk (columns 16 kk..) of P (16 x 64, as accumulator fragments),
// rounded to T: a[0], a[1] rows g, g + 8 of columns 16 kk + 2c.., a[2], a[3] the same 8 on.
template <typename T>
__device__ __forceinline__ void pack_a(const float p[8][4], int kk, std::uint32_t a[4]) {
  a[0] = pack<T>(p[2 * kk][0], p[2 * kk][1]);
  a[1] = pack<T>(p[2 * kk][2], p[2 * kk][3]);
  a[2] = pack<T>(p[2 * kk + 1][0], p[2 * kk + 1][1]);
  a[3] = pack<T>(p[2 * kk + 1][2], p[2 * kk + 1][3]);
}

// acc (16 x 64) += A (16 x 64, k-step kk's fragment from load_a(kk, a)) * tile, where the tile
// holds 64 rows (A's columns) of 64: the context from values, or gradients from queries and
// keys. Tile rows from `valid` on are past T (A is 0 there) and skipped.
template <typename T, typename LoadA>
__device__ __forceinline__ void mma_a_rows(LoadA load_a, const T* tile, int valid, int lane,
                                           float acc[8][4]) {
  const int m = lane / 8, r = lane % 8;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    if (kk * 16 >= valid) break;
    std::uint32_t a[4];
    load_a(kk, a);
#pragma unroll
    for (int nt = 0; nt < 8; nt += 2) {
      std::uint32_t b[4];
      ldmatrix_x4_trans(b, tile + (kk * 16 + (m & 1) * 8 + r) * kPad + (nt + (m >> 1)) * 8);
      mma<T>(acc[nt], a, b[0], b[1]);
      mma<T>(acc[nt + 1], a, b[2], b[3]);
    }
  }
}

// acc += P (16 x 64, as accumulator fragments) * tile, as mma_a_rows.
template <typename T>
__device__ __forceinline__ void mma_p_rows(const float p[8][4], const T* tile, int valid, int lane,
                                           float acc[8][4]) {
  mma_a_rows<T>([&](int kk, std::uint32_t a[4]) { pack_a<T>(p, kk, a); }, tile, valid, lane, acc);
}

// Where a thread stands: its (batch * query head) bh, its warp's first of 16 rows (queries, or
// keys in dK/dV) and its lane's row group g and column pair c in the mma fragments.
struct Place {
  int bh, t, lane, g, c, first;
  std::int64_t base_q;         // where query head bh's token 0 starts in q, dq
  std::int64_t base_kv;        // where its key/value head's starts in k, v, dk, dv
  std::int64_t base_out;       // where query head bh's starts in out, dout
  const float* mask;           // this batch's key mask, or null
  const std::int32_t* starts;  // this batch's document starts, or null
};

// group: a.group, or a constant 1 where the caller knows it (multi-head: base_kv is base_q).
__device__ __forceinline__ Place place_of(const FlashArgs& a, int bh, int group) {
  Place p;
  p.bh = bh;
  p.t = a.t;
  p.lane = threadIdx.x % kWarp;
  p.g = p.lane / 4;
  p.c = p.lane % 4;
  p.first = static_cast<int>(blockIdx.x) * kTile + static_cast<int>(threadIdx.x / kWarp) * 16;
  const std::int64_t batch = p.bh / a.heads, head = p.bh % a.heads;
  p.base_q = batch * p.t * a.ld_qkv + head * kDim;
  p.base_kv = batch * p.t * a.ld_qkv + head / group * kDim;
  p.base_out = batch * p.t * a.ld_out + head * kDim;
  p.mask = a.mask ? a.mask + batch * p.t : nullptr;
  p.starts = a.starts ? a.starts + batch * p.t : nullptr;
  return p;
}

// Forward and dQ: one block row per (batch * query head).
__device__ __forceinline__ Place query_place_of(const FlashArgs& a) {
  return place_of(a, static_cast<int>(blockIdx.y) + a.bh_first, a.group);
}

__device__ __forceinline__ std::uint64_t dropout_stream(const FlashArgs& a) {
  return a.stream_source != nullptr ? *a.stream_source : a.stream;
}

__device__ __forceinline__ float dropped(const FlashArgs& a, std::uint64_t stream, int bh,
                                         int query, int key, float v) {
  std::uint64_t i = (static_cast<std::uint64_t>(bh) * a.t + query) * a.t + key;
  return dropout_keep(a.key, stream, i, a.p) ? v * a.keep_scale : 0.0f;
}

template <typename T, bool kDropout>
__global__ void __launch_bounds__(kThreads) flash_forward_kernel(FlashArgs a) {
  __shared__ __align__(16) KeyValueTiles<T> tiles;
  const Place at = query_place_of(a);
  const int bh = at.bh, t = at.t, lane = at.lane, g = at.g, c = at.c, ld = a.ld_qkv;
  const float* mask = at.mask;
  const T* q = static_cast<const T*>(a.q) + at.base_q;
  const T* k = static_cast<const T*>(a.k) + at.base_kv;
  const T* v = static_cast<const T*>(a.v) + at.base_kv;
  const int row[2] = {at.first + g, at.first + g + 8};
  std::uint32_t qa[4][4];
  load_rows_a(q, ld, row[0], t, c, qa);
  float o[8][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  // Causal: key tiles after this block's queries are wholly above the diagonal: not visited.
  const int k_end = a.causal ? min(t, static_cast<int>(blockIdx.x) * kTile + kTile) : t;
  // Packed documents: key tiles before the block's earliest start are not visited either.
  const int k_begin =
      document_start(at.starts, static_cast<int>(blockIdx.x) * kTile) / kTile * kTile;
  const int row_start[2] = {row[0] < t ? document_start(at.starts, row[0]) : 0,
                            row[1] < t ? document_start(at.starts, row[1]) : 0};
  const std::uint64_t stream = kDropout ? dropout_stream(a) : 0;

  auto fetch = [&](int k0) { fetch_keys(tiles, k, v, ld, mask, k0, t); };
  fetch(k_begin);
  cp_async_commit();
  for (int k0 = k_begin; k0 < k_end; k0 += kTile) {
    next_tile(k0, k_end, fetch);
    if (at.first >= t) continue;  // this warp's rows are all past T
    const T* ks = tiles.k[(k0 / kTile) & 1];
    const T* vs = tiles.v[(k0 / kTile) & 1];
    const float* key_ok = tiles.key_ok[(k0 / kTile) & 1];
    float s[8][4] = {};
    mma_rows_t<T>(qa, ks, t - k0, lane, s);
    float tile_max[2] = {-INFINITY, -INFINITY};
    // Only a tile with a mask or past T reads which keys are attended; only the causal diagonal
    // tile (a key after one of this warp's 16 queries) compares keys with queries.
    const bool every_key = mask == nullptr && k0 + kTile <= t;
    const bool diagonal = a.causal && k0 + kTile - 1 > at.first;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        int col = nt * 8 + 2 * c + (e & 1);
        bool on = (every_key || key_ok[col] != 0.0f) && !(diagonal && k0 + col > row[e >> 1]) &&
                  k0 + col >= row_start[e >> 1];
        s[nt][e] = on ? s[nt][e] * a.scale_log2 : -INFINITY;
        tile_max[e >> 1] = fmaxf(tile_max[e >> 1], s[nt][e]);
      }
    float base_of[2], alpha[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 1));
      tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 2));
      float m_new = fmaxf(m[i], tile_max[i]);
      base_of[i] = m_new == -INFINITY ? 0.0f : m_new;  // a fully masked row so far stays 0
      alpha[i] = exp2f(m[i] - base_of[i]);
      m[i] = m_new;
      l[i] *= alpha[i];
    }
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        o[nt][e] *= alpha[e >> 1];
        float pe = exp2f(s[nt][e] - base_of[e >> 1]);
        l[e >> 1] += pe;
        if (kDropout && row[e >> 1] < t && pe != 0.0f)
          pe = dropped(a, stream, bh, row[e >> 1], k0 + nt * 8 + 2 * c + (e & 1), pe);
        s[nt][e] = pe;
      }
    mma_p_rows<T>(s, vs, t - k0, lane, o);
  }

  T* out = static_cast<T*>(a.out) + at.base_out;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    if (row[i] >= t) continue;
    float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
      *reinterpret_cast<std::uint32_t*>(out + static_cast<std::int64_t>(row[i]) * a.ld_out +
                                        nt * 8 + 2 * c) =
          pack<T>(o[nt][2 * i] * inv, o[nt][2 * i + 1] * inv);
    if (c == 0)
      a.lse[static_cast<std::int64_t>(bh) * t + row[i]] =
          l[i] > 0.0f ? m[i] + log2f(l[i]) : INFINITY;
  }
}

// delta[bh*T + token] = sum_d dout * out over one head's 64 values of one token row: 8 threads
// per (token row, head), 8 halves each, rows in the (B*T, E) layout's order.
template <typename T>
__global__ void flash_delta_kernel(const T* __restrict__ out, const T* __restrict__ dout,
                                   std::int64_t rows, int t, int heads, int ld,
                                   float* __restrict__ delta) {
  std::int64_t r = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 8;
  int part = threadIdx.x % 8;
  float sum = 0.0f;
  std::int64_t token_row = r / heads, head = r % heads;
  if (r < rows) {
    std::int64_t at = token_row * ld + head * kDim;
    Pack<T> o = reinterpret_cast<const Pack<T>*>(out + at)[part];
    Pack<T> d = reinterpret_cast<const Pack<T>*>(dout + at)[part];
#pragma unroll
    for (int i = 0; i < 8; ++i) sum += load(o.v[i]) * load(d.v[i]);
  }
  for (int offset = 4; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (r < rows && part == 0) delta[((token_row / t) * heads + head) * t + token_row % t] = sum;
}

// dK and dV of 64 keys (16 per warp) of one key/value head, looping over its group's query heads
// in order and over every query tile of each, and dS^T of those keys against every query of each
// query head into the workspace, for the dQ kernel. kGrouped: group > 1; without it the one query
// head's pass is the multi-head kernel as it was (no loop over heads: its registers, its spills).
template <typename T, bool kDropout, bool kGrouped>
__global__ void __launch_bounds__(kThreads) flash_backward_kv_kernel(FlashArgs a) {
  __shared__ __align__(16) T q_tiles[2][kTile * kPad];  // double-buffered
  __shared__ __align__(16) T do_tiles[2][kTile * kPad];
  __shared__ float lse_tiles[2][kTile], delta_tiles[2][kTile];
  __shared__ int start_tiles[2][kTile];  // the queries' document starts
  __shared__ int first_after;            // the first document start after this block's keys
  // One block row per (batch * key/value head) r, whose query heads are the (batch * query head)
  // rows r * group .. r * group + group - 1; a chunk starts at a whole group.
  const int group = kGrouped ? a.group : 1;
  const Place at = place_of(a, (static_cast<int>(blockIdx.y) + a.bh_first / group) * group, group);
  const int t = at.t, lane = at.lane, g = at.g, c = at.c, ld = a.ld_qkv;
  const float* mask = at.mask;
  const int key[2] = {at.first + g, at.first + g + 8};
  const bool key_on[2] = {key_attended(mask, key[0], t), key_attended(mask, key[1], t)};
  std::uint32_t ka[4][4], va[4][4];
  load_rows_a(static_cast<const T*>(a.k) + at.base_kv, ld, key[0], t, c, ka);
  load_rows_a(static_cast<const T*>(a.v) + at.base_kv, ld, key[0], t, c, va);
  float dk[8][4] = {}, dv[8][4] = {};

  // Causal: query tiles before this block's keys are wholly above the diagonal (P = 0): not
  // visited, and the dQ kernel does not read their dS^T.
  const int q_start = a.causal ? static_cast<int>(blockIdx.x) * kTile : 0;
  // Packed documents: queries from the first start after this block's last key on (starts never
  // decrease) see none of its keys: their tiles are not visited.
  int q_end = t;
  if (at.starts != nullptr) {
    const int k_last = min(static_cast<int>(blockIdx.x) * kTile + kTile - 1, t - 1);
    if (threadIdx.x == 0) first_after = t;
    __syncthreads();
    for (int i = k_last + 1 + static_cast<int>(threadIdx.x); i < t; i += kThreads)
      if (document_start(at.starts, i) > k_last) atomicMin(&first_after, i);
    __syncthreads();
    q_end = first_after;
  }
  [[maybe_unused]] const std::uint64_t stream = kDropout ? dropout_stream(a) : 0;

  // Query head bh's pass: its q and dout rows, and this lane's column pair of its key row g in
  // bh's workspace slab (row g + 8 is 8 ld_ds on).
  auto over_query_head = [&](int bh, const T* q, const T* dout, T* ds) {
    auto fetch = [&](int q0) {
      const int b = (q0 / kTile) & 1;
      load_tile_async(q, ld, q0, t, q_tiles[b]);
      load_tile_async(dout, a.ld_out, q0, t, do_tiles[b]);
      if (threadIdx.x < kTile) {
        int r = q0 + threadIdx.x;
        std::int64_t i = static_cast<std::int64_t>(bh) * t + r;
        lse_tiles[b][threadIdx.x] = r < t ? a.lse[i] : INFINITY;
        delta_tiles[b][threadIdx.x] = r < t ? a.delta[i] : 0.0f;
        start_tiles[b][threadIdx.x] = r < t ? document_start(at.starts, r) : 0;
      }
    };
    fetch(q_start);
    cp_async_commit();
    for (int q0 = q_start; q0 < q_end; q0 += kTile) {
      next_tile(q0, q_end, fetch);
      // This warp's keys are all past T: the dQ kernel reads their dS rows as zeros.
      if (at.first >= t) continue;
      // The causal diagonal tile: a query before one of this warp's 16 keys.
      const bool diagonal = a.causal && q0 < at.first + 16;
      const int* start_s = start_tiles[(q0 / kTile) & 1];
      auto visible = [&](int i, int col) {
        return key_on[i] && !(diagonal && q0 + col < key[i]) && key[i] >= start_s[col];
      };
      const T* qs = q_tiles[(q0 / kTile) & 1];
      const T* dos = do_tiles[(q0 / kTile) & 1];
      const float* lse_s = lse_tiles[(q0 / kTile) & 1];
      const float* delta_s = delta_tiles[(q0 / kTile) & 1];
      float p[8][4] = {}, dp[8][4] = {};
      mma_rows_t<T>(ka, qs, t - q0, lane, p);    // S^T: keys x queries
      mma_rows_t<T>(va, dos, t - q0, lane, dp);  // dP'^T = V dO^T
      // Queries past T have lse +inf and delta 0 (and S, dP 0): their P and dS are exactly 0, so
      // the workspace's padding columns hold zeros.
      if constexpr (kDropout) {
        float pd[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            int col = nt * 8 + 2 * c + (e & 1), query = q0 + col;
            float pe = visible(e >> 1, col) ? exp2f(p[nt][e] * a.scale_log2 - lse_s[col]) : 0.0f;
            float de = dp[nt][e];
            pd[nt][e] = pe;
            if (pe != 0.0f) {
              pd[nt][e] = dropped(a, stream, bh, query, key[e >> 1], pe);
              de = pd[nt][e] != 0.0f ? de * a.keep_scale : 0.0f;
            }
            p[nt][e] = pe * (de - delta_s[col]);  // dS^T
          }
        mma_p_rows<T>(pd, dos, t - q0, lane, dv);
      } else {
        // Without dropout P itself feeds dV, then becomes dS^T in place: no third array.
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            int col = nt * 8 + 2 * c + (e & 1);
            p[nt][e] = visible(e >> 1, col) ? exp2f(p[nt][e] * a.scale_log2 - lse_s[col]) : 0.0f;
          }
        mma_p_rows<T>(p, dos, t - q0, lane, dv);
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) p[nt][e] *= dp[nt][e] - delta_s[nt * 8 + 2 * c + (e & 1)];
      }
      // dS^T rounded once: the same fragments feed dK and, through the workspace, dQ.
      std::uint32_t dsa[4][4];
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) pack_a<T>(p, kk, dsa[kk]);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int j = 0; j < 4; ++j)
          *reinterpret_cast<std::uint32_t*>(ds + (j & 1) * 8 * a.ld_ds + q0 + kk * 16 +
                                            (j >> 1) * 8) = dsa[kk][j];
      mma_a_rows<T>(
          [&](int kk, std::uint32_t f[4]) {
#pragma unroll
            for (int j = 0; j < 4; ++j) f[j] = dsa[kk][j];
          },
          qs, t - q0, lane, dk);
    }
  };

  const T* q = static_cast<const T*>(a.q) + at.base_q;
  const T* dout = static_cast<const T*>(a.dout) + at.base_out;
  T* ds = static_cast<T*>(a.ds) +
          (static_cast<std::int64_t>(at.bh - a.bh_first) * a.ld_ds + key[0]) * a.ld_ds + 2 * c;
  if constexpr (kGrouped) {
    // The group's query heads in order: their q and out columns 64 apart, their rows of lse and
    // delta and their workspace slabs consecutive.
    const std::int64_t slab = static_cast<std::int64_t>(a.ld_ds) * a.ld_ds;
    for (int member = 0; member < group; ++member) {
      // Other warps may still read the previous head's last tiles, in the buffer that this head's
      // first fetch overwrites.
      if (member > 0) __syncthreads();
      over_query_head(at.bh + member, q + member * kDim, dout + member * kDim, ds + member * slab);
    }
  } else {
    over_query_head(at.bh, q, dout, ds);
  }

  // Written once, after the whole group.
  T* dk_out = static_cast<T*>(a.dk) + at.base_kv;
  T* dv_out = static_cast<T*>(a.dv) + at.base_kv;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (key[i] >= t) continue;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      std::int64_t to = static_cast<std::int64_t>(key[i]) * ld + nt * 8 + 2 * c;
      *reinterpret_cast<std::uint32_t*>(dk_out + to) =
          pack<T>(dk[nt][2 * i] * a.scale, dk[nt][2 * i + 1] * a.scale);
      *reinterpret_cast<std::uint32_t*>(dv_out + to) = pack<T>(dv[nt][2 * i], dv[nt][2 * i + 1]);
    }
  }
}

// dQ of 64 queries (16 per warp) = scale dS K, looping over every key tile: a GEMM over the
// workspace's dS^T, whose A fragments ldmatrix transposes out of the shared tile. Six blocks
// fill an H100/H200 SM's 228 KB of shared memory; the bound (80 registers) lets registers too.
template <typename T>
__global__ void __launch_bounds__(kThreads, 6) flash_backward_dq_kernel(FlashArgs a) {
  __shared__ __align__(16) T ds_tiles[2][kTile * kPad];  // dS^T: keys x this block's queries
  __shared__ __align__(16) T k_tiles[2][kTile * kPad];
  const Place at = query_place_of(a);
  const int t = at.t, lane = at.lane, g = at.g, c = at.c, ld = a.ld_qkv;
  const int q_first = static_cast<int>(blockIdx.x) * kTile;
  const T* ds = static_cast<const T*>(a.ds) +
                static_cast<std::int64_t>(at.bh - a.bh_first) * a.ld_ds * a.ld_ds + q_first;
  const T* k = static_cast<const T*>(a.k) + at.base_kv;
  float dq[8][4] = {};

  // Key rows past T are zero-filled, not read: the kv kernel skips warps whose keys are all past
  // T, so the workspace is not written there.
  auto fetch = [&](int k0) {
    const int b = (k0 / kTile) & 1;
    load_tile_async(ds, a.ld_ds, k0, t, ds_tiles[b]);
    load_tile_async(k, ld, k0, t, k_tiles[b]);
  };
  fetch(document_start(at.starts, q_first) / kTile * kTile);
  cp_async_commit();
  // Lane l addresses row l % 8 of 8x8 matrix l / 8: keys +8 for matrices 2, 3 and queries +8
  // for 1, 3, so that .trans hands out the A fragment (queries x keys) in a[0..3] order.
  const int m = lane / 8, r = lane % 8;
  const int a_offset = ((m >> 1) * 8 + r) * kPad + (at.first - q_first) + (m & 1) * 8;
  // Causal: key tiles after this block's queries are wholly above the diagonal (dS = 0, never
  // written by the dK/dV kernel): not visited.
  const int k_end = a.causal ? min(t, q_first + kTile) : t;
  // Packed documents: key tiles before the block's earliest start (dS = 0, not written by the
  // dK/dV kernel) are not visited either.
  const int k_begin = document_start(at.starts, q_first) / kTile * kTile;
  for (int k0 = k_begin; k0 < k_end; k0 += kTile) {
    next_tile(k0, k_end, fetch);
    if (at.first >= t) continue;  // this warp's queries are all past T
    const T* dss = ds_tiles[(k0 / kTile) & 1] + a_offset;
    mma_a_rows<T>([&](int kk, std::uint32_t f[4]) { ldmatrix_x4_trans(f, dss + kk * 16 * kPad); },
                  k_tiles[(k0 / kTile) & 1], t - k0, lane, dq);
  }

  const int row[2] = {at.first + g, at.first + g + 8};
  T* dq_out = static_cast<T*>(a.dq) + at.base_q;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (row[i] >= t) continue;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
      *reinterpret_cast<std::uint32_t*>(dq_out + static_cast<std::int64_t>(row[i]) * ld + nt * 8 +
                                        2 * c) =
          pack<T>(dq[nt][2 * i] * a.scale, dq[nt][2 * i + 1] * a.scale);
  }
}

// q, k, v of the packed (B*T, (H + 2 H_kv) 64) projection; the output and its gradient
// (B*T, H 64).
FlashArgs args_of(const Tensor& qkv, std::int64_t batch, std::int64_t heads, std::int64_t kv_heads,
                  const Tensor& mask, const Tensor& document_starts, bool causal, double p,
                  std::uint64_t key, std::uint64_t stream, const std::uint64_t* stream_source) {
  const std::int64_t e = heads * kDim, ekv = kv_heads * kDim;
  FlashArgs a{};
  a.t = static_cast<int>(qkv.size(0) / batch);
  a.heads = static_cast<int>(heads);
  a.group = static_cast<int>(heads / kv_heads);
  a.ld_qkv = static_cast<int>(e + 2 * ekv);
  a.ld_out = static_cast<int>(e);
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(kDim)));
  a.scale_log2 = static_cast<float>(1.0 / std::sqrt(static_cast<double>(kDim)) / std::log(2.0));
  a.p = p;
  a.keep_scale = static_cast<float>(1.0 / (1.0 - p));
  a.key = key;
  a.stream = stream;
  a.stream_source = stream_source;
  a.mask = mask.defined() ? static_cast<const float*>(mask.data()) : nullptr;
  if (document_starts.defined()) {
    KILN_CHECK(document_starts.dtype() == DType::I32 && document_starts.is_contiguous() &&
                   document_starts.numel() == qkv.size(0) &&
                   document_starts.device() == qkv.device(),
               "flash attention: document starts " + document_starts.str() +
                   " must be contiguous I32 (B, T) on " + qkv.device().str());
    a.starts = static_cast<const std::int32_t*>(document_starts.data());
  }
  a.causal = causal;
  const char* base = static_cast<const char*>(qkv.data());
  const std::size_t size = dtype_size(qkv.dtype());
  a.q = base;
  a.k = base + static_cast<std::size_t>(e) * size;
  a.v = base + static_cast<std::size_t>(e + ekv) * size;
  return a;
}

// Blocks for `count` rows of (batch * head) from a.bh_first on (query heads; key/value heads in
// the dK/dV kernel).
dim3 grid_of(const FlashArgs& a, std::int64_t count) {
  return dim3(static_cast<unsigned>((a.t + kTile - 1) / kTile), static_cast<unsigned>(count));
}

cudaStream_t stream_of(const Tensor& t) {
  return static_cast<cudaStream_t>(current_stream(t.device()));
}

void check_packed(const Tensor& qkv, std::int64_t batch, std::int64_t heads, std::int64_t kv_heads,
                  std::initializer_list<const Tensor*> rows_of_e) {
  KILN_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0,
             "flash attention: heads " + std::to_string(heads) +
                 " must be a positive multiple of kv_heads " + std::to_string(kv_heads));
  KILN_CHECK(
      qkv.dim() == 2 && qkv.is_contiguous() && qkv.size(1) == (heads + 2 * kv_heads) * kDim &&
          batch > 0 && qkv.size(0) % batch == 0,
      "flash attention: expected packed qkv (B*T, (heads + 2*kv_heads)*64), got " + qkv.str());
  for (const Tensor* t : rows_of_e) {
    KILN_CHECK(
        t->is_contiguous() && t->numel() == qkv.size(0) * heads * kDim && t->dtype() == qkv.dtype(),
        "flash attention: expected (B*T, heads*64) " + std::string(dtype_name(qkv.dtype())) +
            ", got " + t->str());
  }
}

}  // namespace

std::int64_t attention_workspace_limit_bytes() {
  const char* text = std::getenv("KILN_ATTENTION_WORKSPACE_MB");
  if (text == nullptr) return std::int64_t{1024} << 20;
  char* end = nullptr;
  const double mb = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(mb > 0) || mb > 1e9) {
    throw InputError("KILN_ATTENTION_WORKSPACE_MB = '" + std::string(text) +
                     "': expected a number of MiB > 0");
  }
  return static_cast<std::int64_t>(mb * 1048576.0);
}

bool flash_attention_supported(DType dtype, std::int64_t batch, std::int64_t heads,
                               std::int64_t kv_heads, std::int64_t head_dim, std::int64_t tokens) {
  // One block row per (batch * query head) in the grid's y dimension, whose limit is 65535.
  return (dtype == DType::F16 || dtype == DType::BF16) && head_dim == kDim && tokens > 0 &&
         tokens < (1 << 20) && batch > 0 && heads > 0 && kv_heads > 0 && heads % kv_heads == 0 &&
         heads <= 65535 / batch;
}

void flash_attention_forward(const Tensor& qkv, std::int64_t batch, std::int64_t heads,
                             std::int64_t kv_heads, const Tensor& mask,
                             const Tensor& document_starts, bool causal, double p,
                             std::uint64_t key, std::uint64_t stream,
                             const std::uint64_t* stream_source, Tensor& out, Tensor& lse) {
  if (qkv.numel() == 0) return;
  check_packed(qkv, batch, heads, kv_heads, {&out});
  KILN_CHECK(aligned16({qkv.data(), out.data()}),
             "flash attention: qkv and out must be 16-byte aligned");
  FlashArgs a = args_of(qkv, batch, heads, kv_heads, mask, document_starts, causal, p, key, stream,
                        stream_source);
  a.out = out.data();
  a.lse = static_cast<float*>(lse.data());
  cudaStream_t s = stream_of(qkv);
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    if (a.p > 0.0) {
      flash_forward_kernel<T, true><<<grid_of(a, batch * heads), kThreads, 0, s>>>(a);
    } else {
      flash_forward_kernel<T, false><<<grid_of(a, batch * heads), kThreads, 0, s>>>(a);
    }
    KILN_CUDA_LAUNCH_CHECK();
  };
  if (qkv.dtype() == DType::F16) {
    launch(__half());
  } else {
    launch(__nv_bfloat16());
  }
}

void flash_attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& dout,
                              const Tensor& lse, const Tensor& mask, const Tensor& document_starts,
                              std::int64_t batch, std::int64_t heads, std::int64_t kv_heads,
                              bool causal, double p, std::uint64_t key, std::uint64_t stream,
                              const std::uint64_t* stream_source, Tensor& dqkv) {
  if (qkv.numel() == 0) return;
  check_packed(qkv, batch, heads, kv_heads, {&out, &dout});
  KILN_CHECK(dqkv.is_contiguous() && dqkv.shape() == qkv.shape() && dqkv.dtype() == qkv.dtype(),
             "flash attention: dqkv " + dqkv.str() + " must be shaped like qkv " + qkv.str());
  KILN_CHECK(aligned16({qkv.data(), out.data(), dout.data(), dqkv.data()}),
             "flash attention: operands must be 16-byte aligned");
  FlashArgs a = args_of(qkv, batch, heads, kv_heads, mask, document_starts, causal, p, key, stream,
                        stream_source);
  const std::int64_t rows = qkv.size(0) * heads;  // (token row, query head) pairs
  Tensor delta = Tensor::empty({rows}, DType::F32, qkv.device());
  // dq, dk, dv start where q, k, v do in the packed rows.
  const char* base = static_cast<const char*>(qkv.data());
  a.dout = dout.data();
  a.dq = dqkv.data();
  a.dk = static_cast<char*>(dqkv.data()) + (static_cast<const char*>(a.k) - base);
  a.dv = static_cast<char*>(dqkv.data()) + (static_cast<const char*>(a.v) - base);
  a.lse = static_cast<float*>(const_cast<void*>(lse.data()));
  a.delta = static_cast<float*>(delta.data());
  // dS^T for the dQ kernel, whole 64 x 64 tiles of it in bounds; as many (batch * key/value head)
  // rows at a time, each with its group of query heads, as the workspace limit holds, so long
  // sequences cost time, not memory (one group at least).
  a.ld_ds = (a.t + kTile - 1) / kTile * kTile;
  const std::int64_t group = heads / kv_heads, kv_total = batch * kv_heads;
  const std::int64_t per_bh = static_cast<std::int64_t>(a.ld_ds) * a.ld_ds;
  const std::int64_t chunk = std::clamp<std::int64_t>(
      attention_workspace_limit_bytes() /
          (per_bh * group * static_cast<std::int64_t>(dtype_size(qkv.dtype()))),
      1, kv_total);
  Tensor ds = Tensor::empty({chunk * group * per_bh}, qkv.dtype(), qkv.device());
  a.ds = ds.data();
  cudaStream_t s = stream_of(qkv);
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    flash_delta_kernel<T><<<static_cast<unsigned>((rows * 8 + 255) / 256), 256, 0, s>>>(
        static_cast<const T*>(out.data()), static_cast<const T*>(dout.data()), rows, a.t, a.heads,
        a.ld_out, a.delta);
    KILN_CUDA_LAUNCH_CHECK();
    for (std::int64_t first = 0; first < kv_total; first += chunk) {
      const std::int64_t count = std::min(chunk, kv_total - first);
      a.bh_first = static_cast<int>(first * group);  // the chunk's first query head row
      const dim3 kv_grid = grid_of(a, count), q_grid = grid_of(a, count * group);
      void (*kv_kernel)(FlashArgs) = flash_backward_kv_kernel<T, false, false>;
      if (a.p > 0.0) {
        kv_kernel = group > 1 ? flash_backward_kv_kernel<T, true, true>
                              : flash_backward_kv_kernel<T, true, false>;
      } else if (group > 1) {
        kv_kernel = flash_backward_kv_kernel<T, false, true>;
      }
      kv_kernel<<<kv_grid, kThreads, 0, s>>>(a);
      KILN_CUDA_LAUNCH_CHECK();
      flash_backward_dq_kernel<T><<<q_grid, kThreads, 0, s>>>(a);
      KILN_CUDA_LAUNCH_CHECK();
    }
  };
  if (qkv.dtype() == DType::F16) {
    launch(__half());
  } else {
    launch(__nv_bfloat16());
  }
}

}  // namespace kiln::cuda
