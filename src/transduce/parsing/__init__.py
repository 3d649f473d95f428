"""Constituency parsing as sequence transduction (the paper's §6.3): sentence in, linearised tree out.

- :mod:`~transduce.parsing.trees`: reading Penn Treebank ``.mrg`` files, the standard preprocessing;
- :mod:`~transduce.parsing.linearize`: trees as decoder tokens and back, always well-formed;
- :mod:`~transduce.parsing.prepare`: treebanks into the prepared-data path of ``transduce prepare``;
"""

from transduce.parsing.linearize import Repair, delinearise, linearise
from transduce.parsing.trees import Tree, parse_trees, preprocess, read_treebank

__all__ = ["Repair", "Tree", "delinearise", "linearise", "parse_trees", "preprocess", "read_treebank"]
