"""Penn Treebank trees: reading bracketed ``.mrg`` files and the standard preprocessing of parsing papers.

A tree is a :class:`Tree` whose leaves are words (``str``); a pre-terminal is a ``Tree`` with one word child (its
label is the part-of-speech tag). :func:`read_treebank` reads a ``.mrg`` file, a directory of them, or a ``.tar.gz``
/ ``.zip`` archive (NLTK's data package) directly, optionally restricted to a range of file names, e.g.
``wsj_0001-0169.mrg.tar.gz:wsj_0001-wsj_0139``. :func:`preprocess` does what parsing papers do before training
and scoring: remove ``-NONE-`` empty elements and the constituents they leave empty, strip function tags and
indices (``NP-SBJ-1`` -> ``NP``, ``NP=2`` -> ``NP``) and drop the root's empty label. Part-of-speech tags are kept.

    trees = [preprocess(t) for t in read_treebank("ptb/wsj_0001-0169.mrg.tar.gz:wsj_0140-wsj_0169")]
    print(trees[0].words(), trees[0].to_string())
"""

from __future__ import annotations

import io
import re
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

from transduce.errors import DataError

ROOT_LABEL = "TOP"  # the label of a root that keeps several constituents (EVALB deletes TOP brackets)
EMPTY_TAG = "-NONE-"  # the part-of-speech tag of traces and other empty elements
_TOKEN = re.compile(r"\(|\)|[^\s()]+")


class Tree:
    """A constituent: a label and its children (subtrees, or one word for a pre-terminal)."""

    __slots__ = ("children", "label")

    def __init__(self, label: str, children: list[Tree | str]) -> None:
        self.label = label
        self.children = children

    def is_preterminal(self) -> bool:
        """True for a part-of-speech node: one child, a word."""
        return len(self.children) == 1 and isinstance(self.children[0], str)

    def words(self) -> list[str]:
        """The words at the leaves, left to right."""
        out: list[str] = []
        for child in self.children:
            if isinstance(child, str):
                out.append(child)
            else:
                out.extend(child.words())
        return out

    def tags(self) -> list[str]:
        """The label of each word's parent (its part-of-speech tag), left to right."""
        out: list[str] = []
        for child in self.children:
            if isinstance(child, str):
                out.append(self.label)
            else:
                out.extend(child.tags())
        return out

    def subtrees(self) -> Iterator[Tree]:
        """This node and every node below it, in pre-order."""
        yield self
        for child in self.children:
            if isinstance(child, Tree):
                yield from child.subtrees()

    def to_string(self) -> str:
        """The one-line bracketed form, ``(S (NP (DT The) (NN cat)) (VP (VBD sat)))``."""
        parts = [child if isinstance(child, str) else child.to_string() for child in self.children]
        return f"({self.label} {' '.join(parts)})" if parts else f"({self.label})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tree) and self.label == other.label and self.children == other.children

    def __hash__(self) -> int:
        return hash(self.to_string())

    def __repr__(self) -> str:
        return f"Tree({self.to_string()!r})"


# ----------------------------------------------------------------------------------------------------------------------
# reading


def parse_trees(text: str, source: str = "<string>") -> Iterator[Tree]:
    """The trees of bracketed text (one or many, across any number of lines), exactly as written.

    The treebank's outer bracket has no label, ``( (S ...) )``: it comes back as a ``Tree`` labelled ``""``.

    Raises:
        DataError: unbalanced brackets or a word outside any bracket, naming ``source`` and the line.
    """
    stack: list[Tree] = []
    line = 1
    pos = 0
    for m in _TOKEN.finditer(text):
        line += text.count("\n", pos, m.start())
        pos = m.start()
        token = m.group()
        if token == "(":
            node = Tree("", [])
            nxt = _TOKEN.match(text, _skip_space(text, m.end()))
            stack.append(node)
            if nxt and nxt.group() not in "()":
                node.label = "\0"  # the label comes next: marked so the next token fills it in
        elif token == ")":
            if not stack:
                raise DataError(f"{source}:{line}: ')' closes no bracket")
            node = stack.pop()
            if not node.children:
                raise DataError(f"{source}:{line}: a bracket without children")
            if not stack:
                yield node
            else:
                stack[-1].children.append(node)
        else:
            if not stack:
                raise DataError(f"{source}:{line}: {token!r} outside any bracket")
            if stack[-1].label == "\0":
                stack[-1].label = token
            else:
                stack[-1].children.append(token)
    if stack:
        raise DataError(f"{source}: {len(stack)} bracket(s) not closed at the end of the text")


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def _in_range(name: str, first: str, last: str) -> bool:
    stem = Path(name).name.split(".")[0]
    return (not first or stem >= first) and (not last or stem <= last)


