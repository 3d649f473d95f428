"""Using a trained classifier: the Python API (``transduce.Classifier``), ``transduce classify`` (from a file or
standard input, plain, TSV or JSON Lines, labels or ``--json``), ``/classify`` of the server and ``transduce
evaluate`` give the same labels and probabilities for the same texts; the metrics on a hand-made case. One tiny
classifier, trained once for the module, serves every test; the one-line refusals of bad input are rows of
test_cli_contract.py."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import pytest
import torch

import transduce
from classifykit import make_classifier_checkpoint
from decodekit import one_thread
from test_classify import classify_config, toy_examples, write_tsv
from transduce.cli import main
from transduce.config import Config, DataConfig, ModelConfig
from transduce.errors import CheckpointError, TransduceError
from transduce.text.vocab import load_vocabulary
from transduce.training.train import train
from transduce.transfer.classify import Classifier, ClassifierModel, load_classifier
from transduce.transfer.classify.data import collate_classes, fit_pair
from transduce.transfer.classify.metrics import classification_scores, confusion_matrix

HELD_OUT = toy_examples(12, 3)  # (label, text): texts the classifier did not train on
TEXTS = [text for _, text in HELD_OUT]


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A classifier of the toy rule (``yes``: the text holds "zebra"), trained for a few seconds."""
    root = tmp_path_factory.mktemp("classifier")
    train(classify_config(root / "run", write_tsv(root / "train.tsv", toy_examples(200, 1)), None, max_steps=30))
    return root / "run"


@pytest.fixture(scope="module")
def classifier(run: Path) -> Classifier:
    return transduce.Classifier.load(run, device="cpu")


def classify(argv: list, capsys) -> str:
    """``transduce classify ARGV`` in-process; its standard output."""
    capsys.readouterr()
    assert main(["classify", *map(str, argv), "--device", "cpu", "-q"]) == 0
    return capsys.readouterr().out


# ----------------------------------------------------------------------------------------------------------------------
# the Python API


def test_the_api_gives_each_text_its_label_and_the_probability_of_every_label(classifier: Classifier, run: Path):
    assert classifier.labels == ["no", "yes"] and not classifier.pairs
    results = classifier.classify(TEXTS)
    probabilities = classifier.probabilities(TEXTS)
    assert [r.label for r in results] == classifier.predict(TEXTS)
    assert sum(r.label == gold for r, (gold, _) in zip(results, HELD_OUT)) >= 10  # it learnt the rule
    for result, row in zip(results, probabilities):
        assert list(result.probabilities) == classifier.labels
        assert list(result.probabilities.values()) == row.tolist()
        assert sum(result.probabilities.values()) == pytest.approx(1.0, abs=1e-6)
        assert result.label == max(result.probabilities, key=result.probabilities.get)
    # another batch size and another order: the same answer for each text
    other = Classifier.load(run, batch_size=3)
    torch.testing.assert_close(other.probabilities(TEXTS[::-1]), probabilities.flip(0), atol=1e-5, rtol=0)
    assert isinstance(load_classifier(run), Classifier)


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        ((["a film", " "],), ValueError, "texts[1] is empty: an empty text has no class"),
        ((["a film"], ["the plot"]), ValueError,
         "this classifier reads single texts (it was trained without data.text2_field): leave texts2 out"),
        (("a film",), TypeError, "texts: a sequence of strings, not one string"),
        # an iterator would be read up to its end by the checks (and has no length): refused, as Translator does
        (((t for t in TEXTS),), TypeError, "texts: a sequence of strings, not a generator: pass list(texts)"),
        ((map(str.strip, TEXTS),), TypeError, "texts: a sequence of strings, not a map: pass list(texts)"),
        (([None],), TypeError, "texts[0]: a string, not NoneType"),
        ((["a film", 3],), TypeError, "texts[1]: a string, not int"),
    ],
)  # fmt: skip
def test_the_api_refuses_what_has_no_class(classifier: Classifier, args, error, message):
    with pytest.raises(error) as e:
        classifier.classify(*args)
    assert str(e.value) == message


