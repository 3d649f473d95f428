"""The HTTP server (``transduce.serving.server``), over real HTTP on 127.0.0.1: answers equal ``Translator.translate``,
the limits (413) and validation errors (422) are JSON naming what is wrong, a failing translation is a 500 for that
request only, the server keeps serving after every bad request, concurrent requests are merged into fewer batches, and a
bounded load test (2,000 requests from 32 clients) sees no error. Also the ``transduce serve`` command (parser, and a
real process stopped with Ctrl-C)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
httpx = pytest.importorskip("httpx", reason="httpx is not installed")

from decodekit import copy_sentences, make_checkpoint, one_thread  # noqa: E402
from transduce.search.translator import Translator  # noqa: E402
from transduce.serving.server import ServerThread, create_app  # noqa: E402

LIMITS = {"max_sentences": 32, "max_chars": 200, "max_body_bytes": 16_384, "max_beam": 8}


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def reference(copy_checkpoint: Path) -> Translator:
    """The translator the server's answers are compared with (loaded separately from the server's)."""
    return Translator.load(copy_checkpoint)


@pytest.fixture(scope="module")
def server(copy_checkpoint: Path):
    """The copy model served on a free port of 127.0.0.1 (uvicorn in a thread), shut down after the module."""
    app = create_app(Translator.load(copy_checkpoint), batch_wait_ms=20.0, **LIMITS)
    with ServerThread(app) as url:
        yield url


@pytest.fixture
def client(server: str):
    with httpx.Client(base_url=server, timeout=120) as c:
        yield c


def stats(client) -> dict:
    return client.get("/health").json()["stats"]


def assert_alive(client) -> None:
    r = client.get("/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"


# ----------------------------------------------------------------------------------------------------------------------
# answers


def test_health_describes_model_defaults_and_limits(client, reference):
    h = client.get("/health").json()
    assert h["status"] == "ok"
    cfg = reference.model.config
    assert h["model"]["encoder_layers"] == cfg.encoder_layers and h["model"]["heads"] == cfg.heads
    assert h["model"]["src_vocab_size"] == cfg.src_vocab_size and h["model"]["parameters"] > 0
    assert h["decode"] == reference.decode.to_dict()
    assert (h["tgt_langs"], h["tgt_lang"]) == ([], None)  # one target language: none to choose (the page: no selector)
    assert {k: h["limits"][k] for k in LIMITS} == LIMITS
    assert set(h["stats"]) >= {"requests", "sentences", "batches", "calls"}


@pytest.mark.parametrize(
    ("default", "expected"), [("", None), ("fr", "fra"), ("pt_BR", "pt_br")], ids=["no-default", "fr", "pt_BR"]
)
def test_health_lists_a_multilingual_models_target_languages_and_default(tmp_path, default, expected):
    """The codes as the model's tokens spell them (what the page's language selector offers and sends back), and
    the default spelt the same way, whichever form decode.tgt_lang (or --tgt-lang) gave it in."""
    tokens = (">>deu<<", ">>fra<<", ">>pt_br<<")
    translator = Translator.load(make_checkpoint(tmp_path, lang_tokens=tokens))
    translator.decode = translator.decode.replace(tgt_lang=default)  # as `transduce serve --tgt-lang` sets it
    with ServerThread(create_app(translator, batch_wait_ms=1.0)) as url, httpx.Client(base_url=url, timeout=120) as c:
        h = c.get("/health").json()
        assert (h["tgt_langs"], h["tgt_lang"]) == (["deu", "fra", "pt_br"], expected)
        for code in h["tgt_langs"]:  # each listed code is accepted as a request's tgt_lang, as the page sends it
            r = c.post("/attention", json={"sentence": "a man.", "tgt_lang": code})
            assert r.status_code == 200 and r.json()["src_pieces"][0] == f">>{code}<<", r.text
        if not default:
            assert c.post("/attention", json={"sentence": "a man."}).json()["error"].startswith("tgt_lang: missing")


def test_the_page_offers_a_language_selector_and_sends_tgt_lang(client):
    """The page (static JS; the browser test in test_web_page.py runs it): a selector filled from /health's
    tgt_langs, hidden for a model of one target language, its choice sent as the request's tgt_lang."""
    page = client.get("/").text
    assert '<select id="tgt-lang">' in page and 'id="tgt-lang-label" hidden' in page
    assert "showLanguages(h.tgt_langs || [], h.tgt_lang)" in page
    assert 'body.tgt_lang = $("tgt-lang").value' in page


