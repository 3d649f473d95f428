"""Seeded sampling: with ``decode.seed`` (``--seed``, the server's ``"seed"``) a sentence's samples depend on the
seed, the sentence and the options alone, not on the batch it is decoded in, so the same seed gives the same output
from the library, the command line and the server; the per-sentence draws still follow the model's distribution."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from decodekit import CharTokenizer, one_thread
from test_search import TABLE_B, A, B, C, Oracle, random_model, random_src, src_for
from transduce.cli import main
from transduce.config import ConfigError, DecodeConfig, ModelConfig
from transduce.model import Transformer
from transduce.search import sample
from transduce.search.translator import Translator


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    with one_thread():
        yield


def seeded(seed: int, n: int) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(seed) for _ in range(n)]


def test_a_generator_per_sentence_draws_from_the_models_distribution():
    oracle = Oracle([TABLE_B])
    draws = sample(oracle, src_for(0), num_samples=2000, max_len_b=10, generator=seeded(0, 1))[0]
    assert {tuple(h.tokens) for h in draws} == {(), (A,), (A, B), (A, B, C)}
    assert 0.37 < sum(not h.tokens for h in draws) / 2000 < 0.43  # p(empty) = 0.4
    assert all(math.isfinite(h.log_prob) for h in draws)  # never a token of probability 0
    (best,) = sample(oracle, src_for(0), num_samples=1, top_k=1, max_len_b=10, generator=seeded(1, 1))
    assert best[0].tokens == [A, B, C]


@torch.inference_mode()
def test_a_generator_per_sentence_makes_its_samples_independent_of_the_batch():
    model, src = random_model(0), random_src(0, n=5)
    together = sample(model, src, num_samples=3, max_len_b=12, generator=seeded(7, 5))
    for i in range(5):
        (alone,) = sample(model, src[i : i + 1], num_samples=3, max_len_b=12, generator=seeded(7, 1))
        assert [h.tokens for h in alone] == [h.tokens for h in together[i]]
    other = sample(model, src, num_samples=3, max_len_b=12, generator=seeded(8, 5))
    assert [[h.tokens for h in hyps] for hyps in other] != [[h.tokens for h in hyps] for hyps in together]
    with pytest.raises(ValueError, match=r"^generator: 4 generators for 5 sentences$"):
        sample(model, src, generator=seeded(7, 4))


SENTENCES = ["abc", "hgfedcba", "", "bad", "abc"]


@pytest.fixture(scope="module")
def translator() -> Translator:
    torch.manual_seed(3)
    model = Transformer(ModelConfig.preset("test", src_vocab_size=12, tgt_vocab_size=12))
    return Translator(model, CharTokenizer(), DecodeConfig(max_len_b=8))


def test_the_same_seed_gives_the_same_translations_whatever_the_batch(translator):
    first = translator.translate(SENTENCES, sampling=True, seed=5)
    assert translator.translate(SENTENCES, sampling=True, seed=5) == first
    assert [translator.translate([s], sampling=True, seed=5)[0] for s in SENTENCES] == first
    assert first[0] == first[4] and first[2] == ""  # the same sentence, the same draws
    assert translator.translate(SENTENCES, sampling=True, seed=6) != first
    nbest = translator.translate_nbest(SENTENCES, nbest=3, sampling=True, seed=5)
    assert translator.translate_nbest(SENTENCES[::-1], nbest=3, sampling=True, seed=5) == nbest[::-1]


def test_seed_is_a_decoding_setting_checked_like_the_others():
    assert DecodeConfig().seed is None and DecodeConfig(sampling=True, seed=0).seed == 0
    with pytest.raises(ConfigError, match=r"^seed: must be >= 0, got -1$"):
        DecodeConfig(sampling=True, seed=-1)
    with pytest.raises(ConfigError, match=r"^decode.seed: expected an integer, got str 'x'$"):
        from transduce.config import Config

        Config.from_dict({"decode": {"seed": "x"}})


def test_translate_with_the_same_seed_writes_the_same_file(checkpoint: Path, tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("a man rides the bike.\nein Hund.\n\nthe dog.\n" * 3, encoding="utf-8")
    outputs = []
    for seed in ("4", "4", "9"):
        out = tmp_path / f"out{len(outputs)}.txt"
        argv = ["translate", "--model", str(checkpoint), "-i", str(src), "-o", str(out), "--sampling", "--seed", seed]
        assert main([*argv, "--device", "cpu", "--max-len-b", "8"]) == 0
        outputs.append(out.read_text(encoding="utf-8"))
    assert outputs[0] == outputs[1] != outputs[2]
    assert outputs[0].splitlines()[:4] == outputs[0].splitlines()[4:8]  # a line's draws do not depend on its batch


def test_the_server_answers_the_same_seed_with_the_same_samples(checkpoint: Path):
    pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
    httpx = pytest.importorskip("httpx", reason="httpx is not installed")
    from transduce.serving.server import ServerThread, create_app

    translator = Translator.load(checkpoint)
    sentences = ["a man rides the bike.", "ein Hund.", "the dog rides a café."]
    with ServerThread(create_app(translator, batch_wait_ms=5.0)) as url, httpx.Client(base_url=url, timeout=60) as c:
        body = {"sentences": sentences, "sampling": True, "seed": 11, "max_len_b": 8}
        first = c.post("/translate", json=body).json()["translations"]
        assert first == translator.translate(sentences, sampling=True, seed=11, max_len_b=8)
        assert c.post("/translate", json=body).json()["translations"] == first
        alone = c.post("/translate", json={**body, "sentences": sentences[1:2]}).json()["translations"]
        assert alone == first[1:2]
        assert c.post("/translate", json={**body, "seed": 12}).json()["translations"] != first
        r = c.post("/translate", json={"sentences": sentences, "nbest": 2, "sampling": True, "seed": 11})
        assert r.status_code == 200 and [len(h) for h in r.json()["nbest"]] == [2, 2, 2]
        r = c.post("/translate", json={"sentences": sentences, "seed": 11})  # the server's decoding does not sample
        assert r.status_code == 422
        assert (
            r.json()["error"]
            == 'seed: applies to sampling only, and this search does not sample (add "sampling": true)'
        )
