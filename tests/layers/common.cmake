# Across families: activation recomputation of every model kind, bit for bit, on the CPU.
kiln_add_test(test_layers_recompute SOURCES test_recompute.cc LABELS cpu DEPS kiln_layers
              TIMEOUT 300)