def test_a_pair_too_long_keeps_some_of_each_text_as_prepare_does(run: Path, tmp_path: Path):
    """Truncated longest-first (transduce.transfer.classify.data.fit_pair): the second text is not cut off."""
    loaded = Classifier.load(make_classifier_checkpoint(tmp_path / "pairs", run / "vocab", text2_field="b"))
    config = loaded.config.replace(data=loaded.config.data.replace(max_len=8))
    pairs = Classifier(loaded.model, loaded.tokenizer, config)
    long = " ".join(TEXTS)
    scores = pairs.logits([long, long], ["the film", "zebra zebra a plot"])
    assert not torch.allclose(scores[0], scores[1])
    tok, model = pairs.tokenizer, pairs.model
    ids = [fit_pair(tok.encode_src(long), tok.encode_src(t2), 8, 2) for t2 in ("the film", "zebra zebra a plot")]
    assert all(len(i) == 8 and i.count(2) == 1 and i.index(2) < 7 for i in ids)
    with torch.inference_mode():
        expected = model(collate_classes([(i, [0]) for i in ids]).src)
    torch.testing.assert_close(scores, expected, atol=1e-5, rtol=0)


def test_learned_positions_hold_a_text_longer_than_they_are(run: Path):
    """A text is cut to what the position table holds (its eos included; <cls> has no position), not refused."""
    vocab = load_vocabulary(run / "vocab")
    torch.manual_seed(0)
    model_cfg = ModelConfig.preset("test", src_vocab_size=vocab.src_vocab_size, tgt_vocab_size=vocab.tgt_vocab_size,
                                   labels=["no", "yes"], positions="learned", max_positions=8)  # fmt: skip
    config = Config(model=model_cfg, data=DataConfig(task="classify"))
    classifier = Classifier(ClassifierModel(model_cfg).eval(), vocab, config)
    long = " ".join(TEXTS)
    assert len(vocab.encode_src(long)) > 8
    with torch.inference_mode():
        expected = classifier.model(collate_classes([(vocab.encode_src(long)[:7], [0])]).src)
    torch.testing.assert_close(classifier.logits([long]), expected, atol=1e-5, rtol=0)


def test_a_translation_model_is_not_a_classifier(checkpoint: Path):
    with pytest.raises(CheckpointError) as e:
        Classifier.load(checkpoint)
    assert str(e.value) == f"{checkpoint} is not a classifier (data.task: translate): use transduce translate"


# ----------------------------------------------------------------------------------------------------------------------
# transduce classify


def test_classify_writes_the_apis_labels_from_a_file_or_standard_input(classifier, run, tmp_path, capsys,
                                                                       monkeypatch):  # fmt: skip
    source = tmp_path / "texts.txt"
    source.write_text("".join(t + "\n" for t in TEXTS), encoding="utf-8")
    out = tmp_path / "new" / "labels.txt"
    assert classify(["--model", run, "-i", source, "-o", out], capsys) == ""
    assert out.read_text(encoding="utf-8").splitlines() == classifier.predict(TEXTS)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(source.read_bytes())))
    assert classify(["--model", run, "--batch-size", "5"], capsys) == out.read_text(encoding="utf-8")
    # --json: the label and every probability, as the API gives them
    lines = [json.loads(line) for line in classify(["--model", run, "-i", source, "--json"], capsys).splitlines()]
    assert lines == [r.to_dict() for r in classifier.classify(TEXTS)]
    assert all(sum(line["probabilities"].values()) == pytest.approx(1.0, abs=1e-6) for line in lines)


@pytest.mark.skipif(not Path("/dev/fd").is_dir(), reason="no /dev/fd")
def test_classify_reads_a_pipe_once(classifier, run, tmp_path, capsys):
    """A pipe cannot be read twice: its lines are kept from the one reading that checks them."""
    read, write = os.pipe()
    try:
        os.write(write, "".join(t + "\n" for t in TEXTS).encode())
        os.close(write)
        assert classify(["--model", run, "-i", f"/dev/fd/{read}"], capsys).splitlines() == classifier.predict(TEXTS)
    finally:
        os.close(read)