def test_a_translation_server_says_it_serves_no_classifier(client):
    answer = client.post("/classify", json={"texts": ["a dog runs."]})
    assert answer.status_code == 404
    assert answer.json()["error"] == ("this server serves a translation model (data.task: translate): POST "
                                      "/translate; /classify needs a classifier (data.task: classify)")  # fmt: skip
    assert client.get("/health").json()["task"] == "translate"


def test_translate_equals_translator_with_default_and_other_options(client, reference):
    sentences = copy_sentences(10, seed=11)
    sentences[3:3] = ["", "   "]
    r = client.post("/translate", json={"sentences": sentences})
    assert r.status_code == 200
    got = r.json()["translations"]
    assert got == reference.translate(sentences)
    assert got[3] == got[4] == ""
    assert all(got[i] for i in range(len(got)) if sentences[i].strip())
    assert sum(a == b for a, b in zip(got, sentences) if a) >= 3  # the copy model mostly copies: a real model ran
    for options in (
        {"beam": 1},
        {"length_penalty": 1.5},
        {"length_penalty": 1.0, "length_norm": "length"},
        {"beam": 2, "length_penalty": 0.0, "max_len_b": 3},
    ):
        got = client.post("/translate", json={"sentences": sentences, **options}).json()["translations"]
        assert got == reference.translate(sentences, **options), options


def test_nbest_returns_scored_lists(client, reference):
    sentences = ["a man rides the red bike.", "", "two girls play."]
    out = client.post("/translate", json={"sentences": sentences, "nbest": 3}).json()
    expected = reference.translate_nbest(sentences, nbest=3)
    assert out["translations"] == [e[0].text for e in expected]
    assert [[h["text"] for h in n] for n in out["nbest"]] == [[t.text for t in e] for e in expected]
    scores = [h["score"] for h in out["nbest"][0]]
    assert len(scores) == 3 and scores == sorted(scores, reverse=True)
    assert out["nbest"][0][0]["score"] == pytest.approx(expected[0][0].score, abs=1e-4)
    assert "nbest" not in client.post("/translate", json={"sentences": sentences}).json()  # only when asked


def test_a_smaller_beam_is_accepted_when_the_configured_nbest_is_larger(copy_checkpoint, reference):
    """translate searches with nbest 1 whatever the run's decode.nbest says, so beam 2 under nbest 4 is valid."""
    from transduce.config import DecodeConfig

    app = create_app(Translator.load(copy_checkpoint, decode=DecodeConfig(beam=4, nbest=4)), batch_wait_ms=1.0)
    sentences = ["a man rides the red bike.", "two girls play."]
    with ServerThread(app) as url, httpx.Client(base_url=url, timeout=120) as c:
        r = c.post("/translate", json={"sentences": sentences, "beam": 2})
        assert r.status_code == 200, r.json()
        assert r.json()["translations"] == reference.translate(sentences, beam=2)
        r = c.post("/attention", json={"sentence": sentences[0], "beam": 2})
        assert r.status_code == 200 and r.json()["translation"] == reference.translate(sentences[:1], beam=2)[0]


def test_empty_sentences_and_order(client, reference):
    sentences = ["", "two girls play on grass.", "", "a dog.", ""]
    got = client.post("/translate", json={"sentences": sentences}).json()["translations"]
    assert len(got) == 5 and got[0] == got[2] == got[4] == ""
    assert got[1] == reference.translate([sentences[1]])[0] and got[3] == reference.translate([sentences[3]])[0]
    assert client.post("/translate", json={"sentences": []}).json() == {"translations": []}
    assert client.post("/translate", json={"sentences": [""]}).json() == {"translations": [""]}


