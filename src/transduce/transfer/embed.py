"""Contextual word vectors from a translation model's encoder (CoVe: McCann et al., 2017, "Learned in Translation:
Contextualized Word Vectors"), in files that any other library reads.

    translator = Translator.load("runs/en-de")
    [v] = translator.embed(["A man rides a bike."])
    v.pieces                                 # ['▁A', '▁man', '▁rides', '▁a', '▁bike', '.']
    v.states                                 # (6, d_model) float32: the encoder's output at each piece
    v.pooled                                 # (d_model,) float32: their mean
    write_embeddings("vectors.npz", Embeddings.of([v], dim=embedding_dim(translator)))

What the vectors are:

- The source is prepared as :meth:`Translator.translate` prepares it: the run's ``decode.input_case`` (ALL-CAPS and
  Title-Case lines lowercased, or truecased) unless ``input_case`` says otherwise, the model's tokenizer, EOS
  appended. The encoder runs on those ids in eval mode (no dropout), without gradients, in the translator's
  precision and on its device; the vectors come back as float32 numpy arrays.
- ``states``: the encoder's output (a pre-norm stack's after its final LayerNorm); row ``k`` belongs to
  ``pieces[k]``. The EOS position is part of the encoder's input but its row is left out, unless
  ``include_eos=True`` (then the last row, with the model's EOS piece, ``</s>``, in ``pieces``).
- ``with_embeddings=True``: each row is ``[embedding; state]``, ``2 * d_model`` columns: CoVe's ``[GloVe(w);
  CoVe(w)]`` with the model's own context-free vector in GloVe's place. The embedding is the piece's row of the
  source embedding matrix times the model's embedding scale (``sqrt(d_model)`` for models that scale embeddings: the
  paper's, Marian's), i.e. the vector the encoder adds the positional encoding to; no position, no dropout.
- A Marian model (a Hugging Face directory, or its ``import-hf`` checkpoint) keeps transduce's interleaved sinusoid
  layout, so its rows are Marian's encoder output with the columns reordered: ``states[:, perm]`` with ``perm =
  transduce.interop.marian.residual_permutation(d_model)`` is what Hugging Face's encoder gives (tested).
- ``pooled``: the mean of the rows returned (so with ``with_embeddings`` the mean embedding, then the mean state;
  the EOS row counts only with ``include_eos``). A text without rows (an empty line, without ``include_eos``) has a
  pooled vector of zeros.
- A text of more than ``max_input_tokens`` pieces is encoded in parts, cut where :meth:`Translator.translate` cuts
  it (after sentence punctuation where possible), each part with its own EOS, and the parts' rows are concatenated
  (with ``include_eos``, each part's EOS row is among them); a warning names the line.
- Texts are sorted by length and batched by a token budget (``max_tokens``, default the run's
  ``decode.max_tokens``); results come back in input order. Padding is masked, so a text's vectors do not depend on
  the other texts of its batch, up to the rounding of batched matrix products (of the order of 1e-6).

The files (:func:`write_embeddings`; the layout is documented in docs/cli.md, ``transduce embed``): every
sentence's rows concatenated into one ``vectors`` array ``(T, D)`` with ``offsets`` ``(N + 1,)`` (sentence ``i`` is
``vectors[offsets[i]:offsets[i + 1]]``), the pieces ``(T,)`` and ``pooled`` ``(N, D)``, as ``.npz``, ``.safetensors``
(pieces in the header's metadata) or ``.npy`` (three files: the vectors, ``.pooled.npy`` and ``.pieces.json``).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np
import torch

from transduce.config import ConfigError
from transduce.files import STDIO, replaced_on_success
from transduce.search import length_batches
from transduce.search.common import pad_sequences
from transduce.text import casing

if TYPE_CHECKING:
    from transduce.search.translator import Translator

log = logging.getLogger(__name__)

FORMATS = ("npz", "npy", "safetensors")
SUFFIXES = {".npz": "npz", ".npy": "npy", ".safetensors": "safetensors"}
LAYOUT = "transduce-embed/1"  # names the layout in every file's metadata
SAFETENSORS_HEADER_LIMIT = 100_000_000  # bytes; safetensors refuses to read a longer header


@dataclass(frozen=True)
class SentenceVectors:
    """The vectors of one text.

    Attributes:
        pieces: the source pieces the rows belong to (EOS included only with ``include_eos``); empty with
            ``pooled_only``.
        states: ``(len(pieces), D)`` float32: the encoder's output per piece (``D = d_model``), or ``[embedding;
            state]`` (``D = 2 * d_model``) with ``with_embeddings``; None with ``pooled_only``.
        pooled: ``(D,)`` float32: the mean of the rows (zeros for a text without rows).
    """

    pieces: list[str]
    states: np.ndarray | None
    pooled: np.ndarray


@dataclass(frozen=True)
class Embeddings:
    """Many texts' vectors in the layout of the files (:func:`write_embeddings`, :func:`read_embeddings`).

    Attributes:
        pooled: ``(N, D)`` float32, one row per text.
        vectors: ``(T, D)`` float32, every text's rows one after the other; None for pooled vectors only.
        offsets: ``(N + 1,)`` int64: text ``i`` has rows ``offsets[i]:offsets[i + 1]``; None when ``vectors`` is.
        pieces: the ``T`` pieces, one per row of ``vectors``; None when ``vectors`` is.
        meta: what the vectors are (``layout``, ``dim``, ``d_model``, ``with_embeddings``, ``include_eos``, ...).
    """

    pooled: np.ndarray
    vectors: np.ndarray | None = None
    offsets: np.ndarray | None = None
    pieces: list[str] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, sentences: Sequence[SentenceVectors], *, dim: int, meta: dict[str, Any] | None = None) -> Embeddings:
        """The texts' vectors gathered (``dim``: ``D``, for the shapes of an empty list); pooled vectors only when
        the texts have no ``states``."""
        meta = {"layout": LAYOUT, "dim": dim, **(meta or {})}
        pooled = np.stack([s.pooled for s in sentences]) if sentences else np.zeros((0, dim), np.float32)
        if any(s.states is None for s in sentences) or meta.get("pooled_only"):
            return cls(pooled, meta={**meta, "pooled_only": True})
        lengths = [len(s.pieces) for s in sentences]
        offsets = np.zeros(len(sentences) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        states = [s.states for s in sentences if s.states is not None]
        vectors = np.concatenate(states) if states else np.zeros((0, dim), np.float32)
        pieces = [p for s in sentences for p in s.pieces]
        return cls(pooled, vectors, offsets, pieces, {**meta, "pooled_only": False})

    def __len__(self) -> int:
        return len(self.pooled)

    def sentence(self, i: int) -> SentenceVectors:
        """Text ``i``'s vectors."""
        if self.vectors is None or self.offsets is None or self.pieces is None:
            return SentenceVectors([], None, self.pooled[i])
        start, end = int(self.offsets[i]), int(self.offsets[i + 1])
        return SentenceVectors(self.pieces[start:end], self.vectors[start:end], self.pooled[i])


