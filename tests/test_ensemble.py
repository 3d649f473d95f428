"""Ensembles (``transduce.search.ensemble``): an ensemble of one model is the model; the ensemble's next-token
distribution is the mean of the members' probabilities, so a beam hypothesis's log-probability equals the teacher-forced
sum of the log mean probabilities; cache == no cache; members with another vocabulary are refused by name; and the
ensemble reaches the command line (``translate`` with several ``--model``), the library and the
server (whose attention view refuses it with a 400)."""

from __future__ import annotations

import math
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from decodekit import make_checkpoint, one_thread
from transduce.cli import main
from transduce.config import Config, ConfigError, DecodeConfig, ModelConfig
from transduce.model import Transformer
from transduce.search import beam_search, greedy_search
from transduce.search.ensemble import Ensemble
from transduce.search.translator import Translator
from transduce.text.special import BOS_ID, EOS_ID, PAD_ID
from transduce.training.checkpoint import save_model


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    with one_thread():
        yield


def random_model(seed: int, **changes) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig.preset("test", **{"src_vocab_size": 40, "tgt_vocab_size": 40, **changes})
    return Transformer(cfg).eval()


def batch(seed: int, n: int = 6) -> torch.Tensor:
    rng = random.Random(seed)
    rows = [[rng.randrange(4, 40) for _ in range(rng.randint(1, 8))] + [EOS_ID] for _ in range(n)]
    width = max(map(len, rows))
    return torch.tensor([r + [PAD_ID] * (width - len(r)) for r in rows])


@torch.inference_mode()
def test_an_ensemble_of_one_is_the_model():
    model, src = random_model(0), batch(0)
    alone = beam_search(model, src, beam=4, nbest=4, max_len_b=12)
    ensembled = beam_search(Ensemble([model]), src, beam=4, nbest=4, max_len_b=12)
    for a, b in zip(alone, ensembled):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)
    # and two copies of one model are that model too (the mean of one distribution twice)
    twice = greedy_search(Ensemble([model, model]), src, max_len_b=12)
    assert [h.tokens for h in twice] == [h.tokens for h in greedy_search(model, src, max_len_b=12)]


@torch.inference_mode()
@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "no-cache"])
def test_beam_scores_are_the_log_mean_of_the_members_probabilities(use_cache):
    """Each hypothesis's log_prob equals, recomputed by teacher forcing through the members one by one, the sum over
    its tokens (and EOS) of log((p1 + p2 + p3) / 3); members of different shapes (post- and pre-norm, 2 or 1
    layers)."""
    members = [random_model(1), random_model(2, norm="pre"), random_model(3, encoder_layers=1, decoder_layers=1)]
    ensemble, src = Ensemble(members), batch(1)
    found = beam_search(ensemble, src, beam=3, nbest=3, max_len_b=10, length_penalty=0.0, use_cache=use_cache)
    for row, hyps in enumerate(found):
        for hyp in hyps:
            tgt_out = torch.tensor([[*hyp.tokens, EOS_ID]])
            tgt_in = torch.tensor([[BOS_ID, *hyp.tokens]])
            probs = torch.stack([
                m.decode(tgt_in, m.encode(src[row : row + 1]), None)[0].float().softmax(-1) for m in members
            ]).mean(0)  # fmt: skip
            expected = probs.gather(-1, tgt_out[..., None]).log().sum().item()
            assert hyp.log_prob == pytest.approx(expected, abs=1e-4)
    if use_cache:  # the same search without the cache finds the same hypotheses
        plain = beam_search(ensemble, src, beam=3, nbest=3, max_len_b=10, length_penalty=0.0, use_cache=False)
        assert [[h.tokens for h in x] for x in found] == [[h.tokens for h in x] for x in plain]


def test_members_must_share_the_vocabulary():
    with pytest.raises(ConfigError, match="ensemble: model 1 has tgt_vocab_size 40, model 2 has 41: the members"):
        Ensemble([random_model(0), random_model(0, tgt_vocab_size=41, share_vocab=False)])
    with pytest.raises(ConfigError, match="at least one model"):
        Ensemble([])


