"""``transduce train``: the training loop around :class:`transduce.training.trainer.Trainer`.

:func:`train` prepares the data when the config names raw text, writes the run directory (see
:mod:`transduce.training.checkpoint` for its layout), and runs updates until ``max_steps``, ``max_epochs``,
``max_minutes``, early stopping (``patience``) or a signal. Every ``valid_every`` updates it validates (loss,
perplexity, BLEU) and writes a checkpoint; ``save_every_minutes`` adds checkpoints by wall time. Under ``torchrun``
every process runs this same code; only rank 0 writes files.

Resuming (``train(resume=RUN_DIR)``) restores the weights, the optimizer, the step, every process's random number
generators and the position in the data, so a run killed after checkpoint k and resumed produces the same weights and
the same ``metrics.jsonl`` loss curve as a run never interrupted.

SIGINT and SIGTERM make the loop finish the current update, write a checkpoint and return ``128 + signal number``
(130, 143), so a script's ``transduce train ... && transduce average ...`` does not go on after an interrupted run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import logging
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as tdist

from transduce.config import Config, ConfigError, ModelConfig
from transduce.data import ParallelDataset, TokenBatchSampler, collate, padding_stats, prepare, read_manifest
from transduce.data.batch import Batch
from transduce.data.prefetch import Prefetch
from transduce.data.sampler import MixedBatchSampler
from transduce.data.train_batches import ConcatPairs, training_data
from transduce.errors import TransduceError
from transduce.model import Transformer
from transduce.parsing import transfer as parse_transfer
from transduce.text.langs import TargetLanguages
from transduce.text.tokenizer import Vocabulary
from transduce.text.vocab import load_vocabulary
from transduce.training import checkpoint as ckpt
from transduce.training import finetune, memory, optim
from transduce.training.distributed import (
    Dist,
    broadcast_object,
    launched_local_rank,
    launched_world_size,
    setup,
    teardown,
)
from transduce.training.runlog import RunLog, Throughput, truncate_metrics
from transduce.training.trainer import StepResult, Trainer, rng_state, select_device, set_rng_state
from transduce.training.validate import ValidResult, read_references, validate
from transduce.transfer.classify import training as classify_training
from transduce.transfer.classify import transfer
from transduce.transfer.classify.model import ClassifierModel
from transduce.transfer.mlm import data as mlm_data
from transduce.transfer.mlm import training as mlm_training
from transduce.transfer.mlm.model import MaskedLM

log = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"


class TrainingError(TransduceError, RuntimeError):
    """Training cannot go on (non-finite losses or gradients, an unusable run directory)."""


@dataclasses.dataclass
class RunState:
    """Loop state saved in every checkpoint beside the trainer's."""

    epoch: int = 0  # current epoch
    position: int = 0  # batches of ``epoch`` this rank has consumed
    best_score: float | None = None  # best validation metric (higher is better), None before any validation
    best_step: int = 0
    bad_validations: int = 0  # validations since the last improvement
    elapsed_s: float = 0.0  # training wall time of the run's earlier processes (before a resume)


@dataclasses.dataclass
class TrainOutcome:
    """How :func:`train` ended."""

    exit_code: int  # 0, or 128 + signal number
    reason: str  # max_steps, max_epochs, max_minutes, patience, signal
    step: int
    run_dir: Path
    last_valid: ValidResult | None = None


# ----------------------------------------------------------------------------------------------------------------------
# setup


