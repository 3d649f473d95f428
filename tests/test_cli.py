"""One command line: the same option names for the same things in every verb, decoding options checked by the
parser, config errors that name their source, training without a YAML file, and interactive translation."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from decodekit import one_thread
from trainkit import write_corpus
from transduce.cli import COMMANDS, build_parser, main
from transduce.config import Config


@pytest.fixture(autouse=True)
def _single_thread():
    with one_thread():
        yield


def subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def visible_options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions if a.help != argparse.SUPPRESS for s in a.option_strings}


def test_every_verb_names_the_model_and_the_output_the_same_way():
    parsers = subparsers()
    assert set(parsers) == set(COMMANDS)
    for verb in ("translate", "classify", "evaluate", "attention", "report", "export", "average", "serve", "import-hf",
                 "embed"):  # fmt: skip
        assert "--model" in visible_options(parsers[verb]), verb
    for verb in ("translate", "classify", "evaluate", "attention", "export", "average", "prepare", "train",
                 "quickstart", "import-hf", "embed"):  # fmt: skip
        assert {"-o", "--output"} <= visible_options(parsers[verb]), verb
        assert "--out" not in visible_options(parsers[verb]), verb  # the old spelling: accepted, not listed
    for verb in parsers:
        assert not {"--out", "--hyp-out"} & visible_options(parsers[verb]), verb


def test_old_spellings_are_still_accepted():
    parser = build_parser()
    assert parser.parse_args(["prepare", "--out", "p"]).output == "p"
    assert parser.parse_args(["quickstart", "--out", "q"]).output == "q"
    assert parser.parse_args(["attention", "--model", "m", "--src", "a", "--out", "a.png"]).output == "a.png"
    assert parser.parse_args(["evaluate", "--hyp", "h", "--ref", "r", "--hyp-out", "o"]).output == "o"
    args = parser.parse_args(["average", "runs/x", "--last", "2", "--out", "avg"])
    assert (args.paths, args.model, args.last, args.output) == (["runs/x"], None, 2, "avg")
    args = parser.parse_args(["export", "--format", "hf", "runs/x", "models/y"])
    from transduce.commands.options import model_and_output

    assert model_and_output(args, "the model") == ("runs/x", "models/y")
    assert model_and_output(parser.parse_args(["export", "--format", "hf", "--model", "a", "-o", "b"]), "") == (
        "a",
        "b",
    )


@pytest.mark.parametrize("argv", [["export", "--format", "hf", "--model", "a"], ["import-hf", "-o", "b"]])
def test_export_and_import_name_what_is_missing(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    missing = "-o/--output" if "--model" in argv else "--model"
    assert err.startswith(f"transduce {argv[0]}: error: {missing} needed: --model PATH (") and err.count("\n") == 1


@pytest.mark.parametrize("verb", ["translate", "evaluate", "attention", "serve"])
@pytest.mark.parametrize("beam", ["0", "-2"])
def test_beam_below_one_is_refused_by_every_verb(verb, beam, capsys):
    argv = [verb, "--model", "m", "--beam", beam]
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(argv)
    assert info.value.code == 2
    assert capsys.readouterr().err == f"transduce {verb}: --beam must be >= 1 (got {beam})\n"


def test_report_and_nbest_counts_below_one_are_refused(capsys):
    for argv, option in ((["report", "r", "--beam", "0"], "--beam"), (["translate", "--model", "m", "--nbest", "0"],
                         "--nbest"), (["average", "--model", "r", "--last", "0"], "--last")):  # fmt: skip
        with pytest.raises(SystemExit):
            build_parser().parse_args(argv)
        assert capsys.readouterr().err == f"transduce {argv[0]}: {option} must be >= 1 (got 0)\n"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["translate", "--model", "m", "--beam", "four"])
    assert capsys.readouterr().err == "transduce translate: --beam must be an integer >= 1 (got 'four')\n"


def test_unrecognized_arguments_are_still_refused(capsys):
    with pytest.raises(SystemExit):
        main(["prepare", "--train", "t", "data.max_len=3", "--bogus"])
    assert capsys.readouterr().err == "transduce prepare: unrecognized arguments: --bogus\n"
    with pytest.raises(SystemExit):
        main(["translate", "--model", "m", "stray"])
    assert capsys.readouterr().err == "transduce translate: unrecognized arguments: stray\n"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["translate", "--threads", "-1"], "--threads must be >= 0 (got -1)"),
        (["translate", "--max-len-b", "-1"], "--max-len-b must be >= 0 (got -1)"),
        (["translate", "--max-tokens", "0"], "--max-tokens must be >= 1 (got 0)"),
        (["translate", "--nbest", "0"], "--nbest must be >= 1 (got 0)"),
        (["translate", "--top-p", "1.5"], "--top-p must be in (0, 1] (got 1.5)"),
        (["translate", "--temperature", "0"], "--temperature must be > 0 (got 0)"),
        (["translate", "--length-penalty", "nan"], "--length-penalty must be >= 0 (got nan)"),
        (["evaluate", "--min-len", "-3"], "--min-len must be >= 0 (got -3)"),
        (["serve", "--port", "70000"], "--port must be between 0 and 65535 (got 70000)"),
        (["serve", "--port", "-1"], "--port must be between 0 and 65535 (got -1)"),
        (["serve", "--max-sentences", "0"], "--max-sentences must be >= 1 (got 0)"),
        (["serve", "--batch-wait-ms", "-5"], "--batch-wait-ms must be >= 0 (got -5)"),
    ],
)
def test_out_of_range_options_are_one_line_naming_the_flag(argv, message, capsys):
    with pytest.raises(SystemExit) as info:  # before any model is loaded: "missing" does not exist
        main([*argv, "--model", "missing", "--ref", "r"] if argv[0] == "evaluate" else [*argv, "--model", "missing"])
    assert info.value.code == 2
    assert capsys.readouterr().err == f"transduce {argv[0]}: {message}\n"


def test_decoding_errors_found_by_the_config_name_the_option_given():
    from transduce.commands.translate import decode_config
    from transduce.config import ConfigError, DecodeConfig

    args = build_parser().parse_args(["translate", "--model", "m"])
    args.sampling, args.top_p = True, 1.5  # past argparse's check, as a caller of decode_config could give it
    with pytest.raises(ConfigError, match=r"^--top-p: must be in \(0, 1\], got 1.5$"):
        decode_config(args, DecodeConfig())


def test_an_unknown_option_after_a_verb_is_reported_by_that_verb_with_the_closest_option(capsys):
    with pytest.raises(SystemExit) as info:
        main(["translate", "--model", "m", "--beams", "3"])
    assert info.value.code == 2
    assert capsys.readouterr().err == "transduce translate: unrecognized arguments: --beams 3; did you mean --beam?\n"
    with pytest.raises(SystemExit):
        main(["evaluate", "--hyp", "h", "--ref", "r", "--bogus"])
    assert capsys.readouterr().err == "transduce evaluate: unrecognized arguments: --bogus\n"


def test_a_missing_or_unknown_verb_is_one_line(capsys):
    with pytest.raises(SystemExit) as info:
        main([])
    assert (
        info.value.code == 2 and capsys.readouterr().err == "transduce: the following arguments are required: COMMAND\n"
    )
    with pytest.raises(SystemExit):
        main(["translat"])
    err = capsys.readouterr().err
    assert err.startswith("transduce: COMMAND: invalid choice: 'translat' (choose from ") and err.count("\n") == 1


def test_verbose_and_quiet_are_accepted_before_and_after_the_verb(capsys):
    parser = build_parser()
    for argv, verbose, quiet in (
        (["translate", "--model", "m"], False, False),
        (["-v", "translate", "--model", "m"], True, False),
        (["translate", "--model", "m", "-v"], True, False),
        (["translate", "-q", "--model", "m"], False, True),
        (["--quiet", "prepare"], False, True),
        (["train", "c.yaml", "--verbose"], True, False),
    ):
        args = parser.parse_args(argv)
        assert (args.verbose, args.quiet) == (verbose, quiet), argv
    with pytest.raises(SystemExit) as info:
        main(["-v", "translate", "--model", "m", "-q"])
    assert info.value.code == 2
    assert capsys.readouterr().err == "transduce translate: -v/--verbose and -q/--quiet exclude each other\n"


def test_quiet_after_the_verb_leaves_only_warnings_on_stderr(checkpoint, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("a dog.\n", encoding="utf-8")
    argv = [sys.executable, "-m", "transduce.cli", "translate", "--model", str(checkpoint), "-i", str(src)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRANSDUCE_KERNELS": "0"}  # no kernel build to wait for or report
    loud = subprocess.run([*argv, "--threads", "1"], capture_output=True, text=True, env=env, timeout=600)
    quiet = subprocess.run([*argv, "--threads", "1", "-q"], capture_output=True, text=True, env=env, timeout=600)
    assert loud.returncode == quiet.returncode == 0
    assert "INFO transduce.training.checkpoint: loaded" in loud.stderr and quiet.stderr == ""
    assert quiet.stdout == loud.stdout and quiet.stdout.count("\n") == 1


def test_a_port_in_use_is_refused_before_the_model_is_loaded(capsys):
    pytest.importorskip("uvicorn")
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", "--model", "missing", "--port", str(port)]) == 2
    assert capsys.readouterr().err == (
        f"transduce serve: error: cannot listen on 127.0.0.1:{port}: the port is in use (another server?); "
        "choose another with --port\n"
    )
    assert main(["serve", "--model", "missing", "--host", "no-such-host.invalid"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("transduce serve: error: --host no-such-host.invalid: not an address of this machine (")
    assert err.count("\n") == 1


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.startswith("transduce 0.")


# ----------------------------------------------------------------------------------------------------------------------
# training from the command line


@pytest.fixture(scope="module")
def tsv_corpus(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("tsv")
    corpus = write_corpus(root / "corpus")
    paths = []
    for split in ("train", "valid"):
        src = (corpus / f"{split}.en").read_text(encoding="utf-8").splitlines()
        path = root / f"{split}.tsv"
        path.write_text("".join(f"{s}\t{s}\n" for s in src), encoding="utf-8")
        paths.append(path)
    return paths[0], paths[1]


def test_train_without_a_yaml_file(tsv_corpus, tmp_path):
    train, valid = tsv_corpus
    run = tmp_path / "run"
    # overrides may come before and after the options
    argv = ["train", "train.max_steps=3", "--preset", "test", "--train", str(train), "--valid", str(valid), "-o",
            str(run), "--vocab-size", "320", "--workers", "1", "train.valid_every=3", "train.valid_bleu=false",
            "train.threads=1", "train.max_tokens=256"]  # fmt: skip
    assert main(argv) == 0
    config = Config.load(run / "config.yaml")
    expected = Config.resolve(
        {"model": {"preset": "test"}},
        [argv[1], *argv[-4:]],
        options={"data": {"train": str(train), "valid": str(valid), "vocab_size": 320, "workers": 1},
                 "train": {"run_dir": str(run)}},
    )  # fmt: skip
    # every other value is the dataclasses' default; the vocabulary sizes and the prepared directory come from the data
    assert config.train == expected.train and config.decode == expected.decode
    assert config.model.replace(src_vocab_size=320, tgt_vocab_size=320) == expected.model.replace(
        src_vocab_size=320, tgt_vocab_size=320
    )
    assert config.data.replace(prepared="") == expected.data
    assert (run / "checkpoints").is_dir()


def test_a_failed_train_leaves_no_run_directory(tsv_corpus, tmp_path, capsys):
    run = tmp_path / "runs" / "new"
    missing = tmp_path / "missing.tsv"
    assert main(["train", "--preset", "test", "--train", str(missing), "-o", str(run)]) == 2
    assert capsys.readouterr().err == f"transduce train: error: {missing}: file not found (data.train)\n"
    assert not (tmp_path / "runs").exists()  # the directories the run created, parents too
    # a directory that was there before is left alone, even empty
    run.mkdir(parents=True)
    assert main(["train", "--preset", "test", "--train", str(missing), "-o", str(run)]) == 2
    assert run.is_dir()


def test_train_errors_name_their_source(tsv_corpus, capsys):
    train, _ = tsv_corpus
    assert main(["train", "--preset", "smal", "--train", str(train)]) == 2
    assert capsys.readouterr().err == (
        "transduce train: error: command-line options: model.preset: unknown model preset 'smal'; did you mean "
        "'small'? (valid presets: base, big, small, tiny, test)\n"
    )
    assert main(["train", "configs/toy.yaml", "train.max_stpes=3"]) == 2
    assert capsys.readouterr().err.startswith(
        "transduce train: error: command-line override 'train.max_stpes=3': unknown key 'train.max_stpes'; did you "
        "mean 'train.max_steps'? (valid keys: "
    )
    assert main(["train", "--resume", "runs/x", "--preset", "tiny"]) == 2
    assert capsys.readouterr().err == (
        "transduce train: error: --resume takes the run's own config; change it with KEY=VALUE overrides\n"
    )
    assert main(["train"]) == 2
    assert capsys.readouterr().err == (
        "transduce train: error: missing CONFIG.yaml (or --resume RUN_DIR, or --preset NAME with the data: --train "
        "CORPUS)\n"
    )


# ----------------------------------------------------------------------------------------------------------------------
# interactive translation


def test_interactive_translation_answers_each_line_before_the_next(checkpoint, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "transduce.cli", "translate", "--model", str(checkpoint), "--beam", "2"]
    log = open(tmp_path / "stderr.txt", "wb")  # noqa: SIM115 (closed below; a pipe nobody reads could fill up)
    pipe = subprocess.PIPE
    proc = subprocess.Popen([*argv, "--interactive"], stdin=pipe, stdout=pipe, stderr=log, env=env)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        answers = []
        for line in ("a man rides.", "", "ein Hund."):
            proc.stdin.write((line + "\n").encode())
            proc.stdin.flush()  # stdin stays open: the answer must come now, not at the end of input
            answers.append(proc.stdout.readline().decode("utf-8"))
        proc.stdin.close()
        assert proc.wait(timeout=120) == 0, (tmp_path / "stderr.txt").read_text()
    finally:
        proc.kill()
        log.close()
    assert len(answers) == 3 and all(a.endswith("\n") for a in answers) and answers[1] == "\n"
    batch = subprocess.run(argv, input=b"a man rides.\n\nein Hund.\n", capture_output=True, env=env, timeout=300)
    assert batch.stdout.decode("utf-8") == "".join(answers)
