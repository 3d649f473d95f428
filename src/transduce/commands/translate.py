"""Translate raw text with a trained model: one output line per input line, in input order.

Examples:
  transduce translate --model runs/multi30k < test.en > test.hyp.de
  transduce translate --model runs/multi30k/average_last5 --input test.en --output test.hyp.de --beam 5
  transduce translate --model runs/multi30k --nbest 4 -i test.en     # ID ||| TEXT ||| log_prob= LP ||| SCORE
  transduce translate --model runs/multi30k --nbest 4 --json -i test.en   # a JSON object per input line
  transduce translate --model runs/multi30k --interactive                # each line answered as it is typed
  transduce translate --model runs/multi30k -i test.tsv                  # the source column (source<TAB>target)
  transduce translate --model runs/hf -i test.jsonl --src-field translation.en   # a JSON Lines field, as prepare
  transduce translate --model runs/multi30k_en_defrcs --tgt-lang fr < test.en    # a multilingual model's language

Input is read as UTF-8 and split on "\\n" only; a byte that is not UTF-8 is an error naming the line, unless
--replace-invalid. An empty line gives an empty line. A line longer than --max-input-tokens subword tokens is split
into pieces that are translated and joined (with a warning naming the line). Sentences are sorted by length and
batched by a token budget internally; the output order is the input order. Decoding defaults come from the run's
config (the paper's: beam 4, length penalty 0.6, maximum length = input length + 50); options override them.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from transduce.commands.options import (
    add_output_argument,
    add_source_input_arguments,
    check_file_output,
    language_code,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    probability,
)
from transduce.config import LENGTH_NORMS, ConfigError, DecodeConfig
from transduce.files import Files, open_output

log = logging.getLogger(__name__)

# option name -> DecodeConfig field
_DECODE_OPTIONS = {
    "beam": "beam",
    "nbest": "nbest",
    "length_penalty": "length_penalty",
    "length_norm": "length_norm",
    "max_len_a": "max_len_a",
    "max_len_b": "max_len_b",
    "min_len": "min_len",
    "no_repeat_ngram": "no_repeat_ngram",
    "early_stopping": "early_stopping",
    "sampling": "sampling",
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "seed": "seed",
    "max_tokens": "max_tokens",
    "tgt_lang": "tgt_lang",
}
#: options that only sampling reads: given without sampling they would change nothing
_SAMPLING_ONLY = ("temperature", "top_k", "top_p", "seed")


def add_device_arguments(parser: argparse.ArgumentParser, precision: str = "auto") -> None:
    """--device and --precision (shared with evaluate/serve/attention/report/embed); ``precision``: its default."""
    from transduce.device import DEVICE_FORMS, PRECISIONS

    parser.add_argument("--device", default="auto", help=f"{DEVICE_FORMS} (default: auto, a GPU when there is one)")
    parser.add_argument(
        "--precision", default=precision, choices=["auto", *PRECISIONS],
        help=f"weights' dtype (default: {precision}). auto: bf16 products on a CPU with AMX (the rest float32), "
        "else fp32 (TF32 products on CUDA); bf16 on a CPU: bf16 linear layers, the rest float32; fp16 for GPUs",
    )  # fmt: skip


#: --model's help where several models make an ensemble
ENSEMBLE_HELP = (
    "run directory, checkpoint or Hugging Face Marian directory; several --model: an ensemble (the mean of the "
    "models' probabilities; one vocabulary; the first model's decoding settings)"
)


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """--model, --device, --threads, --max-input-tokens and the decoding options (shared with evaluate/attention);
    --model may be given several times, for an ensemble: ``args.model`` is a list."""
    add_loading_arguments(parser)
    g = parser.add_argument_group("decoding (default: the run's decode config)")
    g.add_argument(
        "--tgt-lang", metavar="LANG", type=language_code,
        help="a multilingual model's target language, fr or fra (its token, e.g. >>fra<<, goes before every source; "
        "default: the run's decode.tgt_lang; serve: the requests' default)",
    )  # fmt: skip
    g.add_argument("--beam", type=positive_int, metavar="K", help="beam size; 1 is greedy")
    g.add_argument("--length-penalty", type=non_negative_float, metavar="ALPHA", help="length penalty alpha; 0: off")
    g.add_argument(
        "--length-norm", choices=LENGTH_NORMS,
        help="the penalty's form: gnmt ((5 + |Y|) / 6) ** ALPHA (the paper's) or length |Y| ** ALPHA (fairseq's)",
    )  # fmt: skip
    g.add_argument(
        "--max-len-a", type=non_negative_float, metavar="A", help="maximum output length = A * input length + B"
    )
    g.add_argument("--max-len-b", type=non_negative_int, metavar="B")
    g.add_argument("--min-len", type=non_negative_int, metavar="N", help="no EOS before N tokens")
    g.add_argument("--no-repeat-ngram", type=non_negative_int, metavar="N", help="block repeated n-grams of size N")
    g.add_argument(
        "--early-stopping", action="store_true", default=None,
        help="beam search: stop a sentence at K finished hypotheses (faster; fairseq's and CTranslate2's rule)",
    )  # fmt: skip
    g.add_argument("--sampling", action="store_true", default=None, help="sample instead of beam search")
    g.add_argument("--temperature", type=positive_float)
    g.add_argument("--top-k", type=non_negative_int)
    g.add_argument("--top-p", type=probability)
    g.add_argument(
        "--seed", type=non_negative_int, metavar="N",
        help="sampling: seed each sentence's draws (the same seed, the same samples, whatever the batch)",
    )  # fmt: skip
    g.add_argument(
        "--max-tokens", type=positive_int, metavar="N", help="token budget of a batch (sentences x beam x length)"
    )


def add_loading_arguments(parser: argparse.ArgumentParser, model_help: str = ENSEMBLE_HELP,
                          precision: str = "auto") -> None:  # fmt: skip
    """What :func:`load_translator` reads: --model (``args.model`` is a list), --device, --precision (``precision``
    its default), --threads, --max-input-tokens and --int8."""
    parser.add_argument("--model", required=True, action="append", metavar="PATH", help=model_help)
    add_device_arguments(parser, precision)
    parser.add_argument(
        "--threads", type=non_negative_int, default=0, help="torch intra-op threads; 0: torch's default"
    )
    parser.add_argument(
        "--max-input-tokens",
        type=positive_int,
        metavar="N",
        help="split longer lines (default: 1024; max_positions - 1 with learned positions)",
    )
    parser.add_argument(
        "--int8",
        action="store_true",
        help="CPU: dynamic int8 linear layers (all where the CPU has VNNI, else the larger ones; faster, approximate)",
    )


def decode_config(args: argparse.Namespace, base: DecodeConfig) -> DecodeConfig:
    """``base`` with the decoding options that were given on the command line (validated by DecodeConfig).

    ``nbest`` is 1 unless ``--nbest`` is given (only ``translate --nbest`` writes more than one translation), so a
    run whose config says ``nbest: 4`` still accepts ``--beam 2``."""
    changes: dict[str, Any] = {"nbest": 1}
    for option, field in _DECODE_OPTIONS.items():
        value = getattr(args, option, None)
        if value is not None:
            changes[field] = value
    sampling = changes.get("sampling", base.sampling)
    unused = [option for option in _SAMPLING_ONLY if getattr(args, option, None) is not None]
    if unused and not sampling:
        raise ConfigError(f"--{unused[0].replace('_', '-')} applies to sampling only, and this search does not "
                          "sample: add --sampling (or leave the option out)")  # fmt: skip
    if "beam" in changes and changes["nbest"] > changes["beam"] and not sampling:
        raise ConfigError(f"--nbest {changes['nbest']} asks for more translations than --beam {changes['beam']} "
                          "keeps: give --beam of at least --nbest, or leave --beam out")  # fmt: skip
    if changes["nbest"] > changes.get("beam", base.beam) and not sampling:
        changes["beam"] = changes["nbest"]  # --nbest 8 alone widens the beam rather than failing
    try:
        return base.replace(**changes)
    except ConfigError as e:  # name the option that was given ("--top-p: ..."), not the config field ("top_p: ...")
        field, _, reason = str(e).partition(": ")
        given = {f: o for o, f in _DECODE_OPTIONS.items() if getattr(args, o, None) is not None}
        if field not in given:
            raise
        raise ConfigError(f"--{given[field].replace('_', '-')}: {reason}") from None


#: how to get past a line that is not UTF-8 (translate's --replace-invalid)
INVALID_HINT = "use --replace-invalid to translate it with U+FFFD in place"


def load_translator(args: argparse.Namespace, *, language_required: bool = True):
    """The translator of ``--model`` (an ensemble for several); ``language_required``: a multilingual model without
    ``--tgt-lang`` (and without a default) is refused before it is loaded (``serve``, whose requests name their
    language, passes False)."""
    import torch

    from transduce.search.translator import Translator

    if args.threads:
        torch.set_num_threads(args.threads)
    check_target_language(args.model[0], getattr(args, "tgt_lang", None), required=language_required)
    quantize = "int8" if getattr(args, "int8", False) else None
    return Translator.load(args.model, args.device, max_input_tokens=args.max_input_tokens, quantize=quantize,
                           precision=args.precision)  # fmt: skip


def check_target_language(path: str, tgt_lang: str | None, *, required: bool = True) -> None:
    """Before the model at ``path`` is loaded: refuse a ``--tgt-lang`` its vocabulary has no token for (or any, for a
    model of one target language), and (``required``) a missing one where the model has tokens and its run no
    ``decode.tgt_lang``. A model that cannot be read is left to the loading, which names the problem.

    Raises:
        transduce.text.langs.LanguageError: in one line (see :meth:`transduce.text.langs.TargetLanguages.token_id`).
    """
    from transduce.errors import TransduceError
    from transduce.interop.marian import is_marian_dir
    from transduce.text.langs import TargetLanguages
    from transduce.text.vocab import load_vocabulary
    from transduce.training import checkpoint as ckpt

    try:
        if is_marian_dir(path):
            from transduce.interop.marian_vocab import MarianVocab

            vocab, default = MarianVocab.from_pretrained(path), ""
        else:
            checkpoint = ckpt.resolve(path)
            vocab = load_vocabulary(ckpt.vocab_dir_of(checkpoint))
            default = ckpt.read_info(checkpoint).config.decode.tgt_lang
    except (TransduceError, OSError):
        return
    if tgt_lang or default or required:
        TargetLanguages(vocab.lang_tokens(), tgt_lang or default).token_id(None)


#: the options naming what the verb reads and writes: an output that is an input is refused (transduce.files)
FILES = Files(inputs=("model", "input"), outputs=("output",))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    add_source_input_arguments(parser)
    add_output_argument(parser, "translations (default: stdout)", metavar="FILE", default="-")
    parser.add_argument("--nbest", type=positive_int, metavar="K", help="write the K best translations of each line")
    parser.add_argument(
        "--json", action="store_true", help="write a JSON object per input line (with its --nbest translations)"
    )
    parser.add_argument(
        "--interactive",
        action="store_true",
        help="translate each line as soon as it is read (the default when stdin is a terminal)",
    )
    parser.add_argument(
        "--replace-invalid", action="store_true", help="replace bytes that are not UTF-8 instead of failing"
    )


def run(args: argparse.Namespace) -> int:
    from transduce.search.translator import read_source_lines

    check_input(args.input, replace_invalid=args.replace_invalid)
    check_corpus_side(args.input, "source", args.src_field)
    check_file_output(args.output, "-o/--output")
    langs = line_languages(args.input, args.model[0], args.tgt_lang)
    translator = load_translator(args, language_required=not langs)
    cfg = decode_config(args, translator.decode)
    if not langs:
        translator.language_ids(None, 1, cfg)  # a missing or unknown target language (--tgt-lang): before any output
    terminal = args.input == "-" and _is_terminal(sys.stdin)
    interactive = args.interactive or terminal
    if terminal:
        log.info("type a sentence and Enter; Ctrl-D ends")
    lines = read_source_lines(args.input, replace_invalid=args.replace_invalid, field=args.src_field)
    if langs:
        lines = ((lineno, text, langs[lineno]) for lineno, text in lines)
    write = format_json if args.json else format_nbest if args.nbest is not None else format_text
    count = 0
    with open_output(args.output) as out:  # a file appears only when complete; stdout streams
        # interactive: a chunk of one line, flushed at once (else: sorted chunks of 2000 lines for speed)
        chunks = translator.translate_lines(lines, cfg, chunk_size=1 if interactive else 2000)
        chunks = progress(chunks, args.input, shown=not interactive)
        for index, translations in enumerate(chunks):
            out.write(write(index, translations))
            if interactive:
                out.flush()
            count += 1
        out.flush()
    log.info("translated %d lines", count)
    return 0


def line_languages(path: str, model: str, tgt_lang: str | None) -> dict[int, str]:
    """The target language of each line where a TSV or JSON Lines input names it (a third column; the field
    ``tgt_lang``: :func:`transduce.data.corpus.read_languages`), each checked against ``model`` and ``--tgt-lang``
    (which, given, every line must name) before the model is loaded. Empty when the input names none.

    Raises:
        DataError: naming the file and the first line of a language the model cannot write, or that is not
            ``--tgt-lang``.
    """
    from transduce.data.corpus import read_languages
    from transduce.errors import DataError
    from transduce.text.langs import LanguageError, same_language

    langs = read_languages(path)
    first: dict[str, int] = {}
    for lineno, code in langs.items():
        first.setdefault(code, lineno)
    for code, lineno in first.items():
        where = f"{path}, line {lineno}"
        try:
            check_target_language(model, code, required=False)
        except LanguageError as e:
            raise DataError(f"{where}: {str(e).removeprefix('tgt_lang: ')}") from None
        if tgt_lang and not same_language(code, tgt_lang):
            raise DataError(f"{where}: the line's target language {code!r} is not --tgt-lang {tgt_lang!r}; leave "
                            "--tgt-lang out to translate each line into the language it names")  # fmt: skip
    return langs


def check_input(path: str, *, replace_invalid: bool = False, what: str = "translate", hint: str = INVALID_HINT) -> None:
    """Refuse an input file that cannot be translated (``what``) before the model is loaded: missing, a directory,
    empty, or not UTF-8 (one pass in 1 MiB blocks). Standard input, pipes and devices are read as they come (an empty
    standard input gives an empty output).

    Raises:
        DataError: naming the file (and the first line that is not UTF-8, followed by ``hint``).
    """
    from transduce.errors import DataError
    from transduce.text.textio import scan_text

    if path == "-":
        return
    if Path(path).is_dir():
        raise DataError(f"{path}: is a directory, not a text file")
    if not Path(path).exists():
        raise DataError(f"{path}: file not found")
    if Path(path).is_file():
        scan = scan_text(path)
        if scan.first_invalid and not replace_invalid:
            raise DataError(f"{scan.first_invalid}; {hint}" if hint else scan.first_invalid)
        if not scan.lines:
            raise DataError(f"{path}: the file is empty: no lines to {what}")


def check_corpus_side(path: str, side: str, field: str | None) -> None:
    """Before the model is loaded: refuse ``--src-field``/``--tgt-field`` for an input that has no fields, and read a
    TSV or JSON Lines input's ``side`` through once, so that a line without its tab or field fails at once.

    Raises:
        DataError: naming the option, or the file and line (see :func:`transduce.data.corpus.read_side`).
    """
    from transduce.data.corpus import corpus_format, read_side

    check_field(path, side, field)
    if path != "-" and corpus_format(path) != "files":
        for _ in read_side(path, side, field, errors="skip"):  # bad bytes are check_input's (or decoding's) to report
            pass


def check_field(path: str, side: str, field: str | None) -> None:
    """Refuse ``--src-field`` (``side`` "source") or ``--tgt-field`` ("target") for an input that has no fields: a
    field names a part of each line of a JSON Lines file only."""
    from transduce.data.corpus import corpus_format
    from transduce.errors import DataError

    if field is not None and (path == "-" or corpus_format(path) != "jsonl"):
        option = "--src-field" if side == "source" else "--tgt-field"
        where = "standard input" if path == "-" else path
        raise DataError(f"{option} names a field of a JSON Lines input (FILE.jsonl), not of {where}")


def format_text(index: int, translations: list) -> str:
    """The best translation, one line."""
    return translations[0].text + "\n"


def format_nbest(index: int, translations: list) -> str:
    """Moses n-best lines, best first: ``ID ||| TRANSLATION ||| log_prob= LOGPROB ||| SCORE``.

    ID counts input lines from 0; LOGPROB is the model's log-probability of the translation (its tokens and EOS);
    SCORE is the search's ranking score (LOGPROB divided by the length penalty when it is on)."""
    return "".join(f"{index} ||| {t.text} ||| log_prob= {t.log_prob:.6f} ||| {t.score:.6f}\n" for t in translations)