def prepare_run(config: Config, dist: Dist, *, resume: bool) -> tuple[Config, Path, Vocabulary]:
    """Prepare the data if needed, copy the vocabulary and write the resolved config into the run directory.

    Returns:
        The config with the vocabulary sizes of the tokenizer, the prepared directory, the tokenizer.
    """
    run_dir = Path(config.train.run_dir)
    prepared = Path(config.data.prepared) if config.data.prepared else run_dir / "data"
    if dist.enabled:  # say what the ranks wait for: a raw corpus can take longer than a collective's usual time
        timeout = config.train.dist_timeout_minutes
        if dist.is_main:
            log.info("rank 0 prepares the data and the run directory; ranks 1-%d wait for it up to %g min "
                     "(train.dist_timeout_minutes)", dist.world_size - 1, timeout)  # fmt: skip
        else:
            log.info("rank %d: waiting for rank 0 to prepare the data in %s (up to %g min, train.dist_timeout_minutes)",
                     dist.rank, prepared, timeout)  # fmt: skip
    if config.data.task == "classify" and config.data.train and not config.train.init_from:
        _check_positions(config.model, config.data.max_len)  # before the data is prepared with that max_len
    if dist.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        if not resume and ckpt.list_checkpoints(run_dir):
            raise TrainingError(f"{run_dir} already holds checkpoints: resume with --resume {run_dir} or set a new "
                                "train.run_dir")  # fmt: skip
        # fine-tuning: the data is encoded with the pretrained model's vocabulary (extended if asked; a parser's
        # source side alone)
        pretrained = finetune.vocabulary(config, run_dir, resume=resume) if config.train.init_from else None
        if config.data.train:
            prepare(config.data, prepared, vocabulary=pretrained)  # reuses a directory prepared from the same inputs
        elif not (prepared / "manifest.json").exists():
            raise TrainingError(f"no data: set data.train (raw text) or data.prepared (a prepared directory, "
                                f"{prepared} has none)")  # fmt: skip
        elif pretrained is not None:
            finetune.check_prepared(prepared, pretrained)
        elif config.data.task == "mlm":
            mlm_data.check_prepared(prepared, config.data)
    if dist.enabled:
        tdist.barrier()
    tokenizer = load_vocabulary(prepared)
    if config.data.task == "classify":
        if not config.data.train:  # the run's config describes the data as it was prepared: its fields, its max_len
            from transduce.transfer.classify.data import prepared_data_config

            config = Config(model=config.model, data=prepared_data_config(prepared, config.data), train=config.train,
                            decode=config.decode)  # fmt: skip
        model = _classifier_model(config, prepared, tokenizer, resume=resume)
        _check_positions(model, config.data.max_len)
    elif config.data.task == "parse" and config.train.init_from:
        model = parse_transfer.model_config(config, tokenizer, resume=resume)
    elif config.data.task == "mlm":  # the source side is the model's vocabulary; the target side's sizes follow it
        model = config.model.replace(src_vocab_size=tokenizer.src_vocab_size, tgt_vocab_size=tokenizer.tgt_vocab_size,
                                     share_vocab=tokenizer.joint)  # fmt: skip
    elif config.train.init_from:
        model = finetune.model_config(config, tokenizer, resume=resume)
    else:
        share = config.model.share_vocab and tokenizer.joint
        if share != config.model.share_vocab:
            log.warning("model.share_vocab: the vocabulary of %s is not joint; training with separate embeddings",
                        prepared)  # fmt: skip
        model = config.model.replace(
            src_vocab_size=tokenizer.src_vocab_size, tgt_vocab_size=tokenizer.tgt_vocab_size, share_vocab=share
        )
    if config.data.task == "translate":  # a multilingual model never writes its target-language tokens
        model = model.replace(suppress_ids=tokenizer.lang_token_tgt_ids())
        TargetLanguages.of(tokenizer, config.decode.tgt_lang)  # a default the model cannot write is refused now
    config = Config(model=model, data=config.data.replace(prepared=str(prepared)), train=config.train,
                    decode=config.decode)  # fmt: skip
    if dist.is_main:
        vocab = run_dir / ckpt.VOCAB_DIR
        if resume and vocab.exists():
            if ckpt.vocab_sha256(vocab) != ckpt.vocab_sha256(prepared):
                raise TrainingError(f"{vocab}: differs from the vocabulary of {prepared}; cannot resume")
        else:
            ckpt.copy_vocab(prepared, vocab)
        if not resume:  # a resumed run's config is written once its checkpoint has accepted it (_Run)
            ckpt.write_text_atomic(run_dir / CONFIG_FILE, config.to_yaml())
    if dist.enabled:
        tdist.barrier()
    return config, prepared, tokenizer


