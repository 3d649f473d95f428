"""The sentence-polarity record of docs/transfer.md: baselines, and trained classifiers' validation accuracy by seed.

    python benchmarks/movie_reviews.py baselines          # majority class; tf-idf + logistic regression (scikit-learn)
    python benchmarks/movie_reviews.py runs "scratch=runs/mr_scratch_s1,runs/mr_scratch_s2" "fine-tuned=runs/..."
    python benchmarks/movie_reviews.py pieces runs/multi30k_en_de runs/movie_reviews_scratch   # pieces per word

``baselines`` needs scikit-learn (``pip install scikit-learn``; not a dependency of transduce): words as scikit-learn's
``TfidfVectorizer`` splits them, unigrams and bigrams, sublinear term frequencies, logistic regression with C = 4.

``runs`` takes rows ``NAME=RUN,RUN,...``: for each run directory, the best validation accuracy in its metrics.jsonl
(the checkpoint ``transduce classify`` uses), the update it was reached at, the updates made and the training minutes
(its train.log's ``finished ... in N min`` line); per row the mean over the runs. Prints markdown tables.

``pieces`` takes runs (or vocabulary directories): how many pieces each one's source vocabulary makes of a training
text's word (whitespace-separated), over all the training texts.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

from harness import add_common_args, apply_common_args, machine, table

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "movie_reviews"


def read_tsv(path: Path) -> tuple[list[str], list[str]]:
    """Labels and texts of a ``label<TAB>text`` file (gzipped or not)."""
    from transduce.text.textio import read_lines

    labels, texts = [], []
    for _, line in read_lines(path):
        label, text = line.split("\t", 1)
        labels.append(label)
        texts.append(text)
    return labels, texts


def baselines(data: Path) -> list[list[str]]:
    """Majority class and tf-idf + logistic regression, trained on train and scored on valid."""
    try:
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.linear_model import LogisticRegression
    except ImportError as e:
        raise SystemExit("baselines needs scikit-learn: pip install scikit-learn") from e
    train_y, train_x = read_tsv(data / "train.tsv.gz")
    valid_y, valid_x = read_tsv(data / "valid.tsv.gz")
    majority = max(set(train_y), key=train_y.count)
    rows = [["majority class", f"{majority}", f"{100 * valid_y.count(majority) / len(valid_y):.1f}%"]]
    for ngrams in (1, 2):
        vectorizer = TfidfVectorizer(ngram_range=(1, ngrams), sublinear_tf=True)
        features = vectorizer.fit_transform(train_x)
        model = LogisticRegression(C=4.0, max_iter=2000).fit(features, train_y)
        accuracy = (model.predict(vectorizer.transform(valid_x)) == valid_y).mean()
        rows.append([f"tf-idf over words (1-{ngrams} grams) + logistic regression, C = 4",
                     f"{features.shape[1]:,} features", f"{100 * accuracy:.1f}%"])  # fmt: skip
    return rows


FINISHED = re.compile(r"finished \(([^)]*)\) at step (\d+) in ([\d.]+) min")


def run_summary(run: Path) -> tuple[float, int, int, float]:
    """Best validation accuracy, its update, the updates made and the training minutes of a classifier run."""
    best, best_step = -1.0, 0
    for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        event = json.loads(line)
        if event.get("event") == "valid" and event["accuracy"] > best:
            best, best_step = event["accuracy"], event["step"]
    match = FINISHED.findall((run / "train.log").read_text(encoding="utf-8"))
    if not match:
        raise SystemExit(f"{run}/train.log: no 'finished' line (is the run still training?)")
    _, steps, minutes = match[-1]
    return best, best_step, int(steps), float(minutes)


def runs_table(rows: list[str]) -> tuple[list[list[str]], list[list[str]]]:
    per_run, per_row = [], []
    for row in rows:
        name, _, paths = row.partition("=")
        if not paths:
            raise SystemExit(f"{row!r}: expected NAME=RUN,RUN,...")
        summaries = []
        for path in paths.split(","):
            acc, at, steps, minutes = run_summary(Path(path))
            summaries.append((acc, minutes))
            per_run.append([name, path, f"{acc:.2f}%", f"{at:,}", f"{steps:,}", f"{minutes:.1f}"])
        accs = [a for a, _ in summaries]
        spread = f" ± {statistics.stdev(accs):.2f}" if len(accs) > 1 else ""
        per_row.append([name, " / ".join(f"{a:.2f}" for a in accs), f"{statistics.mean(accs):.2f}%{spread}",
                        f"{max(m for _, m in summaries):.1f}"])  # fmt: skip
    return per_row, per_run


def pieces_per_word(runs: list[str], data: Path) -> list[list[str]]:
    """Pieces per whitespace-separated word of the training texts, under each run's source vocabulary."""
    from transduce.text.vocab import load_vocabulary
    from transduce.training import checkpoint as ckpt

    _, texts = read_tsv(data / "train.tsv.gz")
    words = sum(len(t.split()) for t in texts)
    rows = []
    for run in runs:
        path = Path(run)
        vocab = load_vocabulary(path if (path / "tokenizer.json").is_file() else ckpt.vocab_dir_of(ckpt.resolve(path)))
        pieces = sum(len(ids) for ids in vocab.encode_src_batch(texts))
        rows.append([run, f"{vocab.src_vocab_size:,}", f"{pieces / words:.2f}"])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(ap, reps=None)
    sub = ap.add_subparsers(dest="what", required=True)
    b = sub.add_parser("baselines", help="majority class and tf-idf + logistic regression on valid")
    b.add_argument("--data", type=Path, default=DATA, help="the folder with train.tsv.gz and valid.tsv.gz")
    r = sub.add_parser("runs", help="validation accuracy of classifier runs, by row")
    r.add_argument("rows", nargs="+", metavar="NAME=RUN,RUN,...")
    p = sub.add_parser("pieces", help="pieces per word of the training texts under runs' vocabularies")
    p.add_argument("runs", nargs="+", metavar="RUN")
    p.add_argument("--data", type=Path, default=DATA, help="the folder with train.tsv.gz")
    args = ap.parse_args()
    apply_common_args(args)
    print(machine())
    if args.what == "baselines":
        print(table(["baseline", "", "valid accuracy"], baselines(args.data)))
    elif args.what == "pieces":
        print(table(["vocabulary of", "pieces", "pieces per word"], pieces_per_word(args.runs, args.data)))
    else:
        per_row, per_run = runs_table(args.rows)
        print(table(["classifier", "seeds (valid accuracy %)", "mean ± sd", "training min (longest)"], per_row))
        print()
        print(table(["classifier", "run", "best valid accuracy", "at update", "updates", "training min"], per_run))


if __name__ == "__main__":
    main()
