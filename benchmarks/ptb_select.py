"""Choose a parser's final model and search on the tuning split, then parse the development files once.

    python benchmarks/ptb_select.py runs/ptb_s1 --dev $TB:wsj_0140-wsj_0169        # the defaults below
    python benchmarks/ptb_select.py runs/ptb_s1 runs/ptb_s2 --average 2,3 --beams 10,21 --alphas 0.0,0.3,0.6,1.0 \\
        --dev $TB:wsj_0140-wsj_0169 --out runs/ptb_pair                                  # two parsers as an ensemble

The tuning split is the first run's validation treebank (``data.valid``: wsj_0130-wsj_0139 in
``configs/ptb_parse.yaml``), or ``--tuning SPEC``; every choice below is made there by labelled F1 (EVALB's COLLINS
parameters, the constrained search of ``transduce parse``).

1. Candidates, for each run: the checkpoint ``transduce parse --model RUN`` takes (its best by the validation
   metric), its newest checkpoint when that is another, and for each N of ``--average`` the mean of its N newest
   checkpoints (written to ``RUN/average_lastN`` as ``transduce average --model RUN --last N`` does). Each parses the
   tuning split with the paper's search (beam 21, GNMT length penalty 0.3); the best is the run's model.
2. The chosen model, or with several runs the ensemble of their chosen models (``parse --model A --model B``), parses
   the tuning split again for every beam size x length penalty of the grid.
3. The winner parses the tuning split and the development files (``--dev``; without it, the tuning split alone, so
   that a run's choices can be studied before its development files are parsed) once: labelled and unlabelled scores,
   with each member scored beside an ensemble, into ``--out`` (default ``RUN1/select``): ``scores.json`` and the
   trees (``tuning.trees``, ``dev.trees``).

Nothing here parses the development files before step 3. Ties go to the simpler choice (the run's own checkpoint, the
paper's search). Prints markdown tables for ``docs/parsing.md``.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from dataclasses import replace
from pathlib import Path

from harness import add_common_args, apply_common_args, machine, table
from multi30k_select import best, choose_member, floats, ints
from transduce.config import Config
from transduce.parsing.evalb import COLLINS, evalb
from transduce.parsing.parser import PAPER_DECODE, Parser
from transduce.parsing.trees import Tree, read_treebank
from transduce.search.translator import Translator
from transduce.training import checkpoint as ckpt

UNLABELLED = replace(COLLINS, labelled=False)


def own_candidates(run: Path) -> list[tuple[str, Path]]:
    """What ``parse --model RUN`` takes (the best checkpoint, else the newest), then the newest if that differs."""
    own = ckpt.resolve(run)
    found = ckpt.list_checkpoints(run)
    candidates = [(f"the run's own ({own.name})", own)]
    if found and found[-1].resolve() != own.resolve():
        candidates.append((f"last ({found[-1].name})", found[-1]))
    return candidates


def parse_and_score(models: Path | list[Path], gold: list[Tree], **decode) -> tuple[list[Tree], dict]:
    """The trees of ``gold``'s words parsed by ``models`` (one or an ensemble) with the paper's search changed by
    ``decode``, and their labelled and unlabelled scores."""
    parser = Parser(Translator.load(models))
    results = parser.parse([tree.words() for tree in gold], PAPER_DECODE.replace(**decode))
    trees, repaired = [r.tree for r in results], [r.repair.needed for r in results]
    labelled = evalb(gold, trees, repaired=repaired).to_dict()
    unlabelled = evalb(gold, trees, UNLABELLED, repaired=repaired).to_dict()
    return trees, {**labelled, "unlabelled_f1": unlabelled["f1"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", type=Path, nargs="+", help="parsing run directories (several: their ensemble)")
    ap.add_argument("--average", type=ints, default=[2, 3], help="N of the averages of the N newest checkpoints")
    ap.add_argument("--beams", type=ints, default=[PAPER_DECODE.beam])
    ap.add_argument("--alphas", type=floats, default=[0.0, PAPER_DECODE.length_penalty, 0.6, 1.0])
    ap.add_argument("--tuning", metavar="SPEC", help="the treebank to choose on (default: the first run's data.valid)")
    ap.add_argument("--dev", metavar="SPEC", help="the treebank parsed once at the end (none: the tuning split only)")
    ap.add_argument("--out", type=Path, default=None, help="the output folder (default RUN1/select)")
    add_common_args(ap, reps=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    apply_common_args(args)
    print(machine())

    cfg = Config.load(args.runs[0] / "config.yaml")
    tuning_spec = args.tuning or cfg.data.valid
    if not tuning_spec:
        raise SystemExit(f"{args.runs[0] / 'config.yaml'}: no data.valid to choose on: give --tuning SPEC")
    tuning = read_treebank(tuning_spec)

    def tuning_f1(models: Path | list[Path], **decode) -> float:
        return float(parse_and_score(models, tuning, **decode)[1]["f1"])

    print(f"\nTuning F1 ({tuning_spec}, {len(tuning)} trees) of each run's candidates, the paper's search:")
    chosen = [choose_member(run, args.average, tuning_f1, own=own_candidates(run), metric="tuning F1")
              for run in args.runs]  # fmt: skip
    paths = [path for _, _, path in chosen]
    model = paths[0] if len(paths) == 1 else paths
    what = " + ".join(f"{r} {n}" for r, (_, n, _) in zip(args.runs, chosen, strict=True))

    own = (PAPER_DECODE.beam, PAPER_DECODE.length_penalty)
    print(f"\nSearch grid on the tuning split (labelled F1) for {what}:\n")
    grid, cells = [], []
    for beam in args.beams:
        row = []
        for alpha in args.alphas:
            mine = len(paths) == 1 and (beam, alpha) == own  # one run at the paper's search: its member score
            value = chosen[0][0] if mine else tuning_f1(model, beam=beam, length_penalty=alpha)
            grid.append((value, (beam, alpha)))
            row.append(f"{value:.2f}")
        cells.append((beam, *row))
    print(table(("beam", *(f"alpha {a}" for a in args.alphas)), cells))
    grid.sort(key=lambda g: g[1] != own)  # the paper's search first: it wins ties
    beam, alpha = best(grid)

    print(f"\nChosen: {what}, beam {beam}, alpha {alpha}; parsing the tuning and development files once:\n")
    out = args.out or args.runs[0] / "select"
    out.mkdir(parents=True, exist_ok=True)
    sets = [("tuning", tuning_spec, tuning)] + ([("dev", args.dev, read_treebank(args.dev))] if args.dev else [])
    result: dict = {"models": [str(p) for p in paths], "decode": {"beam": beam, "length_penalty": alpha}, "sets": {}}
    rows = []
    members = [(f"member {p}", p) for p in paths] if len(paths) > 1 else []
    for label, models in [("", model), *members]:
        for name, spec, gold in sets:
            t0 = time.perf_counter()
            trees, score = parse_and_score(models, gold, beam=beam, length_penalty=alpha)
            score = {**score, "treebank": spec, "seconds": round(time.perf_counter() - t0, 1)}
            if not label:
                (out / f"{name}.trees").write_text("".join(t.to_string() + "\n" for t in trees), encoding="utf-8")
                result["sets"][name] = score
            else:
                result.setdefault("members", {}).setdefault(str(models), {})[name] = score
            rows.append((f"{name} {label}".strip(), score))
    (out / "scores.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    header = ("set", "F1", "P", "R", "exact", "unlabelled F1", "repaired", "seconds")
    print(table(header, [(n, f"{s['f1']:.2f}", f"{s['precision']:.2f}", f"{s['recall']:.2f}",
                          f"{s['exact_match']:.2f} %", f"{s['unlabelled_f1']:.2f}", s["repaired"], s["seconds"])
                         for n, s in rows]))  # fmt: skip
    print(f"\nwritten: {out}")


if __name__ == "__main__":
    main()