def _classifier_model(config: Config, prepared: Path, tokenizer: Vocabulary, *, resume: bool) -> ModelConfig:
    """A classifier's model section: the labels of the prepared data, the vocabulary's size, and with ``init_from``
    the pretrained encoder's shape (:func:`transduce.transfer.classify.transfer.model_config`)."""
    from transduce.transfer.classify.data import prepared_labels

    labels = prepared_labels(prepared)
    if config.model.labels and config.model.labels != labels:
        raise TrainingError(f"model.labels: {config.model.labels} are not the labels of the data in {prepared} "
                            f"({labels}); leave model.labels out, the data sets it")  # fmt: skip
    if config.train.init_from:
        return transfer.model_config(config, tokenizer, labels, resume=resume)
    return config.model.replace(src_vocab_size=tokenizer.src_vocab_size, tgt_vocab_size=tokenizer.src_vocab_size,
                                share_vocab=True, labels=labels)  # fmt: skip


def _check_positions(model: ModelConfig, max_len: int) -> None:
    """A classifier's texts of ``max_len`` pieces and their end-of-sentence id must fit its learned positions (the
    ``<cls>`` vector has none).

    Raises:
        TrainingError: they do not.
    """
    if model.positions == "learned" and max_len > model.max_positions - 1:
        raise TrainingError(f"data.max_len: {max_len} pieces and the end-of-sentence id do not fit the "
                            f"{model.max_positions} learned positions (model.max_positions); set data.max_len to "
                            f"{model.max_positions - 1} or less (the data is prepared with it)")  # fmt: skip


def _batches(
    dataset: ParallelDataset | ConcatPairs, sampler: TokenBatchSampler | MixedBatchSampler, state: RunState,
    max_epochs: int, make_batch: Callable[[list], Any],
) -> Iterator[tuple[int, int, Any]]:  # fmt: skip
    """``(epoch, position after it, batch)`` from the saved data position onwards, epoch after epoch; ``make_batch``
    collates a list of examples (:func:`~transduce.data.collate` with the model's ids, or a classifier's)."""
    epoch, position = state.epoch, state.position
    while max_epochs == 0 or epoch < max_epochs:
        for indices in sampler.iter_from(epoch, position):
            position += 1
            yield epoch, position, make_batch([dataset[i] for i in indices])
        epoch, position = epoch + 1, 0


