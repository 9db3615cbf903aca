"""Offline throughput on the nano-vllm workload, against the H200's physical floor.

256 sequences (seed 0), prompt and output lengths uniform in [100, 1024], random prompt ids
< 10,000, ignore_eos, temperature 0.6, on the Qwen3-0.6B shape with random bf16 weights.

    python -m troupe.ops.bench_offline                 # through troupe.Engine (the default)
    python -m troupe.ops.bench_offline --mode runner   # ModelRunner with a local loop

Floor: every decode step reads the weights and each sequence's KV once (HBM 4.26e12 B/s),
plus prefill FLOPs at 773e12 FLOP/s (bf16 dense). The fraction reached is floor / measured.
On CUDA it also prints the same floor at the copy and matmul rates measured on the card at
hand (ops/card_rates.py): what a run on another card (an H100) reached of its own floor.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.weights import qwen3_0_6b_config, qwen3_tiny_config, random_weights
from troupe.ops.card_rates import copy_bandwidth, matmul_peak

if TYPE_CHECKING:
    from troupe import EngineConfig
    from troupe.ops.engine_client import Client

HBM_BYTES_PER_S = 4.26e12
BF16_FLOPS = 773e12


def workload(num_seqs: int, seed: int) -> tuple[list[list[int]], list[int]]:
    """(prompt token ids, output lengths): the same draw as ../shared/bench/peer_baseline.py
    (python's `random`, seed 0), so our numbers compare with the recorded floor and HF peer."""
    rng = random.Random(seed)
    prompts = [
        [rng.randint(0, 10_000) for _ in range(rng.randint(100, 1024))] for _ in range(num_seqs)
    ]
    outputs = [rng.randint(100, 1024) for _ in range(num_seqs)]
    return prompts, outputs


def physical_floor_s(
    config: ModelConfig,
    prompts: list[list[int]],
    outputs: list[int],
    bytes_per_s: float = HBM_BYTES_PER_S,
    flops: float = BF16_FLOPS,
) -> float:
    """Seconds the workload needs at least: decode bytes over HBM plus prefill FLOPs (at the
    H200's rates unless others are given)."""
    c = config
    params = linear_params(c) + c.vocab_size * c.hidden_size  # the embedding (tied lm_head)
    weight_bytes = 2 * params
    kv_per_token = c.num_layers * c.kv_values_per_token * 2  # bf16
    decode_steps = max(outputs)  # all sequences fit in one batch: one weight read per step
    kv_bytes = sum(len(p) * o + o * (o - 1) / 2 for p, o in zip(prompts, outputs, strict=True))
    dense = 2 * (params - c.vocab_size * c.hidden_size)  # FLOPs per token, embedding is a gather
    prefill_tokens = sum(len(p) for p in prompts)
    attention = sum(2 * c.num_layers * len(p) ** 2 * c.q_size for p in prompts)  # causal QK + PV
    logits = 2 * c.vocab_size * c.hidden_size * len(prompts)
    byte_s = (decode_steps * weight_bytes + kv_bytes * kv_per_token) / bytes_per_s
    return float(byte_s) + float(dense * prefill_tokens + attention + logits) / flops


def linear_params(c: ModelConfig) -> int:
    """Parameters of the decoder layers' linears (qkv, o, gate, up, down): no embedding, no
    lm_head."""
    return c.num_layers * (
        c.hidden_size * (c.q_size + 2 * c.kv_size)
        + c.q_size * c.hidden_size
        + 3 * c.intermediate_size * c.hidden_size
    )


def write_model_folder(folder: Path, config: ModelConfig) -> None:
    """config.json, random bf16 model.safetensors and a word-level tokenizer.json."""
    from tokenizers import Tokenizer, models

    write_model_weights(folder, config)
    vocab = {f"t{i}": i for i in range(config.vocab_size)}
    Tokenizer(models.WordLevel(vocab, unk_token="t0")).save(str(folder / "tokenizer.json"))


def write_model_weights(folder: Path, config: ModelConfig) -> None:
    """A Qwen3 config.json and random bf16 model.safetensors of `config`'s shape."""
    from safetensors.torch import save_file

    c = config
    cfg = {
        "model_type": "qwen3",
        **hf_shape(c),
        "tie_word_embeddings": True,
        "eos_token_id": list(c.eos_token_ids),
        "torch_dtype": "bfloat16",
    }
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file(random_weights(c, torch.bfloat16, seed=0), str(folder / "model.safetensors"))


def hf_shape(c: ModelConfig) -> dict[str, Any]:
    """The config.json fields (HF's names) of `c`'s shape: a random-weight model's folder."""
    return {
        "hidden_size": c.hidden_size,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "intermediate_size": c.intermediate_size,
        "vocab_size": c.vocab_size,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "max_position_embeddings": c.max_position_embeddings,
    }


def engine_config(folder: Path, args: argparse.Namespace, **options: Any) -> EngineConfig:
    """The config both modes run the workload under (`options`: more EngineConfig fields,
    ops/deepseek_offline.py)."""
    from troupe import EngineConfig

    return EngineConfig(
        model=str(folder),
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=4096,
        enforce_eager=args.enforce_eager,
        **options,
    )


def run_engine(
    folder: Path,
    prompts: list[list[int]],
    outputs: list[int],
    args: argparse.Namespace,
    *,
    client: Client = "tasks",
    timed_steps: bool = False,
    **options: Any,
) -> int:
    """The workload through troupe.Engine (`client`: ops/engine_client.py); `timed_steps`:
    each step stamped and printed by batch size. `options`: more EngineConfig fields."""
    import anyio
    from troupe import Engine, SamplingParams
    from troupe.ops.engine_client import run_requests

    config = engine_config(folder, args, **options)
    total = 0
    timed = None
    if timed_steps:  # each step stamped (gpu/timed_runner.py); no profiler
        from troupe.gpu.runner import build_runner
        from troupe.gpu.runner_setup import with_step_budget
        from troupe.gpu.timed_runner import TimedRunner

        timed = TimedRunner(build_runner(with_step_budget(config)))

    def params(n: int) -> SamplingParams:
        return SamplingParams(temperature=0.6, max_tokens=n, ignore_eos=True)

    async def main() -> None:
        nonlocal total
        async with Engine.open(config, runner=timed) as engine:
            # Warm-up before the clock: Triton compiles a kernel variant on its first use, and a
            # fresh machine's first run paid that inside the timed region (~2x slower). A few of
            # the workload's own prompts at once reach its prefill-chunk and decode shapes.
            warm = [[1, 2, 3], *sorted(prompts, key=len)[-16:]]
            await run_requests(engine, warm, [params(4)] + [params(8)] * 16)
            start = time.perf_counter()
            mark = len(timed.steps) if timed is not None else 0
            total = sum(await run_requests(engine, prompts, list(map(params, outputs)), client))
            run_engine.elapsed = time.perf_counter() - start  # type: ignore[attr-defined]
            # where the time went: the runner's share vs the actors' on the shared GIL
            steps = engine.stats().num_steps
            busy = engine.runner_busy_seconds
            print(
                f"steps={steps} runner busy={busy:.2f}s ({1000 * busy / max(steps, 1):.2f} ms/step)"
            )
            runner = engine.runner_stats()  # counts since start: the warm-up is in them
            if runner.num_overlapped:
                print(
                    f"overlapped steps={runner.num_overlapped} hits={runner.num_overlap_hits} "
                    f"(splits={runner.num_overlap_splits}, merged {runner.num_overlap_merges}) of {runner.num_steps} runner steps"
                )
            actors = engine.actor_busy_seconds()
            print("actor busy: " + ", ".join(f"{k}={v:.2f}s" for k, v in sorted(actors.items())))
            if timed is not None:
                from troupe.ops.burst_steps import by_batch

                print("steps by batch:", *by_batch(timed.steps[mark:]), sep="\n")

    anyio.run(main)
    return total


def run_runner(
    folder: Path,
    prompts: list[list[int]],
    outputs: list[int],
    args: argparse.Namespace,
    **options: Any,
) -> int:
    """A minimal scheduler: admit while blocks last, prefill in token-budget chunks, decode."""
    from troupe import SamplingParams
    from troupe.gpu.model_runner import ModelRunner
    from troupe.messages import SeqWork, StepPlan

    config = engine_config(folder, args, **options)
    runner = ModelRunner.from_config(config)
    bs = runner.block_size
    free = list(range(runner.num_gpu_blocks))
    waiting = list(range(len(prompts)))
    done = [0] * len(prompts)  # tokens whose KV is computed
    outs: list[list[int]] = [[] for _ in prompts]
    tables: dict[int, list[int]] = {}
    running: list[int] = []
    step = 0
    start = time.perf_counter()
    while waiting or running:
        while waiting and len(running) < args.max_num_seqs:
            need = -(-(len(prompts[waiting[0]]) + outputs[waiting[0]]) // bs)
            if need > len(free):
                break
            seq = waiting.pop(0)
            tables[seq], free = free[:need], free[need:]
            running.append(seq)
        budget = args.max_num_batched_tokens
        works = []
        for seq in running:
            prompt = prompts[seq]
            if done[seq] < len(prompt):
                if budget <= 0:
                    continue
                tokens = prompt[done[seq] : done[seq] + budget]
            else:
                tokens = [outs[seq][-1]]
            first = done[seq] == 0
            works.append(
                SeqWork(
                    request_id=str(seq),
                    token_ids=tuple(tokens),
                    start_pos=done[seq],
                    block_ids=tuple(tables[seq]) if first else (),
                    reset=first,
                    sample=done[seq] + len(tokens) >= len(prompt),
                    params=SamplingParams(temperature=0.6, max_tokens=outputs[seq], ignore_eos=True)
                    if first
                    else None,
                )
            )
            done[seq] += len(tokens)
            budget -= len(tokens)
        step += 1
        finished = []
        for token in runner.execute(StepPlan(step_id=step, seqs=tuple(works))):
            seq = int(token.request_id)
            outs[seq].append(token.token_id)
            if len(outs[seq]) == outputs[seq]:
                finished.append(seq)
        for seq in finished:
            running.remove(seq)
            free += tables.pop(seq)
        if finished:
            runner.execute(StepPlan(step_id=step, seqs=(), released=tuple(map(str, finished))))
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    run_runner.elapsed = time.perf_counter() - start  # type: ignore[attr-defined]
    return sum(len(o) for o in outs)


def run_hf_peer(
    folder: Path, prompts: list[list[int]], outputs: list[int], time_limit: float
) -> tuple[int, float, int]:
    """HF transformers' continuous batching on the same weights and workload, as
    ../shared/bench/peer_baseline.py runs it: (tokens, seconds, requests done). Stops at
    `time_limit` seconds and reports what it finished by then."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    model: Any = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.bfloat16)
    model = model.cuda().eval()
    gen = GenerationConfig(
        do_sample=True, temperature=0.6, max_new_tokens=1024, eos_token_id=-1
    )
    manager = model.init_continuous_batching(generation_config=gen)
    manager.warmup()
    manager.start()
    start = time.perf_counter()
    ids = [manager.add_request(p, max_new_tokens=o) for p, o in zip(prompts, outputs, strict=True)]
    done = tokens = 0
    while done < len(ids) and time.perf_counter() - start < time_limit:
        result = manager.get_result(timeout=1)
        if result is not None and result.is_finished():
            done += 1
            tokens += len(result.generated_tokens)
    elapsed = time.perf_counter() - start
    manager.stop(block=True, timeout=10)
    return tokens, elapsed, done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("engine", "runner"), default="engine")
    parser.add_argument(
        "--client", choices=("tasks", "callbacks"), default="tasks",
        help="engine mode: a task per request (Engine.generate) or callbacks (Engine.submit, "
        "as generate_batch); ops/engine_client.py",
    )  # fmt: skip
    parser.add_argument("--num-seqs", type=int, default=256)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=16384)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument(
        "--timed", action="store_true",
        help="engine mode: stamp each step (TimedRunner) and print them grouped by batch size",
    )  # fmt: skip
    parser.add_argument(
        "--gil-switch-interval", type=float, default=None,
        help="EngineConfig.gil_switch_interval_s (default: its default; 0: the interpreter's own)",
    )  # fmt: skip
    parser.add_argument("--smoke", action="store_true", help="a 2-layer model: CPU smoke run")
    parser.add_argument("--peer", choices=("hf",), default=None, help="also run HF transformers")
    parser.add_argument("--peer-time-limit", type=float, default=300.0)
    args = parser.parse_args(argv)
    config = qwen3_tiny_config() if args.smoke else qwen3_0_6b_config()
    prompts, outputs = workload(args.num_seqs, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_model_folder(folder, config)
        if args.mode == "engine":
            options: dict[str, Any] = {}
            if args.gil_switch_interval is not None:
                options["gil_switch_interval_s"] = args.gil_switch_interval or None
            total = run_engine(
                folder, prompts, outputs, args, client=args.client, timed_steps=args.timed,
                **options,
            )  # fmt: skip
            fn = run_engine
        else:
            fn = run_runner
            total = fn(folder, prompts, outputs, args)
        elapsed = fn.elapsed  # type: ignore[attr-defined]
        peer = None
        if args.peer:
            try:
                peer = run_hf_peer(folder, prompts, outputs, args.peer_time_limit)
            except Exception as exc:  # the peer failing must not hide our own numbers
                print(f"HF peer failed: {exc!r}"[:500])
    floor = physical_floor_s(config, prompts, outputs)
    client = f" client={args.client}" if args.mode == "engine" else ""
    print(
        f"mode={args.mode}{client} seqs={args.num_seqs} output tokens={total} time={elapsed:.2f}s"
    )
    print(f"throughput: {total / elapsed:,.0f} output tok/s")
    print(
        f"physical floor: {floor:.2f}s ({total / floor:,.0f} tok/s); reached {floor / elapsed:.1%}"
    )
    if torch.cuda.is_available():  # the same floor at this card's own rates (ops/card_rates.py)
        copy, peak = copy_bandwidth(), matmul_peak()
        card = physical_floor_s(config, prompts, outputs, copy, peak)
        print(
            f"this card ({torch.cuda.get_device_name()}: copy {copy / 1e12:.2f} TB/s, bf16 "
            f"{peak / 1e12:.0f} TFLOP/s): floor {card:.2f}s; reached {card / elapsed:.1%}"
        )
    if peer is not None:
        tokens, seconds, done = peer
        rate = tokens / seconds
        print(
            f"HF transformers continuous batching: {tokens} tokens in {seconds:.1f}s = "
            f"{rate:,.0f} tok/s ({done}/{len(prompts)} requests done); "
            f"troupe is {total / elapsed / rate:.1f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
