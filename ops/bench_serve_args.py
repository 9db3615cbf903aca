"""`troupe bench serve`'s flags (vLLM's names), and the ramp-up they ask for.

Flags this parser does not know are `troupe serve` flags: bench_serve.py passes them on.
"""

from __future__ import annotations

import argparse
import math

from troupe.ops.serve_workload import RampUp

DESCRIPTION = (
    "Serving benchmark: latency and throughput of streamed requests, as `vllm bench serve` "
    "measures."
)


# vLLM's sampling flags beyond --temperature, each sent as the OpenAI field of its name
SAMPLING_FLAGS: tuple[tuple[str, type], ...] = (
    ("--top-p", float),
    ("--top-k", int),
    ("--min-p", float),
    ("--repetition-penalty", float),
    ("--frequency-penalty", float),
    ("--presence-penalty", float),
)


def sampling_fields(args: argparse.Namespace) -> dict[str, float]:
    """The sampling flags given, by field name (`top_p`, ...): what each request carries."""
    fields = (flag[2:].replace("-", "_") for flag, _ in SAMPLING_FLAGS)
    return {name: getattr(args, name) for name in fields if getattr(args, name) is not None}


def build_parser() -> argparse.ArgumentParser:
    # No abbreviations: `--model` must reach the server, not be read as `--model-name`.
    p = argparse.ArgumentParser(
        prog="troupe bench serve",
        description=DESCRIPTION,
        epilog="Other flags go to `troupe serve` (or, with --engine, to the engine): "
        "--model, --device, --max-num-seqs, ... (`troupe serve --help`).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        allow_abbrev=False,
    )
    where = p.add_argument_group("target")
    where.add_argument("--base-url", default=None, help="a running server (else one is started)")
    where.add_argument("--engine", action="store_true", help="Engine.generate in this process")
    where.add_argument("--model-name", default=None, help="'model' sent (default: /v1/models)")
    where.add_argument("--api-key", default=None, help="Bearer key (given to a started server)")
    where.add_argument("--serve-arg", action="append", default=[], help="a `troupe serve` flag")
    where.add_argument("--server-timeout", type=float, default=900.0, help="s to wait for /health")
    where.add_argument(
        "--server-pid",
        type=int,
        default=None,
        help="--base-url's `troupe serve` process: report its CPU time (and its engine child's)",
    )
    where.add_argument(
        "--poll-engine-stats",
        type=float,
        default=None,
        metavar="S",
        help="GET /v1/engine/stats every S s during the run, as the page's live view does",
    )
    load = p.add_argument_group("workload")
    load.add_argument("--dataset-name", choices=["random", "sharegpt-synth"], default="random")
    load.add_argument("--input-len", "--random-input-len", type=int, default=1024)
    load.add_argument("--output-len", "--random-output-len", type=int, default=128)
    load.add_argument("--range-ratio", "--random-range-ratio", type=float, default=0.0)
    for flag in ("--min-input-len", "--max-input-len", "--min-output-len", "--max-output-len"):
        load.add_argument(flag, type=int, default=None, help="explicit uniform bound")
    load.add_argument("--num-prompts", type=int, default=1000)
    load.add_argument(
        "--structured-output-ratio", type=float, default=0.0,
        help="share of requests asking for JSON by a schema of their own (vLLM's name)",
    )  # fmt: skip
    load.add_argument("--request-rate", type=float, default=float("inf"), help="req/s; inf: all")
    load.add_argument("--burstiness", type=float, default=1.0, help="gamma shape; 1: Poisson")
    load.add_argument(
        "--ramp-up-strategy",
        choices=["linear", "exponential"],
        default=None,
        help="rates from --ramp-up-start-rps to --ramp-up-end-rps over the run (no --request-rate)",
    )
    load.add_argument("--ramp-up-start-rps", type=float, default=None, help="the first rate")
    load.add_argument("--ramp-up-end-rps", type=float, default=None, help="the last rate")
    load.add_argument("--max-concurrency", type=int, default=None, help="requests in flight")
    load.add_argument("--seed", type=int, default=0, help="draws lengths, prompts, arrivals")
    load.add_argument("--temperature", type=float, default=0.0)
    for flag, kind in SAMPLING_FLAGS:
        load.add_argument(flag, type=kind, default=None, help="sent only when given (vLLM's)")
    load.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True)
    load.add_argument("--num-warmups", type=int, default=1, help="uncounted requests first")
    load.add_argument(
        "--warm-connections",
        type=int,
        default=None,
        metavar="N",
        help="kept-alive connections opened before the clock starts (default: a burst's size "
        "with --request-rate inf, else 0; 0: vLLM's client, which opens them while timed)",
    )
    out = p.add_argument_group("report")
    out.add_argument("--goodput", nargs="+", default=[], metavar="KEY:MS", help="ttft:200 tpot:20")
    out.add_argument("--metric-percentiles", default="50,90,99")
    out.add_argument("--result-file", default=None, help="write the JSON result here")
    out.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    out.add_argument(
        "--sse-read",
        choices=["events", "lines"],
        default="events",
        help="read the stream by socket reads cut into events (vLLM's client), or by lines",
    )
    return p


def ramp_up(args: argparse.Namespace) -> RampUp | None:
    """The ramp-up the flags ask for (vLLM's rules: both rates, and no --request-rate)."""
    rates = (args.ramp_up_start_rps, args.ramp_up_end_rps)
    if args.ramp_up_strategy is None:
        if rates != (None, None):
            raise ValueError("--ramp-up-start-rps / --ramp-up-end-rps need --ramp-up-strategy")
        return None
    if None in rates:
        raise ValueError("--ramp-up-strategy needs --ramp-up-start-rps and --ramp-up-end-rps")
    if not math.isinf(args.request_rate):
        raise ValueError("--ramp-up-strategy sets the rates: it takes no --request-rate")
    return RampUp(args.ramp_up_strategy, *rates)
