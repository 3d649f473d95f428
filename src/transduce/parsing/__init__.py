"""Constituency parsing as sequence transduction (the paper's §6.3): sentence in, linearised tree out.

- :mod:`~transduce.parsing.trees`: reading Penn Treebank ``.mrg`` files, the standard preprocessing;
- :mod:`~transduce.parsing.linearize`: trees as decoder tokens and back, always well-formed;
- :mod:`~transduce.parsing.prepare`: treebanks into the prepared-data path of ``transduce prepare``;
- :mod:`~transduce.parsing.parser`: parsing with a trained model (the paper's search: beam 21, alpha 0.3);
- :mod:`~transduce.parsing.evalb`: labelled bracketing scores as EVALB computes them (COLLINS.prm);
- :mod:`~transduce.parsing.pcfg`: the baselines, a treebank PCFG with Viterbi CKY and right-branching trees
  (NLTK's Penn Treebank sample: ``transduce download ptb-sample``, :mod:`transduce.data.download`);
- :mod:`~transduce.parsing.transfer`: a parser whose encoder starts as a translation model's.
"""

from transduce.parsing.linearize import Repair, delinearise, linearise
from transduce.parsing.trees import Tree, parse_trees, preprocess, read_treebank

__all__ = ["Repair", "Tree", "delinearise", "linearise", "parse_trees", "preprocess", "read_treebank"]