def test_attention_matches_translator(client, reference):
    sentence = "a man rides the red bike."
    out = client.post("/attention", json={"sentence": sentence, "beam": 2}).json()
    translation = reference.translate([sentence], beam=2)[0]
    assert out["translation"] == translation
    maps = reference.attention(sentence, translation)
    assert out["src_pieces"] == maps.src_pieces and out["tgt_pieces"] == maps.tgt_out_pieces
    layers, heads, t, s = maps.cross.shape
    assert (out["layers"], out["heads"]) == (layers, heads)
    assert [len(out["cross"]), len(out["cross"][0]), len(out["cross"][0][0]), len(out["cross"][0][0][0])] == [
        layers, heads, t, s,
    ]  # fmt: skip
    cross = torch.tensor(out["cross"], dtype=torch.float64)
    assert torch.allclose(cross, maps.cross.double(), atol=6e-5)
    assert torch.allclose(cross.sum(-1), torch.ones(layers, heads, t, dtype=torch.float64), atol=1e-3)
    given = client.post("/attention", json={"sentence": sentence, "target": "a dog."}).json()
    assert given["translation"] == "a dog."
    assert given["tgt_pieces"] == reference.attention(sentence, "a dog.").tgt_out_pieces


def test_openapi_schema_documents_the_api(client):
    schema = client.get("/openapi.json").json()
    assert {"/translate", "/attention", "/health"} <= set(schema["paths"])
    post = schema["paths"]["/translate"]["post"]
    assert {"200", "413", "422"} <= set(post["responses"])
    body = schema["components"]["schemas"]["TranslateRequest"]
    assert body["required"] == ["sentences"]
    assert body["properties"]["beam"]["anyOf"][0]["maximum"] == LIMITS["max_beam"]
    assert client.get("/docs").status_code == 200


# ----------------------------------------------------------------------------------------------------------------------
# limits and errors


