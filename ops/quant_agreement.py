"""Greedy agreement of quantized weights (kept as shipped) with the dequantized fp32 path.

    python -m troupe.ops.quant_agreement                  # the default model, 32 tokens
    python -m troupe.ops.quant_agreement --model X.gguf --num-tokens 32
    python -m troupe.ops.quant_agreement --torch-int4     # torch's int4 kernel, not the native

For each prompt (a chat-style mix: questions, code, lists, arithmetic, other languages) it
generates greedily with the dequantized model, then feeds the same tokens to the quantized
one (teacher forcing) and reports per step: whether the argmax agrees, the largest logit
difference, and at a disagreement the reference's top-1 minus top-2 margin (a near-tie when
small). It also generates freely with the quantized model and counts tokens equal to the
reference's before the first difference.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from troupe.config import EngineConfig
from troupe.gpu.model_runner import ModelRunner
from troupe.messages import SamplingParams, SeqWork, StepPlan

PROMPTS = (
    "What is the capital of France?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "List three ways to save energy at home.",
    "What is 17 times 23?",
    "Traduis en anglais : le chat dort sur le canapé.",
    "Explain what a hash map is to a ten-year-old.",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "Give me a haiku about autumn rain.",
)


class Stream:
    """One sequence through a runner: a prefill, then one-token decode steps (the shapes
    generation runs, so the quantized decode path is the one measured)."""

    def __init__(self, runner: ModelRunner, name: str) -> None:
        self.runner, self.name, self.len, self.step = runner, name, 0, 0

    def feed(self, tokens: list[int]) -> torch.Tensor:
        """Append `tokens`; the logits after the last one."""
        bs = self.runner.block_size
        have = -(-self.len // bs)
        need = -(-(self.len + len(tokens)) // bs)
        work = SeqWork(
            request_id=self.name,
            token_ids=tuple(tokens),
            start_pos=self.len,
            block_ids=tuple(range(have, need)),
            reset=self.len == 0,
            params=SamplingParams(temperature=0, max_tokens=1) if self.len == 0 else None,
            num_prompt_tokens=len(tokens) if self.len == 0 else 0,
        )
        self.step += 1
        self.len += len(tokens)
        return self.runner.logits(StepPlan(step_id=self.step, seqs=(work,)))[0].float()

    def close(self) -> None:
        self.runner.logits(StepPlan(step_id=self.step + 1, seqs=(), released=(self.name,)))


def greedy(runner: ModelRunner, prompt: list[int], n: int) -> tuple[list[int], list[torch.Tensor]]:
    stream = Stream(runner, "greedy")
    row = stream.feed(prompt)
    tokens, rows = [], [row]
    for _ in range(n - 1):
        tokens.append(int(row.argmax()))
        row = stream.feed(tokens[-1:])
        rows.append(row)
    tokens.append(int(row.argmax()))
    stream.close()
    return tokens, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--num-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--torch-int4", action="store_true", help="cpu_native_kernels=False for the kept model"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from troupe.actors.graph import load_tokenizer_for

    tok = load_tokenizer_for(args.model)
    base = EngineConfig(model=args.model, device="cpu", num_kv_blocks=64, max_model_len=1024)
    ref = ModelRunner.from_config(base.replace(quantization="dequantize"))
    quant_config = base.replace(quantization="auto")
    if args.torch_int4:
        quant_config = quant_config.replace(cpu_native_kernels=False)
    quant = ModelRunner.from_config(quant_config)
    agree = total = identical = 0
    deltas: list[float] = []
    margins: list[float] = []
    for text in PROMPTS:
        ids = tok.encode(tok.render_chat([{"role": "user", "content": text}]), False)
        want, rows = greedy(ref, ids, args.num_tokens)
        forced = Stream(quant, "forced")
        for i, row in enumerate(rows):
            got = forced.feed(list(ids) if i == 0 else [want[i - 1]])
            deltas.append(float((got - row).abs().max()))
            total += 1
            if int(got.argmax()) == want[i]:
                agree += 1
            else:
                top = row.topk(2).values
                margins.append(float(top[0] - top[1]))
        forced.close()
        free, _ = greedy(quant, ids, args.num_tokens)
        same = next((i for i, (a, b) in enumerate(zip(want, free, strict=True)) if a != b), None)
        identical += same is None
        print(
            f"{text[:40]!r:44s} free-run equal for {args.num_tokens if same is None else same:2d}"
            f"/{args.num_tokens}; max |dlogit| {max(deltas[-len(rows) :]):.3f}",
            flush=True,
        )
    print(
        f"teacher-forced argmax agreement {agree}/{total}; prompts identical over "
        f"{args.num_tokens} tokens {identical}/{len(PROMPTS)}; |dlogit| per step: median "
        f"{statistics.median(deltas):.3f}, max {max(deltas):.3f}; reference top-2 margins at "
        f"disagreements: {', '.join(f'{m:.3f}' for m in margins) or 'none'}"
    )


if __name__ == "__main__":
    main()
