"""``transduce prepare`` on the command line: flags, config file + dotted overrides, one-line errors, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from transduce.cli import main


def write(directory: Path, name: str, n: int = 300, drop_last_de: bool = False) -> str:
    words = ["the", "a", "dog", "runs", "in", "park", "red", "big", "café", "über"]
    src = [" ".join(words[(i * 7 + k) % len(words)] for k in range(3 + i % 9)) for i in range(n)]
    (directory / f"{name}.en").write_text("".join(s + "\n" for s in src), encoding="utf-8")
    tgt = [s.upper() for s in src][: n - 1 if drop_last_de else n]
    (directory / f"{name}.de").write_text("".join(t + "\n" for t in tgt), encoding="utf-8")
    return str(directory / name)


def run(capsys, *argv: str) -> tuple[int, str]:
    code = main(["prepare", *argv])
    return code, capsys.readouterr().err


def test_flags(tmp_path, capsys):
    train = write(tmp_path, "train")
    test = write(tmp_path, "test_a", n=20)
    out = tmp_path / "out"
    code, _ = run(capsys, "--train", train, "--test", test, "--output", str(out), "--vocab-size", "300",
                  "--separate-vocab", "--lowercase", "--max-len", "50", "--dedup", "--workers", "1")  # fmt: skip
    assert code == 0
    manifest = json.loads((out / "manifest.json").read_text())
    opts = manifest["options"]
    assert (opts["vocab_size"], opts["joint_vocab"], opts["lowercase"], opts["max_len"], opts["dedup"]) == (
        300, False, True, 50, True
    )  # fmt: skip
    assert list(manifest["splits"]) == ["train", "test_a"] and manifest["splits"]["test_a"]["pairs"] == 20


def test_config_file_overrides_and_flags(tmp_path, capsys):
    train = write(tmp_path, "train")
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"data:\n  train: {train}\n  vocab_size: 999\n  max_len: 77\n  prepared: {tmp_path / 'prep'}\n")
    code, _ = run(capsys, "--config", str(cfg), "--vocab-size", "300", "data.max_len=66", "data.workers=1")
    assert code == 0
    opts = json.loads((tmp_path / "prep" / "manifest.json").read_text())["options"]
    assert opts["vocab_size"] == 300 and opts["max_len"] == 66  # flag over file, override over file


def test_errors_are_one_line_with_exit_code_2(tmp_path, capsys):
    train = write(tmp_path, "train")
    bad = write(tmp_path, "bad", drop_last_de=True)
    out = str(tmp_path / "out")
    cases = [
        (["--train", bad, "-o", out], f"{bad}.en has 300 lines but {bad}.de has 299: a parallel corpus needs one line "
                                      "per sentence on both sides"),
        (["--train", str(tmp_path / "none"), "-o", out], f"{tmp_path / 'none.en'}: file not found (nor none.en.gz)"),
        (["--train", train], "no output directory: pass --output DIR or set data.prepared"),
        (["-o", out], "no training corpus: set data.train (--train PREFIX|FILE.tsv|FILE.jsonl, or --src-file and "
                      "--tgt-file)"),
        (["--train", train, "-o", out, "data.vocab_sise=8"],
         "command-line override 'data.vocab_sise=8': unknown key 'data.vocab_sise'; did you mean 'data.vocab_size'? "
         "(valid keys: src_lang, "),
        (["--train", train, "-o", out, "--src-lang", "de"], "command-line options: data.tgt_lang: source and target "
                                                            "language are both 'de'\n"),
        (["--train", train, "-o", out, "--vocab-size", "50", "--workers", "1"], "vocab_size 50 is too small for the "
                                                                             "joint vocabulary"),
        (["--train", train, "-o", out, "data.vocab_type=bep"], "command-line override 'data.vocab_type=bep': "
                                                               "data.vocab_type: 'bep' is not one of 'bpe', 'unigram'; "
                                                               "did you mean 'bpe'?\n"),
        (["--train", train, "--src-file", train + ".en", "--tgt-file", train + ".de", "-o", out],
         "give the training corpus once: --train CORPUS or --src-file and --tgt-file\n"),
        (["--src-file", train + ".en", "-o", out],
         "--src-file and --tgt-file go together (the two sides of the training corpus)\n"),
        (["--src-file", train + ".en", "--tgt-file", str(tmp_path / "none.de"), "-o", out],
         f"{tmp_path / 'none.de'}: file not found (data.train)\n"),
    ]  # fmt: skip
    for argv, expected in cases:
        code, err = run(capsys, *argv)
        assert code == 2, argv
        assert err.startswith(f"transduce prepare: error: {expected}"), err
        assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_end_to_end_in_a_subprocess(tmp_path):
    train = write(tmp_path, "train")
    argv = [sys.executable, "-m", "transduce.cli", "prepare", "--train", train, "--output", str(tmp_path / "o"),
            "--vocab-size", "300"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "train: read 300 pairs, kept 300" in done.stderr
    done = subprocess.run([*argv[:-1], "100"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].startswith("transduce prepare: error: ")


@pytest.mark.slow
def test_a_killed_prepare_leaves_no_output_and_the_rerun_cleans_up(tmp_path):
    train = write(tmp_path, "train", n=40_000)
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "transduce.cli", "prepare", "--train", train, "--output", str(out), "--vocab-size",
            "300", "--workers", "1"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".out.tmp-*/train.src.bin")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.kill()  # SIGKILL: no chance to clean up
    proc.wait()
    if proc.returncode == 0:
        pytest.skip("prepare finished before it could be killed")
    assert not out.exists()
    assert subprocess.run(argv, capture_output=True, timeout=120).returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "train.de", "train.en"]
