"""n-gram acceptance of a real model on realistic tasks: summarise, rewrite, code edit.

Each task is one chat request, greedy, run alone with speculation off and on (the outputs must
match); printed per task: output tokens, decode steps, proposals and accepted ones, mean
accepted length per verification, tokens per step, and wall time both ways.

    python -m troupe.ops.spec_tasks                      # SmolLM2-135M-Instruct on the CPU
    python -m troupe.ops.spec_tasks --model PATH --device cuda
"""

from __future__ import annotations

import argparse
import time
from typing import Any

PARAGRAPH = (
    "The city council met on Tuesday to discuss the new bicycle lanes on Main Street. "
    "Several shop owners said that the lanes had reduced parking for their customers, while "
    "cyclists said that the lanes had made the street much safer. The council agreed to "
    "count traffic for three more months before deciding whether to keep the lanes."
)
CODE = """def average(values):
    total = 0
    for v in values:
        total = total + v
    return total / len(values)


def report(values):
    print("average:", average(values))
"""
TASKS = {
    "summarise": f"Summarise this paragraph in two sentences:\n\n{PARAGRAPH}",
    "rewrite": f"Rewrite this paragraph in simpler words, keeping every fact:\n\n{PARAGRAPH}",
    "code-edit": (
        "Change this code so that average returns 0 for an empty list. Reply with the whole "
        f"code only.\n\n{CODE}"
    ),
}


def run(config: Any, max_tokens: int) -> dict[str, tuple[list[int], float, Any, Any]]:
    import anyio
    from troupe import Engine, SamplingParams
    from troupe.actors.graph import load_tokenizer_for

    tok = load_tokenizer_for(config.model)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    out: dict[str, tuple[list[int], float, Any, Any]] = {}

    async def main() -> None:
        async with Engine.open(config) as engine:
            for name, text in TASKS.items():
                chat = tok.render_chat(
                    [{"role": "user", "content": text}], add_generation_prompt=True
                )
                prompt = tok.encode(chat, add_special_tokens=False)
                before = engine.stats()
                start = time.perf_counter()
                tokens = [t async for e in engine.generate(prompt, params) for t in e.token_ids]
                out[name] = (tokens, time.perf_counter() - start, before, engine.stats())

    anyio.run(main)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--prompt-lookup-min", type=int, default=2)
    parser.add_argument("--prompt-lookup-max", type=int, default=4)
    args = parser.parse_args(argv)
    from troupe import EngineConfig

    base = EngineConfig(model=args.model, device=args.device, max_model_len=1024)
    off = run(base, args.max_tokens)
    on = run(
        base.replace(
            speculative_method="ngram",
            num_speculative_tokens=args.k,
            prompt_lookup_min=args.prompt_lookup_min,
            prompt_lookup_max=args.prompt_lookup_max,
        ),
        args.max_tokens,
    )
    for name in TASKS:
        tokens, seconds, before, after = on[name]
        plain, plain_s, *_ = off[name]
        steps = after.num_steps - before.num_steps
        proposed = after.num_spec_proposed_tokens - before.num_spec_proposed_tokens
        accepted = after.num_spec_accepted_tokens - before.num_spec_accepted_tokens
        old = before.spec_accepted_lengths or (0,) * len(after.spec_accepted_lengths)
        verifications = sum(after.spec_accepted_lengths) - sum(old)
        print(
            f"{name:<10} tokens={len(tokens):<4} identical={tokens == plain} steps={steps:<4} "
            f"proposed={proposed:<4} accepted={accepted:<4} "
            f"acceptance={accepted / max(proposed, 1):5.1%} "
            f"accepted len={accepted / max(verifications, 1):4.2f} "
            f"tokens/step={len(tokens) / max(steps, 1):4.2f} "
            f"time on={seconds:6.2f}s off={plain_s:6.2f}s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
