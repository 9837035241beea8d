"""The CUDA layer: checked driver calls, the device, kernels and their launches."""
