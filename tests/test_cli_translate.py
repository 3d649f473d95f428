"""End-to-end CLI tests of translate / evaluate / attention on a small random checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from decodekit import one_thread
from transduce.cli import main


@pytest.fixture(autouse=True)
def _single_thread():
    with one_thread():
        yield


LINES = ["a man rides the bike.", "", "café 😀 Ünïcode", "x" * 1200, "   ", "ein Hund."]


def test_translate_file_keeps_one_line_per_line(checkpoint, tmp_path, caplog):
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    assert main(["translate", "--model", str(checkpoint), "--input", str(src), "--output", str(out)]) == 0
    got = out.read_text(encoding="utf-8").split("\n")
    assert got[-1] == "" and len(got[:-1]) == len(LINES)
    assert got[1] == "" and got[4] == ""
    assert "line 4: 1201 source tokens exceed max_input_tokens=1024" in caplog.text
    # beam 1 / a small token budget: the same count, the same order
    out2 = tmp_path / "out2.txt"
    args = ["translate", "--model", str(checkpoint), "--input", str(src), "--output", str(out2), "--max-tokens", "50"]
    assert main(args) == 0
    assert out2.read_text(encoding="utf-8") == out.read_text(encoding="utf-8")


def test_translate_nbest_format(checkpoint, tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("a dog.\nthe bike.\n", encoding="utf-8")
    assert main(["translate", "--model", str(checkpoint), "--input", str(src), "--nbest", "3"]) == 0
    rows = [line.split(" ||| ") for line in capsys.readouterr().out.splitlines()]
    assert [r[0] for r in rows] == ["0", "0", "0", "1", "1", "1"]
    # Moses: ID ||| TRANSLATION ||| FEATURES ||| SCORE, the features "log_prob= X"; what the API returns
    from transduce.search.translator import Translator

    # (the command's default precision is auto: bf16 products on a CPU with AMX, fp32 elsewhere)
    expected = Translator.load(checkpoint, precision="auto").translate_nbest(["a dog.", "the bike."], nbest=3)
    assert rows == [
        [str(i), t.text, f"log_prob= {t.log_prob:.6f}", f"{t.score:.6f}"] for i, ts in enumerate(expected) for t in ts
    ]
    assert main(["translate", "--model", str(checkpoint), "--input", str(src), "--nbest", "3", "--json"]) == 0
    objects = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert objects == [
        {"id": i, "translations": [{"text": t.text, "score": round(t.score, 6), "log_prob": round(t.log_prob, 6)}
                                   for t in ts]}
        for i, ts in enumerate(expected)
    ]  # fmt: skip
    assert main(["translate", "--model", str(checkpoint), "--input", str(src), "--json"]) == 0
    assert [len(json.loads(line)["translations"]) for line in capsys.readouterr().out.splitlines()] == [1, 1]


def test_invalid_utf8_is_one_line_error_or_replaced(checkpoint, tmp_path, capsys):
    src = tmp_path / "bad.txt"
    src.write_bytes(b"a dog.\n\xff\xfe the bike\n")
    assert main(["translate", "--model", str(checkpoint), "--input", str(src)]) == 2
    err = capsys.readouterr().err
    assert "line 2: not valid UTF-8" in err and "Traceback" not in err
    assert main(["translate", "--model", str(checkpoint), "--input", str(src), "--replace-invalid"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_translate_stdin_to_stdout_subprocess(checkpoint):
    text = "a man.\n\nein Hund fährt.\n"
    proc = subprocess.run(
        [sys.executable, "-m", "transduce.cli", "translate", "--model", str(checkpoint), "--beam", "2"],
        input=text.encode(), capture_output=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    out = proc.stdout.decode("utf-8").split("\n")
    assert len(out) == 4 and out[1] == "" and out[3] == ""


def test_evaluate_json_and_mismatch(checkpoint, tmp_path, capsys):
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("a dog.\nthe man.\n", encoding="utf-8")
    ref.write_text("ein Hund läuft über die Wiese.\nder Mann fährt mit dem Rad.\n", encoding="utf-8")
    hyp_out = tmp_path / "hyp.txt"
    args = ["evaluate", "--model", str(checkpoint), "--src", str(src), "--ref", str(ref)]
    assert main([*args, "--json", "--lc-tok", "de", "--output", str(hyp_out)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert {"bleu", "bleu_signature", "chrf", "chrf_signature", "bleu_lc_tok"} <= set(result)
    assert len(hyp_out.read_text(encoding="utf-8").splitlines()) == 2
    # scoring an existing file; a reference of another length is an error, never a score
    assert main(["evaluate", "--hyp", str(ref), "--ref", str(ref)]) == 0
    assert "BLEU = 100.00" in capsys.readouterr().out
    short = tmp_path / "short.txt"
    short.write_text("ein Hund.\n", encoding="utf-8")
    assert main(["evaluate", "--hyp", str(short), "--ref", str(ref)]) == 2
    assert "1 hypotheses but 2 references" in capsys.readouterr().err
    assert main(["evaluate", "--model", str(checkpoint), "--src", str(src), "--ref", str(short)]) == 2
    assert f"{src} vs {short}: 2 source lines but 1 references" in capsys.readouterr().err
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ein Hund.\n\xff der Mann.\n")
    assert main(["evaluate", "--hyp", str(ref), "--ref", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.txt, line 2: not valid UTF-8" in err and "every file scored or translated must be UTF-8" in err
    assert "--replace-invalid" not in err and "Traceback" not in err  # evaluate has no such option


def test_translator_option_errors_are_one_line_errors(checkpoint, tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("a dog.\n", encoding="utf-8")
    for option, value, reason in (("--max-input-tokens", "0", ">= 1"), ("--max-len-a", "inf", ">= 0")):
        with pytest.raises(SystemExit) as info:  # argparse refuses it, before the model is loaded
            main(["translate", "--model", str(checkpoint), "--input", str(src), option, value])
        assert info.value.code == 2
        assert capsys.readouterr().err == f"transduce translate: {option} must be {reason} (got {value})\n"


def test_attention_command_writes_pngs(checkpoint, tmp_path):
    out = tmp_path / "att.png"
    args = ["attention", "--model", str(checkpoint), "--src", "a man rides.", "-o", str(out), "--self"]
    assert main(args) == 0
    assert out.exists() and (tmp_path / "att.encoder.png").exists() and (tmp_path / "att.decoder.png").exists()
    assert main([*args[:-1], "--tgt", "ein Mann."]) == 0


def test_attention_command_draws_the_translation_the_decoding_options_give(checkpoint, tmp_path, capsys):
    args = ["attention", "--model", str(checkpoint), "--src", "a man rides.", "--output", str(tmp_path / "a.png")]
    assert main(args) == 0
    default = capsys.readouterr().out.split()
    assert main([*args, "--max-len-a", "0", "--max-len-b", "2"]) == 0
    short = capsys.readouterr().out.split()
    assert len(default) > 3 and len(short) == 3  # two pieces, then the forced EOS


def test_decoding_options_override_the_run_config():
    import argparse

    from transduce.commands.translate import add_model_arguments, decode_config
    from transduce.config import DecodeConfig

    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    base = DecodeConfig(beam=5, length_penalty=1.0)
    args = parser.parse_args(["--model", "m", "--early-stopping", "--beam", "3"])
    assert decode_config(args, base) == DecodeConfig(beam=3, length_penalty=1.0, early_stopping=True)
    assert decode_config(parser.parse_args(["--model", "m"]), base) == base  # nothing given: the run's config
    args = parser.parse_args(["--model", "m", "--length-norm", "length"])
    assert decode_config(args, base) == DecodeConfig(beam=5, length_penalty=1.0, length_norm="length")
    with pytest.raises(SystemExit):  # argparse: invalid choice
        parser.parse_args(["--model", "m", "--length-norm", "average"])
    assert decode_config(parser.parse_args(["--model", "m"]), base.replace(early_stopping=True)).early_stopping
    # the run's nbest does not stand in the way of a smaller beam: only --nbest asks for more than one translation
    wide = DecodeConfig(beam=4, nbest=4)
    parser.add_argument("--nbest", type=int)  # translate's own option
    assert decode_config(parser.parse_args(["--model", "m", "--beam", "2"]), wide) == DecodeConfig(beam=2, nbest=1)
    assert decode_config(parser.parse_args(["--model", "m", "--nbest", "6"]), wide) == DecodeConfig(beam=6, nbest=6)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--temperature", "0.5"], "--temperature applies to sampling only, and this search does not sample: add "
                                   "--sampling (or leave the option out)"),
        (["--beam", "1", "--top-k", "5"], "--top-k applies to sampling only, and this search does not sample: add "
                                          "--sampling (or leave the option out)"),
        (["--seed", "3"], "--seed applies to sampling only, and this search does not sample: add --sampling (or "
                          "leave the option out)"),
        (["--nbest", "5", "--beam", "2"], "--nbest 5 asks for more translations than --beam 2 keeps: give --beam of "
                                          "at least --nbest, or leave --beam out"),
    ],
)  # fmt: skip
def test_decoding_options_that_would_change_nothing_or_be_overridden_are_refused(
    checkpoint, tmp_path, capsys, options, message
):
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("a dog.\n", encoding="utf-8")
    argv = ["translate", "--model", str(checkpoint), "-i", str(src), "-o", str(out), "--device", "cpu", *options]
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("transduce translate: ") and line.endswith(message)
    assert not out.exists()


def test_sampling_options_are_accepted_with_sampling_from_the_command_line_or_the_run():
    import argparse

    from transduce.commands.translate import add_model_arguments, decode_config
    from transduce.config import DecodeConfig

    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    parser.add_argument("--nbest", type=int)  # translate's own option
    args = parser.parse_args(["--model", "m", "--sampling", "--temperature", "0.5", "--seed", "3", "--top-p", "0.9"])
    assert decode_config(args, DecodeConfig()) == DecodeConfig(sampling=True, temperature=0.5, seed=3, top_p=0.9)
    args = parser.parse_args(["--model", "m", "--seed", "3", "--nbest", "5", "--beam", "2"])  # samples: no beam
    assert decode_config(args, DecodeConfig(sampling=True)) == DecodeConfig(sampling=True, seed=3, nbest=5, beam=2)
    args = parser.parse_args(["--model", "m", "--nbest", "4", "--beam", "4"])
    assert decode_config(args, DecodeConfig()) == DecodeConfig(beam=4, nbest=4)


def _write_corpus_forms(directory, sources: list[str], references: list[str]) -> dict[str, object]:
    """The same test set as prepare reads it: two text files, a TSV file and a JSON Lines file with nested fields."""
    import json

    src, ref = directory / "test.en", directory / "test.de"
    src.write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    ref.write_text("".join(r + "\n" for r in references), encoding="utf-8")
    tsv, jsonl = directory / "test.tsv", directory / "test.jsonl"
    tsv.write_text("".join(f"{s}\t{r}\n" for s, r in zip(sources, references)), encoding="utf-8")
    rows = [{"id": i, "translation": {"en": s, "de": r}} for i, (s, r) in enumerate(zip(sources, references))]
    jsonl.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return {"src": src, "ref": ref, "tsv": tsv, "jsonl": jsonl}


def test_translate_reads_the_source_side_of_a_tsv_or_json_lines_corpus(checkpoint, tmp_path, capsys):
    files = _write_corpus_forms(tmp_path, ["a dog.", "the man rides.", ""], ["ein Hund.", "der Mann.", "leer"])
    model = ["translate", "--model", str(checkpoint), "--beam", "2"]
    assert main([*model, "-i", str(files["src"])]) == 0
    expected = capsys.readouterr().out
    assert len(expected.splitlines()) == 3 and expected.splitlines()[2] == ""
    assert main([*model, "-i", str(files["tsv"])]) == 0
    assert capsys.readouterr().out == expected
    assert main([*model, "-i", str(files["jsonl"]), "--src-field", "translation.en"]) == 0
    assert capsys.readouterr().out == expected
    # a missing field, and a field option for an input that has no fields: one line each
    assert main([*model, "-i", str(files["jsonl"])]) == 2
    assert capsys.readouterr().err == (
        f"transduce translate: error: {files['jsonl']}, line 1: no field 'src' for the source (found: 'id', "
        "'translation'); --src-field names another\n"
    )
    assert main([*model, "-i", str(files["jsonl"]), "--src-field", "translation.fr"]) == 2
    assert capsys.readouterr().err == (
        f"transduce translate: error: {files['jsonl']}, line 1: no field 'translation.fr' for the source (found: "
        "'en', 'de'); --src-field names another\n"
    )
    assert main([*model, "-i", str(files["tsv"]), "--src-field", "en"]) == 2
    assert capsys.readouterr().err == (
        f"transduce translate: error: --src-field names a field of a JSON Lines input (FILE.jsonl), not of "
        f"{files['tsv']}\n"
    )
    bad = tmp_path / "bad.tsv"
    bad.write_text("a dog.\tein Hund.\nno tab here\n", encoding="utf-8")
    assert main([*model, "-i", str(bad)]) == 2
    assert capsys.readouterr().err == (
        f"transduce translate: error: {bad}, line 2: expected source<TAB>target (one tab), or "
        "source<TAB>target<TAB>language (two), found no tab\n"
    )


def test_evaluate_reads_both_sides_from_one_tsv_or_json_lines_file(checkpoint, tmp_path, capsys):
    import json

    files = _write_corpus_forms(tmp_path, ["a dog.", "the man rides."], ["ein Hund läuft.", "der Mann fährt."])
    model = ["evaluate", "--model", str(checkpoint), "--beam", "2", "--json"]
    assert main([*model, "--src", str(files["src"]), "--ref", str(files["ref"])]) == 0
    expected = json.loads(capsys.readouterr().out)
    assert main([*model, "--src", str(files["tsv"]), "--ref", str(files["tsv"])]) == 0
    assert json.loads(capsys.readouterr().out) == expected
    assert main([*model, "--src", str(files["tsv"])]) == 0  # --ref defaults to the target side of --src's file
    assert json.loads(capsys.readouterr().out) == expected
    fields = ["--src-field", "translation.en", "--tgt-field", "translation.de"]
    assert main([*model, "--src", str(files["jsonl"]), *fields]) == 0
    assert json.loads(capsys.readouterr().out) == expected
    # scoring existing translations against the target side of a corpus file
    assert main(["evaluate", "--hyp", str(files["ref"]), "--ref", str(files["jsonl"]), *fields[2:]]) == 0
    assert "BLEU = 100.00" in capsys.readouterr().out
    assert main([*model, "--src", str(files["jsonl"]), "--src-field", "translation.en"]) == 2
    assert capsys.readouterr().err == (
        f"transduce evaluate: error: {files['jsonl']}, line 1: no field 'tgt' for the target (found: 'id', "
        "'translation'); --tgt-field names another\n"
    )
    assert main([*model, "--src", str(files["src"])]) == 2
    assert capsys.readouterr().err == (
        "transduce evaluate: error: --ref FILE is needed: the references (they default to the target side of --src "
        "only when --src is a TSV or JSON Lines file)\n"
    )
    assert main([*model, "--src", str(files["src"]), "--ref", str(files["ref"]), "--tgt-field", "de"]) == 2
    assert capsys.readouterr().err == (
        f"transduce evaluate: error: --tgt-field names a field of a JSON Lines input (FILE.jsonl), not of "
        f"{files['ref']}\n"
    )
    assert main(["evaluate", "--hyp", str(files["tsv"]), "--ref", str(files["ref"])]) == 2
    assert capsys.readouterr().err == (
        f"transduce evaluate: error: {files['tsv']}: --hyp reads translations as translate writes them, one per "
        "line, not a TSV or JSON Lines corpus\n"
    )


def test_a_progress_bar_is_drawn_when_standard_error_is_a_terminal_only(checkpoint, tmp_path, capsys, monkeypatch):
    import gzip
    import sys

    import transduce.commands.translate as command

    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("a dog.\n" * 5 + "the bike.", encoding="utf-8")  # 6 lines, the last without a line end
    argv = ["translate", "--model", str(checkpoint), "-i", str(src), "-o", str(out), "--device", "cpu"]
    assert main(argv) == 0
    assert "lines/s" not in capsys.readouterr().err  # a log file or a pipe: no bar
    monkeypatch.setattr(command, "_is_terminal", lambda stream: stream is sys.stderr)
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "0/6 [" in err and "lines/s" in err  # the input's 6 lines are the total
    assert main([*argv, "--interactive"]) == 0  # each line answered as it comes: no bar
    assert "lines/s" not in capsys.readouterr().err
    packed = tmp_path / "in.txt.gz"
    packed.write_bytes(gzip.compress(src.read_bytes()))
    assert main([*argv[:4], str(packed), *argv[5:]]) == 0  # no total without decompressing: a count
    err = capsys.readouterr().err
    assert "0 lines [" in err and "/6" not in err
    assert len(out.read_text(encoding="utf-8").splitlines()) == 6
