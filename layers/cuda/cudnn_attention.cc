// cuDNN's fused attention (scaled dot-product attention through the cuDNN frontend's graph API)
// for the unmasked, dropout-free case: ViT's attention in training and every attention in eval,
// and GPT-2's causal attention (cuDNN's diagonal band: top-left aligned, right bound 0, so query
// i sees keys j <= i; its kernels skip the tiles above the diagonal).
// On Hopper it runs cuDNN's tuned flash kernels, several times faster than Kiln's own mma.sync
// kernels (layers/cuda/flash_attention.cu), which keep the masked and dropout cases: cuDNN's
// dropout draws another mask than Dropout's, and its padding mask takes lengths, not a (B, T)
// key mask. Backward asks for cuDNN's deterministic algorithm (dQ from a dP workspace, no
// atomics), so a step is bitwise repeatable and a resumed run stays bit for bit.
// One graph pair (forward, backward) per shape, causal flag and device is built and kept; a shape
// cuDNN declines (old library, other GPU) is remembered and served by the flash kernels.

#include <cudnn_frontend.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>

#include "core/cuda/cudnn_handle.h"
#include "core/device.h"
#include "core/tensor.h"
#include "layers/cuda/attention_cuda.h"

namespace kiln::cuda {
namespace {

namespace fe = cudnn_frontend;
using TensorRef = std::shared_ptr<fe::graph::Tensor_attributes>;

struct AttentionGraphs {
  bool supported = false;
  std::string reason;  // why not, when not
  std::shared_ptr<fe::graph::Graph> forward, backward;
  TensorRef q, k, v, o, stats;                        // forward
  TensorRef bq, bk, bv, bo, bdo, bstats, dq, dk, dv;  // backward
  std::int64_t forward_workspace = 0, backward_workspace = 0;
  // Backward runs over chunks of this many sequences: the deterministic algorithm's dP workspace
  // grows with B*H*T*T, and chunks keep it under the attention workspace limit.
  std::int64_t backward_batch = 0;
};

// device, dtype, B, H, H_kv, T, d, causal, the workspace limit (it sets the backward's chunks)
using Key = std::tuple<int, int, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                       std::int64_t, bool, std::int64_t>;

// Grouped-query attention when hkv < h: query head i reads key/value head i / (h / hkv).
struct Shape {
  std::int64_t b, h, hkv, t, d;
  bool causal;
  std::int64_t width() const { return (h + 2 * hkv) * d; }
  std::vector<std::int64_t> dims() const { return {b, h, t, d}; }
  std::vector<std::int64_t> kv_dims() const { return {b, hkv, t, d}; }
  // Packed (B*T, (H + 2 H_kv) d) rows [q | k | v]: head i of token s at s*width + i*d.
  std::vector<std::int64_t> packed() const { return {t * width(), d, width(), 1}; }
  // Token-major (B*T, H d) rows.
  std::vector<std::int64_t> rows() const { return {t * h * d, d, h * d, 1}; }
  std::vector<std::int64_t> stats_dims() const { return {b, h, t, 1}; }
  std::vector<std::int64_t> stats_strides() const { return {h * t, t, 1, 1}; }
};

std::shared_ptr<fe::graph::Graph> new_graph(fe::DataType_t io) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(io)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

TensorRef input(fe::graph::Graph& g, const char* name, const std::vector<std::int64_t>& dims,
                const std::vector<std::int64_t>& strides) {
  return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_dim(dims).set_stride(strides));
}

// Validates, lowers and plans a graph; false and the frontend's message when cuDNN declines.
bool finish(fe::graph::Graph& g, cudnnHandle_t handle, std::int64_t& workspace,
            std::string& reason) {
  auto failed = [&](const char* stage, fe::error_t status) {
    if (status.is_good()) return false;
    reason = std::string(stage) + ": " + status.get_message();
    return true;
  };
  if (failed("validate", g.validate()) ||
      failed("build_operation_graph", g.build_operation_graph(handle)) ||
      failed("create_execution_plans", g.create_execution_plans({fe::HeurMode_t::A})) ||
      failed("check_support", g.check_support(handle)) ||
      failed("build_plans", g.build_plans(handle, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE)) ||
      failed("get_workspace_size", g.get_workspace_size(workspace))) {
    return false;
  }
  return true;
}

// The backward graph of shape `s` (its b: sequences per chunk); false and a.reason when cuDNN
// declines.
bool build_backward(AttentionGraphs& a, const Shape& s, fe::DataType_t io, float scale,
                    cudnnHandle_t handle) {
  auto& g = *(a.backward = new_graph(io));
  a.bq = input(g, "q", s.dims(), s.packed());
  a.bk = input(g, "k", s.kv_dims(), s.packed());
  a.bv = input(g, "v", s.kv_dims(), s.packed());
  a.bo = input(g, "o", s.dims(), s.rows());
  a.bdo = input(g, "do", s.dims(), s.rows());
  a.bstats = input(g, "stats", s.stats_dims(), s.stats_strides());
  a.bstats->set_data_type(fe::DataType_t::FLOAT);
  fe::graph::SDPA_backward_attributes backward_options;
  backward_options.set_name("attention_backward")
      .set_attn_scale(scale)
      .set_deterministic_algorithm(true);
  if (s.causal)
    backward_options.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
        .set_diagonal_band_right_bound(0);
  auto [dq, dk, dv] = g.sdpa_backward(a.bq, a.bk, a.bv, a.bo, a.bdo, a.bstats, backward_options);
  dq->set_output(true).set_dim(s.dims()).set_stride(s.packed());
  for (const TensorRef& d : {dk, dv})
    d->set_output(true).set_dim(s.kv_dims()).set_stride(s.packed());
  a.dq = dq;
  a.dk = dk;
  a.dv = dv;
  return finish(g, handle, a.backward_workspace, a.reason);
}

void build(AttentionGraphs& a, const Shape& s, fe::DataType_t io, cudnnHandle_t handle) {
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.d)));
  auto& f = *(a.forward = new_graph(io));
  a.q = input(f, "q", s.dims(), s.packed());
  a.k = input(f, "k", s.kv_dims(), s.packed());
  a.v = input(f, "v", s.kv_dims(), s.packed());
  fe::graph::SDPA_attributes forward_options;
  forward_options.set_name("attention").set_generate_stats(true).set_attn_scale(scale);
  // Causal: the band of keys j <= i + 0 below a top-left aligned diagonal (set_causal_mask's
  // meaning, which this frontend marks for deprecation).
  if (s.causal)
    forward_options.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
        .set_diagonal_band_right_bound(0);
  auto [o, stats] = f.sdpa(a.q, a.k, a.v, forward_options);
  o->set_output(true).set_dim(s.dims()).set_stride(s.rows());
  stats->set_output(true).set_data_type(fe::DataType_t::FLOAT);
  stats->set_dim(s.stats_dims()).set_stride(s.stats_strides());
  a.o = o;
  a.stats = stats;
  if (!finish(f, handle, a.forward_workspace, a.reason)) return;

  // The backward graph for the whole batch, or for the largest halving of it whose workspace
  // fits under the limit.
  for (std::int64_t chunk = s.b; chunk >= 1; chunk = chunk % 2 == 0 ? chunk / 2 : 0) {
    Shape c = s;
    c.b = chunk;
    if (!build_backward(a, c, io, scale, handle)) return;
    if (a.backward_workspace <= attention_workspace_limit_bytes()) {
      a.backward_batch = chunk;
      a.supported = true;
      return;
    }
  }
  a.reason = "its backward workspace of " + std::to_string(a.backward_workspace >> 20) +
             " MiB is above the attention workspace limit (KILN_ATTENTION_WORKSPACE_MB) even for "
             "the smallest chunk of the batch";
}