# ----------------------------------------------------------------------------------------------------------------------
# computing


def embedding_dim(translator: Translator, *, with_embeddings: bool = False) -> int:
    """``D``, the width of the rows: the model's ``d_model``, twice that with ``with_embeddings``."""
    d_model = translator.model.config.d_model
    return 2 * d_model if with_embeddings else d_model


def embed_lines(
    translator: Translator,
    lines: Iterable[tuple[int, str]],
    *,
    pooled_only: bool = False,
    with_embeddings: bool = False,
    include_eos: bool = False,
    input_case: str | None = None,
    max_tokens: int | None = None,
    chunk_size: int = 2000,
) -> Iterator[SentenceVectors]:
    """The vectors of a stream of ``(line number, text)``, ``chunk_size`` lines at a time (sorted within a chunk),
    in input order; the options are :meth:`Translator.embed`'s. Line numbers appear in warnings.

    Raises:
        ConfigError: an ensemble (whose members' encoders differ), an unknown ``input_case``, ``max_tokens`` < 1,
            ``input_case="truecase"`` without the truecasing table.
    """
    model = translator.model
    if len(getattr(model, "members", ())) > 1:
        raise ConfigError(f"embed reads one model's encoder; this translator is an ensemble of {len(model.members)} "
                          "models")  # fmt: skip
    case = translator.decode.input_case if input_case is None else input_case
    if case not in casing.INPUT_CASES:
        raise ConfigError(f"input_case: {case!r} is not one of {', '.join(map(repr, casing.INPUT_CASES))}")
    budget = translator.decode.max_tokens if max_tokens is None else max_tokens
    if budget < 1:
        raise ConfigError(f"max_tokens must be >= 1, got {budget}")
    truecaser = translator._truecaser() if case == "truecase" else None

    def prepared(chunk: list[tuple[int, str]]) -> list[tuple[int, str]]:
        if case == "keep":
            return chunk
        return [(lineno, casing.normalize(text, truecaser)[0]) for lineno, text in chunk]

    def run(chunk: list[tuple[int, str]]) -> list[SentenceVectors]:
        return _embed_chunk(translator, prepared(chunk), budget, pooled_only, with_embeddings, include_eos)

    chunk: list[tuple[int, str]] = []
    for item in lines:
        chunk.append(item)
        if len(chunk) >= chunk_size:
            yield from run(chunk)
            chunk = []
    if chunk:
        yield from run(chunk)


