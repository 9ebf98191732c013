"""asv benchmarks for nbjit: dispatch overhead of nbjit.jit against jax.jit."""
