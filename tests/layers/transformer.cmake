# Transformer family: LayerNorm, Embedding, attention, blocks, BERT and ViT.
kiln_add_test(test_layers_transformer SOURCES test_transformer.cc LABELS cpu DEPS kiln_layers
              TIMEOUT 600)
if(KILN_WITH_CUDA)
  kiln_add_test(test_layers_transformer_gpu SOURCES test_transformer_gpu.cc LABELS gpu
                DEPS kiln_layers)
endif()
# The llama family: RMSNorm, rotary positions, grouped-query attention, SwiGLU, tiny models.
kiln_add_test(test_layers_llama SOURCES test_llama.cc LABELS cpu DEPS kiln_layers TIMEOUT 300)
