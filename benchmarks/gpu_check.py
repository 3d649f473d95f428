"""Check the whole GPU path in one go (about 10 minutes on one GPU): training under torchrun in bf16 and fp16 (one
process, and two processes sharing the GPU), exact resume, GPU translations against the CPU's, training throughput
against torch.nn.Transformer and Hugging Face's MarianMTModel with the same weights, and peak memory.

    python benchmarks/gpu_check.py                       # the `base` model on Multi30k (../shared/data/multi30k)
    python benchmarks/gpu_check.py --data DIR            # DIR/{train,val}.{en,de}[.gz] (transduce download multi30k)
    python benchmarks/gpu_check.py --cpu                 # the same checks with a tiny model and corpus on the CPU
                                                         # (its one-process runs in this process, not torchrun)

It writes OUT/gpu_check.json and prints a table; the exit status is 1 when a check fails (a training run that
fails, a resume that is not exact, translations that differ). On a GPU, a resumed run equals the uninterrupted one
only up to the non-deterministic order of some CUDA reductions: the largest weight difference is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from harness import add_common_args, apply_common_args, machine, table  # noqa: E402
from train_common import MarianLogits, TorchTransformer, copy_to_torch  # noqa: E402
from transduce.config import Config  # noqa: E402
from transduce.data import ParallelDataset, TokenBatchSampler, collate  # noqa: E402
from transduce.model import Transformer  # noqa: E402
from transduce.search.translator import Translator  # noqa: E402
from transduce.text.textio import read_lines, resolve_corpus_file  # noqa: E402
from transduce.training import checkpoint as ckpt  # noqa: E402
from transduce.training.loss import smoothed_nll_sums  # noqa: E402

WORDS = ["red", "blue", "green", "cat", "dog", "bird", "runs", "sits", "eats", "big", "small", "the", "a"]


def tiny_corpus(directory: Path) -> Path:
    """A copy task (target = source) of 200 training and 20 validation lines."""
    rng = random.Random(0)
    directory.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", 200), ("val", 20)):
        lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 7))) for _ in range(n)]
        for lang in ("en", "de"):
            (directory / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return directory


def base_config(args: argparse.Namespace, data: Path) -> Config:
    if args.cpu:
        return Config.load(ROOT / "configs" / "toy.yaml", overrides=[
            f"data.train={data / 'train'}", f"data.valid={data / 'val'}", "train.device=cpu",
            "train.max_tokens=256", "train.threads=1",
        ])  # fmt: skip
    return Config.load(ROOT / "configs" / "multi30k_en_de.yaml", overrides=[
        f"data.train={data / 'train'}", f"data.valid={data / 'val'}", "data.test=[]", "model.preset=base",
        "model.d_model=512", "model.d_ff=2048", "model.norm=post", "model.dropout=0.1", "train.max_tokens=4096",
        "train.valid_max_sentences=200", "train.threads=0", "train.decay_by=steps", "train.schedule=inverse_sqrt",
        "train.peak_lr=7e-4", "train.warmup_steps=100", "train.max_minutes=0",
    ])  # fmt: skip


def torchrun(config: Config, path: Path, nproc: int, *overrides: str, resume: Path | None = None,
             in_process: bool = False) -> float:  # fmt: skip
    """Run ``transduce train`` under torchrun (``in_process``: one process, this one, as the CPU mode does to spare
    the launches); returns the wall time (raises when it fails)."""
    config.save(path)
    start = time.monotonic()
    if in_process and nproc == 1:
        from transduce.training.train import train

        outcome = train(resume=resume, overrides=list(overrides)) if resume else train(Config.load(path, overrides))
        if outcome.exit_code:
            raise RuntimeError(f"training {path} ended with {outcome.exit_code}")
        return time.monotonic() - start
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           "-m", "transduce.cli", "train"]  # fmt: skip
    cmd += ["--resume", str(resume), *overrides] if resume else [str(path), *overrides]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), *sys.path]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return time.monotonic() - start


def last_metrics(run: Path) -> dict:
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [e for e in events if e.get("event") == "train"]
    valid = [e for e in events if e.get("event") == "valid"]
    return {"loss": train[-1]["loss"], "tokens_per_s": train[-1]["tokens_per_s"],
            "valid_bleu": valid[-1].get("bleu") if valid else None}  # fmt: skip


def weights(path: Path) -> dict[str, torch.Tensor]:
    model, _, _ = ckpt.load_model(path)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def throughput(config: Config, prepared: Path, device: torch.device, precision: str, steps: int) -> dict:
    """Training tokens/s (forward + backward) of transduce, torch.nn.Transformer and MarianMTModel with the same
    weights on the same batches, and each one's peak memory."""
    from transduce.interop.marian import marian_model

    torch.manual_seed(0)
    model = Transformer(config.model).to(device)
    data = ParallelDataset(prepared, "train")
    sampler = TokenBatchSampler(data.src_lengths, data.tgt_lengths, config.train.max_tokens, seed=1)
    batches = [collate([data[i] for i in idx]).to(device) for idx, _ in zip(sampler.iter_from(0), range(steps))]
    contenders = {"transduce": model}
    ref = TorchTransformer(config.model).to(device)
    copy_to_torch(model, ref)
    contenders["torch.nn.Transformer"] = ref
    try:
        contenders["MarianMTModel"] = MarianLogits(marian_model(model).to(device), config.model.pad_id)
    except Exception as err:  # transformers not installed: say so, measure the others
        print(f"MarianMTModel skipped: {err}", file=sys.stderr)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[precision]
    out = {}
    for name, net in contenders.items():
        net.train()
        tokens = 0
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        for i, batch in enumerate([batches[0], *batches]):  # the first pass warms up
            if i == 1:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                logits = net(batch.src, batch.tgt_in)
            loss, _ = smoothed_nll_sums(logits, batch.tgt_out, 0.1, config.model.pad_id)
            loss.backward()
            net.zero_grad(set_to_none=True)
            tokens += (batch.n_src_tokens + batch.n_tgt_tokens) if i else 0
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else None
        out[name] = {"tokens_per_s": tokens / seconds, "peak_memory_mib": peak / 2**20 if peak else None}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="tiny model and corpus on the CPU (what CI runs)")
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "multi30k")
    parser.add_argument("--out", type=Path, default=Path("runs/gpu_check"))
    parser.add_argument("--steps", type=int, help="updates per training run (default: 200 on a GPU, 4 on the CPU)")
    add_common_args(parser, reps=None)
    args = parser.parse_args()
    apply_common_args(args)
    print(machine())
    if not args.cpu and not torch.cuda.is_available():
        parser.error("no CUDA device: run with --cpu for the CPU half")
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    steps = args.steps or (4 if args.cpu else 200)
    data = tiny_corpus(out / "corpus") if args.cpu else args.data
    config = base_config(args, data)
    config = config.replace(train=config.train.replace(max_steps=steps, valid_every=steps // 2, log_every=1,
                                                       save_every_minutes=0.0, keep_last=0))  # fmt: skip
    prepared = out / "prepared"
    config = config.replace(data=config.data.replace(prepared=str(prepared)))
    device = torch.device("cpu" if args.cpu else "cuda")
    report: dict = {"device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu", "steps": steps,
                    "torch": torch.__version__, "runs": {}, "checks": {}}  # fmt: skip
    shared = "train.device=cpu" if args.cpu else "train.device=cuda:0"  # two processes on one GPU (gloo)
    runs = [("bf16", 1, ()), ("fp16", 1, ()), ("bf16", 2, (shared,))]
    ok = True
    for precision, nproc, extra in runs:
        name = f"{precision}_x{nproc}"
        run = out / name
        cfg = config.replace(train=config.train.replace(run_dir=str(run), precision=precision))
        try:
            seconds = torchrun(cfg, out / f"{name}.yaml", nproc, *extra, in_process=args.cpu)
            report["runs"][name] = {"seconds": round(seconds, 1), **last_metrics(run)}
        except RuntimeError as err:
            report["runs"][name] = {"error": str(err)[-2000:]}
            ok = False
    # exact resume: half the updates, then --resume to the end, against the uninterrupted bf16 run
    half = out / "bf16_resumed"
    cfg = config.replace(train=config.train.replace(run_dir=str(half), precision="bf16", max_steps=steps // 2))
    try:
        torchrun(cfg, out / "bf16_resumed.yaml", 1, in_process=args.cpu)
        torchrun(cfg, out / "bf16_resumed.yaml", 1, f"train.max_steps={steps}", resume=half, in_process=args.cpu)
        a = weights(out / "bf16_x1" / "checkpoints" / f"step_{steps:08d}")
        b = weights(half / "checkpoints" / f"step_{steps:08d}")
        diff = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
        report["checks"]["resume_max_weight_diff"] = diff
        report["checks"]["resume_exact"] = diff == 0.0
        ok &= diff == 0.0 or device.type == "cuda"
    except (RuntimeError, FileNotFoundError) as err:
        report["checks"]["resume_error"] = str(err)[-2000:]
        ok = False
    # translations on the device against the CPU's (greedy, fp32 weights)
    model_path = out / "bf16_x1" / "checkpoints" / f"step_{steps:08d}"
    if model_path.exists():
        lines = [t for _, t in read_lines(resolve_corpus_file(data / "val", config.data.src_lang))][:200]
        here = Translator.load(model_path, device).translate(lines, beam=1)
        cpu = Translator.load(model_path, "cpu").translate(lines, beam=1)
        same = sum(x == y for x, y in zip(here, cpu))
        report["checks"]["decode_equal_to_cpu"] = f"{same}/{len(lines)}"
        if device.type == "cuda":
            half_prec = Translator.load(model_path, device, precision="bf16").translate(lines, beam=1)
            report["checks"]["decode_bf16_equal_to_cpu"] = f"{sum(x == y for x, y in zip(half_prec, cpu))}/{len(lines)}"
        ok &= same == len(lines) or device.type == "cuda"
        for precision in ("bf16", "fp16"):
            report[f"throughput_{precision}"] = throughput(config, prepared, device, precision, 3 if args.cpu else 30)
    report["peak_host_memory_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    report["ok"] = bool(ok)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2))
    rows = [(name, *(run.get(k, "-") for k in ("seconds", "loss")), run.get("error", "")[:60]) for name, run in
            report["runs"].items()]  # fmt: skip
    print(table(("run", "seconds", "last loss", "error"), rows))
    print(json.dumps(report, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
