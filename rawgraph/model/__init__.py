"""The decoder of LLaMA, Qwen2, Qwen3 and Mistral (one family table): configuration,
checkpoints, the model on the GPU, and a NumPy reference."""

from rawgraph.model import reference
from rawgraph.model.checkpoint import Checkpoint, load, save
from rawgraph.model.config import PRESETS, ModelConfig, preset
from rawgraph.model.decoder import Model
from rawgraph.model.family import FAMILIES, Family
from rawgraph.model.inputs import DeviceStateError
from rawgraph.model.safetensors import CheckpointError
from rawgraph.model.step import PrefillPiece, Shape
from rawgraph.model.tokenizer import Tokenizer
from rawgraph.model.weights import random_weights

__all__ = [
           "FAMILIES",
           "PRESETS",
           "Checkpoint",
           "CheckpointError",
           "DeviceStateError",
           "Family",
           "Model",
           "ModelConfig",
           "PrefillPiece",
           "Shape",
           "Tokenizer",
           "load",
           "preset",
           "random_weights",
           "reference",
           "save",
]
