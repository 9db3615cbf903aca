"""How troupe starts its child processes: from a fork server that has imported torch once.

The engine process of `troupe serve`, tensor- and pipeline-parallel workers, prefill/decode
workers and the grammar process all used to be spawned: a fresh interpreter each, importing
torch and the engine's modules again (~3 s of a 2-core machine's time per child). Python's
fork server is one such interpreter, started at the first child and kept while this process
lives; it has imported what `PRELOAD` names, and each later child is a fork of it (~20 ms).

Forking it is as safe as spawning: it is a fresh interpreter started by exec, single-threaded,
and nothing it imports touches CUDA (no troupe module calls into torch.cuda at import time), so
a child initializes CUDA as a spawned one does. What differs: a child inherits the fork
server's environment variables and standard streams from when the server started, not this
process's at the child's start (its working directory, sys.path and `__main__` are this
process's then, as a spawned child's are).
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.context import ForkServerContext

# What the children import (~3.5 s of the 2-core machine's time, ~1 s of it troupe's own):
# torch, the engine process's modules and the runner's. Nothing here imports Triton or
# transformers (a CPU engine never does; the grammar child adds xgrammar, which only it needs)
# or touches CUDA.
PRELOAD = (
    "torch",
    "troupe.gateway.engine_process",
    "troupe.actors.graph",
    "troupe.gpu.runner_setup",
    "troupe.gpu.model_runner",
)


def child_context() -> ForkServerContext:
    """The multiprocessing context every troupe child process is started from."""
    context = multiprocessing.get_context("forkserver")
    assert isinstance(context, ForkServerContext)
    context.set_forkserver_preload(list(PRELOAD))
    return context