// KILN_ATTENTION_CUDNN=0 keeps every attention on Kiln's flash kernels (read at each call, so a
// test can compare the two in one process).
bool enabled() {
  const char* v = std::getenv("KILN_ATTENTION_CUDNN");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

std::mutex cache_mutex;
std::map<Key, AttentionGraphs> cache;

// The graphs of this shape on the current device, built on first use.
AttentionGraphs& graphs_for(const Tensor& qkv, std::int64_t batch, std::int64_t heads,
                            std::int64_t kv_heads, bool causal) {
  const Shape s{batch, heads, kv_heads, qkv.size(0) / batch, qkv.size(1) / (heads + 2 * kv_heads),
                causal};
  const Key key{qkv.device().index, static_cast<int>(qkv.dtype()),    s.b, s.h, s.hkv, s.t, s.d,
                s.causal,           attention_workspace_limit_bytes()};
  std::lock_guard<std::mutex> lock(cache_mutex);
  auto found = cache.find(key);
  if (found != cache.end()) return found->second;
  AttentionGraphs& a = cache[key];
  const fe::DataType_t io =
      qkv.dtype() == DType::F16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16;
  try {
    build(a, s, io, cudnn_handle());
  } catch (const std::exception& e) {
    a.supported = false;
    a.reason = e.what();
  }
  if (!a.supported) {
    std::fprintf(stderr,
                 "kiln: cuDNN fused attention declines B=%lld H=%lld H_kv=%lld T=%lld d=%lld%s "
                 "(%s); using Kiln's own attention\n",
                 static_cast<long long>(s.b), static_cast<long long>(s.h),
                 static_cast<long long>(s.hkv), static_cast<long long>(s.t),
                 static_cast<long long>(s.d), s.causal ? " causal" : "", a.reason.c_str());
  }
  return a;
}

void execute(const fe::graph::Graph& g, std::unordered_map<TensorRef, void*>& pack,
             std::int64_t workspace_bytes, Device device, const char* what) {
  Tensor workspace;
  if (workspace_bytes > 0) workspace = Tensor::empty({workspace_bytes}, DType::U8, device);
  fe::error_t status =
      g.execute(cudnn_handle(), pack, workspace.defined() ? workspace.data() : nullptr);
  KILN_CHECK(status.is_good(),
             std::string("cuDNN fused attention ") + what + " failed: " + status.get_message());
}

// The address of column `index` of row 0 of a row-major tensor (q, k or v within packed rows).
void* column(const Tensor& t, std::int64_t index) {
  return const_cast<char*>(static_cast<const char*>(t.data())) +
         index * static_cast<std::int64_t>(dtype_size(t.dtype()));
}

}  // namespace

