"""Other toolkits' model formats: Hugging Face Marian in and out (:mod:`.marian`), CTranslate2 out
(:mod:`.ctranslate2`). Both need the ``interop`` extra (``pip install "transduce[interop]"``)."""

from __future__ import annotations

from pathlib import Path

from transduce.errors import InteropError


def require(module: str):
    """Import an optional dependency, or raise :class:`InteropError` saying how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise InteropError(f'this needs the {module} package: pip install "transduce[interop]"') from None


def prepare_output(out_dir: str | Path, *, overwrite: bool) -> Path:
    """Check that ``out_dir`` may be written: absent, empty, or ``overwrite`` is set."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InteropError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise InteropError(f"{out}: directory exists and is not empty (use --force to replace it)")
    return out


def quiet_transformers() -> None:
    """Turn off transformers' per-file progress bars and advisory warnings (for the command line)."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
