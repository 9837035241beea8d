"""Text for the server: chat templates rendered as transformers renders them, and generated
text released as it becomes final (whole characters, nothing that may turn out to begin a stop
string).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from rawgraph.model.checkpoint import json_object
from rawgraph.model.safetensors import CheckpointError


def _raise(message: str) -> None:
    raise ValueError(message)


def _template(cfg: dict | None, path: Path) -> str | None:
    """The `chat_template` of a JSON object: a string, or the list of named templates
    ("default" taken); None if it has none."""
    src = (cfg or {}).get("chat_template")
    if isinstance(src, list):  # [{"name": ..., "template": ...}]
        named = {t.get("name"): t.get("template") for t in src if isinstance(t, dict)}
        src = named.get("default")
    if src is not None and not isinstance(src, str):
        raise CheckpointError(f"{path}: chat_template must be a string")
    return src


class ChatTemplate:
    """A checkpoint's chat template (`from_dir`: where transformers writes it) rendered with
    Jinja2 in a sandbox, with the environment transformers gives it: trim_blocks,
    lstrip_blocks, loop controls, `tojson`, `raise_exception`, `strftime_now`, `bos_token`
    and `eos_token`."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = ""):
        try:
            from jinja2 import TemplateError
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError as e:  # an optional dependency
            raise ImportError("chat templates need jinja2: pip install 'rawgraph[serve]'") \
                from e
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = lambda x, indent=None, **kw: json.dumps(
            x, ensure_ascii=False, indent=indent, sort_keys=kw.get("sort_keys", False))
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except TemplateError as e:
            raise CheckpointError(f"chat_template does not compile: {e}") from None
        self._errors = TemplateError
        self.bos_token, self.eos_token = bos_token, eos_token

    @classmethod
    def from_dir(cls, root: Path) -> ChatTemplate | None:
        """The chat template of the checkpoint in `root` (None: it has none), where
        transformers puts it: `chat_template.jinja` (since 4.52), else tokenizer_config.json's
        `chat_template`, else `chat_template.json`'s (a processor's); the bos and eos tokens
        from tokenizer_config.json. CheckpointError naming a file that is not what it
        should be."""
        root = Path(root)
        cfg = json_object(root / "tokenizer_config.json")
        jinja = root / "chat_template.jinja"
        if jinja.is_file():
            try:
                src = jinja.read_text()
            except (OSError, UnicodeDecodeError) as e:
                raise CheckpointError(f"{jinja}: not readable text ({e})") from None
        else:
            src = _template(cfg, root / "tokenizer_config.json")
            if src is None:
                src = _template(json_object(root / "chat_template.json"),
                                root / "chat_template.json")
        if src is None:
            return None

        def token(name: str) -> str:
            v = (cfg or {}).get(name) or ""
            return v.get("content", "") if isinstance(v, dict) else str(v)

        return cls(src, token("bos_token"), token("eos_token"))

    def render(self, messages: list[dict[str, str]]) -> str:
        """The prompt text for `messages`, ending where the assistant's answer begins;
        ValueError with the template's own message when it refuses them."""
        try:
            return self._template.render(messages=messages, add_generation_prompt=True,
                                         bos_token=self.bos_token, eos_token=self.eos_token,
                                         tools=None)
        except self._errors as e:
            raise ValueError(f"the chat template failed: {e}") from None


class TextStream:
    """Generated token ids in, text out as it becomes final, and held back while it ends in an
    incomplete character or could still be the start of a stop string. A stop string ends the
    text before it (`stopped`).

    Decoding is incremental, as vLLM's detokenizer does it: each push decodes a window from a
    few tokens before the new ones (the context a tokenizer's spacing and a character spread
    over several byte tokens need) and appends what the new ids add, so a token costs the
    same at the 4,000th as at the first; decoding all ids every time would make a stream's
    text quadratic in its length."""

    def __init__(self, decode: Callable[[list[int]], str], stop: list[str]):
        self.decode, self.stop = decode, stop
        self.ids: list[int] = []
        self.text = ""   # the text decoded so far, without a trailing incomplete character
        self.sent = 0    # characters released
        self.stopped = False
        self._hold = max((len(s) for s in stop), default=1) - 1
        self._start = 0  # ids[_start:_done] decode to the end of `text` (the window's context)
        self._done = 0   # ids up to here are in `text`
        self._partial = 0  # characters of ids[_done:] already in `text` (before a partial one)

    def push(self, ids: list[int]) -> str:
        """Add tokens; the text that is now final (possibly "")."""
        if self.stopped:
            return ""
        self.ids += ids
        self._decode(final=False)
        start = max(0, self.sent - self._hold)
        hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
        if hits:
            self.stopped = True
            return self._release(min(hits))
        return self._release(len(self.text) - self._hold)

    def finish(self) -> str:
        """The rest, once no more tokens come (a trailing incomplete character included)."""
        if self.stopped:
            return ""
        self._decode(final=True)
        return self._release(len(self.text))

    def _decode(self, final: bool) -> None:
        """Append the text of ids[_done:], decoded after their context ids[_start:_done];
        unless `final`, not while it ends in an incomplete character (U+FFFD)."""
        if self._done == len(self.ids):
            return
        before = self.decode(self.ids[self._start:self._done])
        new = self.decode(self.ids[self._start:])[len(before):]
        if not final and new.endswith("\ufffd"):  # the characters before it are whole
            whole = new.rstrip("\ufffd")
            self.text += whole[self._partial:]
            self._partial = max(self._partial, len(whole))
            return
        if new:
            self.text += new[self._partial:]
            self._partial = 0
            self._start, self._done = self._done, len(self.ids)

    def _release(self, end: int) -> str:
        if end <= self.sent:
            return ""
        out, self.sent = self.text[self.sent:end], end
        return out