def format_json(index: int, translations: list) -> str:
    """``{"id": ID, "translations": [{"text", "score", "log_prob"}, ...]}`` on one line, best first."""
    hyps = [{"text": t.text, "score": round(t.score, 6), "log_prob": round(t.log_prob, 6)} for t in translations]
    return json.dumps({"id": index, "translations": hyps}, ensure_ascii=False) + "\n"


def progress(items: Iterable[Any], path: str, *, shown: bool) -> Iterable[Any]:
    """``items`` (one per line translated) with a progress bar on standard error when that is a terminal and
    ``shown`` (not interactive translation); nothing is drawn into a log file or a pipe. The bar's total is the
    line count of a plain input file, counted in 1 MiB blocks (none for standard input or a gzipped file)."""
    if not (shown and _is_terminal(sys.stderr)):
        return items
    from tqdm import tqdm

    return tqdm(items, total=_count_lines(path), unit=" lines", file=sys.stderr, dynamic_ncols=True, leave=False)


def _count_lines(path: str) -> int | None:
    if path == "-" or not Path(path).is_file():
        return None
    count, last = 0, b"\n"
    with open(path, "rb") as f:
        if f.read(2) == b"\x1f\x8b":  # gzip: no count without decompressing it
            return None
        f.seek(0)
        while block := f.read(1 << 20):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # a replaced or closed stdin
        return False
