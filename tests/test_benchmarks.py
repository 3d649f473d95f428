"""The benchmark scripts' shared harness (benchmarks/harness.py): tables, interleaved timing, the machine line; every
script imports and uses it, and none speaks of anything but the repository."""

from __future__ import annotations

import importlib
import json
import re
import sys
from pathlib import Path

import pytest

from transduce import fastpaths

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = sorted(p.stem for p in BENCHMARKS.glob("*.py") if p.stem not in ("harness", "train_common"))


@pytest.fixture(scope="module")
def harness():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module("harness")
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.fixture(scope="module")
def toy_pair(tmp_path_factory):
    """A toy corpus (with a test split: the validation sentences reversed word by word) and two toy runs trained on
    it with seeds 1 and 2: a pair to ensemble, shared by the tests of the scripts that take one."""
    from trainkit import toy_config, write_corpus
    from transduce.training.train import train

    root = tmp_path_factory.mktemp("toy_pair")
    corpus = write_corpus(root / "corpus", n_train=200, n_valid=12)
    for lang in ("en", "de"):
        lines = (corpus / f"valid.{lang}").read_text(encoding="utf-8").splitlines()
        (corpus / f"test.{lang}").write_text("".join(" ".join(x.split()[::-1]) + "\n" for x in lines), encoding="utf-8")
    runs = [root / f"s{seed}" for seed in (1, 2)]
    for seed, run in zip((1, 2), runs, strict=True):
        assert train(toy_config(corpus, run, seed=seed, max_steps=30, valid_every=10, log_every=10)).exit_code == 0
    return corpus, runs


def test_table_is_markdown(harness):
    text = harness.table(("a", "b c"), [(1, "x"), ("2.50", None)])
    assert text == "| a | b c |\n|---|---|\n| 1 | x |\n| 2.50 | None |"


def test_interleaved_rotates_who_goes_first_and_reports_what_each_run_returns(harness):
    calls = []
    fns = {name: (lambda name=name: calls.append(name) or (0.5 if name == "b" else None)) for name in "abc"}
    times = harness.interleaved(fns, reps=3, warmup=1)
    assert calls == ["a", "b", "c", "a", "b", "c", "b", "c", "a", "c", "a", "b"]  # a warm-up each, then rotated
    assert times["b"] == [0.5, 0.5, 0.5] and all(0 <= t < 0.5 for t in times["a"] + times["c"])
    assert harness.median_seconds(lambda: 2.0, reps=3) == 2.0


def test_interleaved_pieces_runs_every_contender_on_a_part_before_the_next_part(harness, monkeypatch):
    calls = []
    clock = iter(range(1000))
    monkeypatch.setattr(harness.time, "perf_counter", lambda: float(next(clock)))
    fns = {name: (lambda i, name=name: calls.append((name, i))) for name in "ab"}
    times = harness.interleaved_pieces(fns, pieces=3, reps=2)
    # part by part, the order rotating with the part and the repetition
    first = [("a", 0), ("b", 0), ("b", 1), ("a", 1), ("a", 2), ("b", 2)]
    second = [("b", 0), ("a", 0), ("a", 1), ("b", 1), ("b", 2), ("a", 2)]
    assert calls == [*first, *second]
    assert times == {"a": [3.0, 3.0], "b": [3.0, 3.0]}  # each part one tick of the patched clock, summed


def test_the_machine_line_says_what_ran(harness):
    line = harness.machine()
    assert re.match(r"\d{4}-\d{2}-\d{2}; torch ", line)
    assert harness.cpu_features().split(",")[0] in line and fastpaths.settings.describe() in line
    with fastpaths.override(kernels=False):
        assert "kernels=False" in harness.machine()


def test_common_arguments(harness):
    import argparse

    ap = argparse.ArgumentParser()
    harness.add_common_args(ap, threads=1, reps=7)
    args = ap.parse_args([])
    assert (args.threads, args.reps) == (1, 7)
    ap = argparse.ArgumentParser()
    harness.add_common_args(ap, reps=None)
    assert not hasattr(ap.parse_args(["--threads", "2"]), "reps")


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_uses_the_harness_and_speaks_only_of_the_repository(script):
    text = (BENCHMARKS / f"{script}.py").read_text(encoding="utf-8")
    assert "\nfrom harness import " in text, f"{script}.py does not use the harness"
    assert "print(machine())" in text and "add_common_args(" in text and "table(" in text, script
    for pattern in (r"\bsessions?\b", r"\bissues?\b", r"\btickets?\b", r"\br\d{1,2}\b", r"\btargets? (is|are) "):
        assert not re.search(pattern, text, re.I), (script, pattern)


