"""Scoring a classifier's labels against gold labels: accuracy, per-class precision, recall and F1, macro-F1 and the
confusion matrix.

    scores = classification_scores(gold, predicted, labels=["negative", "positive"])
    scores.accuracy, scores.macro_f1      # percentages, 0-100
    print(scores.table())                 # the confusion matrix and the per-class scores, as evaluate prints them

The confusion matrix has a row per gold label and a column per predicted label, in the order of ``labels`` (the
classifier's). A class that is never predicted has precision 0 (no predictions to be right about) and so F1 0; one
that never occurs in the gold labels has recall 0. Macro-F1 is the unweighted mean of the F1 of the classes that
occur among the gold or the predicted labels (scikit-learn's default set); a class in neither has no F1 and does not
count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from transduce.errors import TransduceError


def confusion_matrix(gold: Sequence[int], predicted: Sequence[int], classes: int) -> torch.Tensor:
    """``(classes, classes)`` int64 counts: ``[g, p]`` is how many examples of gold class ``g`` were predicted ``p``."""
    g = torch.as_tensor(list(gold), dtype=torch.long)
    p = torch.as_tensor(list(predicted), dtype=torch.long)
    if g.shape != p.shape:
        raise ValueError(f"{len(g)} gold labels but {len(p)} predictions")
    if len(g) and (min(g.min(), p.min()) < 0 or max(g.max(), p.max()) >= classes):
        raise ValueError(f"class indices must be in [0, {classes})")
    return torch.bincount(g * classes + p, minlength=classes * classes).view(classes, classes)


def _ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """``num / den`` element-wise, 0 where ``den`` is 0."""
    return torch.where(den > 0, num / den.clamp(min=1), torch.zeros_like(num))


@dataclass(frozen=True)
class ClassificationScores:
    """Scores of predicted labels against gold labels (see the module docstring). Percentages are 0-100.

    Attributes:
        labels: the class names, the order of every list and of the matrix's rows and columns.
        confusion: ``confusion[gold][predicted]`` counts.
        accuracy: the share of examples whose prediction is the gold label.
        macro_f1: the mean F1 of the classes that occur among the gold or predicted labels.
        precision, recall, f1: per class.
        support: gold examples per class.
        examples: examples scored.
    """

    labels: list[str]
    confusion: list[list[int]]
    accuracy: float
    macro_f1: float
    precision: list[float]
    recall: list[float]
    f1: list[float]
    support: list[int]
    examples: int

    def to_dict(self) -> dict[str, Any]:
        """The JSON that ``transduce evaluate --json`` prints for a classifier."""
        per_class = {
            label: {"precision": p, "recall": r, "f1": f, "support": s}
            for label, p, r, f, s in zip(self.labels, self.precision, self.recall, self.f1, self.support, strict=True)
        }
        return {"accuracy": self.accuracy, "macro_f1": self.macro_f1, "examples": self.examples,
                "labels": list(self.labels), "per_class": per_class,
                "confusion": [list(row) for row in self.confusion]}  # fmt: skip

    def table(self) -> str:
        """The scores as ``transduce evaluate`` prints them: accuracy and macro-F1, the confusion matrix (rows gold,
        columns predicted) and precision, recall, F1 and support per class."""
        correct = sum(self.confusion[i][i] for i in range(len(self.labels)))
        lines = [f"accuracy = {self.accuracy:.2f}  ({correct} of {self.examples})", f"macro-F1 = {self.macro_f1:.2f}",
                 "", "confusion matrix (rows: gold, columns: predicted)"]  # fmt: skip
        name = max(len("label"), *(len(label) for label in self.labels))
        cell = max(5, *(len(label) for label in self.labels), *(len(str(n)) for row in self.confusion for n in row))
        lines.append(f"{'gold':<{name}}  " + "  ".join(f"{label:>{cell}}" for label in self.labels))
        for label, row in zip(self.labels, self.confusion, strict=True):
            lines.append(f"{label:<{name}}  " + "  ".join(f"{n:>{cell}}" for n in row))
        lines += ["", f"{'label':<{name}}  precision  recall      F1  support"]
        for i, label in enumerate(self.labels):
            lines.append(f"{label:<{name}}  {self.precision[i]:9.2f}  {self.recall[i]:6.2f}  {self.f1[i]:6.2f}  "
                         f"{self.support[i]:7d}")  # fmt: skip
        return "\n".join(lines)


def classification_scores(gold: Sequence[str], predicted: Sequence[str], labels: Sequence[str]) -> ClassificationScores:
    """Accuracy, per-class precision / recall / F1, macro-F1 and the confusion matrix (see the module docstring).

    Raises:
        TransduceError: no examples, or lists of different lengths.
        ValueError: a label that is not in ``labels``.
    """
    if len(gold) != len(predicted):
        raise TransduceError(f"{len(gold)} gold labels but {len(predicted)} predictions: nothing was scored")
    if not gold:
        raise TransduceError("no examples to score")
    index = {label: i for i, label in enumerate(labels)}
    unknown = next((x for x in (*gold, *predicted) if x not in index), None)
    if unknown is not None:
        raise ValueError(f"label {unknown!r} is not one of {', '.join(labels)}")
    matrix = confusion_matrix([index[x] for x in gold], [index[x] for x in predicted], len(labels))
    counts = matrix.double()
    tp = counts.diagonal()
    support, predictions = counts.sum(dim=1), counts.sum(dim=0)  # (C,) gold and predicted counts per class
    precision, recall = _ratio(tp, predictions), _ratio(tp, support)
    f1 = _ratio(2 * precision * recall, precision + recall)
    present = (support > 0) | (predictions > 0)
    percent = lambda t: [100.0 * float(x) for x in t]  # noqa: E731
    return ClassificationScores(
        labels=list(labels),
        confusion=matrix.tolist(),
        accuracy=100.0 * float(tp.sum()) / len(gold),
        macro_f1=100.0 * float(f1[present].mean()),
        precision=percent(precision),
        recall=percent(recall),
        f1=percent(f1),
        support=[int(x) for x in support],
        examples=len(gold),
    )


__all__ = ["ClassificationScores", "classification_scores", "confusion_matrix"]