@torch.inference_mode()
def _embed_chunk(
    translator: Translator,
    lines: list[tuple[int, str]],
    max_tokens: int,
    pooled_only: bool,
    with_embeddings: bool,
    include_eos: bool,
) -> list[SentenceVectors]:
    model = translator.model
    cfg = model.config
    keep = 0 if include_eos else 1  # rows dropped at the end of each part: its EOS
    ids = translator._encode([text for _, text in lines])
    # parts: (text index, source ids + EOS); a text of no pieces is one part, its EOS alone
    parts: list[tuple[int, list[int]]] = []
    for i, ((lineno, _), toks) in enumerate(zip(lines, ids)):
        split = translator._split(toks) if len(toks) > translator.max_input_tokens else [toks]
        if len(split) > 1:
            log.warning("line %d: %d source tokens exceed max_input_tokens=%d; encoded in %d parts",
                        lineno, len(toks), translator.max_input_tokens, len(split))  # fmt: skip
        parts.extend((i, [*part, cfg.eos_id]) for part in split)

    rows: list[np.ndarray | None] = [None] * len(parts)
    for indices in length_batches([len(p[1]) for p in parts], max_tokens):
        src = pad_sequences([parts[k][1] for k in indices], cfg.pad_id, translator.device)  # (B, S)
        states = model.encode(src).states  # (B, S, d_model)
        if with_embeddings:
            states = torch.cat([model.source_embeddings(src).to(states.dtype), states], dim=-1)  # (B, S, 2 d_model)
        states = states.float().cpu().numpy()
        for row, k in enumerate(indices):
            rows[k] = states[row, : len(parts[k][1]) - keep]

    dim = embedding_dim(translator, with_embeddings=with_embeddings)
    per_text: list[list[int]] = [[] for _ in lines]
    for k, (i, _) in enumerate(parts):
        per_text[i].append(k)
    out = []
    for ks in per_text:
        matrix = np.concatenate([rows[k] for k in ks]) if ks else np.zeros((0, dim), np.float32)
        pooled = matrix.mean(axis=0, dtype=np.float64).astype(np.float32) if len(matrix) else np.zeros(dim, np.float32)
        if pooled_only:
            out.append(SentenceVectors([], None, pooled))
            continue
        pieces = [p for k in ks for p in translator.tokenizer.src_pieces(parts[k][1][: len(parts[k][1]) - keep])]
        out.append(SentenceVectors(pieces, np.ascontiguousarray(matrix), pooled))
    return out


# ----------------------------------------------------------------------------------------------------------------------
# files


def format_of(path: str | Path, format: str | None = None) -> str | None:
    """The format of an output: ``format`` when given, else the one its suffix names (None: neither).

    Raises:
        ConfigError: ``format`` is unknown, or contradicts the suffix (``x.npy`` written as npz).
    """
    named = SUFFIXES.get(Path(str(path)).suffix.lower()) if str(path) != STDIO else None
    if format is None:
        return named
    if format not in FORMATS:
        raise ConfigError(f"unknown format {format!r} (valid: {', '.join(FORMATS)})")
    if named is not None and named != format:
        raise ConfigError(f"{path}: the name says {named} but the format asked for is {format}")
    return format


def npy_files(path: str | Path) -> tuple[Path, Path, Path]:
    """The three files of the npy format: ``OUT.npy`` (vectors), ``OUT.pooled.npy`` and ``OUT.pieces.json``."""
    path = Path(path)
    base = path.with_suffix("") if path.suffix.lower() == ".npy" else path
    return path, base.with_name(base.name + ".pooled.npy"), base.with_name(base.name + ".pieces.json")


def output_files(path: str | Path, format: str, *, pooled_only: bool) -> list[str]:
    """The files :func:`write_embeddings` writes for ``path`` (``"-"``: standard output)."""
    if str(path) == STDIO or format != "npy" or pooled_only:
        return [str(path)]
    return [str(p) for p in npy_files(path)]


