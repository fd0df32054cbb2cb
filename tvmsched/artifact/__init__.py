"""The artifact: its format (manifest, weights, kernels) and its signing."""