bool cudnn_attention_forward(const Tensor& qkv, std::int64_t batch, std::int64_t heads,
                             std::int64_t kv_heads, bool causal, Tensor& out, Tensor& lse) {
  if (!enabled() || qkv.numel() == 0 || qkv.size(1) % (heads + 2 * kv_heads) != 0) return false;
  const std::int64_t d = qkv.size(1) / (heads + 2 * kv_heads);
  if (d % 8 != 0 || d > 128) return false;
  AttentionGraphs& a = graphs_for(qkv, batch, heads, kv_heads, causal);
  if (!a.supported) return false;
  const std::int64_t e = heads * d, ekv = kv_heads * d;
  std::unordered_map<TensorRef, void*> pack{{a.q, column(qkv, 0)},
                                            {a.k, column(qkv, e)},
                                            {a.v, column(qkv, e + ekv)},
                                            {a.o, column(out, 0)},
                                            {a.stats, column(lse, 0)}};
  execute(*a.forward, pack, a.forward_workspace, qkv.device(), "forward");
  return true;
}

void cudnn_attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& dout,
                              const Tensor& lse, std::int64_t batch, std::int64_t heads,
                              std::int64_t kv_heads, bool causal, Tensor& dqkv) {
  AttentionGraphs& a = graphs_for(qkv, batch, heads, kv_heads, causal);
  KILN_CHECK(a.supported, "cuDNN fused attention backward without its forward: " + a.reason);
  const std::int64_t d = qkv.size(1) / (heads + 2 * kv_heads);
  const std::int64_t e = heads * d, ekv = kv_heads * d, t = qkv.size(0) / batch;
  auto at = [](const Tensor& x, std::int64_t elements) {
    return static_cast<char*>(const_cast<void*>(x.data())) +
           elements * static_cast<std::int64_t>(dtype_size(x.dtype()));
  };
  // Chunk c's sequences start at row c*chunk*T of qkv, out, dout, dqkv and at c*chunk*H*T of lse.
  for (std::int64_t first = 0; first < batch; first += a.backward_batch) {
    const std::int64_t rows = first * t;
    std::unordered_map<TensorRef, void*> pack{{a.bq, at(qkv, rows * qkv.size(1))},
                                              {a.bk, at(qkv, rows * qkv.size(1) + e)},
                                              {a.bv, at(qkv, rows * qkv.size(1) + e + ekv)},
                                              {a.bo, at(out, rows * out.size(1))},
                                              {a.bdo, at(dout, rows * dout.size(1))},
                                              {a.bstats, at(lse, first * heads * t)},
                                              {a.dq, at(dqkv, rows * dqkv.size(1))},
                                              {a.dk, at(dqkv, rows * dqkv.size(1) + e)},
                                              {a.dv, at(dqkv, rows * dqkv.size(1) + e + ekv)}};
    execute(*a.backward, pack, a.backward_workspace, qkv.device(), "backward");
  }
}

}  // namespace kiln::cuda
