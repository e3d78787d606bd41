# Convolutional family: conv2d, batchnorm, pooling, relu, and the fashion_cnn / resnet models.
list(APPEND KILN_LAYERS_SOURCES conv2d.cc batchnorm.cc pooling.cc relu.cc models/fashion_cnn.cc
     models/resnet.cc)
list(APPEND KILN_LAYERS_CUDA_SOURCES cuda/conv2d.cc cuda/conv2d_graph.cc cuda/conv2d.cu cuda/batchnorm.cu
     cuda/pooling.cu cuda/relu.cu)
