"""Outputs never destroy inputs, and are written whole or not at all: the same-file check every verb runs before it
reads or writes anything, and the temporary file renamed over an output only on success (transduce.files)."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from decodekit import one_thread
from transduce.cli import COMMANDS, build_parser, main
from transduce.errors import TransduceError
from transduce.files import check_outputs, open_output, replaced_on_success, same_file


@pytest.fixture(autouse=True)
def _single_thread():
    with one_thread():
        yield


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.rstrip("\n")


# ----------------------------------------------------------------------------------------------------------------------
# an output that is an input


def test_same_file_sees_through_links_and_other_spellings(tmp_path):
    a = tmp_path / "a.txt"
    a.write_text("x\n", encoding="utf-8")
    (tmp_path / "sub").mkdir()
    os.symlink(a, tmp_path / "link.txt")
    os.link(a, tmp_path / "hard.txt")
    assert same_file(a, tmp_path / "sub" / ".." / "a.txt")
    assert same_file(tmp_path / "link.txt", a) and same_file(tmp_path / "hard.txt", a)
    assert same_file(tmp_path / "new.txt", tmp_path / "new.txt")  # one path, whether it exists or not
    assert not same_file(a, tmp_path / "new.txt") and not same_file(a, tmp_path / "sub")


def test_check_outputs_names_both_options_in_one_line(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("x\n", encoding="utf-8")
    with pytest.raises(TransduceError) as info:
        check_outputs([("--model", ["m1", "m2"]), ("-i/--input", str(src))], [("-o/--output", str(src))])
    assert str(info.value) == f"-o/--output {src} is the same file as -i/--input {src}: refusing to overwrite an input"
    with pytest.raises(TransduceError, match=r"^--scores s.json is the same file as -o/--output s.json: each output "
                       r"needs a file of its own$"):  # fmt: skip
        check_outputs([("-i/--input", "-")], [("-o/--output", "s.json"), ("--scores", "s.json")])
    treebank = tmp_path / "wsj.mrg"
    treebank.write_text("", encoding="utf-8")
    with pytest.raises(TransduceError, match="is the same file as --treebank"):  # PATH:RANGE counts as PATH
        check_outputs([("--treebank", f"{treebank}:wsj_0001-wsj_0099")], [("--scores", str(treebank))])
    with pytest.raises(TransduceError, match=rf"^-o/--output {tmp_path} holds --train {src}: refusing to replace a "
                       r"directory that holds an input$"):  # fmt: skip
        check_outputs([("--train", str(src))], [], replaced=[("-o/--output", str(tmp_path))])
    # distinct files, standard streams, absent options: nothing to refuse
    check_outputs([("-i/--input", "-"), ("--model", None)], [("-o/--output", "-"), ("--scores", None)])
    check_outputs([("-i/--input", str(src))], [("-o/--output", str(tmp_path / "out.txt"))])
    check_outputs([("--model", str(tmp_path))], [("-o/--output", str(tmp_path / "avg"))], replaced=[])


#: verb -> (arguments before the paths, input option, output option); {model} is a model directory, {x} the file
SAME_FILE_CASES = {
    "translate -i": (["translate", "--model", "{model}", "-i", "{x}", "-o", "{x}"], "-i/--input", "-o/--output"),
    "evaluate --ref": (["evaluate", "--model", "{model}", "--src", "{y}", "--ref", "{x}", "-o", "{x}"], "--ref",
                       "-o/--output"),
    "evaluate --hyp": (["evaluate", "--hyp", "{x}", "--ref", "{y}", "-o", "{x}"], "--hyp", "-o/--output"),
    "parse --input": (["parse", "--model", "{model}", "--input", "{x}", "--output", "{x}"], "-i/--input",
                      "-o/--output"),
    "parse --treebank": (["parse", "--baseline", "right-branching", "--treebank", "{x}", "--scores", "{x}"],
                         "--treebank", "--scores"),
    "attention --model": (["attention", "--model", "{x}", "--src", "a dog.", "-o", "{x}"], "--model", "-o/--output"),
    "average --model": (["average", "--model", "{x}", "{y}", "-o", "{x}"], "--model", "-o/--output"),
    "export --model": (["export", "--format", "hf", "--model", "{x}", "-o", "{x}", "--force"], "--model",
                       "-o/--output"),
    "import-hf --model": (["import-hf", "--model", "{x}", "-o", "{x}", "--force"], "--model", "-o/--output"),
    "prepare --train": (["prepare", "--train", "{x}", "-o", "{x}", "--force"], "--train", "-o/--output"),
    "train CONFIG": (["train", "{x}", "-o", "{x}"], "CONFIG.yaml", "-o/--output"),
}  # fmt: skip


@pytest.mark.parametrize("case", SAME_FILE_CASES)
def test_every_verb_refuses_an_output_that_is_one_of_its_inputs(case, tmp_path, capsys):
    argv, input_option, output_option = SAME_FILE_CASES[case]
    x, y = tmp_path / "x.txt", tmp_path / "y.txt"
    x.write_bytes(b"precious\n")
    y.write_bytes(b"other\n")
    os.symlink(x, tmp_path / "link.txt")
    for spelling in (x, tmp_path / "link.txt", tmp_path / "." / "x.txt"):
        # the model does not exist: the check comes before anything is read
        args = [a.format(model=tmp_path / "no-model", x=x, y=y) for a in argv]
        args[len(args) - 1 - args[::-1].index(str(x))] = str(spelling)  # the output's spelling of x
        assert main(args) == 2
        verb = argv[0]
        assert _error_line(capsys) == (f"transduce {verb}: error: {output_option} {spelling} is the same file as "
                                       f"{input_option} {x}: refusing to overwrite an input")  # fmt: skip
        assert x.read_bytes() == b"precious\n" and sorted(p.name for p in tmp_path.iterdir()) == [
            "link.txt", "x.txt", "y.txt"]  # fmt: skip


def test_a_directory_that_holds_an_input_is_not_replaced(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "train.tsv").write_text("a\tb\n", encoding="utf-8")
    assert main(["prepare", "--train", str(corpus / "train.tsv"), "-o", str(corpus), "--force"]) == 2
    assert _error_line(capsys) == (
        f"transduce prepare: error: -o/--output {corpus} holds --train {corpus / 'train.tsv'}: refusing to replace a "
        "directory that holds an input"
    )
    assert [p.name for p in corpus.iterdir()] == ["train.tsv"]


def test_the_older_positional_spelling_is_checked_too(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}", encoding="utf-8")
    assert main(["export", "--format", "hf", str(model), str(model), "--force"]) == 2
    assert _error_line(capsys) == (f"transduce export: error: -o/--output {model} is the same file as --model "
                                   f"{model}: refusing to overwrite an input")  # fmt: skip
    assert [p.name for p in model.iterdir()] == ["config.json"]


def test_standard_output_redirected_to_the_input_is_refused(checkpoint, tmp_path):
    src = tmp_path / "in.txt"
    src.write_bytes(b"a dog.\n")
    with open(src, "ab") as stdout:  # transduce translate -i in.txt >> in.txt
        argv = [sys.executable, "-m", "transduce.cli", "translate", "--model", str(checkpoint), "-i", str(src)]
        proc = subprocess.run(argv, stdout=stdout, stderr=subprocess.PIPE, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.decode() == (f"transduce translate: error: standard output is the same file as -i/--input "
                                    f"{src}: refusing to overwrite an input\n")  # fmt: skip
    assert src.read_bytes() == b"a dog.\n"
    with open(src, "rb") as stdin:  # transduce translate -o in.txt < in.txt
        argv = [sys.executable, "-m", "transduce.cli", "translate", "--model", str(checkpoint), "-o", str(src)]
        proc = subprocess.run(argv, stdin=stdin, capture_output=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.decode() == (f"transduce translate: error: -o/--output {src} is the same file as standard "
                                    f"input: refusing to overwrite an input\n")  # fmt: skip
    assert src.read_bytes() == b"a dog.\n"


def test_every_option_that_names_an_output_is_declared_as_one():
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for verb, parser in action.choices.items():
        files = importlib.import_module(f"transduce.commands.{COMMANDS[verb][0]}").FILES
        written = {a.dest for a in parser._actions if {"-o", "--output", "--scores"} & set(a.option_strings)}
        assert written <= set(files.outputs) | set(files.replaced), verb
        for dest in (*files.inputs, *files.outputs, *files.replaced):
            assert any(a.dest == dest for a in parser._actions), (verb, dest)


# ----------------------------------------------------------------------------------------------------------------------
# whole or not at all


def test_an_output_replaces_the_old_file_only_on_success(tmp_path):
    out = tmp_path / "out.txt"
    out.write_text("old\n", encoding="utf-8")
    out.chmod(0o640)
    with pytest.raises(KeyboardInterrupt), open_output(out) as f:
        f.write("half\n")
        raise KeyboardInterrupt
    assert out.read_text(encoding="utf-8") == "old\n" and os.listdir(tmp_path) == ["out.txt"]
    with open_output(out) as f:
        f.write("new\n")
        assert out.read_text(encoding="utf-8") == "old\n"  # not before the end
    assert out.read_text(encoding="utf-8") == "new\n" and os.listdir(tmp_path) == ["out.txt"]
    assert out.stat().st_mode & 0o777 == 0o640  # the old file's permissions
    # no old file: none after a failure, and the directories made for it are gone again
    deep = tmp_path / "a" / "b" / "new.txt"
    with pytest.raises(ValueError), open_output(deep) as f:
        raise ValueError("bad input")
    assert sorted(os.listdir(tmp_path)) == ["out.txt"]
    # a symbolic link keeps pointing at its file, which gets the new content
    os.symlink(out, tmp_path / "link.txt")
    with open_output(tmp_path / "link.txt") as f:
        f.write("through the link\n")
    assert (tmp_path / "link.txt").is_symlink() and out.read_text(encoding="utf-8") == "through the link\n"


def test_a_writer_that_takes_a_path_keeps_the_suffix(tmp_path):
    with replaced_on_success(tmp_path / "att.png") as tmp:
        assert tmp.parent == tmp_path and tmp.suffix == ".png" and tmp.name.startswith(".att.tmp-")
        tmp.write_bytes(b"png")
    assert (tmp_path / "att.png").read_bytes() == b"png"


def test_a_device_or_pipe_output_is_written_in_place_and_never_replaced(tmp_path):
    # /dev/null as an output: nothing's same file (stdin redirected from it included), and the node is not
    # replaced by a regular file (as root, a rename over /dev/null would break the machine's /dev/null)
    check_outputs([("-i/--input", "/dev/null"), ("--treebank", "-")], [("-o/--output", "/dev/null")])
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    with open_output(fifo) as f:
        f.write("through the pipe\n")
    reader.join(timeout=10)
    assert got == [b"through the pipe\n"]
    assert stat.S_ISFIFO(fifo.stat().st_mode) and os.listdir(tmp_path) == ["pipe"]
    with replaced_on_success(fifo) as path:
        assert path == fifo


def test_standard_output_streams(capsys):
    with open_output("-") as out:
        out.write("first\n")
        assert capsys.readouterr().out == "first\n"  # written as it comes


def test_translate_fails_at_line_2101_and_leaves_the_old_output(checkpoint, tmp_path, capsys):
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_bytes(b"\n" * 2100 + b"caf\xe9\n")  # 2,000 lines are translated (one chunk) before line 2,101 is read
    out.write_text("old translations\n", encoding="utf-8")
    assert main(["translate", "--model", str(checkpoint), "-i", str(src), "-o", str(out)]) == 2
    assert _error_line(capsys).startswith(f"transduce translate: error: {src}, line 2101: not valid UTF-8")
    assert out.read_text(encoding="utf-8") == "old translations\n" and sorted(os.listdir(tmp_path)) == [
        "in.txt", "out.txt"]  # fmt: skip
    # a bad byte at line 1 and no earlier output: no file at all
    src.write_bytes(b"\xff\n")
    new = tmp_path / "new.txt"
    assert main(["translate", "--model", str(checkpoint), "-i", str(src), "-o", str(new)]) == 2
    assert "line 1: not valid UTF-8" in _error_line(capsys)
    assert not new.exists() and sorted(os.listdir(tmp_path)) == ["in.txt", "out.txt"]


def test_translate_from_standard_input_fails_at_line_2101_and_leaves_the_old_output(
    checkpoint, tmp_path, capsys, monkeypatch
):
    import io

    out = tmp_path / "out.txt"
    out.write_text("old translations\n", encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\n" * 2100 + b"caf\xe9\n")))
    assert main(["translate", "--model", str(checkpoint), "-o", str(out)]) == 2
    assert _error_line(capsys) == (
        "transduce translate: error: -, line 2101: not valid UTF-8 (byte 0xe9 at column 4); use --replace-invalid "
        "to translate it with U+FFFD in place"
    )
    assert out.read_text(encoding="utf-8") == "old translations\n" and os.listdir(tmp_path) == ["out.txt"]


def test_an_interrupted_translation_leaves_the_old_output(checkpoint, tmp_path):
    out = tmp_path / "out.txt"
    out.write_text("old translations\n", encoding="utf-8")
    argv = [sys.executable, "-m", "transduce.cli", "translate", "--model", str(checkpoint), "--interactive",
            "-o", str(out)]  # fmt: skip
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        proc.stdin.write(b"a dog.\nthe man.\n")  # translated and written to the temporary file, then it waits
        proc.stdin.flush()
        deadline = time.monotonic() + 120

        def written() -> bool:  # a translation written: to a temporary file (or over the old one, which must not be)
            tmp = [str(p) for p in tmp_path.iterdir() if p.name.startswith(".out.tmp-")]
            with contextlib.suppress(FileNotFoundError):  # (gone if the process failed and cleaned up)
                return out.read_bytes() != b"old translations\n" or any(os.path.getsize(p) > 0 for p in tmp)
            return False

        while not written():  # then the process waits for the next line, as a user's Ctrl-C finds it
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err.decode()[-3000:]
    assert err.decode().splitlines()[-1] == "transduce translate: interrupted"
    assert out.read_text(encoding="utf-8") == "old translations\n" and os.listdir(tmp_path) == ["out.txt"]


def test_verbs_write_their_files_only_through_transduce_files():
    commands = Path(__file__).resolve().parents[1] / "src" / "transduce" / "commands"
    for path in commands.glob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"\.write_text\(|\.write_bytes\(|open\([^)]*['\"][wax]", text), path.name


def test_a_ctranslate2_export_that_fails_half_way_leaves_the_old_directory(checkpoint, tmp_path, monkeypatch):
    from transduce.interop import ctranslate2

    out = tmp_path / "ct2"
    out.mkdir()
    (out / "old.txt").write_text("an earlier export\n", encoding="utf-8")

    def fail(tokenizer, directory):
        raise RuntimeError("disk full")

    with monkeypatch.context() as patch:
        patch.setattr(ctranslate2, "_copy_tokenizer_files", fail)  # after the model files are written
        with pytest.raises(RuntimeError, match="disk full"):
            ctranslate2.export_ctranslate2(checkpoint, out, overwrite=True)
    assert os.listdir(out) == ["old.txt"] and os.listdir(tmp_path) == ["ct2"]
    ctranslate2.export_ctranslate2(checkpoint, out, overwrite=True)
    assert (out / "model.bin").is_file() and not (out / "old.txt").exists() and os.listdir(tmp_path) == ["ct2"]