def test_the_smallest_position_limit_of_the_members_bounds_the_ensembles_inputs_and_outputs(caplog):
    from decodekit import CharTokenizer
    from transduce.search.common import max_lengths

    sinusoidal = random_model(0, src_vocab_size=12, tgt_vocab_size=12)
    learned = random_model(1, src_vocab_size=12, tgt_vocab_size=12, positions="learned", max_positions=16)
    with caplog.at_level("INFO", logger="transduce.search.ensemble"):
        ensemble = Ensemble([sinusoidal, learned])
    assert "ensemble: model 2's learned positions stop at 16: inputs and outputs limited to 15 tokens" in caplog.text
    assert (ensemble.config.positions, ensemble.config.max_positions) == ("learned", 16)
    assert sinusoidal.config.positions == "sinusoidal"  # the members' own configs are left as they are
    src = torch.tensor([[4] * 10 + [EOS_ID]])
    assert max_lengths(ensemble, src, 1.0, 40).tolist() == [15]
    translator = Translator(ensemble, CharTokenizer(), DecodeConfig(beam=2, max_len_a=1.0, max_len_b=40))
    assert translator.max_input_tokens == 15
    (text,) = translator.translate(["abcdefgh" * 3])  # 24 tokens: two pieces of at most 15, each decoded within 15
    assert [len(piece) <= 15 for piece in text.split(" ")] == [True, True]
    with pytest.raises(ConfigError, match=r"^max_input_tokens: 20 exceeds the model's learned positions "
                       r"\(max_positions 16 allows 15\)$"):  # fmt: skip
        Translator(ensemble, CharTokenizer(), max_input_tokens=20)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """Two random checkpoints with one vocabulary, and a third with another vocabulary of the same size."""
    root = tmp_path_factory.mktemp("ensemble")
    first = make_checkpoint(root / "a", max_len_b=8, seed=0)
    model_cfg = Translator.load(first).model.config
    torch.manual_seed(7)
    config = Config(model=model_cfg, decode=DecodeConfig(max_len_b=8))
    second = save_model(root / "b" / "model", Transformer(model_cfg).eval(), config, root / "a" / "vocab")
    other = make_checkpoint(root / "c", max_len_b=8, seed=5)
    return first, second, other


SENTENCES = ["a man rides the bike.", "ein Hund.", "", "the dog rides a café."]


def test_library_and_command_line_ensembles(pair, tmp_path, capsys):
    first, second, other = pair
    ensemble = Translator.load([first, second])
    assert isinstance(ensemble.model, Ensemble) and len(ensemble.model) == 2
    expected = ensemble.translate(SENTENCES)
    assert expected != Translator.load(first).translate(SENTENCES)  # (the second model changes something)
    src = tmp_path / "src.txt"
    src.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    out = tmp_path / "hyp.txt"
    assert main(["translate", "--model", str(first), "--model", str(second), "-i", str(src), "-o", str(out)]) == 0
    assert out.read_text(encoding="utf-8").splitlines() == expected
    with pytest.raises(ConfigError, match=f"ensemble: {other} has another source vocabulary than {first}"):
        Translator.load([first, other])
    assert main(["attention", "--model", str(first), "--model", str(second), "--src", "a man.",
                 "-o", str(tmp_path / "a.png")]) == 2  # fmt: skip
    assert "attention draws one model's weights: give one --model, not 2" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="attention shows one model's weights; this translator is an ensemble of 2"):
        ensemble.attention("a man.")


def test_server_translates_with_an_ensemble_and_refuses_its_attention(pair):
    pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
    httpx = pytest.importorskip("httpx", reason="httpx is not installed")
    from transduce.serving.server import ServerThread, create_app

    first, second, _ = pair
    translator = Translator.load([first, second])
    with ServerThread(create_app(translator, batch_wait_ms=5.0)) as url, httpx.Client(base_url=url, timeout=60) as c:
        r = c.post("/translate", json={"sentences": SENTENCES})
        assert r.status_code == 200 and r.json()["translations"] == translator.translate(SENTENCES)
        health = c.get("/health").json()["model"]
        assert health["ensemble"] == 2 and health["parameters"] == 2 * Translator.load(first).model.num_parameters()
        r = c.post("/attention", json={"sentence": "a man."})
        assert r.status_code == 400 and "ensemble of 2 models" in r.json()["error"]


def test_log_mean_probabilities_by_hand():
    """Two members' distributions over 2 tokens, (0.9, 0.1) and (0.5, 0.5): the ensemble's is (0.7, 0.3)."""

    class Fixed(torch.nn.Module):
        def __init__(self, probs):
            super().__init__()
            self.config = SimpleNamespace(src_vocab_size=2, tgt_vocab_size=2, pad_id=0, bos_id=0, eos_id=1)
            self.logits = torch.tensor(probs).log()

        def encode(self, src):
            return None

        def decode(self, tgt, memory, cache=None):
            return self.logits.expand(tgt.shape[0], tgt.shape[1], 2), cache

    ensemble = Ensemble([Fixed([0.9, 0.1]), Fixed([0.5, 0.5])])
    tokens = torch.zeros(1, 1, dtype=torch.long)
    out, _ = ensemble.decode(tokens, ensemble.encode(tokens))
    assert out.exp()[0, 0].tolist() == pytest.approx([0.7, 0.3], abs=1e-6)
    assert math.isclose(out.exp().sum().item(), 1.0, abs_tol=1e-6)
