"""Sentence classification (``data.task: classify``): transduce's encoder with a classification head, trained from
scratch or started from a translation model's encoder (docs/transfer.md).

- :mod:`transduce.transfer.classify.data`: labelled TSV / JSON Lines corpora, their preparation, batches;
- :mod:`transduce.transfer.classify.model`: :class:`ClassifierModel` (encoder, ``<cls>``/mean/max pooling, head; CoVe's
  task model);
- :mod:`transduce.transfer.classify.transfer`: what a classifier takes from a translation model, freezing, learning
  rates;
- :mod:`transduce.transfer.classify.training`: the loss and the validation (accuracy) the training loop calls;
- :mod:`transduce.transfer.classify.classifier`: :class:`Classifier`, a trained classifier that labels text;
- :mod:`transduce.transfer.classify.inputs`: the texts ``transduce classify`` and ``evaluate`` read;
- :mod:`transduce.transfer.classify.metrics`: accuracy, per-class and macro F1, the confusion matrix.

Using a trained classifier::

    classifier = Classifier.load("runs/movie_reviews_finetune")
    classifier.labels                                  # ['negative', 'positive']
    classifier.predict(["a gripping , funny film ."])  # ['positive']
    classifier.classify(texts)                         # [Classification(label, probabilities), ...]
    classifier.probabilities(texts)                    # (N, classes) tensor
"""

from __future__ import annotations

from transduce.transfer.classify.classifier import Classification, Classifier, is_classifier, load_classifier
from transduce.transfer.classify.model import ClassifierModel

__all__ = ["Classification", "Classifier", "ClassifierModel", "is_classifier", "load_classifier"]
