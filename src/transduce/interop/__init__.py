"""Other toolkits' model formats: Hugging Face Marian in and out (:mod:`.marian`), CTranslate2 out
(:mod:`.ctranslate2`). Both need the ``interop`` extra (``pip install "transduce[interop]"``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from transduce.errors import InteropError

if TYPE_CHECKING:
    from transduce.config import ModelConfig


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


def hf_config_fields(c: ModelConfig) -> dict[str, Any]:
    """The ``transformers`` config fields of our model config that Marian and Pegasus (the pre-norm export, see
    :mod:`.pegasus`) name and mean alike: shape, dropouts, positions and special ids."""
    return dict(
        tie_word_embeddings=c.tie_output,
        d_model=c.d_model,
        encoder_layers=c.encoder_layers,
        decoder_layers=c.decoder_layers,
        encoder_attention_heads=c.heads,
        decoder_attention_heads=c.heads,
        encoder_ffn_dim=c.d_ff,
        decoder_ffn_dim=c.d_ff,
        activation_function=c.activation,
        dropout=c.dropout,
        attention_dropout=c.attention_dropout,
        activation_dropout=c.activation_dropout,
        max_position_embeddings=c.max_positions,  # rows of the position table (1024 by default; opus-mt: 512)
        scale_embedding=c.scale_embeddings,
        pad_token_id=c.pad_id,
        eos_token_id=c.eos_id,
        bos_token_id=c.bos_id,
        decoder_start_token_id=c.bos_id,
        forced_eos_token_id=c.eos_id,
    )