def split_spec(spec: str | Path) -> tuple[Path, str, str]:
    """``PATH[:FIRST-LAST]`` -> (path, first file stem, last file stem); empty stems mean no bound.

    ``PATH`` wins when it exists as written (a path may contain ':')."""
    spec = str(spec)
    if Path(spec).exists() or ":" not in spec:
        return Path(spec), "", ""
    path, _, span = spec.rpartition(":")
    first, sep, last = span.partition("-")
    if not sep:
        first = last = span
    return Path(path), first, last


def treebank_files(spec: str | Path) -> Iterator[tuple[str, str]]:
    """``(name, text)`` of each ``.mrg`` file of ``spec`` in name order (see :func:`read_treebank`).

    Raises:
        DataError: the path does not exist, is not a treebank, or the range selects no file.
    """
    path, first, last = split_spec(spec)
    if not path.exists():
        raise DataError(f"{path}: treebank not found (a .mrg file, a directory of them, a .tar.gz or a .zip)")
    found = 0
    if path.is_dir():
        for file in sorted(path.rglob("*.mrg"), key=lambda p: p.name):
            if _in_range(file.name, first, last):
                found += 1
                yield str(file), _decode(file.read_bytes(), str(file))
    elif tarfile.is_tarfile(path):
        with tarfile.open(path) as tar:
            members = sorted((m for m in tar.getmembers() if m.isfile() and m.name.endswith(".mrg")),
                             key=lambda m: Path(m.name).name)  # fmt: skip
            for member in members:
                if _in_range(member.name, first, last):
                    found += 1
                    data = tar.extractfile(member).read()  # type: ignore[union-attr]
                    yield f"{path}:{member.name}", _decode(data, f"{path}:{member.name}")
    elif zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            for name in sorted((n for n in archive.namelist() if n.endswith(".mrg")), key=lambda n: Path(n).name):
                if _in_range(name, first, last):
                    found += 1
                    yield f"{path}:{name}", _decode(archive.read(name), f"{path}:{name}")
    else:
        found += 1
        yield str(path), _decode(path.read_bytes(), str(path))
    if not found:
        bounds = f" from {first or 'the first'} to {last or 'the last'}" if first or last else ""
        raise DataError(f"{path}: no .mrg files{bounds}")


def _decode(data: bytes, source: str) -> str:
    try:
        return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8").read()
    except UnicodeDecodeError as e:
        raise DataError(f"{source}: byte {e.start + 1} is not UTF-8") from None


def read_treebank(spec: str | Path, *, raw: bool = False) -> list[Tree]:
    """The trees of a treebank, preprocessed with :func:`preprocess` unless ``raw``.

    Args:
        spec: ``PATH`` or ``PATH:FIRST-LAST``. ``PATH`` is a ``.mrg`` file, a directory (searched recursively for
            ``*.mrg``) or a ``.tar``/``.tar.gz``/``.zip`` archive; ``FIRST-LAST`` keeps the files whose name (without
            extension) sorts between the two, inclusive: ``wsj_0001-wsj_0139``.
        raw: return the trees as written.

    Raises:
        DataError: unreadable input, or a tree that preprocessing leaves empty.
    """
    out = []
    for name, text in treebank_files(spec):
        for i, tree in enumerate(parse_trees(text, name)):
            if raw:
                out.append(tree)
                continue
            clean = preprocess(tree)
            if clean is None:
                raise DataError(f"{name}: tree {i + 1} has no words once empty elements are removed")
            out.append(clean)
    return out


# ----------------------------------------------------------------------------------------------------------------------
# preprocessing


def strip_label(label: str) -> str:
    """``NP-SBJ-1`` -> ``NP``, ``NP=2`` -> ``NP``, ``PP-LOC-CLR`` -> ``PP``; ``-LRB-`` and ``-NONE-`` stay."""
    if label.startswith("-") and label.endswith("-"):
        return label
    return re.split(r"[-=]", label, maxsplit=1)[0] or label


def preprocess(tree: Tree) -> Tree | None:
    """The tree of parsing papers: no empty elements, no function tags or indices, no empty root label.

    Constituents left without words are removed; unary chains are kept. A root with an empty label is replaced by
    its only child, or labelled :data:`ROOT_LABEL` when it has several. Returns ``None`` for a tree without words.
    """
    clean = _clean(tree)
    if clean is None:
        return None
    if clean.label == "":
        if len(clean.children) == 1 and isinstance(clean.children[0], Tree):
            return clean.children[0]
        clean.label = ROOT_LABEL
    return clean


def _clean(tree: Tree) -> Tree | None:
    if tree.is_preterminal():
        return None if tree.label == EMPTY_TAG else Tree(tree.label, list(tree.children))
    children: list[Tree | str] = []
    for child in tree.children:
        if isinstance(child, str):  # a word directly under a phrase (not in the treebank's format): kept
            children.append(child)
            continue
        kept = _clean(child)
        if kept is not None:
            children.append(kept)
    if not children:
        return None
    return Tree(strip_label(tree.label), children)
