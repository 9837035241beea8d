"""The LLaMA-architecture decoder: configuration, checkpoints, and a NumPy reference."""
