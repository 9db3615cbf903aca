"""Draw docs/benchmarks.png from the offline-throughput table in docs/benchmarks.md.

    python -m troupe.ops.plot_benchmarks

Reads the rows of the "Offline throughput" table (date, commit, hardware, tok/s, ...) so the
plot never disagrees with the notes, and draws them against the HF transformers peer and the
workload's physical floor.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"
HF_PEER_TOK_S = 594  # ../shared/bench/peer_baseline.py on the H200, HF continuous batching
FLOOR_TOK_S = 36_014  # 133,966 output tokens over the 3.72 s floor


def offline_rows(markdown: str) -> list[tuple[str, float]]:
    """(commit, output tok/s) for each row of the offline table, in order."""
    section = markdown.split("## Offline throughput", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and re.fullmatch(r"[0-9a-f]{7,}", cells[1]):
            rows.append((cells[1], float(cells[3].replace(",", "").strip("*"))))
    return rows


def main(argv: list[str] | None = None) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = offline_rows((DOCS / "benchmarks.md").read_text())
    if not rows:
        print("no offline rows found in docs/benchmarks.md", file=sys.stderr)
        return 1
    labels = ["HF transformers\n(continuous batching)"] + [f"troupe\n{c}" for c, _ in rows]
    values = [HF_PEER_TOK_S] + [v for _, v in rows]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    bars = ax.bar(labels, values, color=["#999999"] + ["#2f5fd0"] * len(rows))
    ax.axhline(FLOOR_TOK_S, color="#c0392b", linestyle="--", linewidth=1.2)
    ax.text(-0.4, FLOOR_TOK_S * 1.02, f"physical floor {FLOOR_TOK_S:,} tok/s", color="#c0392b")
    ax.axhline(FLOOR_TOK_S / 2, color="#e67e22", linestyle=":", linewidth=1.2)
    ax.text(-0.4, FLOOR_TOK_S / 2 * 1.03, "target: 50% of the floor", color="#e67e22")
    for bar, value in zip(bars, values, strict=True):
        ax.text(bar.get_x() + bar.get_width() / 2, value, f"{value:,.0f}", ha="center", va="bottom")
    ax.set_ylabel("output tokens/s")
    ax.set_ylim(0, FLOOR_TOK_S * 1.12)
    ax.set_title("nano-vllm workload, Qwen3-0.6B shape (random bf16), one H200")
    fig.tight_layout()
    out = DOCS / "benchmarks.png"
    fig.savefig(out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
