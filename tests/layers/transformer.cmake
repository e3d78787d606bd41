# Transformer family: LayerNorm, Embedding, attention, blocks, BERT and ViT.
kiln_add_test(test_layers_transformer SOURCES test_transformer.cc LABELS cpu DEPS kiln_layers
              TIMEOUT 600)
if(KILN_WITH_CUDA)
  kiln_add_test(test_layers_transformer_gpu SOURCES test_transformer_gpu.cc LABELS gpu
                DEPS kiln_layers)
endif()
# The llama family: RMSNorm, rotary positions, grouped-query attention, SwiGLU, tiny models.
kiln_add_test(test_layers_llama SOURCES test_llama.cc LABELS cpu DEPS kiln_layers TIMEOUT 300)
# Packed documents (document masks, per-document rotary positions) on the CPU.
kiln_add_test(test_layers_packed_documents SOURCES test_packed_documents.cc LABELS cpu
              DEPS kiln_layers TIMEOUT 300)
if(KILN_WITH_CUDA)
  kiln_add_test(test_layers_packed_documents_gpu SOURCES test_packed_documents_gpu.cc LABELS gpu
                DEPS kiln_layers)
endif()
