"""The CPU default, side by side: troupe, HF transformers and llama-cpp-python on one GGUF.

    python -m troupe.ops.cpu_bench                      # every system that is installed
    python -m troupe.ops.cpu_bench --systems troupe --troupe-quantization dequantize
    python -m troupe.ops.cpu_bench --json out.json
    python -m troupe.ops.cpu_bench --llama-python /work/llamacpp-venv/bin/python

llama-cpp-python may live in its own virtual environment (`--llama-python`: its interpreter;
it runs this file directly, without troupe). Build it for the machine's instruction set but
without -march=native where the VM refuses some of what the CPU flags list (AMX here):

    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
      -DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON \
      -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON" pip install llama-cpp-python

(GGML_NATIVE=OFF alone builds for baseline x86-64, without AVX: far slower than llama.cpp is.)

Each system runs in its own subprocess (so start time and peak RSS are its own), on the same
token ids (random ids < 10,000, seed 0), greedy, and reports:

    start       seconds from nothing loaded to ready (troupe: Engine.open; HF: from_pretrained
                of the GGUF; llama.cpp: Llama(...))
    ttft_100    seconds to the first token of a 100-token prompt (median of --repeats)
    ttft_1000   the same for 1,000 tokens
    decode      tokens/s of one stream after its first token (64 tokens of a 16-token prompt)
    batch       tokens/s of 16 requests x 64 tokens (16-token prompts), from submit to the last
                token: troupe submits all 16 at once, HF generates them as one batch (equal
                lengths, no padding), llama-cpp-python runs them one at a time (one sequence
                per context)
    peak_rss    MiB (ru_maxrss of the subprocess)

A warm-up request runs first. Prompts differ per repeat (prefix caching would otherwise serve
them), so each TTFT is a full prefill.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

SYSTEMS = ("troupe", "hf", "llama_cpp")


def prompts(length: int, count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed * 1_000_003 + length)
    return [[rng.randint(100, 10_000) for _ in range(length)] for _ in range(count)]


Generate = Callable[[list[int], int], tuple[list[int], list[float]]]
GenerateMany = Callable[[list[list[int]], int], int]  # prompts, max_tokens -> tokens generated
BATCH, BATCH_TOKENS = 16, 64


def measure(
    generate: Generate, repeats: int, start_s: float, many: GenerateMany | None = None
) -> dict[str, Any]:
    """TTFT and decode figures through `generate(ids, max_tokens) -> (token ids, arrival
    times)`, the times taken when each token reached the caller (perf_counter), and the batch
    figure through `many` (one at a time through `generate` when None)."""
    generate(prompts(32, 1, 99)[0], 4)  # warm-up
    out: dict[str, Any] = {"start_s": start_s}
    for length in (100, 1000):
        times = []
        for ids in prompts(length, repeats, 1):
            t0 = time.perf_counter()
            generate(ids, 1)
            times.append(time.perf_counter() - t0)
        out[f"ttft_{length}_s"] = statistics.median(times)
    rates: list[float] = []
    first: list[int] = []
    for ids in prompts(16, repeats, 2):
        tokens, stamps = generate(ids, 65)
        rates.append((len(stamps) - 1) / (stamps[-1] - stamps[0]))
        first = first or tokens
    out["decode_tok_s"] = statistics.median(rates)
    if many is None:

        def many(prompts: list[list[int]], max_tokens: int) -> int:
            return sum(len(generate(ids, max_tokens)[0]) for ids in prompts)

    batch_rates = []
    for seed in range(repeats):
        batch = prompts(16, BATCH, 10 + seed)
        t0 = time.perf_counter()
        count = many(batch, BATCH_TOKENS)
        batch_rates.append(count / (time.perf_counter() - t0))
    out["batch_tok_s"] = statistics.median(batch_rates)
    out["tokens"] = first
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def run_troupe(
    model: str | None,
    quantization: str,
    repeats: int,
    threads: int,
    torch_int4: bool = False,
    kernel_threads: int = 0,
) -> dict[str, Any]:
    import anyio
    import torch
    from troupe import Engine, EngineConfig, SamplingParams
    from troupe.messages.events import Delta, Finished

    torch.set_num_threads(threads)
    # "auto" is the default: leave it out, so the script also runs on commits without the field
    extra: dict[str, Any] = {} if quantization == "auto" else {"quantization": quantization}
    if torch_int4:  # likewise: the native int4 kernel is the default where it builds
        extra["cpu_native_kernels"] = False
    if kernel_threads:  # the native kernels' threads (0, left out: torch's count)
        extra["cpu_kernel_threads"] = kernel_threads
    config = EngineConfig(model=model, device="cpu", **extra)
    result: dict[str, Any] = {}

    async def main() -> None:
        t0 = time.perf_counter()
        async with Engine.open(config) as engine:
            start = time.perf_counter() - t0

            async def gen(ids: list[int], max_tokens: int) -> tuple[list[int], list[float]]:
                params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
                tokens: list[int] = []
                stamps: list[float] = []
                async for event in engine.generate(ids, params):
                    if event.is_terminal and not isinstance(event, Finished):
                        raise RuntimeError(f"request ended with {event!r}")
                    new = list(event.token_ids) if isinstance(event, Delta | Finished) else []
                    tokens += new
                    stamps += [time.perf_counter()] * len(new)
                return tokens, stamps

            def generate(ids: list[int], max_tokens: int) -> tuple[list[int], list[float]]:
                return anyio.from_thread.run(gen, ids, max_tokens)

            async def gen_many(batch: list[list[int]], max_tokens: int) -> int:
                counts: list[int] = []

                async def one(ids: list[int]) -> None:
                    counts.append(len((await gen(ids, max_tokens))[0]))

                async with anyio.create_task_group() as tg:
                    for ids in batch:
                        tg.start_soon(one, ids)
                return sum(counts)

            def many(batch: list[list[int]], max_tokens: int) -> int:
                return anyio.from_thread.run(gen_many, batch, max_tokens)

            result.update(await anyio.to_thread.run_sync(measure, generate, repeats, start, many))

    anyio.run(main)
    return result


def run_hf(model: str, repeats: int, threads: int) -> dict[str, Any]:
    from pathlib import Path

    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    path = Path(model)
    t0 = time.perf_counter()
    hf = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, torch_dtype=torch.float32, attn_implementation="sdpa"
    )
    hf.eval()
    start = time.perf_counter() - t0

    class Stamps:  # a transformers streamer: put() gets the prompt, then each new token
        def __init__(self) -> None:
            self.times: list[float] = []

        def put(self, value: Any) -> None:
            self.times.append(time.perf_counter())

        def end(self) -> None:
            pass

    @torch.inference_mode()
    def generate(ids: list[int], max_tokens: int) -> tuple[list[int], list[float]]:
        input_ids = torch.tensor([ids])
        stamps = Stamps()
        out = hf.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
            streamer=stamps,
        )
        return out[0, len(ids) :].tolist(), stamps.times[1:]

    @torch.inference_mode()
    def many(batch: list[list[int]], max_tokens: int) -> int:
        input_ids = torch.tensor(batch)  # equal lengths: no padding
        out = hf.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
        )
        return int(out[:, input_ids.shape[1] :].numel())

    return measure(generate, repeats, start, many)


def run_llama_cpp(model: str, repeats: int, threads: int) -> dict[str, Any]:
    from llama_cpp import Llama

    t0 = time.perf_counter()
    llm = Llama(model_path=model, n_ctx=2048, n_threads=threads, verbose=False, n_batch=1024)
    start = time.perf_counter() - t0

    def generate(ids: list[int], max_tokens: int) -> tuple[list[int], list[float]]:
        llm.reset()
        out: list[int] = []
        stamps: list[float] = []
        for token in llm.generate(ids, top_k=1, temp=0.0, reset=True):
            out.append(int(token))
            stamps.append(time.perf_counter())
            if len(out) == max_tokens:
                break
        return out, stamps

    return measure(generate, repeats, start)


def child(args: argparse.Namespace) -> None:
    model = args.model
    if args.system == "troupe":
        result = run_troupe(
            model,
            args.troupe_quantization,
            args.repeats,
            args.threads,
            args.troupe_torch_int4,
            args.troupe_kernel_threads,
        )
    elif args.system == "llama_cpp":  # model: a path already (the parent resolved it)
        result = run_llama_cpp(model, args.repeats, args.threads)
    else:
        from troupe.config import resolve_model_path

        result = run_hf(str(resolve_model_path(model)), args.repeats, args.threads)
    print("RESULT " + json.dumps(result), flush=True)


MODULES = {"troupe": "torch", "hf": "transformers", "llama_cpp": "llama_cpp"}


def installed(python: str, system: str) -> bool:
    check = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({MODULES[system]!r}) is None)"
    return subprocess.run([python, "-c", check], check=False).returncode == 0


def child_command(args: argparse.Namespace, system: str) -> list[str]:
    """The child's command line: llama.cpp runs this file under --llama-python (no troupe
    import there), the others `-m troupe.ops.cpu_bench` under this interpreter."""
    common = ["--system", system, "--repeats", str(args.repeats), "--threads", str(args.threads)]
    if system == "llama_cpp":
        from troupe.config import resolve_model_path

        model = str(resolve_model_path(args.model))
        return [args.llama_python, os.path.abspath(__file__), *common, "--model", model]
    cmd = [sys.executable, "-m", "troupe.ops.cpu_bench", *common]
    cmd += ["--troupe-quantization", args.troupe_quantization]
    cmd += ["--troupe-torch-int4"] if args.troupe_torch_int4 else []
    cmd += ["--troupe-kernel-threads", str(args.troupe_kernel_threads)]
    return cmd + (["--model", args.model] if args.model else [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--systems", nargs="*", default=list(SYSTEMS), choices=SYSTEMS)
    parser.add_argument("--model", default=None, help="a .gguf file (default: the default model)")
    parser.add_argument("--troupe-quantization", default="auto")
    parser.add_argument(
        "--troupe-torch-int4", action="store_true", help="troupe with cpu_native_kernels=False"
    )
    parser.add_argument(
        "--troupe-kernel-threads", type=int, default=0,
        help="troupe's cpu_kernel_threads (0: torch's count, --threads)",
    )  # fmt: skip
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument(
        "--llama-python", default=sys.executable, help="the interpreter with llama_cpp installed"
    )
    parser.add_argument("--system", default=None, help=argparse.SUPPRESS)  # the child's side
    args = parser.parse_args()
    if args.system:
        child(args)
        return
    results: dict[str, Any] = {}
    for system in args.systems:
        python = args.llama_python if system == "llama_cpp" else sys.executable
        if not installed(python, system):
            print(f"{system}: not installed for {python}, skipped", flush=True)
            continue
        cmd = child_command(args, system)
        load_before = os.getloadavg()[0]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        load = f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after"
        lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if proc.returncode or not lines:
            print(f"{system}: failed\n{proc.stderr[-2000:]}", flush=True)
            continue
        results[system] = json.loads(lines[-1][len("RESULT ") :])
        results[system]["load"] = load
        print_row(system, results[system])
        print(f"{'':10s} ({load})", flush=True)
    reference = results.get("troupe", {}).get("tokens")
    for system, result in results.items():
        if reference and system != "troupe":
            same = sum(a == b for a, b in zip(reference, result["tokens"], strict=False))
            print(f"{system}: {same}/{len(reference)} greedy tokens equal troupe's")
    if args.json:
        with open(args.json, "w") as file:
            json.dump(results, file, indent=1)


def print_row(system: str, r: dict[str, Any]) -> None:
    print(
        f"{system:10s} start {r['start_s']:6.2f} s | TTFT 100 {r['ttft_100_s'] * 1e3:7.1f} ms | "
        f"TTFT 1000 {r['ttft_1000_s'] * 1e3:7.1f} ms | decode {r['decode_tok_s']:6.1f} tok/s | "
        f"16 x 64 {r['batch_tok_s']:6.1f} tok/s | "
        f"peak RSS {r['peak_rss_mib']:7.0f} MiB",
        flush=True,
    )


if __name__ == "__main__":
    main()