def test_the_kept_scripts(harness):
    assert SCRIPTS == ["bpe_dropout", "casing", "decode_compare", "gpu_check", "kv_cache", "linear_backends",
                       "movie_reviews", "multi30k_select", "prepare", "ptb_select", "scaling", "serve_load",
                       "train_memory", "train_speed", "utf8_check"]  # fmt: skip


def test_movie_reviews_reads_a_classifier_runs_best_accuracy_and_minutes(harness, tmp_path):
    movie_reviews = importlib.import_module("movie_reviews")
    for seed, (accs, minutes) in enumerate((([61.5, 74.0, 73.0], 9.5), ([70.0, 72.0, 76.0], 10.25)), start=1):
        run = tmp_path / f"s{seed}"
        run.mkdir()
        events = [{"event": "valid", "step": 100 * (i + 1), "accuracy": a} for i, a in enumerate(accs)]
        events.insert(1, {"event": "train", "step": 150, "loss": 0.5})
        (run / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
        log = f"x INFO transduce.training.train: finished (max_steps) at step 300 in {minutes} min\n"
        (run / "train.log").write_text(log)
    assert movie_reviews.run_summary(tmp_path / "s1") == (74.0, 200, 300, 9.5)
    per_row, per_run = movie_reviews.runs_table([f"scratch={tmp_path / 's1'},{tmp_path / 's2'}"])
    assert per_row == [["scratch", "74.00 / 76.00", "75.00% ± 1.41", "10.2"]]
    assert [r[2:] for r in per_run] == [["74.00%", "200", "300", "9.5"], ["76.00%", "300", "300", "10.2"]]
    (tmp_path / "s3").mkdir()
    (tmp_path / "s3" / "metrics.jsonl").write_text("", encoding="utf-8")
    (tmp_path / "s3" / "train.log").write_text("still training\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="no 'finished' line"):
        movie_reviews.run_summary(tmp_path / "s3")


def test_multi30k_select_breaks_ties_towards_the_first_candidate(harness):
    select = importlib.import_module("multi30k_select")
    assert select.best([(40.0, "last"), (40.5, "avg3"), (40.5, "avg6")]) == "avg3"
    assert select.best([(41.0, "own"), (41.0, "other")]) == "own"


@pytest.mark.slow
def test_multi30k_select_scores_an_ensemble_chosen_on_validation_and_its_members(
    harness, toy_pair, tmp_path, monkeypatch
):
    from transduce.config import Config
    from transduce.search.translator import Translator
    from transduce.training.report import score_both

    select = importlib.import_module("multi30k_select")
    corpus, runs = toy_pair
    out = tmp_path / "ens"
    argv = ["multi30k_select.py", *map(str, runs), "--average", "2", "--beams", "1,2", "--alphas", "1.0",
            "--metric", "bleu", "--test", str(corpus / "test"), "--out", str(out), "--threads", "1"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    select.main()
    result = json.loads((out / "scores.json").read_text(encoding="utf-8"))
    models = [Path(m) for m in result["models"]]
    assert [m.is_relative_to(run) for m, run in zip(models, runs, strict=True)] == [True, True]  # one per run
    assert result["decode"]["beam"] in (1, 2) and list(result["sets"]) == ["valid", "test"]
    assert set(result["members"]) == set(result["models"])
    assert all(list(sets) == ["valid", "test"] for sets in result["members"].values())
    # the ensemble's scores are those of its models translating together with the chosen settings
    translator = Translator.load(models, decode=Config.load(runs[0] / "config.yaml").decode.replace(**result["decode"]))
    for name in ("valid", "test"):
        sources = (corpus / f"{name}.en").read_text(encoding="utf-8").splitlines()
        references = (corpus / f"{name}.de").read_text(encoding="utf-8").splitlines()
        hypotheses = translator.translate(sources)
        assert (out / f"{name}.hyp.de").read_text(encoding="utf-8").splitlines() == hypotheses
        assert result["sets"][name] == score_both(hypotheses, references, "de")


@pytest.mark.slow
def test_casing_translates_with_the_ensemble_of_its_models(harness, toy_pair, monkeypatch, capsys):
    from sacrebleu.metrics import BLEU

    from transduce.search.evaluate import score
    from transduce.search.translator import Translator

    casing_script = importlib.import_module("casing")
    corpus, runs = toy_pair
    argv = ["casing.py", "--model", str(runs[0]), "--model", str(runs[1]), "--src", str(corpus / "valid.en"),
            "--ref", str(corpus / "valid.de"), "--lang", "de", "--input-case", "keep", "--threads", "1"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    casing_script.main()
    out = capsys.readouterr().out
    assert f"model {runs[0]} + {runs[1]}; 12 sentences" in out
    rows = {cells[1]: cells for cells in (line.split(" | ") for line in out.splitlines()) if cells[0] == "| keep"}
    sources = (corpus / "valid.en").read_text(encoding="utf-8").splitlines()
    references = (corpus / "valid.de").read_text(encoding="utf-8").splitlines()
    ensemble = Translator.load(runs)
    normal = ensemble.translate(sources)
    upper = ensemble.translate([s.upper() for s in sources])
    assert normal != Translator.load(runs[0]).translate(sources)  # the ensemble, not its first model
    assert rows["normal"][4] == f"{score(normal, references).bleu:.2f}"
    assert rows["ALL CAPS"][2] == f"{BLEU(lowercase=True).corpus_score(upper, [references]).score:.2f}"


@pytest.mark.slow
def test_ptb_select_chooses_on_the_tuning_split_and_parses_the_development_files_once(harness, tmp_path, monkeypatch):
    from test_parsing_model import toy_parse_config, write_toy_treebank
    from transduce.parsing.evalb import evalb
    from transduce.parsing.parser import PAPER_DECODE, Parser
    from transduce.parsing.trees import read_treebank
    from transduce.search.translator import Translator
    from transduce.training import checkpoint as ckpt
    from transduce.training.train import train

    select = importlib.import_module("ptb_select")
    train_mrg, tuning_mrg = write_toy_treebank(tmp_path / "treebank")
    dev_mrg = tmp_path / "treebank" / "toy_dev.mrg"  # the tuning trees in reverse order: another file to parse once
    trees = tuning_mrg.read_text(encoding="utf-8").splitlines()
    dev_mrg.write_text("\n".join(trees[::-1]) + "\n", encoding="utf-8")
    runs = [tmp_path / f"s{seed}" for seed in (1, 2)]
    for seed, run in zip((1, 2), runs, strict=True):
        more = (f"train.seed={seed}", "train.max_steps=60", "train.valid_every=20", "train.keep_last=3")
        assert train(toy_parse_config(train_mrg, tuning_mrg, run, *more)).exit_code == 0
    own = [path.resolve() for _, path in select.own_candidates(runs[0])]  # what `parse --model RUN` takes first
    assert own[0] == ckpt.resolve(runs[0]).resolve() and len(set(own)) == len(own)
    out = tmp_path / "pair"
    argv = ["ptb_select.py", *map(str, runs), "--average", "2", "--beams", "1,3", "--alphas", "0.3,1.0",
            "--dev", str(dev_mrg), "--out", str(out), "--threads", "1"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    select.main()
    result = json.loads((out / "scores.json").read_text(encoding="utf-8"))
    models = [Path(m) for m in result["models"]]
    assert [m.is_relative_to(run) for m, run in zip(models, runs, strict=True)] == [True, True]  # one per run
    assert result["decode"]["beam"] in (1, 3) and result["decode"]["length_penalty"] in (0.3, 1.0)
    assert list(result["sets"]) == ["tuning", "dev"] and set(result["members"]) == set(result["models"])
    # the written trees and scores are those of the ensemble parsing with the chosen search, every tree well-formed
    parser = Parser(Translator.load(models))
    for name, path in (("tuning", tuning_mrg), ("dev", dev_mrg)):
        gold = read_treebank(str(path))
        parses = parser.parse([t.words() for t in gold], PAPER_DECODE.replace(**result["decode"]))
        written = (out / f"{name}.trees").read_text(encoding="utf-8").splitlines()
        assert written == [r.tree.to_string() for r in parses]
        assert result["sets"][name]["f1"] == round(evalb(gold, [r.tree for r in parses]).f1, 2)
        assert result["sets"][name]["repaired"] == 0 and result["sets"][name]["treebank"] == str(path)
