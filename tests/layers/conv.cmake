# Convolutional layers and models: gradient checks and model shapes on the CPU; CUDA against the
# CPU on a GPU.
kiln_add_test(test_layers_conv SOURCES test_conv.cc LABELS cpu DEPS kiln_layers TIMEOUT 300)
if(KILN_WITH_CUDA)
  kiln_add_test(test_layers_conv_gpu SOURCES test_conv_gpu.cc LABELS gpu DEPS kiln_layers
                TIMEOUT 900)
endif()
