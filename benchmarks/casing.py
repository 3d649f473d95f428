"""How a model copes with the casing of its input: BLEU on the normal sources, on an ALL-CAPS copy and on a
Title-Case copy, each scored case-insensitively against the references (sacreBLEU 13a, lowercase), plus the cased
sacreBLEU and the lowercased tokenised BLEU of the normal sources.

    python benchmarks/casing.py --model runs/multi30k_en_de \\
        --src ../shared/data/multi30k/test_2016_flickr.en.gz --ref ../shared/data/multi30k/test_2016_flickr.de.gz \\
        --lang de --input-case keep,normalize

``--model`` given several times translates with the ensemble of the models (as ``transduce evaluate`` does).

Each ``--input-case`` value is one row group: ``keep`` gives the model the lines as they are, ``normalize`` lowercases
ALL-CAPS and Title-Case lines first, ``truecase`` lowercases them and recases each word to its usual form in the
training sources (transduce.text.casing). Decoding is the model's own configuration unless --beam is given.
"""

from __future__ import annotations

import argparse
import time

from sacrebleu.metrics import BLEU

from harness import add_common_args, apply_common_args, machine, table
from transduce.search.evaluate import score, score_tokenized_lowercase
from transduce.search.translator import Translator
from transduce.text import casing
from transduce.text.textio import read_lines

VARIANTS = {"normal": lambda s: s, "ALL CAPS": str.upper, "Title Case": casing.title}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model",
        required=True,
        action="append",
        help="run directory, checkpoint or Hugging Face Marian directory (several times: their ensemble)",
    )
    parser.add_argument("--src", required=True, help="source sentences (raw, cased)")
    parser.add_argument("--ref", required=True, help="reference translations (raw, cased)")
    parser.add_argument("--lang", required=True, help="target language, for the lowercased tokenised BLEU")
    parser.add_argument("--input-case", default="keep,normalize", help="comma-separated: keep, normalize, truecase")
    parser.add_argument("--beam", type=int, help="beam size (default: the model's decoding configuration)")
    parser.add_argument("--limit", type=int, default=0, help="only the first N sentences (0: all)")
    add_common_args(parser, reps=None)
    args = parser.parse_args()
    apply_common_args(args)
    print(machine())

    sources = [text for _, text in read_lines(args.src)]
    references = [text for _, text in read_lines(args.ref)]
    if args.limit:
        sources, references = sources[: args.limit], references[: args.limit]
    translator = Translator.load(args.model if len(args.model) > 1 else args.model[0])
    insensitive = BLEU(lowercase=True)
    print(f"model {' + '.join(args.model)}; {len(sources)} sentences")
    header = ("input_case", "source", "BLEU (case-insensitive)", "vs normal", "cased sacreBLEU", "lc-tok BLEU", "s")
    rows = []
    for mode in args.input_case.split(","):
        normal = None
        for name, transform in VARIANTS.items():
            started = time.perf_counter()
            cfg = translator.search_config(beam=args.beam, input_case=mode)
            hyps = [ts[0].text for ts in translator.translate_lines(enumerate(map(transform, sources), 1), cfg)]
            seconds = time.perf_counter() - started
            bleu = insensitive.corpus_score(hyps, [references]).score
            normal = bleu if normal is None else normal
            cased = lc_tok = "-"
            if name == "normal":
                cased = f"{score(hyps, references).bleu:.2f}"
                lc_tok = f"{score_tokenized_lowercase(hyps, references, args.lang).bleu_lc_tok:.2f}"
            rows.append((mode, name, f"{bleu:.2f}", f"{bleu - normal:+.2f}", cased, lc_tok, f"{seconds:.0f}"))
    print(table(header, rows))
    print(f"case-insensitive BLEU: {insensitive.get_signature()}")


if __name__ == "__main__":
    main()
