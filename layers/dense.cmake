# Dense layers (linear, its LoRA adapter and FP8 projections, activations, dropout, reshape,
# softmax cross-entropy) and the MLP.
list(APPEND KILN_LAYERS_SOURCES linear.cc lora.cc fp8_projection.cc activations.cc dropout.cc
     reshape.cc softmax_cross_entropy.cc models/mlp.cc)
list(APPEND KILN_LAYERS_CUDA_SOURCES cuda/linear.cu cuda/fp8_projection.cu cuda/activations.cu
     cuda/dropout.cu cuda/softmax_cross_entropy.cu)
