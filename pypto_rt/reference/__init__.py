"""The reference executor: eager, program-order execution on the op library (the semantic oracle)."""
