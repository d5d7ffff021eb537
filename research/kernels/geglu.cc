// GEGLU's element-wise part as two fused CPU kernels, for research/fused_geglu.py:
//   RoutingGeglu(a, b) -> h = gelu(a) * b                       (one pass: reads a, b; writes h)
//   RoutingGegluGrad(a, b, dh) -> (da, db) = (dh b gelu'(a), dh gelu(a))   (one pass)
// gelu is T2T's tanh approximation (common_layers.gelu), tanh is Eigen's (as TF's Tanh op).
// float32 only; a, b, dh of one shape, any rank. Work is split over TF's intra-op threads in
// blocks of kBlock elements; each block's temporaries live on the stack.
#include <algorithm>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"

namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::int64;
using Block = Eigen::Array<float, Eigen::Dynamic, 1, 0, 2048, 1>;
using In = Eigen::Map<const Eigen::ArrayXf>;
using Out = Eigen::Map<Eigen::ArrayXf>;

constexpr float kC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kK = 0.044715f;
constexpr int64 kBlock = 2048;

template <typename Fn>
void ForBlocks(OpKernelContext* ctx, int64 n, int64 cost, Fn fn) {
  auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  tensorflow::Shard(workers->num_threads, workers->workers, (n + kBlock - 1) / kBlock,
                    cost * kBlock, [&](int64 first, int64 last) {
                      for (int64 i = first; i < last; ++i) {
                        int64 start = i * kBlock, m = std::min(kBlock, n - start);
                        fn(start, m);
                      }
                    });
}

class GegluOp : public OpKernel {
 public:
  explicit GegluOp(OpKernelConstruction* c) : OpKernel(c) {}
  void Compute(OpKernelContext* ctx) override {
    const Tensor& a = ctx->input(0);
    const Tensor& b = ctx->input(1);
    OP_REQUIRES(ctx, a.shape() == b.shape(),
                tensorflow::errors::InvalidArgument("a and b differ in shape"));
    Tensor* h = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, a.shape(), &h));
    const float* pa = a.flat<float>().data();
    const float* pb = b.flat<float>().data();
    float* ph = h->flat<float>().data();
    ForBlocks(ctx, a.NumElements(), 40, [&](int64 s, int64 m) {
      In x(pa + s, m), y(pb + s, m);
      Block cdf = 0.5f * (1.0f + (kC * (x + kK * x.cube())).tanh());
      Out(ph + s, m) = x * cdf * y;
    });
  }
};

class GegluGradOp : public OpKernel {
 public:
  explicit GegluGradOp(OpKernelConstruction* c) : OpKernel(c) {}
  void Compute(OpKernelContext* ctx) override {
    const Tensor& a = ctx->input(0);
    const Tensor& b = ctx->input(1);
    const Tensor& dh = ctx->input(2);
    OP_REQUIRES(ctx, a.shape() == b.shape() && a.shape() == dh.shape(),
                tensorflow::errors::InvalidArgument("a, b and dh differ in shape"));
    Tensor *da = nullptr, *db = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, a.shape(), &da));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, a.shape(), &db));
    const float* pa = a.flat<float>().data();
    const float* pb = b.flat<float>().data();
    const float* pd = dh.flat<float>().data();
    float *pda = da->flat<float>().data(), *pdb = db->flat<float>().data();
    ForBlocks(ctx, a.NumElements(), 60, [&](int64 s, int64 m) {
      In x(pa + s, m), y(pb + s, m), d(pd + s, m);
      Block t = (kC * (x + kK * x.cube())).tanh();
      Block gelu = 0.5f * x * (1.0f + t);
      Out(pdb + s, m) = d * gelu;
      Block slope = 0.5f * x * (1.0f - t.square()) * kC * (1.0f + 3.0f * kK * x.square());
      Out(pda + s, m) = d * y * (0.5f * (1.0f + t) + slope);  // gelu'(a) = cdf + a cdf'
    });
  }
};

}  // namespace

REGISTER_OP("RoutingGeglu")
    .Input("a: float")
    .Input("b: float")
    .Output("h: float")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(0));
      return tensorflow::OkStatus();
    });

REGISTER_OP("RoutingGegluGrad")
    .Input("a: float")
    .Input("b: float")
    .Input("dh: float")
    .Output("da: float")
    .Output("db: float")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      for (int i = 0; i < 2; ++i) c->set_output(i, c->input(0));
      return tensorflow::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("RoutingGeglu").Device(tensorflow::DEVICE_CPU), GegluOp);
REGISTER_KERNEL_BUILDER(Name("RoutingGegluGrad").Device(tensorflow::DEVICE_CPU), GegluGradOp);
