"""`troupe router` and `troupe serve --data-parallel-size N`.

`troupe router --backend-urls URL...` routes over replicas started elsewhere (other machines,
other ports). `troupe serve --data-parallel-size N` starts N `troupe serve` replicas on this
machine, each on a free port of 127.0.0.1 and, on CUDA, its own GPU (CUDA_VISIBLE_DEVICES=i, as
vLLM and SGLang place data-parallel ranks), waits until each serves, then runs the router on
--host/--port in front of them. SIGINT/SIGTERM stop the router, then every replica (each
drains); a replica that exits on its own is reported and the router keeps serving on the rest.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import types
import typing

import structlog
from troupe.config import ConfigError
from troupe.gateway.router_settings import RouterSettings
from troupe.gateway.serve_process import serving_url, stop_serving

log = structlog.get_logger("troupe.router")

_HELP = {
    "backend_urls": "the replicas: http(s)://host:port of each `troupe serve`",
    "cache_threshold": "prefix matched / prompt length at which a request follows its prefix",
    "balance_abs_threshold": "in-flight difference (max - min) above which load decides",
    "balance_rel_threshold": "... and max > this x min",
    "max_tree_chars": "prompt characters remembered per replica (LRU beyond)",
    "health_check_interval_s": "seconds between /health checks of each replica",
    "connect_timeout_s": "seconds to connect to a replica",
    "lora_replay_timeout_s": "seconds for each run-time LoRA load replayed to a replica coming up",
    "max_body_bytes": "request bodies above this get 413",
    "api_key": "required of /v1/router/stats (the replicas check their own routes)",
}


def add_router_arguments(parser: argparse.ArgumentParser, *, with_backends: bool) -> None:
    """One flag per RouterSettings field (`--backend-urls` only for `troupe router`)."""
    hints = typing.get_type_hints(RouterSettings)
    group = parser.add_argument_group("router")
    for f in dataclasses.fields(RouterSettings):
        if f.name == "backend_urls" and not with_backends:
            continue
        flag, help_text = "--" + f.name.replace("_", "-"), f"{_HELP[f.name]} (default: {f.default})"
        if f.name == "backend_urls":
            group.add_argument(flag, nargs="+", required=True, metavar="URL", help=help_text)
        else:
            hint = hints[f.name]
            if typing.get_origin(hint) in (typing.Union, types.UnionType):
                hint = next(a for a in typing.get_args(hint) if a is not type(None))
            group.add_argument(flag, type=hint, default=f.default, help=help_text)


def router_settings_from_args(ns: argparse.Namespace, backend_urls: list[str]) -> RouterSettings:
    names = [f.name for f in dataclasses.fields(RouterSettings) if f.name != "backend_urls"]
    values = {name: getattr(ns, name) for name in names}
    return RouterSettings(backend_urls=tuple(backend_urls), **values)


def run_router(ns: argparse.Namespace, settings: RouterSettings) -> int:
    """Route until SIGINT/SIGTERM (`ns`: --host, --port, --shutdown-grace); 0 after a stop."""
    from troupe.gateway.router_app import serve_router

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve_router(
            settings, host=ns.host, port=ns.port, stop=stop, shutdown_grace=ns.shutdown_grace
        )

    asyncio.run(main())
    return 0


class ReplicaProcess:
    """One `python -m troupe serve` replica on a free port, its JSON log forwarded to stderr."""

    def __init__(self, index: int, serve_args: list[str], env: dict[str, str]) -> None:
        self.index = index
        command = [sys.executable, "-m", "troupe", *serve_args]  # serve_args start with "serve"
        command += ["--host", "127.0.0.1", "--port", "0", "--log-format", "json"]
        self.is_stopping = False
        # Its own session: a Ctrl-C to the terminal reaches the router alone, which then
        # stops each replica once (a second signal would cut a replica's drain short).
        self._proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )

    def wait_url(self) -> str:
        """The replica's URL from its `serving` log line (blocking)."""
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            sys.stderr.write(f"[replica {self.index}] {line}")
            if (url := serving_url(line)) is not None:
                threading.Thread(target=self._forward, daemon=True).start()
                return url
        raise RuntimeError(f"replica {self.index} exited ({self._proc.wait()}) before serving")

    def _forward(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            sys.stderr.write(f"[replica {self.index}] {line}")
        status = self._proc.wait()
        if not self.is_stopping:
            log.warning("replica exited", index=self.index, status=status)

    def stop(self, timeout: float) -> int | None:
        """SIGTERM (it drains), then its exit status; None if it had to be killed."""
        self.is_stopping = True
        return stop_serving(self._proc, timeout)


def _die_with_parent() -> None:
    """In the replica, before exec: SIGTERM when the router's process dies (Linux), so a
    killed router leaves no replica behind."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def replica_args(argv: list[str]) -> list[str]:
    """`troupe serve` flags for a replica: the user's, less where to listen and the DP size."""
    dropped = {"--host", "--port", "--data-parallel-size", "--log-format"}
    out: list[str] = []
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in dropped:
            skip = "=" not in arg and i + 1 < len(argv)
            continue
        out.append(arg)
    return out


def run_data_parallel(ns: argparse.Namespace, argv: list[str], *, use_cuda: bool) -> int:
    """Start `ns.data_parallel_size` replicas, route over them, stop them all at the end."""
    args = replica_args(argv)
    replicas: list[ReplicaProcess] = []
    try:
        for i in range(ns.data_parallel_size):
            env = dict(os.environ)
            if use_cuda:
                env["CUDA_VISIBLE_DEVICES"] = _visible_device(i)
            replicas.append(ReplicaProcess(i, args, env))
        urls = [r.wait_url() for r in replicas]
        settings = RouterSettings(
            backend_urls=tuple(urls), max_body_bytes=ns.max_body_bytes, api_key=ns.api_key
        )
        return run_router(ns, settings)
    except (RuntimeError, ConfigError) as exc:
        print(f"troupe serve: {exc}", file=sys.stderr)
        return 1
    finally:
        for r in replicas:
            r.stop(ns.shutdown_grace + 10)


def _visible_device(i: int) -> str:
    """The i-th of the devices this process may use (CUDA_VISIBLE_DEVICES, else all)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not visible:
        return str(i)
    devices = visible.split(",")
    if i >= len(devices):
        raise RuntimeError(f"--data-parallel-size wants GPU #{i}; visible: {visible}")
    return devices[i]
