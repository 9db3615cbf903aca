"""A cross-encoder (a tiny random one-label Qwen3ForSequenceClassification whose tokenizer has
a pair template) scores pairs as transformers does: /v1/score and /v1/rerank (the engine in its
child process) and LLM.score give sigmoid(logit) of the two texts encoded as a pair, the pair
encoding being transformers' `tokenizer(text_1, text_2)`; usage counts each pair's tokens; a
pair too long is refused naming its second text; a classifier of several labels cannot score
and is refused naming `model`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from troupe import LLM, EngineConfig
from troupe.actors.score_pairs import score_kind
from troupe.gateway.state import GatewaySettings

from tests.gateway.conftest import ServerThread, post_json
from tests.gpu.tiny_classifier import hf_logits, tiny_classifier

QUERY = "w5 w6 w7"
DOCS = ["w9 w8", "w5 w6 w7", "w30 w31 w32 w33", "w100"]


def _add_pair_template(folder: Path) -> None:
    """The word tokenizer with a post-processor: `w3 $A w4` alone, `w3 $A w4 $B w4` a pair."""
    from tokenizers import Tokenizer, processors

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.post_processor = processors.TemplateProcessing(
        single="w3 $A w4", pair="w3 $A w4 $B:1 w4:1", special_tokens=[("w3", 3), ("w4", 4)]
    )
    tok.save(str(folder / "tokenizer.json"))


@pytest.fixture(scope="module")
def cross(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = Path(tmp_path_factory.mktemp("cross")) / "model"
    hf_model = tiny_classifier(folder, "qwen3", labels={})  # one label: a reranker's head
    _add_pair_template(folder)
    return folder, hf_model


@pytest.fixture(scope="module")
def server(cross: tuple[Path, Any]) -> Iterator[ServerThread]:
    config = EngineConfig(device="cpu", model=str(cross[0]), max_model_len=24, max_num_seqs=4)
    srv = ServerThread(config, GatewaySettings()).start()
    yield srv
    srv.shutdown()


def _pair_ids(folder: Path, first: str, second: str) -> list[int]:
    """transformers' pair encoding, the reference (vLLM encodes a cross-encoder's pair so)."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    return list(tok(first, second)["input_ids"])


def _hf_score(cross: tuple[Path, Any], first: str, second: str) -> float:
    folder, hf_model = cross
    return float(torch.sigmoid(hf_logits(hf_model, _pair_ids(folder, first, second)))[0])


def test_the_pair_is_encoded_as_transformers_encodes_it(
    cross: tuple[Path, Any], server: ServerThread
) -> None:
    ids = server.engine.tokenizer.encode_pair("w5 w6", "w7")
    assert ids == _pair_ids(cross[0], "w5 w6", "w7") == [3, 5, 6, 4, 7, 4]


def test_scores_are_the_sigmoid_of_the_pairs_logit(
    cross: tuple[Path, Any], server: ServerThread
) -> None:
    status, body = post_json(server.url, "/v1/score", {"text_1": QUERY, "text_2": DOCS})
    assert status == 200, body
    got = [d["score"] for d in body["data"]]
    want = [_hf_score(cross, QUERY, doc) for doc in DOCS]
    assert got == pytest.approx(want, abs=1e-5)
    assert len(set(got)) == len(got)  # the pairs differ: a real score, not a constant
    tokens = sum(len(_pair_ids(cross[0], QUERY, doc)) for doc in DOCS)
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    # N:N pairs text i with text i; the order of a pair matters to a cross-encoder
    status, body = post_json(server.url, "/score", {"text_1": DOCS[:2], "text_2": [QUERY, QUERY]})
    assert status == 200, body
    want = [_hf_score(cross, doc, QUERY) for doc in DOCS[:2]]
    assert [d["score"] for d in body["data"]] == pytest.approx(want, abs=1e-5)


def test_rerank_orders_by_the_cross_encoders_score(
    cross: tuple[Path, Any], server: ServerThread
) -> None:
    status, body = post_json(
        server.url, "/v1/rerank", {"query": QUERY, "documents": DOCS, "top_n": 3}
    )
    assert status == 200, body
    want = {i: _hf_score(cross, QUERY, doc) for i, doc in enumerate(DOCS)}
    best = sorted(want, key=lambda i: -want[i])[:3]
    assert [r["index"] for r in body["results"]] == best
    for result in body["results"]:
        assert result["relevance_score"] == pytest.approx(want[result["index"]], abs=1e-5)
        assert result["document"] == {"text": DOCS[result["index"]]}


def test_a_pair_too_long_is_refused_naming_its_document(server: ServerThread) -> None:
    documents = ["w1", " ".join(["w9"] * 20)]  # alone it fits max_model_len; with the query not
    status, body = post_json(server.url, "/v1/rerank", {"query": QUERY, "documents": documents})
    assert status == 400 and body["error"]["param"] == "documents[1]", body


def test_llm_score_on_a_cross_encoder(cross: tuple[Path, Any]) -> None:
    config = EngineConfig(device="cpu", model=str(cross[0]), max_model_len=24, max_num_seqs=4)
    with LLM(config) as llm:
        outs = llm.score(QUERY, DOCS, use_tqdm=False)
        with pytest.raises(ValueError, match="data_1 has 2 texts and data_2 3"):
            llm.score(DOCS[:2], DOCS[:3])
    want = [_hf_score(cross, QUERY, doc) for doc in DOCS]
    assert [o.outputs.score for o in outs] == pytest.approx(want, abs=1e-5)
    assert outs[0].prompt_token_ids == _pair_ids(cross[0], QUERY, DOCS[0])


def test_what_scores_pairs() -> None:
    assert score_kind("m", (), is_token_classifier=False) == "embed"
    assert score_kind("m", ("LABEL_0",), is_token_classifier=False) == "cross"
    with pytest.raises(ValueError, match=r"model 'm' cannot score pairs: .* 3 labels"):
        score_kind("m", ("a", "b", "c"), is_token_classifier=False)
    with pytest.raises(ValueError, match="token-classification"):
        score_kind("m", ("a",), is_token_classifier=True)