def test_classify_reads_the_text_of_tsv_and_json_lines_files(classifier, run, tmp_path, capsys):
    expected = "".join(label + "\n" for label in classifier.predict(TEXTS))
    tsv = write_tsv(tmp_path / "test.tsv", [("whatever", text) for text in TEXTS])  # the label column is ignored
    assert classify(["--model", run, "-i", tsv], capsys) == expected
    named = tmp_path / "test.txt"
    named.write_bytes(tsv.read_bytes())
    assert classify(["--model", run, "-i", named, "--format", "tsv"], capsys) == expected
    jsonl = tmp_path / "test.jsonl"
    jsonl.write_text("".join(json.dumps({"id": i, "review": {"body": t}}) + "\n" for i, t in enumerate(TEXTS)),
                     encoding="utf-8")  # fmt: skip
    assert classify(["--model", run, "-i", jsonl, "--text-field", "review.body"], capsys) == expected


def test_a_classifier_of_pairs_reads_two_texts_a_line(run, tmp_path, capsys):
    pairs = Classifier.load(make_classifier_checkpoint(tmp_path / "pairs", run / "vocab", text2_field="b"))
    first, second = TEXTS[:6], TEXTS[6:]
    expected = [r.to_dict() for r in pairs.classify(first, second)]
    plain = tmp_path / "pairs.txt"
    plain.write_text("".join(f"{a}\t{b}\n" for a, b in zip(first, second)), encoding="utf-8")
    lines = classify(["--model", tmp_path / "pairs", "-i", plain, "--json"], capsys).splitlines()
    assert [json.loads(line) for line in lines] == expected
    jsonl = tmp_path / "pairs.jsonl"
    jsonl.write_text("".join(json.dumps({"p": a, "h": b}) + "\n" for a, b in zip(first, second)), encoding="utf-8")
    argv = ["--model", tmp_path / "pairs", "-i", jsonl, "--json", "--text-field", "p", "--text2-field", "h"]
    assert [json.loads(line) for line in classify(argv, capsys).splitlines()] == expected
    with pytest.raises(ValueError, match=r"^this classifier reads sentence pairs \(data.text2_field: b\): give "):
        pairs.classify(first)


# ----------------------------------------------------------------------------------------------------------------------
# the server


