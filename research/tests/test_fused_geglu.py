"""research/fused_geglu.py: its compiled GEGLU kernels against TF's ops, values and gradients."""
import numpy as np
import pytest
import tensorflow as tf

from conftest import research_module
from routing_transformer.core import layers


@pytest.fixture(scope="module")
def fused(tmp_path_factory):
  module = research_module("fused_geglu")
  path = module.build_kernel(str(tmp_path_factory.mktemp("kernels")))
  return module, module.load_kernel(path)


@pytest.mark.parametrize("shape", [(1024, 2048), (3, 1000), (2, 5, 7), (1,)])
def test_fused_geglu_matches_tf_ops_values_and_gradients(fused, shape):
  """Shapes across the kernel's 2,048-element blocks: several whole blocks, a partial last block
  (3,000 elements), rank 3, one element."""
  module, kernels = fused
  errors = module.exactness(kernels, shape=shape, seed=sum(shape))
  assert set(errors) == {"h", "da", "db"}
  assert max(errors.values()) < module.TOLERANCE, errors


def test_fused_geglu_gradient_through_a_product_is_tfs(fused):
  """The registered gradient inside a larger graph: d/d(a, b, w) of sum((gelu(a) b) w)^2."""
  _, kernels = fused
  rng = np.random.default_rng(3)
  a, b = (tf.constant(rng.normal(0, 2, (40, 24)).astype(np.float32)) for _ in range(2))
  w = tf.constant(rng.normal(0, 1, (24, 8)).astype(np.float32))
  grads = []
  for hidden in (layers.geglu_hidden, kernels.routing_geglu):
    with tf.GradientTape() as tape:
      tape.watch([a, b, w])
      loss = tf.reduce_sum(tf.matmul(hidden(a, b), w) ** 2)
    grads.append([g.numpy() for g in tape.gradient(loss, [a, b, w])])
  for reference, got in zip(*grads):
    np.testing.assert_allclose(got, reference, rtol=1e-4, atol=1e-4 * np.abs(reference).max())


def test_fused_geglu_refuses_inputs_of_different_shapes(fused):
  _, kernels = fused
  with pytest.raises(tf.errors.InvalidArgumentError, match="differ in shape"):
    kernels.routing_geglu(tf.zeros([4, 3]), tf.zeros([3, 4]))
  with pytest.raises(tf.errors.InvalidArgumentError, match="differ in shape"):
    kernels.routing_geglu_grad(tf.zeros([4, 3]), tf.zeros([4, 3]), tf.zeros([12]))


def test_fused_geglu_without_a_compiler_names_the_fix(tmp_path):
  module = research_module("fused_geglu")
  with pytest.raises(RuntimeError, match="install g\\+\\+"):
    module.build_kernel(str(tmp_path), compiler="no-such-compiler-here")


def test_fused_geglu_compile_failure_shows_the_compiler_output(tmp_path, monkeypatch):
  module = research_module("fused_geglu")
  broken = tmp_path / "broken.cc"
  broken.write_text("this is not C++;\n")
  monkeypatch.setattr(module, "SOURCE", str(broken))
  with pytest.raises(RuntimeError, match="compiling .*broken.cc failed(.|\n)*error"):
    module.build_kernel(str(tmp_path / "out"))
