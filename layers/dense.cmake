# Dense layers (linear and its LoRA adapter, activations, dropout, reshape, softmax cross-entropy)
# and the MLP.
list(APPEND KILN_LAYERS_SOURCES linear.cc lora.cc activations.cc dropout.cc reshape.cc
     softmax_cross_entropy.cc models/mlp.cc)
list(APPEND KILN_LAYERS_CUDA_SOURCES cuda/linear.cu cuda/activations.cu cuda/dropout.cu
     cuda/softmax_cross_entropy.cu)