def write_embeddings(path: str | Path, embeddings: Embeddings, format: str | None = None) -> list[str]:
    """Write ``embeddings`` to ``path`` (``"-"``: standard output, npz unless ``format`` says otherwise) in
    ``format`` (default: the suffix's); every file under a temporary name, renamed only when all are written.

    Returns:
        The files written (see :func:`output_files`).

    Raises:
        ConfigError: no format; npy with per-piece vectors to standard output (three files); safetensors whose
            pieces would not fit the header safetensors reads.
    """
    fmt = format_of(path, format) or ("npz" if str(path) == STDIO else None)
    if fmt is None:
        raise ConfigError(f"{path}: unknown format: name it .npz, .npy or .safetensors, or give the format")
    pooled_only = embeddings.vectors is None
    writers: list[Callable[[BinaryIO], None]]
    if fmt == "npz":
        writers = [lambda f: _write_npz(f, embeddings)]
    elif fmt == "safetensors":
        data = _safetensors_bytes(embeddings)
        writers = [lambda f: f.write(data)]
    elif pooled_only:
        writers = [lambda f: np.save(f, embeddings.pooled)]
    else:
        if str(path) == STDIO:
            raise ConfigError("the npy format writes three files (vectors, pooled vectors, pieces), not standard "
                              "output: give a file name, or write npz or safetensors")  # fmt: skip
        writers = [lambda f: np.save(f, embeddings.vectors), lambda f: np.save(f, embeddings.pooled),
                   lambda f: f.write(_pieces_json(embeddings).encode())]  # fmt: skip
    files = output_files(path, fmt, pooled_only=pooled_only)
    if str(path) == STDIO:
        out = sys.stdout.buffer
        writers[0](out)
        out.flush()
        return files
    with contextlib.ExitStack() as stack:  # renamed in turn at the end, only when every writer succeeded
        for name, write in zip(files, writers):
            tmp = stack.enter_context(replaced_on_success(name))
            with open(tmp, "xb") as f:
                write(f)
    return files


def read_embeddings(path: str | Path, format: str | None = None) -> Embeddings:
    """What :func:`write_embeddings` wrote to ``path``."""
    fmt = format_of(path, format)
    if fmt == "npz":
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            if "vectors" not in z:
                return Embeddings(z["pooled"], meta=meta)
            return Embeddings(z["pooled"], z["vectors"], z["offsets"], [str(p) for p in z["pieces"]], meta)
    if fmt == "safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="np") as f:
            header = f.metadata() or {}
            arrays = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 (not a dict)
        meta = json.loads(header["meta"])
        if "vectors" not in arrays:
            return Embeddings(arrays["pooled"], meta=meta)
        pieces = json.loads(header["pieces"])
        return Embeddings(arrays["pooled"], arrays["vectors"], arrays["offsets"], pieces, meta)
    if fmt == "npy":
        main, pooled, sidecar = npy_files(path)
        first = np.load(main, allow_pickle=False)
        if sidecar.exists() and pooled.exists():
            side = json.loads(sidecar.read_text(encoding="utf-8"))
            offsets = np.asarray(side["offsets"], np.int64)
            sentences = np.load(pooled, allow_pickle=False)
            if offsets[-1] == len(first) and len(offsets) == len(sentences) + 1:  # not the files of an older run
                pieces = [p for sentence in side["pieces"] for p in sentence]
                return Embeddings(sentences, first, offsets, pieces, side["meta"])
        return Embeddings(first, meta={"layout": LAYOUT, "dim": first.shape[-1], "pooled_only": True})
    raise ConfigError(f"{path}: unknown format: name it .npz, .npy or .safetensors, or give the format")


def _write_npz(f: BinaryIO, e: Embeddings) -> None:
    arrays = {"pooled": e.pooled, "meta": np.array(json.dumps(e.meta))}
    if e.vectors is not None:
        arrays |= {"vectors": e.vectors, "offsets": e.offsets, "pieces": np.array(e.pieces, dtype=str)}
    np.savez(f, **arrays)  # a file object: numpy adds no suffix


def _safetensors_bytes(e: Embeddings) -> bytes:
    from safetensors.numpy import save

    arrays = {"pooled": e.pooled}
    metadata = {"meta": json.dumps(e.meta)}
    if e.vectors is not None:
        arrays |= {"vectors": e.vectors, "offsets": e.offsets}
        metadata["pieces"] = json.dumps(e.pieces, ensure_ascii=False)
        size = len(metadata["pieces"].encode())
        if size > SAFETENSORS_HEADER_LIMIT - 1_000_000:
            raise ConfigError(f"the pieces take {size:,} bytes, more than a safetensors header holds "
                              f"({SAFETENSORS_HEADER_LIMIT:,}): write npz or npy")  # fmt: skip
    return save(arrays, metadata=metadata)


def _pieces_json(e: Embeddings) -> str:
    assert e.offsets is not None and e.pieces is not None
    bounds = e.offsets.tolist()
    pieces = [e.pieces[a:b] for a, b in itertools.pairwise(bounds)]
    return json.dumps({"meta": e.meta, "offsets": bounds, "pieces": pieces}, ensure_ascii=False) + "\n"


__all__ = [
    "FORMATS",
    "Embeddings",
    "SentenceVectors",
    "embed_lines",
    "embedding_dim",
    "format_of",
    "output_files",
    "read_embeddings",
    "write_embeddings",
]
