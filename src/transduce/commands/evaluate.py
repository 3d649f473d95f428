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

A classifier (data.task: classify) is scored on labelled examples in its training data's form, FILE.tsv
(label<TAB>text) or FILE.jsonl (the run's fields unless --text-field, --text2-field, --label-field): accuracy,
macro-F1, the confusion matrix (rows gold, columns predicted) and each class's precision, recall and F1, in percent.
  transduce evaluate --model runs/movie_reviews_finetune --src reviews/test.tsv
  transduce evaluate --model runs/movie_reviews_finetune --src reviews/test.tsv --json -o test.labels
"""

from __future__ import annotations

import argparse
import json
import logging

from transduce.commands.classify import add_input_form_arguments
from transduce.commands.options import add_output_argument, check_file_output, hidden_alias
from transduce.commands.translate import (
    add_model_arguments,
    check_field,
    decode_config,
    line_languages,
    load_translator,
)
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
    add_output_argument(parser, "also write the translations (a classifier: the labels) here", metavar="FILE")
    hidden_alias(parser, "--hyp-out", "output")
    parser.add_argument("--lc-tok", metavar="LANG", help="also lowercased Moses-tokenised BLEU (target language)")
    parser.add_argument("--json", action="store_true", help="print the scores as JSON")
    parser.add_argument("--force", action="store_true", help="score references that look tokenised anyway")
    g = parser.add_argument_group("a classifier's examples (--src)")
    add_input_form_arguments(g, ("tsv", "jsonl"))
    g.add_argument("--label-field", metavar="NAME", help="JSON Lines: the label (default: the run's data.label_field)")


INVALID_HINT = "every file scored or translated must be UTF-8"


def _read(path: str, side: str = "target", field: str | None = None) -> list[str]:
    """The lines of a text file, or one side of a TSV or JSON Lines file (see transduce.data.corpus.read_side)."""
    from transduce.data.corpus import read_side

    return [text for _, text in read_side(path, side, field, hint=INVALID_HINT)]


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
    from transduce.data.corpus import read_side
    from transduce.search.evaluate import LengthMismatchError, score, score_tokenized_lowercase, tokenized_evidence
    from transduce.transfer.classify import is_classifier

    if args.model and is_classifier(args.model[0]):
        return run_classifier(args)
    given = next((option for option, dest in CLASSIFIER_OPTIONS.items() if getattr(args, dest) is not None), None)
    if given is not None:
        raise TransduceError(f"{given} reads a classifier's examples; this evaluation translates")
    if (args.src is None) == (args.hyp is None):
        raise TransduceError("give exactly one of --src (with --model) and --hyp")
    if args.hyp is not None and args.output:
        raise TransduceError("-o/--output writes the translations of --src; with --hyp nothing is translated")
    if args.hyp is not None:  # the search's options mean nothing for a file of translations
        from transduce.commands.translate import _DECODE_OPTIONS

        unused = [o for o in _DECODE_OPTIONS if getattr(args, o, None) not in (None, False)]
        if unused:
            option = "--" + unused[0].replace("_", "-")
            raise TransduceError(f"{option} applies to translating --src; with --hyp nothing is translated")
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
        sources = list(read_side(args.src, "source", args.src_field, hint=INVALID_HINT))
        if len(sources) != len(references):  # fail before spending time translating
            raise LengthMismatchError(len(sources), len(references), f"{args.src} vs {ref}", what="source lines")
        langs = line_languages(args.src, args.model[0], args.tgt_lang)  # a multilingual test file's, per line
        translator = load_translator(args, language_required=not langs)
        cfg = decode_config(args, translator.decode)
        lines = [(n, text, langs[n]) for n, text in sources] if langs else sources
        hypotheses = [ts[0].text for ts in translator.translate_lines(lines, cfg)]
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


# ----------------------------------------------------------------------------------------------------------------------
# a classifier

#: the options for a classifier's examples -> their argparse dest
CLASSIFIER_OPTIONS = {"--format": "format", "--text-field": "text_field", "--text2-field": "text2_field",
                      "--label-field": "label_field"}  # fmt: skip
#: the options for translation (as spelled -> argparse dest) that mean nothing for a classifier
TRANSLATION_OPTIONS = {"--hyp": "hyp", "--ref": "ref", "--lc-tok": "lc_tok", "--src-field": "src_field",
                       "--tgt-field": "tgt_field", "--max-input-tokens": "max_input_tokens"}  # fmt: skip


def run_classifier(args: argparse.Namespace) -> int:
    """Classify the labelled examples of --src and score the labels (see the module docstring)."""
    from transduce.commands.classify import classifier_config, input_fields
    from transduce.commands.translate import _DECODE_OPTIONS, check_input
    from transduce.transfer.classify import Classifier
    from transduce.transfer.classify.inputs import input_format, read_labelled
    from transduce.transfer.classify.metrics import classification_scores

    model = args.model[0]
    if len(args.model) > 1:
        raise TransduceError(f"{model} is a classifier: evaluate one classifier at a time, not {len(args.model)}")
    translation = {**TRANSLATION_OPTIONS, **{f"--{o.replace('_', '-')}": o for o in _DECODE_OPTIONS}}
    unused = [option for option, dest in translation.items() if getattr(args, dest, None) not in (None, False)]
    unused += [option for option, on in (("--force", args.force), ("--int8", args.int8)) if on]
    unused += ["--precision"] if args.precision not in ("fp32", "auto") else []
    if unused:
        raise TransduceError(f"{unused[0]} applies to translation; {model} is a classifier, scored on the labels of "
                             "--src")  # fmt: skip
    if args.src is None:
        raise TransduceError(f"{model} is a classifier: give --src FILE.tsv (label<TAB>text) or FILE.jsonl, the "
                             "labelled examples to score it on")  # fmt: skip
    check_file_output(args.output, "-o/--output")
    check_input(args.src, what="score", hint="")
    config = classifier_config(model)
    form = input_format(args.src, args.format)
    examples = list(read_labelled(args.src, form, input_fields(args, config, args.src, form), config.model.labels))
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    classifier = Classifier.load(model, args.device)
    texts2 = [t2 for *_, t2 in examples] if classifier.pairs else None
    predicted = classifier.predict([text for _, _, text, _ in examples], texts2)
    if args.output:
        write_text(args.output, "".join(label + "\n" for label in predicted))
    scores = classification_scores([label for _, label, _, _ in examples], predicted, classifier.labels)
    print(json.dumps(scores.to_dict(), indent=2, ensure_ascii=False) if args.json else scores.table())
    return 0
