#include "layers/relu.h"

#include "core/cpu/element.h"
#include "core/ops.h"
#include "layers/conv2d.h"
#include "layers/cuda/relu_cuda.h"

namespace kiln {

Tensor dense_memory(const Tensor& x, bool* channels_last) {
  *channels_last = is_channels_last(x);
  return *channels_last ? to_physical(x, true) : x.contiguous();
}

namespace relu_cpu {

void forward(const Tensor& x, Tensor& y) {
  KILN_DISPATCH_FLOATING(x.dtype(), T, {
    const T* px = static_cast<const T*>(x.data());
    T* py = static_cast<T*>(y.data());
    for (std::int64_t i = 0, n = x.numel(); i < n; ++i) {
      py[i] = cpu::load(px[i]) > 0 ? px[i] : cpu::store<T>(0.0);
    }
  });
}

void backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  KILN_DISPATCH_FLOATING(dy.dtype(), T, {
    const T* py = static_cast<const T*>(y.data());
    const T* pd = static_cast<const T*>(dy.data());
    T* pdx = static_cast<T*>(dx.data());
    for (std::int64_t i = 0, n = dy.numel(); i < n; ++i) {
      pdx[i] = cpu::load(py[i]) > 0 ? pd[i] : cpu::store<T>(0.0);
    }
  });
}

}  // namespace relu_cpu

Tensor ReLU::forward_impl(Context& ctx, const Tensor& x) {
  (void)ctx;
  bool cl = false;
  Tensor xd = dense_memory(x, &cl);
  Tensor yd = inplace_ ? xd : Tensor::empty(xd.shape(), xd.dtype(), xd.device());
  Tensor rd;
  if (residual_.defined()) {
    KILN_CHECK(residual_.shape() == x.shape(), "ReLU " + name() + ": residual " +
                                                   shape_str(residual_.shape()) + " for input " +
                                                   shape_str(x.shape()));
    rd = to_physical(residual_, cl).to(xd.dtype());
    residual_ = Tensor();
  }
  if (xd.device().is_cuda()) {
    if (rd.defined()) {
      relu_cuda::forward_add(xd, rd, yd);
    } else {
      relu_cuda::forward(xd, yd);
    }
  } else {
    if (rd.defined()) {
      Tensor sum = Tensor::empty(xd.shape(), xd.dtype(), xd.device());
      ops::add(xd, rd, sum);
      xd = sum;
    }
    relu_cpu::forward(xd, yd);
  }
  saved_y_ = yd;
  saved_channels_last_ = cl;
  return cl ? from_physical(yd, true) : yd;
}

Tensor ReLU::backward_impl(Context& ctx, const Tensor& dy) {
  (void)ctx;
  KILN_CHECK(saved_y_.defined(), "ReLU " + name() + ": backward without forward");
  Tensor dyd = saved_channels_last_ ? to_physical(dy, true) : dy.contiguous();
  if (dyd.dtype() != saved_y_.dtype()) dyd = dyd.to(saved_y_.dtype());
  Tensor dx = Tensor::empty(dyd.shape(), dyd.dtype(), dyd.device());
  if (dyd.device().is_cuda()) {
    relu_cuda::backward(saved_y_, dyd, dx);
  } else {
    relu_cpu::backward(saved_y_, dyd, dx);
  }
  return saved_channels_last_ ? from_physical(dx, true) : dx;
}

}  // namespace kiln
