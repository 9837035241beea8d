"""Text in and out through a checkpoint's tokenizer.json (the `tokenizers` package, the
`hf` extra)."""

from __future__ import annotations

from pathlib import Path

from rawgraph.model.safetensors import CheckpointError


class Tokenizer:
    """encode(text) -> ids and decode(ids) -> text with a Hugging Face tokenizer.json."""

    def __init__(self, path: str | Path):
        try:
            from tokenizers import Tokenizer as HFTokenizer
        except ImportError as e:  # an optional dependency
            raise ImportError("text in and out needs the `tokenizers` package: "
                              "pip install 'rawgraph[hf]'") from e
        path = Path(path)
        if not path.is_file():
            raise CheckpointError(f"{path}: no tokenizer file" if not path.exists()
                                  else f"{path}: not a file")
        try:
            self._tok = HFTokenizer.from_file(str(path))
        except Exception as e:  # the tokenizers package raises a bare Exception
            raise CheckpointError(f"{path}: not a tokenizer.json the tokenizers package "
                                  f"reads ({e})") from None
        self.path = path

    def encode(self, text: str, special: bool = True) -> list[int]:
        """Token ids of `text`; `special`: with the tokenizer's special tokens, such as BOS
        (a rendered chat template has its own)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self._tok.encode(text, add_special_tokens=special).ids

    def decode(self, ids: list[int]) -> str:
        """Text of token ids, special tokens dropped."""
        return self._tok.decode(ids, skip_special_tokens=True)

    def piece(self, token: int) -> str:
        """One token's own text, special tokens kept (what log-probabilities name it)."""
        return self._tok.decode([token], skip_special_tokens=False)
