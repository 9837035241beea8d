"""The LLaMA-architecture decoder: configuration, checkpoints, the model on the GPU, and a
NumPy reference."""

from rawgraph.model import reference
from rawgraph.model.checkpoint import Checkpoint, load, save
from rawgraph.model.config import PRESETS, LlamaConfig, preset
from rawgraph.model.decoder import DeviceStateError, Model
from rawgraph.model.safetensors import CheckpointError
from rawgraph.model.step import PrefillPiece
from rawgraph.model.tokenizer import Tokenizer
from rawgraph.model.weights import random_weights

__all__ = ["PRESETS", "Checkpoint", "CheckpointError", "DeviceStateError", "LlamaConfig", "Model",
           "PrefillPiece", "Tokenizer", "load", "preset", "random_weights", "reference", "save"]
