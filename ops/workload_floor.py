"""The least time an offline workload can take on the H200, counted two ways (issues 9 and 12).

    python -m troupe.ops.workload_floor              # Llama-3.1-8B shape, 512 x (1,000 + 1,000)
    python -m troupe.ops.workload_floor --wave 418 --prompt-len 1000 --output-len 1000

Every sequence has the same prompt and output length; decode runs in waves of `--wave`
sequences, each wave one step per output token. Two floors, each the sum of three parts:

    issue   issue 9's floor: one read of every weight (embedding included) per decode step,
            every sequence's KV read once per step, and prefill at 2 x (parameters less the
            embedding) FLOPs per token, plus causal attention, at the matmul rate
    matmul  the same schedule counting what a decode step cannot beat either: its linear
            layers' FLOPs (2 x batch x matmul parameters) when they take longer than reading
            the weights, and prefill without the lm_head on tokens nobody samples

Rates: copy 4.26 TB/s and bf16 matmul 773 TFLOP/s, measured on the H200 (docs/benchmarks.md).
An fp8 cache halves the KV part only; the ratio of the two caches' floors bounds what fp8 KV can
gain at equal efficiency.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from troupe.gpu.model_config import ModelConfig
from troupe.ops.bench_offline import linear_params

COPY_BYTES_PER_S = 4.26e12
MATMUL_FLOPS = 773e12


@dataclass(frozen=True)
class Floor:
    prefill_s: float
    decode_linear_s: float  # the decode steps' linear layers: weights read, or their FLOPs
    kv_s: float

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_linear_s + self.kv_s


def floors(
    c: ModelConfig,
    *,
    num_seqs: int,
    prompt_len: int,
    output_len: int,
    wave: int,
    kv_bytes_per_value: int,
) -> tuple[Floor, Floor]:
    """(issue 9's floor, the matmul-aware floor) in seconds; see the module doc."""
    head = c.vocab_size * c.hidden_size  # the lm_head (an untied embedding as big again)
    body = linear_params(c)
    waves = [min(wave, num_seqs - i) for i in range(0, num_seqs, wave)]
    # causal: QK^T and PV over half the prompt-by-prompt square, in every layer
    attention = num_seqs * 2 * c.num_layers * prompt_len**2 * c.q_size
    kv_per_token = c.num_layers * c.kv_values_per_token * kv_bytes_per_value
    context = sum(range(prompt_len, prompt_len + output_len))  # each step reads all it holds
    kv_s = num_seqs * context * kv_per_token / COPY_BYTES_PER_S
    weights_s = 2 * (body + 2 * head) / COPY_BYTES_PER_S  # bf16, embedding and lm_head
    issue = Floor(
        prefill_s=(2 * (body + head) * num_seqs * prompt_len + attention) / MATMUL_FLOPS,
        decode_linear_s=len(waves) * output_len * weights_s,
        kv_s=kv_s,
    )
    step_s = [max(weights_s, 2 * batch * (body + head) / MATMUL_FLOPS) for batch in waves]
    matmul = Floor(
        prefill_s=(2 * body * num_seqs * prompt_len + 2 * head * num_seqs + attention)
        / MATMUL_FLOPS,
        decode_linear_s=output_len * sum(step_s),
        kv_s=kv_s,
    )
    return issue, matmul


def report(args: argparse.Namespace, config: ModelConfig) -> list[str]:
    kw = dict(
        num_seqs=args.num_seqs, prompt_len=args.prompt_len, output_len=args.output_len,
        wave=args.wave,
    )  # fmt: skip
    lines = [
        f"{args.num_seqs} x ({args.prompt_len} + {args.output_len}) tokens, waves of {args.wave}",
        f"{'cache':5s} {'floor':6s} {'prefill':>8s} {'linear':>8s} {'KV':>8s} {'total':>8s}"
        f" {'tok/s':>8s}",
    ]
    totals: dict[tuple[str, str], float] = {}
    for cache, nbytes in (("bf16", 2), ("fp8", 1)):
        for name, f in zip(
            ("issue", "matmul"), floors(config, kv_bytes_per_value=nbytes, **kw), strict=True
        ):
            totals[cache, name] = f.total_s
            rate = args.num_seqs * args.output_len / f.total_s
            lines.append(
                f"{cache:5s} {name:6s} {f.prefill_s:7.2f}s {f.decode_linear_s:7.2f}s "
                f"{f.kv_s:7.2f}s {f.total_s:7.2f}s {rate:8.0f}"
            )
    for name in ("issue", "matmul"):
        ratio = totals["bf16", name] / totals["fp8", name]
        lines.append(f"fp8 KV over bf16 at equal efficiency ({name} floors): {ratio:.3f}x")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m troupe.ops.workload_floor", description=__doc__)
    p.add_argument("--num-seqs", type=int, default=512)
    p.add_argument("--prompt-len", type=int, default=1000)
    p.add_argument("--output-len", type=int, default=1000)
    p.add_argument("--wave", type=int, default=256, help="sequences decoding at once")
    args = p.parse_args(argv)
    from troupe.ops.fp8_kv_bench import LLAMA_8B

    for line in report(args, LLAMA_8B):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
