# Convolutional family: conv2d, batchnorm, pooling, relu, and the fashion_cnn / resnet models.
list(APPEND KILN_LAYERS_SOURCES conv2d.cc conv_bn_chain.cc batchnorm.cc pooling.cc relu.cc models/fashion_cnn.cc
     models/resnet.cc)
list(APPEND KILN_LAYERS_CUDA_SOURCES cuda/conv2d.cc cuda/conv2d_graph.cc cuda/conv2d.cu cuda/conv_bn_fusion.cc
     cuda/conv_bn_fusion.cu cuda/batchnorm.cu
     cuda/pooling.cu cuda/relu.cu)
# The fused convolution + batch-norm patterns are built through the cuDNN frontend (header-only,
# vendored in third_party/); -isystem keeps its headers out of our warnings.
set_source_files_properties(cuda/conv_bn_fusion.cc PROPERTIES COMPILE_OPTIONS
  "-isystem;${PROJECT_SOURCE_DIR}/third_party/cudnn_frontend/include")
