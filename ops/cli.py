"""The `troupe` command: serve, run-batch, generate, bench, replay.

Every EngineConfig field is a flag in kebab-case (`--max-num-seqs 128`), generated from the
dataclass so the two never drift apart.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types
import typing
from typing import TYPE_CHECKING, Any

from troupe.config import ConfigError, EngineConfig, field_choices

if TYPE_CHECKING:
    from troupe.messages.sampling import SamplingParams
    from troupe.messages.sampling_defaults import SamplingDefaults


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per EngineConfig field, typed from its annotation."""
    hints, choices = typing.get_type_hints(EngineConfig), field_choices()
    group = parser.add_argument_group("engine")
    for f in dataclasses.fields(EngineConfig):
        flag = "--" + f.name.replace("_", "-")
        hint = hints[f.name]
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        default = f.default
        if hint is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=default)
        elif f.name == "lora_modules":  # repeated: `--lora-modules a=/x '{"name": "b", ...}'`
            group.add_argument(
                flag, nargs="*", type=_lora_module, default=default, metavar="NAME=PATH"
            )
        elif typing.get_origin(hint) is tuple:  # repeated values
            group.add_argument(flag, nargs="*", type=str, default=default, metavar="VALUE")
        elif typing.get_origin(hint) is dict:  # JSON: `--override-generation-config '{...}'`
            group.add_argument(flag, type=_json_object, default=default, metavar="JSON")
        elif f.name in choices:
            allowed = [name for name in choices[f.name] if name is not None]
            group.add_argument(flag, choices=allowed, default=default)
        else:
            group.add_argument(flag, type=hint, default=default, metavar=f.name.upper())


_LORA_MODULE_KEYS = {"name", "path", "base_model_name"}


def _lora_module(text: str) -> str:
    """One --lora-modules value as EngineConfig takes it ("name=path"), from either of vLLM's
    forms: `name=path`, or a JSON object {"name", "path", "base_model_name"?}. An adapter here
    always runs on the served model, so base_model_name (vLLM's /v1/models `parent`) is read
    and not used: the parent is the served model's id."""
    if not text.lstrip().startswith("{"):
        return text  # name=path, checked with the rest of EngineConfig
    module = _json_object(text)
    if unknown := sorted(module.keys() - _LORA_MODULE_KEYS):
        raise argparse.ArgumentTypeError(
            f"unknown field {unknown[0]!r} (fields: name, path, base_model_name)"
        )
    name, path = module.get("name"), module.get("path")
    if not isinstance(name, str) or not isinstance(path, str):
        raise argparse.ArgumentTypeError(f"needs 'name' and 'path' strings, got {text!r:.200}")
    return f"{name}={path}"


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def config_from_args(ns: argparse.Namespace) -> EngineConfig:
    values = {f.name: getattr(ns, f.name) for f in dataclasses.fields(EngineConfig)}
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    return EngineConfig(**values)


# `generate`'s max_tokens where neither --max-tokens nor the model's max_new_tokens sets one
DEFAULT_MAX_TOKENS = 64
# `generate`'s flags that the model's generation_config.json may default (SamplingDefaults)
_SAMPLING_FLAGS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def sampling_params_from_args(
    ns: argparse.Namespace, defaults: SamplingDefaults, max_model_len: int
) -> SamplingParams:
    """`generate`'s SamplingParams as the server builds a request's: the flags given win, the
    model's defaults (Engine.sampling_defaults) fill those left out (argparse's None), then
    SamplingParams' own; max_tokens: the flag, the model's max_new_tokens (never past
    max_model_len), else DEFAULT_MAX_TOKENS."""
    from troupe import SamplingParams

    given = {name: getattr(ns, name) for name in _SAMPLING_FLAGS if getattr(ns, name) is not None}
    if ns.sampling_seed is not None:
        given["seed"] = ns.sampling_seed
    if ns.lora is not None:
        given["lora"] = ns.lora
    if ns.max_tokens is not None:
        max_tokens = ns.max_tokens
    elif defaults.max_tokens is not None:
        max_tokens = defaults.max_tokens_within(max_model_len)
    else:
        max_tokens = DEFAULT_MAX_TOKENS
    return SamplingParams(max_tokens=max_tokens, **defaults.fill(given))


def _cmd_generate(ns: argparse.Namespace, config: EngineConfig) -> int:
    import anyio
    from troupe import Engine
    from troupe.messages import Delta, Finished

    prompt: Any = [{"role": "user", "content": ns.prompt}] if ns.chat else ns.prompt

    async def run() -> int:
        async with Engine.open(config) as engine:
            params = sampling_params_from_args(ns, engine.sampling_defaults, engine.max_model_len)
            async for event in engine.generate(prompt, params):
                sys.stdout.write(event.text)
                sys.stdout.flush()
                if isinstance(event, Delta):
                    continue
                sys.stdout.write("\n")
                if isinstance(event, Finished):
                    t = event.timings
                    print(
                        f"[{event.finish_reason}] {event.usage.completion_tokens} tokens, "
                        f"ttft {1000 * (t.ttft or 0):.1f} ms, tpot {1000 * (t.tpot or 0):.1f} ms",
                        file=sys.stderr,
                    )
                    return 0
                print(f"[{event.finish_reason}] {getattr(event, 'message', '')}", file=sys.stderr)
                return 1
        return 1

    return anyio.run(run)


