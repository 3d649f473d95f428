"""Choose a Multi30k run's final model and decoding settings on the validation set, then score the test sets once.

    python benchmarks/multi30k_select.py runs/multi30k_en_de                       # last 5 and last 10 averaged
    python benchmarks/multi30k_select.py RUN --average 5,10,15 --beams 4,6 --alphas 0.6,1.0,1.4
    python benchmarks/multi30k_select.py RUN --average 3,5,8,12 --norms gnmt,length   # both length penalty forms

1. Candidates: the run's newest checkpoint and, for each N of ``--average``, the mean of its N newest checkpoints
   (written to ``RUN/average_lastN`` as ``transduce average --model RUN --last N`` does). Each is translated on the
   validation set with the run's decoding settings.
2. The candidate with the best validation BLEU in the literature's convention (lowercased, Moses-tokenised) is
   decoded on the validation set again for every beam size x length penalty (x penalty form, ``--norms``).
3. The winning model and settings translate the validation and test sets once, through ``transduce report
   --evaluate`` (``RUN/eval/scores.json``: both BLEU conventions with signatures).

Nothing here looks at the test set before step 3. Prints markdown tables for ``docs/multi30k.md``.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

from harness import add_common_args, apply_common_args, machine, table
from transduce.config import Config
from transduce.search.evaluate import score_tokenized_lowercase
from transduce.search.translator import Translator
from transduce.text.textio import read_lines, resolve_corpus_file
from transduce.training import checkpoint as ckpt
from transduce.training.report import evaluate_run


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def names(text: str) -> list[str]:
    return [x for x in text.split(",") if x]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path, help="training run directory")
    ap.add_argument("--average", type=ints, default=[5, 10], help="N of the averages of the N newest checkpoints")
    ap.add_argument("--beams", type=ints, default=[4, 5])
    ap.add_argument("--alphas", type=floats, default=[0.6, 1.0])
    ap.add_argument(
        "--norms", type=names, default=None,
        help="length penalty forms to try: gnmt, length (DecodeConfig.length_norm; default: the run's)",
    )  # fmt: skip
    add_common_args(ap, reps=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    apply_common_args(args)
    print(machine())

    cfg = Config.load(args.run / "config.yaml")
    if not cfg.data.valid:
        raise SystemExit(f"{args.run / 'config.yaml'}: no data.valid set to choose on")
    lang = cfg.data.tgt_lang
    sources = [t for _, t in read_lines(resolve_corpus_file(cfg.data.valid, cfg.data.src_lang))]
    references = [t for _, t in read_lines(resolve_corpus_file(cfg.data.valid, lang))]

    def val_bleu(model_path: Path, **decode) -> float:
        translator = Translator.load(model_path, decode=cfg.decode.replace(**decode))
        return score_tokenized_lowercase(translator.translate(sources), references, lang).bleu_lc_tok

    found = ckpt.list_checkpoints(args.run)
    candidates: list[tuple[str, Path]] = [(f"last ({found[-1].name})", found[-1])]
    for n in args.average:
        if n > len(found):
            print(f"skipping the average of {n}: the run has {len(found)} checkpoints")
            continue
        out = args.run / f"average_last{n}"
        model, config, vocab_dir = ckpt.average_checkpoints(found[-n:])
        ckpt.save_model(out, model, config, vocab_dir)
        candidates.append((f"average of the last {n} ({found[-n].name} .. {found[-1].name})", out))

    beam0, alpha0, norm0 = cfg.decode.beam, cfg.decode.length_penalty, cfg.decode.length_norm
    norms = args.norms or [norm0]
    print(f"\nValidation BLEU (lowercased, Moses-tokenised), beam {beam0}, alpha {alpha0} ({norm0}):\n")
    scored, cells = [], []
    for name, path in candidates:
        t0 = time.perf_counter()
        bleu = val_bleu(path)
        scored.append((bleu, name, path))
        cells.append((name, f"{bleu:.2f}", f"{time.perf_counter() - t0:.0f}"))
    print(table(("model", "val BLEU", "seconds"), cells))
    best_bleu, best_name, best_path = max(scored, key=lambda s: s[0])  # the first (simplest) wins ties

    print(f"\nDecoding grid on validation for {best_name}:\n")
    grid, cells = {}, []
    own = (beam0, norm0, alpha0)
    for beam in args.beams:
        for norm in norms:
            row = []
            for alpha in args.alphas:
                key = (beam, norm, alpha)
                decode = dict(beam=beam, length_penalty=alpha, length_norm=norm)
                bleu = best_bleu if key == own else val_bleu(best_path, **decode)
                grid[key] = bleu
                row.append(f"{bleu:.2f}")
            cells.append((beam, norm, *row))
    print(table(("beam", "penalty", *(f"alpha {a}" for a in args.alphas)), cells))
    beam, norm, alpha = max(grid, key=lambda k: (grid[k], k == own))  # ties: the run's own settings

    print(f"\nChosen: {best_name}, beam {beam}, alpha {alpha} ({norm}); scoring validation and test sets once:\n")
    result = evaluate_run(args.run, model=best_path, beam=beam, length_penalty=alpha, length_norm=norm)
    cells = [
        (name, f"{s['bleu_lc_tok']:.2f}", f"{s['bleu']:.2f}", f"{s['chrf']:.2f}") for name, s in result["sets"].items()
    ]
    print(table(("set", "BLEU lowercased Moses-tokenised", "sacreBLEU cased", "chrF"), cells))
    first = next(iter(result["sets"].values()))
    print(f"\n{first['bleu_lc_tok_signature']}\n{first['bleu_signature']}\nwritten: {args.run / 'eval'}")


if __name__ == "__main__":
    main()
