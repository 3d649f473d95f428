"""Translate a test set and score it against references with sacreBLEU (BLEU and chrF, with signatures).

Examples:
  transduce evaluate --model runs/multi30k --src test_2016_flickr.en --ref test_2016_flickr.de
  transduce evaluate --model runs/multi30k --src test.en --ref test.de --json -o test.hyp.de
  transduce evaluate --hyp test.hyp.de --ref test.de --lc-tok de      # score an existing translation
  transduce evaluate --model runs/multi30k --src test.tsv             # both sides from one file, as prepare reads it
  transduce evaluate --model runs/hf --src test.jsonl --src-field translation.en --tgt-field translation.de

--src and --ref take a text file (one sentence per line) or a corpus file as `transduce prepare` reads it: the
source, or the target, side of FILE.tsv (source<TAB>target) or FILE.jsonl (the --src-field and --tgt-field fields;
src and tgt by default). Without --ref, a TSV or JSON Lines --src gives the references too.

Scores are on detokenised, cased text. --lc-tok LANG adds the Multi30k literature's number (lowercased,
Moses-tokenised), labelled bleu_lc_tok; it is not comparable with sacreBLEU's. Hypothesis and reference files with
different numbers of lines are an error: nothing is scored.
"""

from __future__ import annotations

import argparse
import json
import logging

from transduce.commands.options import add_output_argument, check_file_output, hidden_alias
from transduce.commands.translate import add_model_arguments, check_field, decode_config, load_translator
from transduce.errors import TransduceError
from transduce.files import Files, write_text

log = logging.getLogger(__name__)


#: the options naming what the verb reads and writes: an output that is an input is refused (transduce.files)
FILES = Files(inputs=("model", "src", "hyp", "ref"), outputs=("output",))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser._option_string_actions["--model"].required = False  # not needed with --hyp
    parser.add_argument(
        "--src", metavar="FILE", help="source sentences to translate (a text file, or FILE.tsv / FILE.jsonl)"
    )
    parser.add_argument("--hyp", metavar="FILE", help="score these translations instead of translating --src")
    parser.add_argument(
        "--ref", metavar="FILE",
        help="reference translations: a text file, or the target side of FILE.tsv / FILE.jsonl (default: --src's "
        "file when it is one of those)",
    )  # fmt: skip
    parser.add_argument("--src-field", metavar="NAME", help="JSON Lines: the field of the source (default: src)")
    parser.add_argument("--tgt-field", metavar="NAME", help="JSON Lines: the field of the reference (default: tgt)")
    add_output_argument(parser, "also write the translations here", metavar="FILE")
    hidden_alias(parser, "--hyp-out", "output")
    parser.add_argument("--lc-tok", metavar="LANG", help="also lowercased Moses-tokenised BLEU (target language)")
    parser.add_argument("--json", action="store_true", help="print the scores as JSON")
    parser.add_argument("--force", action="store_true", help="score references that look tokenised anyway")


def _read(path: str, side: str = "target", field: str | None = None) -> list[str]:
    """The lines of a text file, or one side of a TSV or JSON Lines file (see transduce.data.corpus.read_side)."""
    from transduce.data.corpus import read_side

    return [text for _, text in read_side(path, side, field, hint="every file scored or translated must be UTF-8")]


def _references(args: argparse.Namespace) -> str:
    """--ref, else --src when it is a TSV or JSON Lines file (its target side); refuses what cannot be read so."""
    from transduce.data.corpus import corpus_format

    if args.hyp is not None and corpus_format(args.hyp) != "files":
        raise TransduceError(
            f"{args.hyp}: --hyp reads translations as translate writes them, one per line, not a TSV or JSON Lines "
            "corpus"
        )
    if args.src_field is not None and args.src is None:
        raise TransduceError("--src-field goes with --src FILE.jsonl (the sources to translate)")
    if args.src is not None:
        check_field(args.src, "source", args.src_field)
    ref = args.ref
    if ref is None:
        if args.src is None or corpus_format(args.src) == "files":
            raise TransduceError(
                "--ref FILE is needed: the references (they default to the target side of --src only when --src is "
                "a TSV or JSON Lines file)"
            )
        ref = args.src
    check_field(ref, "target", args.tgt_field)
    return ref


def run(args: argparse.Namespace) -> int:
    from transduce.evaluate import LengthMismatchError, score, score_tokenized_lowercase, tokenized_evidence

    if (args.src is None) == (args.hyp is None):
        raise TransduceError("give exactly one of --src (with --model) and --hyp")
    if args.hyp is not None and args.output:
        raise TransduceError("-o/--output writes the translations of --src; with --hyp nothing is translated")
    check_file_output(args.output, "-o/--output")
    ref = _references(args)
    references = _read(ref, "target", args.tgt_field)
    evidence = None if args.force else tokenized_evidence(references)
    if evidence is not None:  # before any translation: sacreBLEU's score against tokenised text is meaningless
        raise TransduceError(
            f"{ref}: the references look tokenised ({evidence}); sacreBLEU scores detokenised text, so give "
            "the raw references (the lowercased tokenised convention is --lc-tok LANG on raw references too), or "
            "--force to score them anyway"
        )
    if args.hyp is not None:
        hypotheses = _read(args.hyp)
    else:
        if args.model is None:
            raise TransduceError("--src needs --model")
        sources = _read(args.src, "source", args.src_field)
        if len(sources) != len(references):  # fail before spending time translating
            raise LengthMismatchError(len(sources), len(references), f"{args.src} vs {ref}", what="source lines")
        translator = load_translator(args)
        cfg = decode_config(args, translator.decode)
        hypotheses = [ts[0].text for ts in translator.translate_lines(enumerate(sources, start=1), cfg)]
        if args.output:
            write_text(args.output, "".join(h + "\n" for h in hypotheses))
    if len(hypotheses) != len(references):
        raise LengthMismatchError(len(hypotheses), len(references), f"{args.hyp or 'translations'} vs {ref}")
    scores = score(hypotheses, references)
    result = scores.to_dict()
    if args.lc_tok:
        result.update(score_tokenized_lowercase(hypotheses, references, args.lc_tok).to_dict())
        result["bleu_lc_tok_signature"] = result.pop("signature")
    if args.json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
    else:
        print(f"BLEU = {scores.bleu:.2f}  ({scores.bleu_signature})")
        print(f"chrF = {scores.chrf:.2f}  ({scores.chrf_signature})")
        if args.lc_tok:
            print(f"BLEU (lowercased, Moses-tokenised; not sacreBLEU) = {result['bleu_lc_tok']:.2f}")
    return 0
