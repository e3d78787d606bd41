# Transformer family: layernorm, embedding, attention, transformer blocks, BERT and ViT.
list(APPEND KILN_LAYERS_SOURCES layernorm.cc embedding.cc attention.cc transformer_block.cc
     models/bert.cc models/vit.cc)
list(APPEND KILN_LAYERS_CUDA_SOURCES cuda/layernorm.cu cuda/embedding.cu cuda/attention.cu
     cuda/flash_attention.cu)
