"""Text in and out through a checkpoint's tokenizer.json (the `tokenizers` package)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def load_tokenizer(path: str | Path) -> Any:
    """A `tokenizers.Tokenizer` from tokenizer.json; ImportError explains the extra to install."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ImportError("text in and out needs the `tokenizers` package: "
                          "pip install 'rawgraph[hf]'") from None
    return Tokenizer.from_file(str(path))
