"""Perplexity of the default model (SmolLM2-135M, fp32 weights, CPU) with bf16 vs fp8 KV blocks.

Text: docstrings of a fixed list of Python stdlib modules (natural English, on every machine).
It is cut into segments; each segment runs as chunked prefill through the paged cache, so every
chunk reads the KV of the earlier ones back from the pool (in the dtype under test). The fp8
scales are set by the first chunk and kept, as in the engine. Prints perplexity per KV dtype and
the teacher-forced greedy agreement (argmax equal at each position).

    python -m troupe.ops.kv_fp8_perplexity [--tokens 12000] [--segment 2048] [--chunk 512]
                                           [--only bf16|fp8]
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import math
import time

import torch
from troupe.actors.graph import load_tokenizer_for
from troupe.config import default_model_path
from troupe.gpu.attention import AttentionMetadata
from troupe.gpu.kv_cache import KVCache
from troupe.gpu.models import DecoderModel
from troupe.gpu.weights import load_model
from troupe.kernels.kv_quant import FP8_DTYPE

MODULES = (
    "argparse", "collections", "functools", "itertools", "json", "logging", "pathlib",
    "re", "subprocess", "threading", "unittest", "email", "http.client", "inspect",
    "asyncio.tasks", "dataclasses", "typing", "string", "textwrap", "csv", "zipfile",
    "tarfile", "shutil", "tempfile", "random", "statistics", "decimal", "fractions",
)  # fmt: skip
BLOCK = 16


def stdlib_text() -> str:
    """Module and public member docstrings, in a fixed order."""
    parts: list[str] = []
    for name in MODULES:
        module = importlib.import_module(name)
        parts.append(inspect.getdoc(module) or "")
        for attr in sorted(dir(module)):
            if attr.startswith("_"):
                continue
            doc = inspect.getdoc(getattr(module, attr))
            if doc and len(doc) > 200 and doc not in parts:
                parts.append(doc)
    return "\n\n".join(p for p in parts if p)


def segment_logits(model: DecoderModel, kv: KVCache, ids: torch.Tensor, chunk: int) -> torch.Tensor:
    """fp32 logits [n, vocab] of one segment, run as chunked prefill over the pool."""
    n = len(ids)
    table = torch.arange(-(-n // BLOCK), dtype=torch.int32)[None]
    out = []
    for start in range(0, n, chunk):
        end = min(n, start + chunk)
        positions = torch.arange(start, end)
        meta = AttentionMetadata(
            slot_mapping=positions,  # block b holds positions b * 16 ..: slots = positions
            block_tables=table,
            seq_lens=torch.tensor([end], dtype=torch.int32),
            query_start_loc=torch.tensor([0, end - start], dtype=torch.int32),
            max_query_len=end - start,
            max_seq_len=end,
            is_decode=False,
            logits_indices=torch.arange(end - start),
        )
        hidden = model(ids[start:end], positions, meta, kv.layers)
        out.append(model.compute_logits(hidden))
    return torch.cat(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=12000)
    parser.add_argument("--segment", type=int, default=2048)
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--only", choices=("bf16", "fp8"), default=None, help="one KV dtype")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    tokenizer = load_tokenizer_for(None)
    ids = torch.tensor(tokenizer.encode(stdlib_text(), add_special_tokens=False))[: args.tokens]
    if len(ids) < args.tokens:
        raise SystemExit(f"only {len(ids)} tokens of text; lower --tokens")
    config, model = load_model(default_model_path(), torch.float32, torch.device("cpu"), 8192)
    nll: dict[str, float] = {}
    argmax: dict[str, list[torch.Tensor]] = {}
    for name, dtype in (("bf16", torch.bfloat16), ("fp8", FP8_DTYPE)):
        if args.only not in (None, name):
            continue
        t0 = time.perf_counter()
        kv = KVCache(config, num_gpu_blocks=-(-args.segment // BLOCK), num_cpu_blocks=0,
                     block_size=BLOCK, dtype=dtype, device=torch.device("cpu"))  # fmt: skip
        model.set_kv_scales(kv.scales)
        total, count, picks = 0.0, 0, []
        for start in range(0, len(ids), args.segment):
            seg = ids[start : start + args.segment]
            if len(seg) < 2:
                continue
            logits = segment_logits(model, kv, seg, args.chunk)
            logp = torch.log_softmax(logits[:-1], dim=-1)
            total -= float(logp.gather(1, seg[1:, None]).sum())
            count += len(seg) - 1
            picks.append(logits[:-1].argmax(-1))
        nll[name] = total / count
        argmax[name] = picks
        print(f"{name}: {count} scored tokens, perplexity {math.exp(nll[name]):.4f} "
              f"({time.perf_counter() - t0:.0f} s)")  # fmt: skip
    if args.only is not None:
        return
    same = sum(int((a == b).sum()) for a, b in zip(argmax["bf16"], argmax["fp8"], strict=True))
    num = sum(len(a) for a in argmax["bf16"])
    ratio = math.exp(nll["fp8"]) / math.exp(nll["bf16"])
    print(f"fp8 / bf16 perplexity: {ratio:.4f} ({(ratio - 1) * 100:+.2f}%)")
    print(f"greedy agreement (teacher-forced argmax): {same / num:.4f} over {num} positions")


if __name__ == "__main__":
    main()
