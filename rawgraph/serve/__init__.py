"""Online serving: an OpenAI-compatible HTTP server over the engine (`rawgraph serve`).

`Worker` owns the engine on its own thread (`rawgraph.serve.process.EngineProcess`: the same,
in a child process, which other HTTP processes reach through an `EngineLink` each);
`rawgraph.serve.app.create_app` is the ASGI app (Starlette) that relays requests to it;
`protocol` checks OpenAI's request bodies and writes its responses. The app needs the `serve`
extra (starlette, uvicorn, jinja2); what is imported here does not."""

from rawgraph.serve.metrics import Metrics
from rawgraph.serve.protocol import APIError, Generation, parse
from rawgraph.serve.text import ChatTemplate, TextStream
from rawgraph.serve.worker import Job, Worker

__all__ = ["APIError", "ChatTemplate", "Generation", "Job", "Metrics", "TextStream", "Worker",
           "parse"]