def test_the_server_answers_what_the_api_does(classifier, run):
    pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
    httpx = pytest.importorskip("httpx", reason="httpx is not installed")
    from transduce.serving.server import ServerThread
    from transduce.transfer.classify.serve import create_classifier_app

    app = create_classifier_app(Classifier.load(run), max_sentences=len(TEXTS), batch_wait_ms=1.0)
    with ServerThread(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        answer = client.post("/classify", json={"texts": TEXTS})
        assert answer.status_code == 200
        expected = classifier.classify(TEXTS)
        assert answer.json() == {"labels": [r.label for r in expected],
                                 "probabilities": [r.probabilities for r in expected]}  # fmt: skip
        health = client.get("/health").json()
        described = (health["status"], health["task"], health["labels"], health["pairs"])
        assert described == ("ok", "classify", ["no", "yes"], False)
        refusals = [
            ("/translate", {"sentences": ["a dog"]}, 404, "this server serves a classifier (data.task: classify): "
             "POST /classify; /translate, /attention and the page need a translation model"),
            ("/classify", {"texts": ["a film", ""]}, 422, "texts[1] is empty: an empty text has no class"),
            ("/classify", {"texts": ["a"], "texts2": ["b"]}, 422,
             "this classifier reads single texts: leave texts2 out"),
            ("/classify", {"texts": [*TEXTS, "one more"]}, 413, f"too many texts: {len(TEXTS) + 1} > max_sentences "
             f"{len(TEXTS)}"),
        ]  # fmt: skip
        for path, body, status, message in refusals:
            answer = client.post(path, json=body)
            assert (answer.status_code, answer.json()["error"]) == (status, message)
        assert client.get("/").status_code == 404


def test_transduce_serve_serves_a_classifier_with_the_limits_it_reads(run, monkeypatch):
    import transduce.serving.server

    served = {}
    monkeypatch.setattr(transduce.serving.server, "serve", lambda *args, **kwargs: served.update(kwargs))
    assert main(["serve", "--model", str(run), "--port", "0", "--max-sentences", "7", "--device", "cpu", "-q"]) == 0
    assert isinstance(served.pop("classifier"), Classifier)
    assert served == {"access_log": True, "max_sentences": 7, "max_chars": 1000, "max_body_bytes": 1_000_000,
                      "batch_wait_ms": 5.0, "max_batch_sentences": 256}  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------------
# transduce evaluate on a classifier, and the metrics


def test_evaluate_scores_the_apis_labels(classifier, run, tmp_path, capsys):
    test_file = write_tsv(tmp_path / "test.tsv", HELD_OUT)
    out = tmp_path / "labels.txt"
    capsys.readouterr()
    assert main(["evaluate", "--model", str(run), "--src", str(test_file), "-o", str(out), "--json", "-q"]) == 0
    predicted = classifier.predict(TEXTS)
    scores = classification_scores([label for label, _ in HELD_OUT], predicted, ["no", "yes"])
    assert json.loads(capsys.readouterr().out) == scores.to_dict()
    assert out.read_text(encoding="utf-8").splitlines() == predicted
    jsonl = tmp_path / "test.jsonl"
    jsonl.write_text("".join(json.dumps({"gold": label, "s": text}) + "\n" for label, text in HELD_OUT),
                     encoding="utf-8")  # fmt: skip
    argv = ["evaluate", "--model", str(run), "--src", str(jsonl), "--label-field", "gold", "--text-field", "s", "-q"]
    assert main(argv) == 0
    assert capsys.readouterr().out == scores.table() + "\n"


def test_the_metrics_of_a_hand_made_case():
    gold = ["a", "a", "a", "b", "b", "c"]
    predicted = ["a", "a", "b", "b", "a", "a"]  # c is never predicted; d is neither gold nor predicted
    s = classification_scores(gold, predicted, ["a", "b", "c", "d"])
    assert s.confusion == [[2, 1, 0, 0], [1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]]  # rows gold, columns predicted
    assert s.accuracy == 50.0 and s.support == [3, 2, 1, 0] and s.examples == 6
    assert s.precision == pytest.approx([50.0, 50.0, 0.0, 0.0])  # a: 2 of 4 predicted a; b: 1 of 2
    assert s.recall == pytest.approx([200 / 3, 50.0, 0.0, 0.0])  # a: 2 of 3 gold a; b: 1 of 2; c: 0 of 1
    assert s.f1 == pytest.approx([400 / 7, 50.0, 0.0, 0.0])  # a: 2 * 1/2 * 2/3 / (1/2 + 2/3) = 4/7
    assert s.macro_f1 == pytest.approx(100 * (4 / 7 + 1 / 2 + 0) / 3)  # a, b, c: d does not count
    assert s.table() == (
        "accuracy = 50.00  (3 of 6)\n"
        "macro-F1 = 35.71\n"
        "\n"
        "confusion matrix (rows: gold, columns: predicted)\n"
        "gold       a      b      c      d\n"
        "a          2      1      0      0\n"
        "b          1      1      0      0\n"
        "c          1      0      0      0\n"
        "d          0      0      0      0\n"
        "\n"
        "label  precision  recall      F1  support\n"
        "a          50.00   66.67   57.14        3\n"
        "b          50.00   50.00   50.00        2\n"
        "c           0.00    0.00    0.00        1\n"
        "d           0.00    0.00    0.00        0"
    )
    perfect = classification_scores(["x", "y", "y"], ["x", "y", "y"], ["x", "y"])
    assert (perfect.accuracy, perfect.macro_f1, perfect.f1) == (100.0, 100.0, [100.0, 100.0])
    assert confusion_matrix([0, 1, 1], [1, 1, 0], 2).tolist() == [[0, 1], [1, 1]]
    with pytest.raises(TransduceError, match=r"^2 gold labels but 1 predictions: nothing was scored$"):
        classification_scores(["x", "y"], ["x"], ["x", "y"])
    with pytest.raises(ValueError, match=r"^label 'z' is not one of x, y$"):
        classification_scores(["x"], ["z"], ["x", "y"])
