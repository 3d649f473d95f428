"""The server's page (``GET /``) in a real headless Chromium driven by Playwright, against the server on 127.0.0.1:
type a sentence, set the beam, translate, read the translation (it must equal ``Translator.translate``), check the
attention heatmap's axes, switch layer and head, hover a target piece, see a 413 shown as a message, take a
screenshot; the page must load nothing from anywhere but the server and log no JavaScript error.

Needs ``playwright`` (pip) and Debian's ``chromium`` (``apt-get install chromium``; ``.ci/run`` installs it). We do
not run ``playwright install``: the system Chromium is launched by its executable path. Skipped, saying which is
missing, where either is absent."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")

from decodekit import make_checkpoint, one_thread  # noqa: E402
from transduce.search.translator import Translator  # noqa: E402
from transduce.serving.server import ServerThread, create_app  # noqa: E402

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium; .ci/run installs it)"
)

MAX_CHARS = 120


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def reference(copy_checkpoint: Path) -> Translator:
    return Translator.load(copy_checkpoint)


@pytest.fixture(scope="module")
def server(copy_checkpoint: Path):
    with ServerThread(create_app(Translator.load(copy_checkpoint), max_chars=MAX_CHARS)) as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, server):
    """A fresh page that records every request it makes and every JavaScript error."""
    context = browser.new_context(viewport={"width": 1100, "height": 900})
    page = context.new_page()
    page.requests = []
    page.errors = []
    page.on("request", lambda r: page.requests.append(r.url))
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.on("console", lambda m: page.errors.append(m.text) if m.type == "error" else None)
    page.set_default_timeout(60_000)
    yield page
    context.close()


def heatmap_values(page) -> list[list[float]]:
    return page.eval_on_selector_all(
        "#heatmap tr[data-t]", "rows => rows.map(r => [...r.querySelectorAll('td')].map(td => Number(td.dataset.w)))"
    )


def translate_on_page(page, sentence: str, beam: str) -> str:
    page.fill("#source", sentence)
    page.fill("#beam", beam)
    page.click("#translate")
    page.wait_for_function("['done', 'error'].includes(document.body.dataset.state)")
    return page.eval_on_selector("body", "b => b.dataset.state")


def test_page_translates_and_explores_attention(page, server, reference, tmp_path):
    page.goto(server + "/")
    assert page.title() == "transduce"
    page.wait_for_function("document.getElementById('beam').value !== ''")  # defaults filled from /health
    assert page.input_value("#beam") == str(reference.decode.beam)
    assert float(page.input_value("#length-penalty")) == reference.decode.length_penalty

    sentence = "two girls play on the red grass."
    assert translate_on_page(page, sentence, "2") == "done"
    translation = page.text_content("#translation")
    assert translation == reference.translate([sentence], beam=2)[0]
    assert translation

    # the heatmap: one row per target piece, one column per source piece, in order
    maps = reference.attention(sentence, translation)
    layers, heads, t, s = maps.cross.shape
    assert page.eval_on_selector_all("#heatmap th.tgt", "e => e.map(x => x.textContent)") == maps.tgt_out_pieces
    assert page.eval_on_selector_all("#heatmap th.src", "e => e.map(x => x.textContent)") == maps.src_pieces
    average = heatmap_values(page)
    assert len(average) == t and all(len(row) == s for row in average)
    expected = maps.cross.mean(dim=(0, 1))
    assert all(abs(average[i][j] - float(expected[i, j])) < 2e-3 for i in range(t) for j in range(s))
    assert page.eval_on_selector_all("#layer option", "o => o.length") == layers + 1  # each layer + the average
    assert page.eval_on_selector_all("#head option", "o => o.length") == heads + 1

    # one layer, one head: other values, those of that head
    page.select_option("#layer", "1")
    page.select_option("#head", "2")
    one_head = heatmap_values(page)
    assert one_head != average
    assert all(abs(one_head[i][j] - float(maps.cross[1, 2, i, j])) < 2e-4 for i in range(t) for j in range(s))
    page.select_option("#head", "0")
    assert heatmap_values(page) != one_head
    styles = page.eval_on_selector_all("#heatmap td", "e => new Set(e.map(x => x.style.backgroundColor)).size")
    assert styles > 1  # the cells are coloured by weight

    # hovering a target piece highlights the source pieces it attended to, by weight
    page.hover("#target-tokens .tok[data-t='1']")
    weights = page.eval_on_selector_all("#source-tokens .tok", "e => e.map(x => Number(x.dataset.weight))")
    row = maps.cross[1, 0, 1]
    assert weights == pytest.approx(row.tolist(), abs=2e-4)
    hot = page.eval_on_selector_all("#source-tokens .tok.hot", "e => e.map(x => Number(x.dataset.s))")
    assert int(row.argmax()) in hot
    assert page.locator("#target-tokens .tok.active").count() == 1
    page.hover("#heatmap th.tgt[data-t='0']")  # the row headers of the map work too
    assert page.eval_on_selector_all("#source-tokens .tok.hot", "e => e.length") >= 1
    page.hover("h1")
    assert page.eval_on_selector_all("#source-tokens .tok.hot", "e => e.length") == 0

    shot = tmp_path / "page.png"
    page.screenshot(path=str(shot), full_page=True)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000

    assert page.errors == []
    outside = [u for u in page.requests if not u.startswith(server + "/") and not u.startswith("data:")]
    assert outside == [], f"the page loaded something from elsewhere: {outside}"
    assert any(u.endswith("/attention") for u in page.requests)


def test_page_shows_server_errors(page, server, reference):
    page.goto(server + "/")
    assert translate_on_page(page, "a " * MAX_CHARS, "2") == "error"
    message = page.text_content("#error")
    assert "413" in message and f"max_chars {MAX_CHARS}" in message
    page.fill("#length-penalty", "-1")  # the server's 422, shown as it says it
    assert translate_on_page(page, "a dog.", "2") == "error"
    assert "422" in page.text_content("#error") and "length_penalty" in page.text_content("#error")
    page.fill("#length-penalty", "0.6")  # and the page recovers
    assert translate_on_page(page, "a dog.", "1") == "done"
    assert page.text_content("#error") == ""
    assert page.text_content("#translation") == reference.translate(["a dog."], beam=1)[0]
    assert [e for e in page.errors if "422" not in e and "413" not in e] == []  # failed fetches log to the console


def test_page_chooses_a_multilingual_models_target_language(browser, page, tmp_path):
    """A multilingual model served without a default: the page offers its languages (as its tokens spell them), the
    first chosen, and sends the choice as tgt_lang (no 422 "tgt_lang: missing"); the test server above (one target
    language) shows no selector."""
    translator = Translator.load(make_checkpoint(tmp_path, lang_tokens=(">>deu<<", ">>fra<<")))
    with ServerThread(create_app(translator, batch_wait_ms=1.0)) as url:
        page.goto(url + "/")
        page.wait_for_function("document.getElementById('tgt-lang').options.length > 0")
        assert page.is_visible("#tgt-lang")
        assert page.eval_on_selector_all("#tgt-lang option", "o => o.map(x => x.value)") == ["deu", "fra"]
        for code in ("deu", "fra"):
            page.select_option("#tgt-lang", code)
            assert translate_on_page(page, "a man.", "1") == "done", page.text_content("#error")
            assert page.text_content("#translation") == translator.translate(["a man."], beam=1, tgt_lang=code)[0]
            assert page.text_content("#source-tokens .tok") == f">>{code}<<"  # the language token leads the source
    assert page.errors == []


def test_page_shows_no_language_selector_for_a_model_of_one_target_language(page, server):
    page.goto(server + "/")
    page.wait_for_function("document.getElementById('beam').value !== ''")  # /health has been read
    assert not page.is_visible("#tgt-lang")
    assert translate_on_page(page, "a dog.", "1") == "done"  # no tgt_lang sent: this model would refuse one (422)
