"""The input-embedding seam on its own (gpu/embed_rows.py, messages/prompt_embeds.py): where a
step's rows land in its flat batch, joined steps (a merged split), the eager and the captured
forms giving the same hidden states, and a graph's buffers cleared between steps."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from troupe.gpu.embed_rows import (
    EagerRows,
    EmbedsBuffers,
    join_embeds,
    prompt_embeds_of,
    step_embeds,
)
from troupe.messages import PromptEmbeds, SeqWork


def rows(n: int, seed: int, hidden: int = 6) -> torch.Tensor:
    return torch.randn(n, hidden, generator=torch.Generator().manual_seed(seed))


def test_prompt_embeds_round_trip_and_cut() -> None:
    t = rows(5, 0)
    e = prompt_embeds_of(t)
    assert (e.num_rows, e.hidden_size, e.dtype) == (5, 6, "float32") and e.problem() is None
    cut = e.rows(1, 4)
    got = torch.frombuffer(bytearray(cut.data), dtype=torch.float32).view(3, 6)
    assert torch.equal(got, t[1:4])
    assert prompt_embeds_of(t.double()).dtype == "float32"  # other floats travel as float32
    assert prompt_embeds_of(t.bfloat16()).dtype == "bfloat16"
    with pytest.raises(ValueError, match="seq_len, hidden_size"):
        prompt_embeds_of(torch.randn(2, 3, 4))
    bad = PromptEmbeds(e.data[:-4], 5, 6)
    assert bad.problem() is not None and "needs 120" in bad.problem()  # type: ignore[operator]
    assert PromptEmbeds(b"", 0, 6).problem() == "prompt_embeds must hold at least one row, got 0"
    assert "dtype" in (PromptEmbeds(e.data, 5, 6, "int8").problem() or "")


def test_rows_land_at_their_sequences_positions() -> None:
    a, c = prompt_embeds_of(rows(3, 1)), prompt_embeds_of(rows(2, 2))
    seqs = (
        SeqWork("d", (7,), 40),  # a decode
        SeqWork("a", (0, 0, 0, 0), 0, prompt_embeds=a.rows(0, 3)),  # 3 rows, then a token
        SeqWork("t", (5, 6), 0),  # a token prompt
        SeqWork("c", (0, 0), 8, prompt_embeds=c),
    )
    qsl = np.array([0, 1, 5, 7, 9])
    got = step_embeds(seqs, qsl)
    assert got is not None and got.rows.tolist() == [1, 2, 3, 7, 8]
    assert step_embeds(seqs[:1] + seqs[2:3], qsl) is None
    joined = join_embeds(None, got, offset=4)
    assert joined is not None and joined.rows.tolist() == [5, 6, 7, 11, 12]
    both = join_embeds(got, got, offset=9)
    assert both is not None and both.rows.tolist() == [1, 2, 3, 7, 8, 10, 11, 12, 16, 17]


def test_eager_and_graph_forms_agree_and_clear() -> None:
    seqs = (
        SeqWork("d", (7,), 40),
        SeqWork("a", (0, 0, 0), 0, prompt_embeds=prompt_embeds_of(rows(3, 3))),
    )
    embeds = step_embeds(seqs, np.array([0, 1, 4]))
    assert embeds is not None
    hidden = rows(6, 4)  # 4 live rows, 2 of padding
    want = hidden.clone()
    want[1:4] = rows(3, 3)
    eager = EagerRows(embeds, torch.float32, torch.device("cpu"))(hidden[:4])
    assert torch.equal(eager, want[:4])
    buffers = EmbedsBuffers(8, 6, torch.float32, torch.device("cpu"))
    graph = buffers.rows(6)  # what a graph of bucket 6 captured
    buffers.fill(embeds)
    assert torch.equal(graph(hidden), want)
    buffers.fill(None)  # a later step without rows: nothing of the last one stays
    assert torch.equal(graph(hidden), hidden)


def test_rows_are_cast_to_the_models_dtype() -> None:
    seqs = (SeqWork("a", (0, 0), 0, prompt_embeds=prompt_embeds_of(rows(2, 5).bfloat16())),)
    embeds = step_embeds(seqs, np.array([0, 2]))
    assert embeds is not None
    out = EagerRows(embeds, torch.float32, torch.device("cpu"))(torch.zeros(2, 6))
    assert out.dtype == torch.float32
    assert torch.equal(out, rows(2, 5).bfloat16().float())
