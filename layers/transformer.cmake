# Transformer family: layernorm and rmsnorm, embedding, attention (multi-head and grouped-query,
# rotary positions), transformer blocks, the SwiGLU MLP, BERT, ViT, GPT-2 and the llama family.
list(APPEND KILN_LAYERS_SOURCES layernorm.cc embedding.cc attention.cc transformer_block.cc
     tied_decoder.cc rotary.cc grouped_query_attention.cc swiglu_mlp.cc models/bert.cc
     models/vit.cc models/gpt2.cc models/llama.cc)
list(APPEND KILN_LAYERS_CUDA_SOURCES cuda/layernorm.cu cuda/embedding.cu cuda/attention.cu
     cuda/flash_attention.cu cuda/cudnn_attention.cc cuda/rotary.cu cuda/swiglu.cu)
# cuDNN's attention is built through the cuDNN frontend (header-only, vendored in third_party/);
# -isystem keeps its headers out of our warnings.
set_source_files_properties(cuda/cudnn_attention.cc PROPERTIES COMPILE_OPTIONS
  "-isystem;${PROJECT_SOURCE_DIR}/third_party/cudnn_frontend/include")
