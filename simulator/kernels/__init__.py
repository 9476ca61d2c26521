"""The kernels compute ops name: one record per kernel (numeric function, payload rule, cost, profile axes), the
prefill kernels, measured kernel profiles, payload shapes, the dense reference."""
