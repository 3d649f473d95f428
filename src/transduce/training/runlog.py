"""What the user sees during training: a progress bar or plain log lines, a JSONL metrics file, TensorBoard.

Only rank 0 creates a :class:`RunLog`; other ranks get a silent one (``enabled=False``).

``metrics.jsonl`` holds one JSON object per event: ``{"event": "train", "step": ..., "loss": ...}`` every
``log_every`` updates, ``{"event": "valid", ...}`` per validation, ``{"event": "checkpoint", ...}`` and so on. When
a run is resumed the events after the checkpoint's step are dropped (:func:`truncate_metrics`), so the file of a
resumed run reads like the file of a run that was never interrupted.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

from transduce.training.checkpoint import write_text_atomic

log = logging.getLogger("transduce.training.train")

METRICS_FILE = "metrics.jsonl"
LOG_FILE = "train.log"


def truncate_metrics(path: Path, step: int) -> None:
    """Drop the events of ``path`` written after update ``step`` (and any torn last line)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line torn by a kill
        if event.get("step", 0) <= step:
            kept.append(line)
    write_text_atomic(path, "".join(line + "\n" for line in kept))


def read_metrics(path: str | Path, event: str | None = None) -> list[dict[str, Any]]:
    """The events of a metrics file (of one kind when ``event`` is given)."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            item = json.loads(line)
            if event is None or item.get("event") == event:
                out.append(item)
    return out


class RunLog:
    """Progress bar (stderr is a terminal) or plain log lines, plus ``metrics.jsonl``, ``train.log`` and TensorBoard.

    Args:
        run_dir: where the files go.
        max_steps: for the bar's total and the ETA (0: unknown).
        enabled: False on ranks other than 0: everything is a no-op.
        initial_step: the step a resumed run starts from.
        time_limited: the run also stops at a time limit: the bar has no total until :meth:`progress` tells which
            limit comes first.
    """

    def __init__(
        self, run_dir: Path, max_steps: int, *, enabled: bool = True, initial_step: int = 0, time_limited: bool = False
    ) -> None:
        self.enabled = enabled
        self.max_steps = max_steps
        self._bar = None
        self._tb = None
        self._file_handler: logging.Handler | None = None
        self._metrics = None
        if not enabled:
            return
        self._metrics = open(run_dir / METRICS_FILE, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())
        self._file_handler = logging.FileHandler(run_dir / LOG_FILE, encoding="utf-8")
        self._file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger("transduce").addHandler(self._file_handler)
        if logging.getLogger("transduce").getEffectiveLevel() > logging.INFO:
            logging.getLogger("transduce").setLevel(logging.INFO)
        try:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(run_dir / "tensorboard"), purge_step=initial_step + 1)
        except Exception:  # tensorboard not installed (or broken): metrics.jsonl is enough
            self._tb = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            total = None if time_limited else max_steps or None
            self._bar = tqdm(total=total, initial=initial_step, unit="step", dynamic_ncols=True)

    def event(self, kind: str, step: int, **values: Any) -> None:
        """Append one event to ``metrics.jsonl`` (flushed) and its numbers to TensorBoard."""
        if not self.enabled:
            return
        record = {"event": kind, "step": step, **values}
        assert self._metrics is not None
        self._metrics.write(json.dumps(record) + "\n")
        self._metrics.flush()
        if self._tb is not None:
            for key, value in values.items():
                if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                    self._tb.add_scalar(f"{kind}/{key}", value, step)

    def progress(
        self,
        step: int,
        epoch: int,
        loss: float,
        lr: float,
        tokens_per_s: float,
        eta_s: float,
        *,
        clock: tuple[float, float] | None = None,
    ) -> None:
        """Update the bar (terminal) or write a plain line (otherwise).

        Args:
            clock: ``(elapsed, limit)`` in seconds where a time limit ends the run before ``max_steps``: the step
                is then shown against the time (``time 0:02:00/0:08:00``), not against a step count it will never
                reach.
        """
        if not self.enabled:
            return
        eta = _hms(eta_s) if math.isfinite(eta_s) else "?"
        timing = f"time {_hms(clock[0])}/{_hms(clock[1])} " if clock is not None else ""
        if self._bar is not None:
            self._bar.n = step
            self._bar.total = None if clock is not None else (self.max_steps or None)
            postfix = f"ep {epoch} loss {loss:.3f} lr {lr:.2e} {tokens_per_s:,.0f} tok/s {timing}ETA {eta}"
            self._bar.set_postfix_str(postfix)
        else:
            total = f"/{self.max_steps}" if self.max_steps and clock is None else ""
            log.info(
                "step %d%s epoch %d loss %.4f lr %.3e %s tok/s %sETA %s",
                step, total, epoch, loss, lr, f"{tokens_per_s:,.0f}", timing, eta,
            )  # fmt: skip

    def info(self, message: str, *args: Any) -> None:
        """A log line (to the console and ``train.log``) on rank 0."""
        if self.enabled:
            log.info(message, *args)

    def close(self) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        if self._tb is not None:
            self._tb.close()
        if self._metrics is not None:
            self._metrics.close()
        if self._file_handler is not None:
            logging.getLogger("transduce").removeHandler(self._file_handler)
            self._file_handler.close()


def _hms(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Throughput:
    """Tokens per second and the ETA over the last logging interval."""

    def __init__(self) -> None:
        self.start = self.mark = time.perf_counter()
        self.tokens = 0

    def add(self, tokens: int) -> None:
        self.tokens += tokens

    def rate(self) -> float:
        """Target + source tokens per second since the last call; resets the interval."""
        now = time.perf_counter()
        rate = self.tokens / max(now - self.mark, 1e-9)
        self.mark, self.tokens = now, 0
        return rate
