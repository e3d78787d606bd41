# Dense layers: gradient checks and the SGD smoke test on the CPU; CUDA against the CPU on a GPU.
kiln_add_test(test_layers_dense
  SOURCES test_dense.cc test_dense_loss.cc test_fp8_projection.cc
  LABELS cpu DEPS kiln_layers TIMEOUT 300)
if(KILN_WITH_CUDA)
  kiln_add_test(test_layers_dense_gpu SOURCES test_dense_gpu.cc LABELS gpu DEPS kiln_layers)
  kiln_add_test(test_layers_fp8_projection_gpu SOURCES test_fp8_projection_gpu.cc LABELS gpu
    DEPS kiln_layers)
endif()