class _Signals:
    """SIGINT/SIGTERM set a flag instead of killing the process; the loop saves and stops at the next update."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError):  # not the main thread: leave the handlers alone
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        self.received = signum
        log.warning("received %s: stopping after this update with a checkpoint", signal.Signals(signum).name)

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


# ----------------------------------------------------------------------------------------------------------------------
# the run


class _Run:
    """The state of one training process of a run (a resume starts another): trainer, data, logging, checkpoints."""

    def __init__(self, config: Config, dist: Dist, device: torch.device, resume: bool) -> None:
        self.dist, self.device = dist, device
        self.config, self.prepared, self.tokenizer = prepare_run(config, dist, resume=resume)
        self.cfg = self.config.train
        self.run_dir = Path(self.cfg.run_dir)
        self.vocab_sha = ckpt.vocab_sha256(self.run_dir / ckpt.VOCAB_DIR)
        torch.manual_seed(self.cfg.seed)  # the same initial weights on every rank
        self.task = self.config.data.task
        self.classify = self.task == "classify"
        self.model: Transformer | ClassifierModel | MaskedLM
        if self.classify:
            self.model = ClassifierModel(self.config.model)
            if self.cfg.init_from and not resume:
                transfer.initialise(self.model, self.config)
            transfer.freeze(self.model, self.config)  # before the optimizer, which then holds only what trains
        elif self.task == "mlm":
            self.model = MaskedLM(self.config.model)  # (pretrained from scratch: the config refuses init_from)
        else:
            self.model = Transformer(self.config.model)
            if self.cfg.init_from and not resume and self.config.data.task == "parse":
                parse_transfer.initialise(self.model, self.config)  # the encoder alone: the decoder writes trees
            elif self.cfg.init_from and not resume:
                finetune.initialise(self.model, self.config, self.tokenizer)
            finetune.freeze(self.model, self.config)  # before the optimizer, which then holds only what trains
        self.trainer = Trainer(self.config, self.model, device, dist)
        if self.cfg.init_optimizer and not resume:
            finetune.load_optimizer(self.trainer, self.config)
        torch.manual_seed(self.cfg.seed + 1000 * dist.rank)  # different dropout masks on different ranks
        self.state = RunState()
        if self.classify:
            self.train_data, self.sampler = classify_training.training_batches(
                self.prepared, self.config, rank=dist.rank, world_size=dist.world_size
            )
            self.main_sampler = self.sampler
        elif self.task == "mlm":
            masked = mlm_training.training_batches(self.prepared, self.config, rank=dist.rank,
                                                   world_size=dist.world_size)  # fmt: skip
            self.train_data, self.sampler, self.main_sampler = masked, masked, masked.sampler
        else:
            self.train_data, self.sampler, self.main_sampler = training_data(
                self.prepared, self.cfg.max_tokens, self.config.data.mix_share,
                seed=self.cfg.seed, rank=dist.rank, world_size=dist.world_size,
                bpe_dropout=self.config.data.bpe_dropout, tokenizer=self.tokenizer, max_len=self.config.data.max_len,
            )  # fmt: skip
        self.valid_data = ParallelDataset(self.prepared, "valid") if "valid" in self._splits() else None
        self.references, self.reference_kind = (None, "")
        decodes = self.task in ("translate", "parse")  # (a classifier and a masked language model have no BLEU)
        if self.valid_data is not None and self.cfg.valid_bleu and dist.is_main and decodes:
            self.references, self.reference_kind = read_references(self.valid_data, self.tokenizer)
        if resume:
            self._restore()
            if dist.is_main:  # the overrides are saved only now that the run goes ahead with them
                ckpt.write_text_atomic(self.run_dir / CONFIG_FILE, self.config.to_yaml())
        self.runlog = RunLog(self.run_dir, self.cfg.max_steps, enabled=dist.is_main, initial_step=self.trainer.step,
                             time_limited=self.cfg.max_minutes > 0)  # fmt: skip
        d_model = self.config.model.d_model  # (a fine-tuning run's: the pretrained model's)
        self.runlog.info("learning rate: %s", optim.describe_schedule(self.cfg, d_model))
        short_warmup = optim.warmup_beyond_run(self.cfg, d_model)
        if short_warmup and dist.is_main:
            log.warning("%s", short_warmup)
        padding = padding_stats(self.main_sampler)  # padding is compute spent on nothing: say how much there is
        self.runlog.info(
            "batches: %d per epoch (all ranks), padding %.1f%% of tokens (source %.1f%%, target %.1f%%)",
            padding["batches"], 100 * padding["padding_share"], 100 * padding["src_padding_share"],
            100 * padding["tgt_padding_share"],
        )  # fmt: skip

    def _splits(self) -> list[str]:
        return list(read_manifest(self.prepared).get("splits", {}))

    # checkpoints ------------------------------------------------------------------------------------------------------

    def _restore(self) -> None:
        path = ckpt.resolve(self.run_dir, prefer=ckpt.LAST)
        ckpt.verify(path)
        info = ckpt.read_info(path)
        diff = ckpt.model_config_diff(info.config, self.config)
        if diff:
            raise ckpt.CheckpointError(f"{path}: the checkpoint's model differs from the config: {'; '.join(diff)}")
        ckpt.check_vocab(info, self.run_dir / ckpt.VOCAB_DIR)
        ckpt.load_weights(self.model, path, device=self.device)
        saved = ckpt.load_trainer_state(path)
        self.trainer.load_state_dict(saved["trainer"], source=str(path))
        self.state = RunState(**saved["run"])
        if saved["world_size"] == self.dist.world_size:
            set_rng_state(saved["rng"][self.dist.rank])
            self.state.epoch, self.state.position = saved["data"]["epoch"], saved["data"]["position"]
        else:
            log.warning("resuming with %d processes instead of %d: the data restarts at the next epoch and the "
                        "random streams differ", self.dist.world_size, saved["world_size"])  # fmt: skip
            self.state.epoch, self.state.position = saved["data"]["epoch"] + 1, 0
        if self.dist.is_main:
            truncate_metrics(self.run_dir / "metrics.jsonl", self.trainer.step)
        log.info("resumed %s at step %d (epoch %d, batch %d)", path, self.trainer.step, self.state.epoch,
                 self.state.position)  # fmt: skip

    def save(self, *, elapsed_s: float, valid: ValidResult | None = None) -> Path | None:
        """Write a checkpoint of the current step (collective: every rank contributes its RNG state)."""
        rngs = [rng_state()]
        if self.dist.enabled:
            rngs = [None] * self.dist.world_size
            tdist.all_gather_object(rngs, rng_state())
        if not self.dist.is_main:
            return None
        run = dataclasses.asdict(self.state) | {"elapsed_s": elapsed_s}
        trainer_state = {
            "trainer": self.trainer.state_dict(), "run": run, "rng": rngs, "world_size": self.dist.world_size,
            "data": {"epoch": self.state.epoch, "position": self.state.position},
        }  # fmt: skip
        step = self.trainer.step
        path = ckpt.write_checkpoint(
            self.run_dir / ckpt.CHECKPOINTS_DIR / f"step_{step:08d}", self.model, self.config,
            vocab_sha=self.vocab_sha, step=step, trainer_state=trainer_state,
        )  # fmt: skip
        ckpt.set_pointer(self.run_dir, ckpt.LAST, path)
        if valid is not None and self.state.best_step == step:
            ckpt.set_pointer(self.run_dir, ckpt.BEST, path)
        self._prune()
        self.runlog.event("checkpoint", step, path=str(path))
        return path

    def _prune(self) -> None:
        keep = self.cfg.keep_last
        if not keep:
            return
        best = ckpt.read_pointer(self.run_dir, ckpt.BEST)
        for old in ckpt.list_checkpoints(self.run_dir)[:-keep]:
            if best is None or old.resolve() != best.resolve():
                shutil.rmtree(old, ignore_errors=True)

    # validation -------------------------------------------------------------------------------------------------------

    def validate(self) -> ValidResult | None:
        if self.valid_data is None:
            return None
        if self.classify:
            result = classify_training.validate(self.model, self.valid_data, self.config, self.device, self.dist,
                                                self.trainer.autocast)  # fmt: skip
        elif self.task == "mlm":
            result = mlm_training.validate(self.model, self.valid_data, self.config, self.device, self.dist,
                                           self.trainer.autocast)  # fmt: skip
        else:
            result = validate(self.model, self.valid_data, self.tokenizer, self.references, self.reference_kind,
                              self.config, self.device, self.dist, self.trainer.autocast)  # fmt: skip
        result = broadcast_object(result)  # BLEU is computed on rank 0; every rank takes the same decisions
        assert isinstance(result, ValidResult)
        score = result.metric(self.cfg.best_metric)
        step = self.trainer.step
        if self.state.best_score is None or score > self.state.best_score:
            self.state.best_score, self.state.best_step, self.state.bad_validations = score, step, 0
        else:
            self.state.bad_validations += 1
        self.runlog.event("valid", step, **result.to_dict(), best_step=self.state.best_step)
        bleu = ""
        if result.bleu is not None:
            bleu = f" BLEU {result.bleu:.2f} chrF {result.chrf:.2f} ({result.bleu_signature})"
        best = " (best)" if self.state.best_step == step else ""
        if self.task == "mlm":
            self.runlog.info("validation at step %d: masked-LM loss %.4f nll %.4f accuracy %.2f%% (%d chosen pieces)%s",
                             step, result.loss, result.nll, result.accuracy, result.tokens, best)  # fmt: skip
        elif result.accuracy is not None:
            self.runlog.info("validation at step %d: accuracy %.2f%% loss %.4f nll %.4f (%d examples)%s", step,
                             result.accuracy, result.loss, result.nll, result.tokens, best)  # fmt: skip
        else:
            self.runlog.info("validation at step %d: loss %.4f nll %.4f ppl %.2f%s%s", step, result.loss, result.nll,
                             result.ppl, bleu, best)  # fmt: skip
        return result

    # the loop ---------------------------------------------------------------------------------------------------------

    def fit(self, signals: _Signals) -> TrainOutcome:
        cfg = self.cfg
        started = time.monotonic()
        elapsed = lambda: self.state.elapsed_s + time.monotonic() - started  # noqa: E731
        pin = self.device if self.device.type == "cuda" else None
        if self.classify:
            make_batch = classify_training.collate(self.config)
        elif self.task == "mlm":
            make_batch = mlm_training.collate(self.config)
        else:
            make_batch = functools.partial(collate, pad_id=self.config.model.pad_id, bos_id=self.config.model.bos_id,
                                           eos_id=self.config.model.eos_id)  # fmt: skip
        source = _batches(self.train_data, self.sampler, self.state, cfg.max_epochs, make_batch)
        batches = Prefetch(source, depth=2 * cfg.accumulate, pin=pin)
        try:
            return self._loop(signals, batches, started, elapsed)
        finally:
            batches.close()

    def _loop(self, signals: _Signals, batches: Iterator[tuple[int, int, Batch]], started: float, elapsed: Any
              ) -> TrainOutcome:  # fmt: skip
        cfg, trainer = self.cfg, self.trainer
        last_save = time.monotonic()
        speed, process_start_step = Throughput(), trainer.step
        interval_loss = interval_tokens = 0.0
        last_valid: ValidResult | None = None
        reason, validated_at = "max_steps", -1
        warned_warmup = False
        if cfg.decay_by == "time":
            trainer.time_share = elapsed() / (60 * cfg.max_minutes)
        if self.dist.is_main:
            n = f"{self.model.num_parameters():,}"
            self.runlog.info("training %s parameters on %s x%d; run directory %s", n, self.device,
                             self.dist.world_size, self.run_dir)  # fmt: skip
        while trainer.step < cfg.max_steps:
            group = list(itertools.islice(batches, cfg.accumulate))
            if not group:
                reason = "max_epochs"
                break
            self.state.epoch, self.state.position = group[-1][0], group[-1][1]

            # decisions every rank must agree on, carried by the step's all-reduce (asked once its work is queued)
            def flags(last_save: float = last_save) -> list[float]:
                return [
                    float(signals.received is not None),
                    float(cfg.save_every_minutes > 0 and time.monotonic() - last_save >= 60 * cfg.save_every_minutes),
                    float(cfg.max_minutes > 0 and elapsed() >= 60 * cfg.max_minutes),
                    elapsed() / (60 * cfg.max_minutes) if cfg.decay_by == "time" else 0.0,
                ]

            result = trainer.train_step([b for _, _, b in group], flags)
            agreed = list(result.flags)
            trainer.time_share = agreed[3] / self.dist.world_size  # the ranks' mean: the next update's schedule
            speed.add(result.tokens + result.src_tokens)
            if result.overflow:
                log.info("fp16: gradient overflow at step %d; update skipped, loss scale lowered to %g",
                         trainer.step + 1, trainer.scaler.get_scale())  # fmt: skip
            elif result.skipped:
                self._nonfinite(result)
            if result.skipped:
                continue
            interval_loss += result.loss * result.tokens
            interval_tokens += result.tokens
            step = trainer.step
            if step % cfg.log_every == 0 or step == cfg.max_steps:
                loss = interval_loss / max(interval_tokens, 1.0)
                rate = speed.rate()
                done = step - process_start_step
                eta = (cfg.max_steps - step) * (time.monotonic() - started) / max(done, 1)
                clock = None  # (elapsed, limit) in seconds where the time limit comes first: logged against it
                if cfg.max_minutes > 0:  # whichever limit comes first
                    left = max(0.0, 60 * cfg.max_minutes - elapsed())
                    clock = (elapsed(), 60 * cfg.max_minutes) if left < eta else None
                    eta = min(eta, left)
                self.runlog.progress(step, self.state.epoch, loss, result.lr, rate, eta, clock=clock)
                if not warned_warmup and self.dist.is_main:
                    warned_warmup = self._warn_endless_warmup(step, trainer.time_share)
                self.runlog.event("train", step, epoch=self.state.epoch, loss=loss, lr=result.lr, tokens_per_s=rate,
                                  grad_norm=result.grad_norm, skipped_total=trainer.nonfinite_total)  # fmt: skip
                interval_loss = interval_tokens = 0.0
            if cfg.valid_every and step % cfg.valid_every == 0:
                last_valid, validated_at = self.validate(), step
                self.save(elapsed_s=elapsed(), valid=last_valid)
                last_save = time.monotonic()
                if cfg.patience and self.state.bad_validations >= cfg.patience:
                    reason = "patience"
                    break
            elif agreed[1] > 0 or agreed[0] > 0:
                self.save(elapsed_s=elapsed())
                last_save = time.monotonic()
            if agreed[0] > 0:
                signum = signals.received or signal.SIGTERM
                self.runlog.info("stopped by %s at step %d; resume with: transduce train --resume %s",
                                 signal.Signals(signum).name, step, self.run_dir)  # fmt: skip
                return TrainOutcome(128 + int(signum), "signal", step, self.run_dir, last_valid)
            if agreed[2] > 0:
                reason = "max_minutes"
                break
        if trainer.step != validated_at:
            last_valid = self.validate()
            self.save(elapsed_s=elapsed(), valid=last_valid)
        self.runlog.info("finished (%s) at step %d in %.1f min", reason, trainer.step, elapsed() / 60)
        return TrainOutcome(0, reason, trainer.step, self.run_dir, last_valid)

    def _warn_endless_warmup(self, step: int, time_share: float) -> bool:
        """Warn (once: returns True) when a cosine decaying by time will not even finish its warmup, counted in
        updates, inside ``max_minutes`` at the pace so far: its rate would still be rising when the time runs out."""
        cfg = self.cfg
        if cfg.decay_by != "time" or cfg.warmup_by != "steps" or step >= cfg.warmup_steps:
            return True  # nothing to warn about, or no more
        fit = step / time_share if time_share > 0 else float("inf")  # updates the whole budget holds at this pace
        if fit >= cfg.warmup_steps:
            return False  # asked again at the next log line, with a steadier pace
        log.warning("at this pace (%d updates in %.1f minutes) the %g minutes of train.max_minutes fit about %d "
                    "updates, fewer than train.warmup_steps=%d: the learning rate would still be rising when the time "
                    "runs out (train.warmup_by=time ends the warmup at its share of the time as well)",
                    step, time_share * cfg.max_minutes, cfg.max_minutes, fit, cfg.warmup_steps)  # fmt: skip
        return True

    def _nonfinite(self, result: StepResult) -> None:
        trainer = self.trainer
        self.runlog.event("nonfinite", trainer.step, loss=str(result.loss), grad_norm=str(result.grad_norm),
                          in_row=trainer.nonfinite_in_row, total=trainer.nonfinite_total)  # fmt: skip
        # the trainer measures the gradient norm only after a finite loss
        what = f"loss ({result.loss})" if result.grad_norm is None else f"gradient norm ({result.grad_norm})"
        log.warning("non-finite %s at step %d: update skipped (%d in a row)", what, trainer.step + 1,
                    trainer.nonfinite_in_row)  # fmt: skip
        if trainer.nonfinite_in_row >= self.cfg.max_nonfinite:
            last = ckpt.read_pointer(self.run_dir, ckpt.LAST)
            where = f"the last good checkpoint is {last}" if last else "no checkpoint was written yet"
            raise TrainingError(f"{trainer.nonfinite_in_row} non-finite losses or gradients in a row after step "
                                f"{trainer.step}; stopping ({where}). Lower the learning rate or try "
                                "precision: fp32.")  # fmt: skip


def check_resume(run_dir: Path, config: Config) -> None:
    """Refuse, before anything is written, a resume that cannot go on: its last checkpoint's model differs from
    ``config`` (an override changed the architecture), or ``config``'s ``max_steps`` is below the run's step.

    Raises:
        CheckpointError, TrainingError: naming the difference; the run directory is left as it was.
    """
    path = ckpt.resolve(run_dir, prefer=ckpt.LAST)
    info = ckpt.read_info(path)
    diff = ckpt.model_config_diff(info.config, config)
    if diff:
        raise ckpt.CheckpointError(f"{path}: the checkpoint's model differs from the config: {'; '.join(diff)}")
    if info.step > config.train.max_steps:
        raise TrainingError(f"{run_dir}: train.max_steps={config.train.max_steps} is below the run's step {info.step}; "
                            f"nothing changed (give train.max_steps above {info.step} to go on)")  # fmt: skip


def _check_schedule_settings(config: Config, resumed: Path | None) -> None:
    """Refuse a learning-rate setting that the run's schedule ignores
    (:func:`transduce.training.optim.ignored_settings`); a resumed run whose own config.yaml already held it (it trained
    so) only gets a warning."""
    ignored = optim.ignored_settings(config.train)
    if resumed is not None:
        before = optim.ignored_settings(Config.load(resumed / CONFIG_FILE).train)
        for line in (line for line in ignored if line in before):
            log.warning("%s", line)
        ignored = [line for line in ignored if line not in before]
    if ignored:
        raise ConfigError("; ".join(ignored))


def train(config: Config | None = None, *, resume: str | Path | None = None, overrides: list[str] | None = None
          ) -> TrainOutcome:  # fmt: skip
    """Train as ``config`` says, or resume the run in ``resume`` (its ``config.yaml`` plus ``overrides``).

    Under ``torchrun`` each process calls this; the process group is created and destroyed here.
    """
    if resume is not None:
        run_dir = Path(resume)
        if not (run_dir / CONFIG_FILE).exists():
            raise TrainingError(f"{run_dir}: not a run directory (no {CONFIG_FILE})")
        config = Config.load(run_dir / CONFIG_FILE, overrides=[*(overrides or []), f"train.run_dir={run_dir}"])
        check_resume(run_dir, config)
    elif config is None:
        raise TrainingError("train: give a config or a run directory to resume")
    _check_schedule_settings(config, run_dir if resume is not None else None)
    if config.train.threads:
        torch.set_num_threads(config.train.threads)
    local = Dist(local_rank=launched_local_rank())
    device = select_device(config.train.device, local)  # a missing GPU is one line, before any work
    shared_gpu = device.type == "cuda" and ":" in config.train.device and launched_world_size() > 1
    dist = setup(device, config.train.dist_timeout_minutes, shared_gpu=shared_gpu)
    try:
        with memory.training_memory(device):  # oneDNN's caches capped, large tensors from the block cache
            run = _Run(config, dist, device, resume=resume is not None)
            try:
                with _Signals() as signals:
                    return run.fit(signals)
            finally:
                run.runlog.close()
    finally:
        teardown()


__all__ = ["RunState", "TrainOutcome", "TrainingError", "check_resume", "prepare_run", "train"]
