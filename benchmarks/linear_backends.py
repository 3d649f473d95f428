"""The linear layers of a decoding step, through MKL's BLAS (``F.linear``), through MKL's plain product with a
contiguous transposed copy of the weight (``transduce.model.packed.transposed_weight``, what
``fastpaths.settings.transposed_weights`` decodes with), through oneDNN with the weight packed once
(``transduce.model.packed.project``), with bf16 weights and products (``transduce.model.bf16``: float32 in
and out, as ``--precision bf16`` decodes on the CPU: transduce's AMX kernel where the CPU has AMX-BF16, with
oneDNN's bf16 product beside it there) and with dynamic int8 quantisation
(``transduce.model.quantize``, every layer whatever its size) through PyTorch's operation (fbgemm), through
transduce's VNNI kernel (where the CPU has AVX512-VNNI) and through the same product in AMX tiles (where the CPU has
AMX-INT8), side by side: time per call and
GFLOP/s by layer shape and row count.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 python benchmarks/linear_backends.py \\
        --preset tiny --rows 4,32,128 --threads 1

Shapes: the preset's decoder layers (self-attention Q/K/V, attention output, cross-attention Q, feed-forward in
and out; the feed-forward's first product with its ReLU, fused into oneDNN's call) and the pre-softmax projection
for a vocabulary of ``--vocab``. A beam-4 search of 32 sentences runs 128 rows a step (fewer as sentences finish).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from harness import add_common_args, apply_common_args, interleaved, machine, table
from transduce import fastpaths
from transduce.config import ModelConfig
from transduce.model import bf16, kernels, packed
from transduce.model.quantize import int8_function, quantize_int8


def per_call(fns: list, reps: int) -> list[float]:
    """Median seconds per call of each function, timed interleaved (``reps`` rounds, each a few milliseconds of
    calls of every function in turn), so that a noisy moment hits all alike."""

    def calls_of(fn, calls: int) -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - t0) / calls

    rounds = {}
    for i, fn in enumerate(fns):
        fn()
        calls = max(1, int(0.005 / max(calls_of(fn, 1), 1e-7)))
        rounds[i] = functools.partial(calls_of, fn, calls)
    times = interleaved(rounds, reps, warmup=0)
    return [statistics.median(times[i]) for i in range(len(fns))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--rows", default="4,32,128")
    add_common_args(ap, threads=1, reps=7)
    args = ap.parse_args()
    apply_common_args(args)
    if not fastpaths.onednn_available():
        raise SystemExit("this torch build has no oneDNN linear")
    cfg = ModelConfig.preset(args.preset, src_vocab_size=args.vocab, tgt_vocab_size=args.vocab)
    d, f = cfg.d_model, cfg.d_ff
    shapes = [("self-attention Q/K/V", d, 3 * d, None), ("attention output, cross Q", d, d, None),
              ("feed-forward in + ReLU", d, f, "relu"), ("feed-forward out", f, d, None),
              ("pre-softmax projection", d, args.vocab, None)]  # fmt: skip
    print(machine())
    print(f"preset {args.preset} (d_model {d}, d_ff {f}); median of {args.reps}\n")
    vnni = hasattr(kernels.compiled(), "int8_linear")
    amx = vnni and hasattr(kernels.compiled(), "int8_amx_linear") and kernels.compiled().amx_available()
    header = ["layer", "rows", "F.linear, us", "GFLOP/s", "transposed copy, us", "speed-up", "oneDNN packed, us",
              "speed-up", "bf16, us", "speed-up", "fbgemm int8, us", "speed-up"]  # fmt: skip
    header += ["transduce int8, us", "speed-up", "vs fbgemm"] if vnni else []
    header += ["transduce int8 in AMX tiles, us", "vs transduce int8"] if amx else []
    bf16_amx = bf16.amx_kernel() is not None
    header += ["bf16 oneDNN, us", "bf16 vs oneDNN"] if bf16_amx else []
    rows_out = []
    torch.manual_seed(0)
    with torch.inference_mode():
        for name, n_in, n_out, act in shapes:
            lin = nn.Linear(n_in, n_out).eval()
            int8 = quantize_int8(nn.Sequential(lin), min_weights=0)[0]
            half = bf16.bf16_function(bf16.BF16Linear(lin), relu=act == "relu")
            for rows in map(int, args.rows.split(",")):
                x = torch.randn(rows, 1, n_in)

                def plain(lin=lin, x=x, act=act):
                    y = F.linear(x, lin.weight, lin.bias)
                    return F.relu(y) if act else y

                def transposed(lin=lin, x=x, act=act):
                    y = torch.addmm(lin.bias, x.view(-1, lin.in_features), packed.transposed_weight(lin.weight))
                    return F.relu(y) if act else y

                def onednn(lin=lin, x=x, act=act):
                    return packed.project(lin, x, act, output=True)  # (output=True: oneDNN for any layer)

                def dynamic_int8(int8=int8, x=x, act=act):
                    y = int8(x)  # the layer's forward: PyTorch's int8 operation (fbgemm)
                    return F.relu(y) if act else y

                torch.testing.assert_close(onednn(), plain(), atol=1e-4, rtol=1e-4)
                torch.testing.assert_close(transposed()[:, None], plain(), atol=1e-4, rtol=1e-4)
                fns = [plain, transposed, onednn, functools.partial(half, x.view(rows, n_in)), dynamic_int8]
                torch.testing.assert_close(fns[3]()[:, None], plain(), atol=0.1, rtol=0.05)
                if vnni:
                    with fastpaths.override(int8_amx=False):
                        fns.append(functools.partial(int8_function(int8, relu=act == "relu"), x.view(rows, n_in)))
                    torch.testing.assert_close(fns[-1]()[:, None], dynamic_int8(), atol=0.1, rtol=0.1)
                if amx:  # the same product in AMX tiles (inputs a multiple of 64: else the VNNI kernel again)
                    with fastpaths.override(int8_amx=True):
                        fns.append(functools.partial(int8_function(int8, relu=act == "relu"), x.view(rows, n_in)))
                    assert torch.equal(fns[-1](), fns[-2]())  # (the same outputs, bit for bit)
                if bf16_amx:  # oneDNN's bf16 product, beside the AMX kernel that bf16 decoding uses here
                    layer, rows_x = bf16.BF16Linear(lin), x.view(rows, n_in)

                    def onednn_bf16(layer=layer, x=rows_x, act=act):
                        with fastpaths.override(bf16_amx=False):
                            return bf16.project(layer, x, act)

                    fns.append(onednn_bf16)
                times = per_call(fns, args.reps)
                t_plain, t_transposed, t_packed, t_bf16, t_int8 = times[:5]
                flop = 2 * rows * n_in * n_out
                cells = [name, rows, f"{t_plain * 1e6:.1f}", f"{flop / t_plain / 1e9:.1f}", f"{t_transposed * 1e6:.1f}",
                         f"{t_plain / t_transposed:.2f}x", f"{t_packed * 1e6:.1f}", f"{t_plain / t_packed:.2f}x",
                         f"{t_bf16 * 1e6:.1f}", f"{t_plain / t_bf16:.2f}x", f"{t_int8 * 1e6:.1f}",
                         f"{t_plain / t_int8:.2f}x"]  # fmt: skip
                if vnni:
                    cells += [f"{times[5] * 1e6:.1f}", f"{t_plain / times[5]:.2f}x", f"{t_int8 / times[5]:.2f}x"]
                if amx:
                    cells += [f"{times[6] * 1e6:.1f}", f"{times[5] / times[6]:.2f}x"]
                if bf16_amx:
                    cells += [f"{times[-1] * 1e6:.1f}", f"{times[-1] / t_bf16:.2f}x"]
                rows_out.append(cells)
    print(table(header, rows_out))


if __name__ == "__main__":
    main()
