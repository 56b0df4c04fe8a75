"""The playground in a real headless Chromium against the real proxy on the default model."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright import sync_api as pw

from semif_proxy.settings.defaults import DEFAULT_NORMALIZATION
from semif_proxy.testing.server import ProxyProcess
from tests.conftest import StartProxy

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.fail(
            "the playground tests need Chromium and none is on PATH: install it with "
            "`apt-get install chromium` (Debian/Ubuntu; `make test` run as root installs it)"
        )
    with pw.sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser: object, proxy: ProxyProcess) -> Iterator[object]:
    context = browser.new_context(viewport={"width": 1200, "height": 900})  # type: ignore[attr-defined]
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.goto(proxy.url + "/")
    pg.wait_for_selector("body[data-ready=true]")
    yield pg
    context.close()
    assert not errors, errors  # no JavaScript errors along the way


def shot(pg: object, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)  # type: ignore[attr-defined]


def test_example_decision_draws_bars(page: object) -> None:
    page.select_option("#example", label="Support-ticket routing")
    page.click("#decide")
    page.wait_for_selector(".result .bar-row", timeout=60_000)
    results = page.locator(".result")
    assert results.count() == 2  # the question and the extra one on the same state
    first = results.nth(0)
    rows = first.locator(".bar-row")
    assert [rows.nth(i).get_attribute("data-option") for i in range(rows.count())] == [
        "billing",
        "account_access",
        "shipping",
    ]
    probs = [float(rows.nth(i).get_attribute("data-probability")) for i in range(rows.count())]
    assert sum(probs) == pytest.approx(1.0, abs=1e-6)
    shown = [
        float(rows.nth(i).locator(".pct").inner_text().split()[0]) for i in range(rows.count())
    ]
    assert sum(shown) == pytest.approx(100.0, abs=0.2)
    top = first.locator(".bar-row.top")
    assert top.count() == 1
    assert (
        top.get_attribute("data-option")
        == ["billing", "account_access", "shipping"][probs.index(max(probs))]
    )
    assert "logit" in first.inner_text() and "allowed token mass" in first.inner_text()
    first.locator("details summary").click()
    assert "<|im_start|>" in first.locator("details pre").inner_text()
    shot(page, "decision")


def test_a_pasted_catalogue_of_40_options_is_decided(page: object) -> None:
    page.select_option("#example", label="Support-ticket routing")
    catalogue = "\n".join(f"intent_{i}: customer intent number {i}" for i in range(40))
    page.click("#bulk summary")
    page.fill("#bulk-options", catalogue)
    page.click("#bulk-apply")
    assert page.locator("#options .option").count() == 40
    assert page.inner_text("#option-count") == "40 of 255 options"
    page.click("#decide")
    page.wait_for_selector(".result .bar-row", timeout=120_000)
    rows = page.locator(".result").nth(0).locator(".bar-row")
    assert rows.count() == 40
    assert rows.nth(39).get_attribute("data-option") == "intent_39"
    too_many = "\n".join(f"o{i}: x" for i in range(256))
    page.fill("#bulk-options", too_many)
    page.click("#bulk-apply")
    assert "limit is 255" in page.inner_text("#options-error")
    assert page.locator("#options .option").count() == 40  # left as it was


def test_system_one_score_example(page: object) -> None:
    page.select_option("#example", label="Incident severity score")
    page.click("#decide")
    page.wait_for_selector(".result .bar-row", timeout=60_000)
    text = page.locator(".result").inner_text()
    assert "expected level" in text and "confidence" in text
    assert page.locator(".result .bar-row").count() == 4
    shot(page, "systemone-score")


def test_readouts_are_chosen_in_the_page(page: object) -> None:
    """The readout fields reach the API and the answer says which readout made it: direct on
    a System One score, deliberate on a decision (its reasoning shown), and a readout that
    does not fit the options refused next to the readout field."""
    page.select_option("#example", label="Incident severity score")
    page.select_option("#readout", "direct")
    assert page.is_hidden("#normalization-row") and page.is_hidden("#deliberation-row")
    page.click("#decide")
    page.wait_for_selector(".result .bar-row", timeout=60_000)
    assert "direct-levels" in page.locator(".result").first.inner_text()

    page.select_option("#example", label="Support-ticket routing")
    page.select_option("#readout", "continuation")  # its normalisation: the server's unless set
    assert page.is_visible("#normalization-row")
    assert page.input_value("#normalization") == ""
    unset = page.locator("#normalization option[value='']").text_content()
    assert f"({DEFAULT_NORMALIZATION} unless set)" in unset  # the page says the default
    page.select_option("#readout", "deliberate")
    assert page.is_visible("#deliberation-row")
    page.fill("#deliberation-tokens", "8")
    page.click("#decide")
    page.wait_for_selector(".result .reasoning", timeout=120_000)
    first = page.locator(".result").first
    assert "deliberate" in first.inner_text()
    assert "Reasoning (" in first.locator(".reasoning summary").inner_text()

    page.select_option("#readout", "direct")  # routing queues are no yes/no or score
    page.click("#decide")
    page.wait_for_selector("#readout-error:not(:empty)")
    assert "400" in page.inner_text("#readout-error")
    assert page.get_attribute("#readout", "aria-invalid") == "true"
    shot(page, "readout-error")


def test_api_error_appears_next_to_its_field(page: object) -> None:
    page.select_option("#example", label="Support-ticket routing")
    page.fill("#question", "")
    page.click("#decide")
    page.wait_for_selector("#question-error:not(:empty)")
    assert "400" in page.inner_text("#question-error")
    assert page.get_attribute("#question", "aria-invalid") == "true"
    assert page.inner_text("#state-error") == ""
    # Options: none is not enough; the API says so and the message lands under the options.
    page.fill("#question", "Which queue?")
    for _ in range(page.locator("#options .option").count()):
        page.click("#options .option:nth-child(1) .remove")
    page.click("#decide")
    page.wait_for_selector("#options-error:not(:empty)")
    assert page.inner_text("#question-error") == ""
    shot(page, "validation-error")


def test_chat_streams_token_by_token(page: object) -> None:
    page.click("#tab-chat")
    page.fill("#chat-input", "Count from one to ten.")
    page.click("#chat-send")
    page.wait_for_selector(".chat-log .assistant[data-done=true]", timeout=180_000)
    reply = page.locator(".chat-log .assistant")
    assert reply.inner_text().strip()
    assert int(reply.get_attribute("data-updates")) > 1  # drawn as it streamed, not at the end
    shot(page, "chat")


def test_keyboard_only_and_small_screens(browser: object, proxy: ProxyProcess) -> None:
    context = browser.new_context(viewport={"width": 320, "height": 640})  # type: ignore[attr-defined]
    pg = context.new_page()
    pg.goto(proxy.url + "/playground")
    pg.wait_for_selector("body[data-ready=true]")
    # Every input has a label.
    unlabeled = pg.evaluate(
        """() => [...document.querySelectorAll('input, textarea, select')].filter(
              el => !(el.labels && el.labels.length) && !el.getAttribute('aria-label')).length"""
    )
    assert unlabeled == 0
    # Keyboard only: pick an example, tab to the button, press Enter.
    pg.focus("#example")
    pg.keyboard.press("ArrowDown")  # first example
    pg.focus("#decide")
    pg.keyboard.press("Enter")
    pg.wait_for_selector(".result .bar-row", timeout=60_000)
    # Tabs switch with the arrow keys.
    pg.focus("#tab-decide")
    pg.keyboard.press("ArrowRight")
    assert pg.get_attribute("#tab-chat", "aria-selected") == "true"
    assert pg.is_visible("#chat-input")
    pg.keyboard.press("ArrowLeft")
    # 320 CSS px is a phone, and what 1280 px looks like at 400 % zoom: nothing scrolls sideways.
    assert pg.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
    shot(pg, "phone")
    context.close()


def test_playground_can_be_switched_off(model_path: Path, start_proxy: StartProxy) -> None:
    server = start_proxy(model_path, {"SEMIF_PLAYGROUND": "off", "SEMIF_CHAT": "off"})
    assert server.call("GET", "/").status == 404
    assert server.call("GET", "/playground/app.js").status == 404


def test_assets_are_local_and_typed(proxy: ProxyProcess) -> None:
    page_html = proxy.call("GET", "/").body.decode()
    assert "http://" not in page_html and "https://" not in page_html  # no CDN
    js = proxy.call("GET", "/playground/app.js")
    assert js.status == 200 and js.headers["Content-Type"].startswith("text/javascript")
    assert "default-src 'self'" in js.headers["Content-Security-Policy"]
    assert proxy.call("GET", "/playground/../settings.py").status == 404
