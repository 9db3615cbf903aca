"""TokenRows (gpu/token_rows.py): per-token outputs kept chunk after chunk until the prompt is
whole, a chunk at position 0 starting over, a released request forgotten; token_classify
through the score head with its bias and vLLM's token activation."""

from __future__ import annotations

import torch
from troupe.gpu.hidden_rows import PooledSeq
from troupe.gpu.scored_forward import Classifier
from troupe.gpu.token_rows import TokenRows


def _seq(
    n: int, *, first: bool, done: bool, task: str = "token_embed", norm: bool = True
) -> PooledSeq:
    return PooledSeq("r", n, first, done, norm, task)  # type: ignore[arg-type]


def test_chunks_join_and_a_restart_drops_the_old_rows() -> None:
    gen = torch.Generator().manual_seed(0)
    a, b, c = (torch.randn(n, 6, generator=gen) for n in (3, 2, 4))
    rows = TokenRows(None)
    assert rows.add(_seq(3, first=True, done=False), a) is None and len(rows) == 1
    assert rows.add(_seq(2, first=False, done=False), b) is None
    # recomputed from position 0: the rows so far are dropped
    assert rows.add(_seq(3, first=True, done=False), a) is None
    whole = rows.add(_seq(4, first=False, done=True), c)
    assert whole is not None and whole.request_id == "r" and len(rows) == 0
    want = torch.nn.functional.normalize(torch.cat([a, c]), dim=-1)
    torch.testing.assert_close(torch.tensor(whole.embedding).view(7, 6), want)
    raw = rows.add(_seq(2, first=True, done=True, norm=False), b)
    assert raw is not None
    torch.testing.assert_close(torch.tensor(raw.embedding).view(2, 6), b)


def test_forget_drops_a_prompt_under_way() -> None:
    rows = TokenRows(None)
    rows.add(_seq(2, first=True, done=False), torch.ones(2, 4))
    rows.forget(["other"])
    assert len(rows) == 1
    rows.forget(["r"])
    assert len(rows) == 0


def test_token_classify_rows_through_the_head() -> None:
    gen = torch.Generator().manual_seed(1)
    weight, bias = torch.randn(3, 6, generator=gen), torch.randn(3, generator=gen)
    hidden = torch.randn(5, 6, generator=gen)
    # classify's activation (none: regression) does not apply to token_classify's rows
    head = Classifier(weight, "none", bias, "softmax")
    rows = TokenRows(head.rows)
    logits = hidden @ weight.t() + bias
    probs = rows.add(_seq(5, first=True, done=True, task="token_classify"), hidden)
    assert probs is not None
    torch.testing.assert_close(torch.tensor(probs.embedding).view(5, 3), logits.softmax(-1))
    raw = rows.add(_seq(5, first=True, done=True, task="token_classify", norm=False), hidden)
    assert raw is not None
    torch.testing.assert_close(torch.tensor(raw.embedding).view(5, 3), logits)
    one = Classifier(weight[:1], "softmax", bias[:1], "sigmoid")  # one label: sigmoid
    torch.testing.assert_close(one.rows(hidden, True), torch.sigmoid(logits[:, :1]))