def test_limits_answer_413_with_json_naming_the_limit(client):
    r = client.post("/translate", json={"sentences": ["a dog."] * 33})
    assert r.status_code == 413 and r.json() == {"error": "too many sentences: 33 > max_sentences 32"}
    assert_alive(client)

    r = client.post("/translate", json={"sentences": ["a dog.", "x" * 201]})
    assert r.status_code == 413
    assert r.json()["error"] == "sentence 2 is too long: 201 characters > max_chars 200"
    assert client.post("/translate", json={"sentences": ["x" * 200]}).status_code == 200  # at the limit: fine
    r = client.post("/attention", json={"sentence": "y" * 201})
    assert r.status_code == 413 and "max_chars 200" in r.json()["error"]
    assert_alive(client)

    big = json.dumps({"sentences": ["a"] * 10_000}).encode()  # 60 kB > max_body_bytes, by Content-Length
    r = client.post("/translate", content=big, headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    assert r.json()["error"] == f"request body too large: {len(big)} bytes > max_body_bytes 16384"
    assert_alive(client)

    def chunked():  # no Content-Length: the bytes that arrive are counted
        yield b'{"sentences": ["'
        for _ in range(40):
            yield b"b" * 1000

    r = client.post("/translate", content=chunked(), headers={"Content-Type": "application/json"})
    assert r.request.headers.get("transfer-encoding") == "chunked"
    assert r.status_code == 413 and "max_body_bytes 16384" in r.json()["error"]
    assert_alive(client)


def test_attention_is_bounded_in_pieces_and_in_values(copy_checkpoint, reference):
    """Byte fallback makes an emoji 4 pieces, and a given target has no character limit of its own: /attention
    counts the pieces on both sides, and the values layers x heads x target x source that the answer would hold."""
    cfg = reference.model.config
    app = create_app(Translator.load(copy_checkpoint), max_attention_tokens=12, max_attention_values=2 * 5 * 12)
    with ServerThread(app) as url, httpx.Client(base_url=url, timeout=60) as c:
        emoji = "\U0001f600" * 3  # 3 characters, 12 or more pieces with EOS
        pieces = len(reference.tokenizer.encode_src(emoji)) + 1
        assert pieces > 12
        r = c.post("/attention", json={"sentence": emoji})
        assert r.status_code == 413 and r.json() == {
            "error": f"sentence has {pieces} source pieces (EOS included) > max_attention_tokens 12"
        }
        target = "a man rides the red bike near two girls."
        pieces = len(reference.tokenizer.encode_tgt(target)) + 1
        assert pieces > 12
        r = c.post("/attention", json={"sentence": "a dog.", "target": target})
        assert r.status_code == 413 and r.json() == {
            "error": f"target has {pieces} target pieces (EOS included) > max_attention_tokens 12"
        }
        s, t = len(reference.tokenizer.encode_src("a dog.")) + 1, len(reference.tokenizer.encode_tgt("a dog.")) + 1
        values = cfg.decoder_layers * cfg.heads * t * s
        assert values > 2 * 5 * 12 and s <= 12 and t <= 12
        r = c.post("/attention", json={"sentence": "a dog.", "target": "a dog."})
        assert r.status_code == 413 and r.json() == {
            "error": f"the attention of {cfg.decoder_layers} layers x {cfg.heads} heads x {t} target x {s} source "
            f"pieces is {values} values > max_attention_values {2 * 5 * 12}"
        }
        r = c.post("/attention", json={"sentence": "a dog."})  # the model's own translation, counted once made
        assert r.status_code == 413 and "> max_attention_values 120" in r.json()["error"]
        assert c.get("/health").json()["limits"]["max_attention_tokens"] == 12
    app = create_app(Translator.load(copy_checkpoint), max_attention_tokens=12, max_attention_values=values)
    with ServerThread(app) as url, httpx.Client(base_url=url, timeout=60) as c:
        r = c.post("/attention", json={"sentence": "a dog.", "target": "a dog."})  # at the limits: answered
        assert r.status_code == 200 and len(r.json()["src_pieces"]) == s and len(r.json()["tgt_pieces"]) == t


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"sentences": ["a dog."', "invalid JSON"),
        (b"sentences=a", "invalid JSON"),
        (b'{"sentences": "a dog."}', "sentences: Input should be a valid list"),
        (b'{"sentences": ["a dog.", 5]}', "sentences.1: Input should be a valid string"),
        (b'{"sentences": ["a"], "beam": 0}', "beam: Input should be greater than or equal to 1"),
        (b'{"sentences": ["a"], "beam": 9}', "beam: Input should be less than or equal to 8"),
        (b'{"sentences": ["a"], "beam": "4"}', "beam: Input should be a valid integer"),
        (b'{"sentences": ["a"], "length_penalty": -1}', "length_penalty: Input should be greater than or equal to 0"),
        (b'{"sentences": ["a"], "length_norm": "avg"}', "length_norm: Input should be 'gnmt' or 'length'"),
        (b'{"sentences": ["a"], "beem": 2}', "beem: Extra inputs are not permitted"),
        (b'{"sentence": ["a"]}', "sentences: Field required"),
        (b"[]", "Input should be a valid dictionary"),
    ],
)
def test_malformed_json_and_wrong_types_answer_422_saying_what_is_wrong(client, body, expected):
    r = client.post("/translate", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 422
    out = r.json()
    assert expected in out["error"], out
    assert isinstance(out["detail"], list) and out["detail"], out  # FastAPI's validation detail
    assert_alive(client)


@pytest.mark.parametrize("path", ["/translate", "/attention"])
@pytest.mark.parametrize(
    ("body", "headers", "expected"),
    [
        (b'{"sentences": ["a\xff dog."]}', {"Content-Type": "application/json"},
         "the request body is not UTF-8 (byte 0xff at offset 17): JSON must be sent as UTF-8"),
        (b'{"sentence": "\xe9t\xe9"}', {"Content-Type": "application/json; charset=latin-1"},
         "the request body is not UTF-8 (byte 0xe9 at offset 14): JSON must be sent as UTF-8"),
        (b'{"sentences": ["a dog."]}', {},
         "the request body must be JSON, sent with Content-Type: application/json (this request has no Content-Type)"),
        (b'{"sentences": ["a dog."]}', {"Content-Type": "text/plain"},
         "the request body must be JSON, sent with Content-Type: application/json (this request's is text/plain)"),
        (b"sentences=a", {"Content-Type": "application/x-www-form-urlencoded"},
         "the request body must be JSON, sent with Content-Type: application/json (this request's is "
         "application/x-www-form-urlencoded)"),
    ],
)  # fmt: skip
def test_a_body_that_is_not_utf8_json_answers_a_one_line_422_saying_why(client, path, body, headers, expected):
    r = client.post(path, content=body, headers=headers)
    assert r.status_code == 422
    assert r.json()["error"] == expected and r.json()["detail"][0]["msg"] == expected
    assert_alive(client)


def test_json_media_types_and_a_byte_order_mark_are_accepted(client, reference):
    expected = reference.translate(["a dog."])
    for content_type in ("application/json; charset=utf-8", "Application/JSON", "application/vnd.api+json"):
        r = client.post("/translate", content=b'{"sentences": ["a dog."]}', headers={"Content-Type": content_type})
        assert r.status_code == 200 and r.json()["translations"] == expected, content_type
    r = client.post("/translate", content=b'\xef\xbb\xbf{"sentences": ["a dog."]}',
                    headers={"Content-Type": "application/json"})  # fmt: skip
    assert r.status_code == 200 and r.json()["translations"] == expected


def test_other_http_errors_are_json_and_the_server_keeps_serving(client, reference):
    for method, path in [("GET", "/nothing"), ("GET", "/translate"), ("DELETE", "/health")]:
        r = client.request(method, path)
        assert r.status_code in (404, 405) and r.json()["error"].startswith(str(r.status_code))
    r = client.post("/attention", json={"sentence": 3})
    assert r.status_code == 422 and "sentence: Input should be a valid string" in r.json()["error"]
    sentences = copy_sentences(3, seed=5)
    assert client.post("/translate", json={"sentences": sentences}).json()["translations"] == reference.translate(
        sentences
    )


class Exploding:
    """A translator that fails on any batch holding the sentence "explode"."""

    def __init__(self, translator: Translator):
        self.inner = translator

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def translate(self, sentences, **options):
        if "explode" in sentences:
            raise RuntimeError("boom on purpose")
        return self.inner.translate(sentences, **options)


def test_failing_translation_is_a_500_for_that_request_only(copy_checkpoint, reference):
    app = create_app(Exploding(Translator.load(copy_checkpoint)), batch_wait_ms=300.0)  # a wide window: one batch
    good = [copy_sentences(2, seed=i) for i in range(6)]

    async def main(url):
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            bodies = [{"sentences": g} for g in good[:3]] + [{"sentences": ["a dog.", "explode"]}]
            bodies += [{"sentences": g} for g in good[3:]]
            return await asyncio.gather(*(c.post("/translate", json=b) for b in bodies))

    with ServerThread(app) as url:
        answers = asyncio.run(main(url))
        bad = answers.pop(3)
        assert bad.status_code == 500
        assert bad.json() == {"error": "translation failed: RuntimeError: boom on purpose"}
        assert [a.json()["translations"] for a in answers] == [reference.translate(g) for g in good]
        with httpx.Client(base_url=url) as c:
            s = stats(c)
            assert s["failed_calls"] >= 1
            assert s["batches"] < 7  # the bad request was batched with good ones, whose answers are right all the same
            assert c.post("/translate", json={"sentences": good[0]}).json()["translations"] == reference.translate(
                good[0]
            )


# ----------------------------------------------------------------------------------------------------------------------
# batching and load


def test_concurrent_requests_are_merged_into_fewer_batches(client, server, reference):
    requests = [copy_sentences(1 + i % 3, seed=100 + i) for i in range(24)]
    before = stats(client)

    async def main():
        async with httpx.AsyncClient(base_url=server, timeout=120) as c:
            answers = await asyncio.gather(*(c.post("/translate", json={"sentences": s}) for s in requests))
            return [a.json()["translations"] for a in answers]

    got = asyncio.run(main())
    after = stats(client)
    assert got == [reference.translate(s) for s in requests]
    assert after["requests"] - before["requests"] == 24
    assert after["sentences"] - before["sentences"] == sum(len(s) for s in requests)
    calls = after["calls"] - before["calls"]
    assert 1 <= calls < 24, f"{calls} translate calls for 24 concurrent requests: no batching"
    assert after["largest_call"] > 3


def run_load(url: str, requests: list[dict], clients: int) -> tuple[list, list[float]]:
    """Send ``requests`` from ``clients`` concurrent clients; returns (answers or exceptions, latencies in s)."""
    answers: list = [None] * len(requests)
    latencies: list[float] = []

    async def worker(queue):
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:  # one connection each: a shared pool is slow
            await send(c, queue)

    async def send(c, queue):
        while not queue.empty():
            i = queue.get_nowait()
            t = time.perf_counter()
            try:
                answers[i] = await c.post("/translate", json=requests[i])
            except Exception as e:  # counted as an error below
                answers[i] = e
            latencies.append(time.perf_counter() - t)

    async def main():
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(len(requests)):
            queue.put_nowait(i)
        await asyncio.gather(*(worker(queue) for _ in range(clients)))

    asyncio.run(main())
    return answers, latencies


@pytest.mark.slow
def test_load_1000_requests_from_32_clients_without_error(client, server, reference):
    rng = random.Random(7)
    pool = [*copy_sentences(300, seed=21), ""]
    requests = []
    for _ in range(1000):
        body: dict = {"sentences": rng.sample(pool, rng.randint(1, 3))}
        if rng.random() < 0.9:  # mostly greedy, to keep the test short; the rest with the default beam 4
            body["beam"] = 1
        requests.append(body)
    expected = {
        None: dict(zip(pool, reference.translate(pool))),
        1: dict(zip(pool, reference.translate(pool, beam=1))),
    }
    before = stats(client)
    start = time.perf_counter()
    answers, latencies = run_load(server, requests, clients=32)
    elapsed = time.perf_counter() - start
    errors = [a for a in answers if not isinstance(a, httpx.Response) or a.status_code != 200]
    assert not errors, errors[:3]
    wrong = 0
    for body, answer in zip(requests, answers):
        ref = expected[body.get("beam")]
        wrong += answer.json()["translations"] != [ref[s] for s in body["sentences"]]
    assert wrong == 0
    after = stats(client)
    latencies.sort()
    p50, p99 = statistics.median(latencies), latencies[int(0.99 * len(latencies)) - 1]
    print(
        f"\nload: 1000 requests, 32 clients: {1000 / elapsed:.0f} requests/s, p50 {p50 * 1000:.0f} ms, "
        f"p99 {p99 * 1000:.0f} ms, {after['calls'] - before['calls']} translate calls, "
        f"{after['busy_s'] - before['busy_s']:.1f} s translating"
    )
    assert after["requests"] - before["requests"] == 1000
    assert after["calls"] - before["calls"] < 500  # merged: far fewer calls than requests
    assert_alive(client)


# ----------------------------------------------------------------------------------------------------------------------
# the command


def test_cli_parser_accepts_serve_options():
    from transduce.cli import build_parser

    args = build_parser().parse_args(
        ["serve", "--model", "X", "--port", "8123", "--max-sentences", "8", "--batch-wait-ms", "2", "--beam", "2"]
    )
    assert (args.command, args.model, args.port, args.host) == ("serve", ["X"], 8123, "127.0.0.1")
    assert (args.max_sentences, args.batch_wait_ms, args.beam, args.max_chars) == (8, 2.0, 2, 1000)
    assert (args.max_attention_tokens, args.max_attention_values) == (256, 1_000_000)


def test_serve_command_hands_the_attention_limits_to_the_server(copy_checkpoint, monkeypatch):
    import transduce.serving.server
    from transduce.cli import main

    given = {}
    monkeypatch.setattr(transduce.serving.server, "serve", lambda *args, **options: given.update(options))
    argv = ["serve", "--model", str(copy_checkpoint), "--port", "0", "--device", "cpu"]
    assert main([*argv, "--max-attention-tokens", "40", "--max-attention-values", "5000"]) == 0
    assert (given["max_attention_tokens"], given["max_attention_values"]) == (40, 5000)


@pytest.mark.slow
def test_cli_serves_until_ctrl_c(tmp_path):
    model = make_checkpoint(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "transduce.cli", "serve", "--model", str(model), "--port", str(port), "--beam", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.communicate()[0]
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health").json()
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the server did not come up"
                time.sleep(0.1)
        assert health["decode"]["beam"] == 2  # --beam sets the server's default
        r = httpx.post(f"http://127.0.0.1:{port}/translate", json={"sentences": ["a dog.", ""]})
        assert r.status_code == 200 and r.json()["translations"][1] == ""
        proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out
    assert f"http://127.0.0.1:{port}/" in out and "Application shutdown complete" in out and "stopped" in out
