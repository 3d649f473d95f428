"""Load test of ``transduce serve``: N requests from C concurrent clients over real HTTP on 127.0.0.1.

The server (``transduce.serving.server.create_app`` under uvicorn) runs in this process, in a background thread, on a
free port; the clients are asyncio tasks with one ``httpx.AsyncClient`` (one keep-alive connection) each, sending
``/translate`` requests of 1-4 sentences back to back. Prints a markdown table: requests/s, sentences/s, p50/p99
latency, how many batches and translate calls the server made, and errors (any answer but 200, or a transport
error). Clients and server share one Python process (and its GIL), so the numbers are a lower bound for a server
with the machine to itself.

Model: ``--model DIR`` (a run directory or checkpoint; inputs from ``--input FILE``, one sentence per line). Without
it, the small copy model of the tests is trained first (``tests/decodekit.py: train_copy_checkpoint``, 2+2 layers,
d_model 64, about 20-40 s on 2 cores) and the inputs are its word sentences: realistic output lengths, unlike a
random model's.

    python benchmarks/serve_load.py                                  # 2,000 requests, 32 clients, beam 4
    python benchmarks/serve_load.py --requests 500 --clients 8 --beam 1
    python benchmarks/serve_load.py --compare                        # also without batching (one request per call)
    python benchmarks/serve_load.py --model runs/multi30k --input test.en
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from harness import add_common_args, apply_common_args, machine, table
from transduce.search.translator import Translator
from transduce.serving.server import ServerThread, create_app


async def _load(url: str, bodies: list[dict], clients: int) -> tuple[list[float], int]:
    """Send every body from ``clients`` concurrent clients; returns (latencies in s, errors)."""
    queue: asyncio.Queue[dict] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)
    latencies: list[float] = []
    errors = 0

    async def client() -> None:
        nonlocal errors
        async with httpx.AsyncClient(base_url=url, timeout=300) as c:  # one connection per client
            while not queue.empty():
                body = queue.get_nowait()
                t = time.perf_counter()
                try:
                    r = await c.post("/translate", json=body)
                    ok = r.status_code == 200 and len(r.json()["translations"]) == len(body["sentences"])
                except httpx.HTTPError:
                    ok = False
                latencies.append(time.perf_counter() - t)
                errors += not ok

    await asyncio.gather(*(client() for _ in range(clients)))
    return latencies, errors


def run(translator: Translator, bodies: list[dict], clients: int, **app_options) -> dict:
    """Serve ``translator`` on a free port, send ``bodies``, return the measurements."""
    app = create_app(translator, **app_options)
    with ServerThread(app) as url:
        httpx.post(url + "/translate", json={"sentences": bodies[0]["sentences"]}, timeout=300)  # warm-up
        before = httpx.get(url + "/health").json()["stats"]
        start = time.perf_counter()
        latencies, errors = asyncio.run(_load(url, bodies, clients))
        elapsed = time.perf_counter() - start
        after = httpx.get(url + "/health").json()["stats"]
    latencies.sort()
    sentences = sum(len(b["sentences"]) for b in bodies)
    calls = after["calls"] - before["calls"]
    return {
        "requests/s": len(bodies) / elapsed,
        "sentences/s": sentences / elapsed,
        "p50 ms": 1000 * statistics.median(latencies),
        "p99 ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "batches": after["batches"] - before["batches"],
        "calls": calls,
        "sentences/call": (after["sentences"] - before["sentences"]) / max(calls, 1),
        "busy %": 100 * (after["busy_s"] - before["busy_s"]) / elapsed,
        "errors": errors,
        "seconds": elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="run directory or checkpoint (default: train the tests' copy model)")
    parser.add_argument("--input", help="source sentences, one per line (with --model)")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--min-sentences", type=int, default=1, help="sentences per request: from")
    parser.add_argument("--max-sentences", type=int, default=4, help="to")
    parser.add_argument("--beam", type=int, help="beam size of every request (default: the model's)")
    parser.add_argument("--batch-wait-ms", type=float, default=5.0)
    parser.add_argument("--compare", action="store_true", help="also run without batching (one request per call)")
    parser.add_argument("--seed", type=int, default=0)
    add_common_args(parser, reps=None)
    args = parser.parse_args()
    apply_common_args(args)
    print(machine())  # its load average: other work on the machine; numbers compare only at similar loads

    with tempfile.TemporaryDirectory() as tmp:
        if args.model:
            translator = Translator.load(args.model)
            path = Path(args.input) if args.input else None
            pool = path.read_text(encoding="utf-8").splitlines() if path else ["A man rides a bike.", "A dog runs."]
            model_name = args.model
        else:
            sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
            from decodekit import copy_sentences, train_copy_checkpoint

            t = time.perf_counter()
            translator = Translator.load(train_copy_checkpoint(Path(tmp)))
            print(f"trained the copy model in {time.perf_counter() - t:.0f} s", file=sys.stderr)
            pool = copy_sentences(500, seed=args.seed)
            model_name = "the tests' copy model (2+2 layers, d_model 64, 4 heads, vocabulary 300)"

        rng = random.Random(args.seed)
        bodies = []
        for _ in range(args.requests):
            body: dict = {"sentences": rng.choices(pool, k=rng.randint(args.min_sentences, args.max_sentences))}
            if args.beam is not None:
                body["beam"] = args.beam
            bodies.append(body)

        settings = {"dynamic batching": {"batch_wait_ms": args.batch_wait_ms}}
        if args.compare:
            settings["one request per call"] = {"batch_wait_ms": 0.0, "max_batch_sentences": 1}
        results = {}
        for name, options in settings.items():
            results[name] = run(translator, bodies, args.clients, max_sentences=max(64, args.max_sentences), **options)

    beam = args.beam or translator.decode.beam
    print(
        f"Model: {model_name}; beam {beam}. {args.requests} requests of {args.min_sentences}-{args.max_sentences} "
        f"sentences from {args.clients} concurrent clients.\n"
    )
    columns = ["requests/s", "sentences/s", "p50 ms", "p99 ms", "batches", "calls", "sentences/call", "busy %"]
    rows = [
        [name] + [f"{r[c]:.1f}" if isinstance(r[c], float) else str(r[c]) for c in columns] + [r["errors"]]
        for name, r in results.items()
    ]
    print(table(["server", *columns, "errors"], rows))


if __name__ == "__main__":
    main()