def _cmd_replay(ns: argparse.Namespace) -> int:
    from troupe.messages.trace import TraceError
    from troupe.ops.replay import replay_trace

    try:
        report = replay_trace(ns.trace)
    except TraceError as exc:
        print(f"troupe replay: {exc}", file=sys.stderr)
        return 2
    if report.divergence is not None:
        print(report.divergence.describe())
        return 1
    print(
        f"replay ok: {report.num_records} records, {report.num_checked} messages matched "
        f"({', '.join(report.actors)})"
    )
    return 0


BENCHMARKS = ("graph", "scheduler", "offline", "soak", "serve")


def _cmd_bench(workload: str, argv: list[str]) -> int:
    """Each benchmark parses its own flags (`troupe bench offline --help`)."""
    import importlib

    module = importlib.import_module(f"troupe.ops.bench_{workload}")
    result: int = module.main(argv)
    return result


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="troupe", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="serve the OpenAI-compatible HTTP + websocket API")
    add_config_arguments(serve)
    try:
        from troupe.gateway.server import add_serve_arguments

        add_serve_arguments(serve)
    except ImportError:
        pass

    serve.add_argument(
        "--data-parallel-size",
        type=int,
        default=1,
        help="replicas of the engine on this machine (one GPU each on CUDA) behind a "
        "prefix-cache-aware router on --host/--port (default 1: no router)",
    )
    router = sub.add_parser(
        "router",
        help="spread OpenAI requests over `troupe serve` replicas (prefix-cache-aware)",
    )
    router.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    router.add_argument("--port", type=int, default=8000, help="port to bind (default 8000)")
    router.add_argument("--shutdown-grace", type=float, default=30.0, help="drain seconds")
    from troupe.gateway.router_launch import add_router_arguments

    add_router_arguments(router, with_backends=True)

    batch = sub.add_parser(
        "run-batch",
        help="answer an OpenAI Batch API file (.jsonl) offline, as vLLM's run_batch",
        description="Answer an OpenAI Batch API file with an in-process engine: each line as "
        "its endpoint answers it over HTTP, written in input order.",
    )
    add_config_arguments(batch)
    from troupe.ops.run_batch import add_run_batch_arguments

    add_run_batch_arguments(batch)

    gen = sub.add_parser("generate", help="stream one completion to stdout")
    gen.add_argument("prompt")
    gen.add_argument("--chat", action="store_true", help="send the prompt as a user chat message")
    sampling = gen.add_argument_group(
        "sampling", "unset: the model's generation_config.json value, else SamplingParams' own"
    )
    sampling.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help=f"default: the model's max_new_tokens, else {DEFAULT_MAX_TOKENS}",
    )
    for name in _SAMPLING_FLAGS:
        kind = int if name == "top_k" else float
        sampling.add_argument("--" + name.replace("_", "-"), type=kind, default=None)
    sampling.add_argument("--sampling-seed", type=int, default=None)
    sampling.add_argument(
        "--lora",
        default=None,
        metavar="NAME",
        help="run on this LoRA adapter, one of --lora-modules (as a request's model over HTTP)",
    )
    add_config_arguments(gen)

    bench = sub.add_parser(
        "bench",
        help="benchmarks: graph overhead, scheduler, offline throughput, soak (leak check), "
        "serve (online latency, as `vllm bench serve`)",
        description="Run one benchmark; flags after its name are its own (`offline --help`).",
    )
    bench.add_argument("workload", choices=BENCHMARKS)

    rep = sub.add_parser("replay", help="re-drive a recorded trace and check every message")
    rep.add_argument("trace")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) >= 2 and args[0] == "bench" and args[1] in BENCHMARKS:
        return _cmd_bench(args[1], args[2:])  # the rest are the benchmark's own flags
    parser = build_parser()
    ns = parser.parse_args(args)
    if ns.command == "replay":
        return _cmd_replay(ns)
    if ns.command == "router":
        return _cmd_router(ns)
    try:
        config = config_from_args(ns)
    except ConfigError as exc:
        parser.error(str(exc))
    from troupe.logs import configure_logging

    configure_logging(config.log_format, config.log_level)
    if ns.command == "generate":
        if ns.lora is not None and ns.lora not in config.lora_adapters:
            served = ", ".join(config.lora_adapters) or "none: give --lora-modules NAME=PATH"
            parser.error(f"--lora: no adapter named {ns.lora!r}; adapters: {served}")
        return _cmd_generate(ns, config)
    if ns.command == "run-batch":
        from troupe.ops.run_batch import run_batch_command

        return run_batch_command(ns, config)
    if ns.data_parallel_size != 1:
        return _cmd_data_parallel(ns, args, config)
    from troupe.gateway.server import run_serve

    return run_serve(ns, config)


def _cmd_router(ns: argparse.Namespace) -> int:
    from troupe.gateway.router_launch import router_settings_from_args, run_router
    from troupe.logs import configure_logging

    configure_logging("console", "info")
    try:
        settings = router_settings_from_args(ns, ns.backend_urls)
    except ConfigError as exc:
        print(f"troupe router: {exc}", file=sys.stderr)
        return 2
    return run_router(ns, settings)


def _cmd_data_parallel(ns: argparse.Namespace, argv: list[str], config: EngineConfig) -> int:
    """`troupe serve --data-parallel-size N`: N replicas and a router in front."""
    from troupe.gateway.router_launch import run_data_parallel

    if ns.data_parallel_size < 1:
        print(f"troupe serve: --data-parallel-size must be >= 1, got {ns.data_parallel_size}",
              file=sys.stderr)  # fmt: skip
        return 2
    use_cuda = config.device == "cuda"
    if config.device == "auto" and config.runner != "fake":
        import torch

        use_cuda = torch.cuda.is_available()
    return run_data_parallel(ns, argv, use_cuda=use_cuda)


if __name__ == "__main__":
    sys.exit(main())
