"""Choose a Multi30k run's (or ensemble's) final model and decoding settings on the validation set, then score the
test sets once.

    python benchmarks/multi30k_select.py runs/multi30k_en_de                       # last 5 and last 10 averaged
    python benchmarks/multi30k_select.py RUN --average 5,10,15 --beams 4,6 --alphas 0.6,1.0,1.4
    python benchmarks/multi30k_select.py RUN --average 3,5,8,12 --norms gnmt,length   # both length penalty forms
    python benchmarks/multi30k_select.py RUN1 RUN2 --average 3,6,12 --beams 5 --alphas 1.0,1.2,1.5,2.0 \\
        --metric bleu --test ../shared/data/multi30k/test_2016_flickr              # two runs as an ensemble

1. Candidates, for each run: its newest checkpoint and, for each N of ``--average``, the mean of its N newest
   checkpoints (written to ``RUN/average_lastN`` as ``transduce average --model RUN --last N`` does). Each is
   translated on the validation set with the run's decoding settings, and the best (``--metric``: sacreBLEU cased,
   ``bleu``, or the literature's lowercased, Moses-tokenised ``bleu_lc_tok``) is the run's model.
2. The chosen model, or with several runs the ensemble of their chosen models (the mean of their probabilities, as
   ``transduce evaluate --model A --model B`` translates), is decoded on the validation set again for every beam
   size x length penalty (x penalty form, ``--norms``).
3. The winning model and settings translate the validation set and the test sets once (the runs' own
   ``data.test``, or ``--test``): one run through ``transduce report --evaluate`` (``RUN/eval/scores.json``); an
   ensemble into ``--out`` (default ``RUN1/eval_ensemble``), with each member scored beside it on the same sets and
   settings (the best single model is reported beside an ensemble).

Nothing here looks at the test set before step 3. Ties go to the simpler choice (the newest checkpoint, the run's own
decoding settings). Prints markdown tables for ``docs/multi30k.md``.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from harness import add_common_args, apply_common_args, machine, table
from transduce.config import Config
from transduce.data.corpus import read_corpus
from transduce.search.translator import Translator
from transduce.text.textio import write_lines
from transduce.training import checkpoint as ckpt
from transduce.training.report import eval_sets, evaluate_run, score_both

METRICS = ("bleu", "bleu_lc_tok")


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def names(text: str) -> list[str]:
    return [x for x in text.split(",") if x]


def best(scored: Sequence[tuple[float, object]]) -> object:
    """The item of the highest score; the first of equal ones (candidates come simplest first)."""
    return max(enumerate(scored), key=lambda e: (e[1][0], -e[0]))[1][1]


def choose_member(
    run: Path, average: list[int], val_score: Callable[[Path], float], *,
    own: list[tuple[str, Path]] | None = None, metric: str = "val BLEU",
) -> tuple[float, str, Path]:  # fmt: skip
    """The run's newest checkpoint (or the ``own`` candidates, named, simplest first) or one of the averages of its
    newest checkpoints, whichever scores best on validation (with its score); ``metric`` heads the printed table."""
    found = ckpt.list_checkpoints(run)
    candidates: list[tuple[str, Path]] = list(own) if own else [(f"last ({found[-1].name})", found[-1])]
    for n in average:
        if n > len(found):
            print(f"{run}: skipping the average of {n}: the run has {len(found)} checkpoints")
            continue
        out = run / f"average_last{n}"
        model, config, vocab_dir = ckpt.average_checkpoints(found[-n:])
        ckpt.save_model(out, model, config, vocab_dir)
        candidates.append((f"average of the last {n} ({found[-n].name} .. {found[-1].name})", out))
    scored, cells = [], []
    for name, path in candidates:
        t0 = time.perf_counter()
        value = val_score(path)
        scored.append((value, (value, name, path)))
        cells.append((name, f"{value:.2f}", f"{time.perf_counter() - t0:.0f}"))
    print(f"\n{run}:\n\n" + table(("model", metric, "seconds"), cells))
    return best(scored)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", type=Path, nargs="+", help="training run directories (several: their ensemble)")
    ap.add_argument("--average", type=ints, default=[5, 10], help="N of the averages of the N newest checkpoints")
    ap.add_argument("--beams", type=ints, default=[4, 5])
    ap.add_argument("--alphas", type=floats, default=[0.6, 1.0])
    ap.add_argument(
        "--norms", type=names, default=None,
        help="length penalty forms to try: gnmt, length (DecodeConfig.length_norm; default: the run's)",
    )  # fmt: skip
    ap.add_argument(
        "--metric", choices=METRICS, default="bleu_lc_tok",
        help="what the choices maximise on validation (default: lowercased, Moses-tokenised BLEU)",
    )  # fmt: skip
    ap.add_argument(
        "--test", action="append", default=None, metavar="CORPUS",
        help="a test corpus as data.test names one (repeatable; default: the first run's data.test)",
    )  # fmt: skip
    ap.add_argument("--precision", default="fp32", help="the decoders' precision (auto, fp32, bf16)")
    ap.add_argument("--out", type=Path, default=None, help="an ensemble's output folder (default RUN1/eval_ensemble)")
    add_common_args(ap, reps=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    apply_common_args(args)
    print(machine())

    cfg = Config.load(args.runs[0] / "config.yaml")
    if not cfg.data.valid:
        raise SystemExit(f"{args.runs[0] / 'config.yaml'}: no data.valid set to choose on")
    lang = cfg.data.tgt_lang
    sets = [(name, *read_corpus(corpus)) for name, corpus in eval_sets(cfg, args.test)]
    _, sources, references = sets[0]

    def val_score(models: Path | list[Path], **decode) -> float:
        translator = Translator.load(models, decode=cfg.decode.replace(**decode), precision=args.precision)
        return float(score_both(translator.translate(sources), references, lang)[args.metric])

    print(f"\nValidation {args.metric} of each run's candidates, its own decoding settings:")
    chosen = [choose_member(run, args.average, val_score) for run in args.runs]
    paths = [path for _, _, path in chosen]
    model = paths[0] if len(paths) == 1 else paths
    what = chosen[0][1] if len(paths) == 1 else "the ensemble of " + " + ".join(f"{r} {n}" for r, (_, n, _) in
                                                                               zip(args.runs, chosen))  # fmt: skip

    beam0, alpha0, norm0 = cfg.decode.beam, cfg.decode.length_penalty, cfg.decode.length_norm
    norms = args.norms or [norm0]
    print(f"\nDecoding grid on validation ({args.metric}) for {what}:\n")
    grid, cells = [], []
    own = (beam0, norm0, alpha0)
    for beam in args.beams:
        for norm in norms:
            row = []
            for alpha in args.alphas:
                key = (beam, norm, alpha)  # one run at its own settings: its member score already
                mine = len(paths) == 1 and key == own
                value = chosen[0][0] if mine else val_score(model, beam=beam, length_penalty=alpha, length_norm=norm)
                grid.append((value, key))
                row.append(f"{value:.2f}")
            cells.append((beam, norm, *row))
    print(table(("beam", "penalty", *(f"alpha {a}" for a in args.alphas)), cells))
    grid.sort(key=lambda g: g[1] != own)  # the run's own settings first: they win ties
    beam, norm, alpha = best(grid)
    decode = dict(beam=beam, length_penalty=alpha, length_norm=norm)

    print(f"\nChosen: {what}, beam {beam}, alpha {alpha} ({norm}); scoring validation and test sets once:\n")
    header = ("set", "BLEU lowercased Moses-tokenised", "sacreBLEU cased", "chrF")
    if len(paths) == 1 and args.test is None:
        result = evaluate_run(args.runs[0], model=paths[0], precision=args.precision, **decode)
        rows = [(name, s) for name, s in result["sets"].items()]
        written = args.runs[0] / "eval"
    else:
        written = args.out or args.runs[0] / ("eval_ensemble" if len(paths) > 1 else "eval")
        written.mkdir(parents=True, exist_ok=True)
        result, rows = {"models": [str(p) for p in paths], "decode": decode, "sets": {}}, []
        members = [(f"member {p}", [p]) for p in paths] if len(paths) > 1 else []
        for label, models in [("", paths), *members]:
            translator = Translator.load(models if len(models) > 1 else models[0],
                                         decode=cfg.decode.replace(**decode), precision=args.precision)  # fmt: skip
            for name, srcs, refs in sets:
                hypotheses = translator.translate(srcs)
                s = score_both(hypotheses, refs, lang)
                if not label:
                    write_lines(hypotheses, written / f"{name}.hyp.{lang}")
                    result["sets"][name] = s
                else:
                    result.setdefault("members", {}).setdefault(str(models[0]), {})[name] = s
                rows.append((f"{name} {label}".strip(), s))
        (written / "scores.json").write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(table(header, [(n, f"{s['bleu_lc_tok']:.2f}", f"{s['bleu']:.2f}", f"{s['chrf']:.2f}") for n, s in rows]))
    first = rows[0][1]
    print(f"\n{first['bleu_lc_tok_signature']}\n{first['bleu_signature']}\nwritten: {written}")


if __name__ == "__main__":
    main()
