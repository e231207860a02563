"""The page at / in a real browser: headless Chromium (Debian's package) driven by Playwright.

Against a server on the built-in model: upload a drawn red circle, ask its colour and read "red";
a second question about the same picture shows cached tokens > 0. Against the tiny random model (long
answers): Stop aborts the request and the pool returns to idle. With --api-key, a wrong key shows
the server's 401 message. Screenshots of each state go to the folder printed at the end."""

import shutil
import tempfile
import time

import pytest
from PIL import Image, ImageDraw

from helpers.server_helpers import start_server
from vlserve.model.builtin import BUILTIN_MODEL_DIR

pytestmark = pytest.mark.browser

SHOTS = tempfile.mkdtemp(prefix="vlserve-page-screenshots-")


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "Chromium is missing: apt-get install chromium (scripts/run.sh test does it when run as root)"
    return path


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        yield b
        b.close()
    print(f"\npage screenshots: {SHOTS}")


def red_circle() -> str:
    image = Image.new("RGB", (128, 128), "white")
    ImageDraw.Draw(image).ellipse((34, 34, 94, 94), fill=(230, 30, 30))
    path = f"{SHOTS}/red_circle.png"
    image.save(path)
    return path


def ask(page, question: str) -> None:
    page.fill("#question", question)
    page.click("#send")


def test_ask_about_a_picture_then_follow_up_from_the_cache(browser):
    engine, srv = start_server(model=str(BUILTIN_MODEL_DIR))
    try:
        page = browser.new_page(viewport={"width": 390, "height": 844})  # a phone-sized screen
        page.goto(srv.url + "/")
        page.set_input_files("#files", red_circle())
        ask(page, "What colour is the circle?")
        first = page.locator(".assistant").nth(0)
        first.locator(".stats").wait_for(timeout=60_000)
        assert "red" in first.inner_text().lower()
        page.screenshot(path=f"{SHOTS}/1-answer.png")
        page.fill("#question", "What shape is it?")
        page.press("#question", "Enter")  # the keyboard alone asks
        second = page.locator(".assistant").nth(1).locator(".stats")
        second.wait_for(timeout=60_000)
        assert int(second.get_attribute("data-cached-tokens")) > 0
        assert "cached" in second.inner_text()
        page.screenshot(path=f"{SHOTS}/2-follow-up.png", full_page=True)
        page.wait_for_function("document.getElementById('m-hit').textContent.includes('%')", timeout=10_000)
    finally:
        srv.stop()
        engine.shutdown()


def test_stop_aborts_a_long_answer_and_frees_the_pool(browser):
    engine, srv = start_server()  # the tiny random model: it rambles until max tokens
    # Paced to 100 forwards a second, so 1,500 tokens take 15 s: on a loaded machine the unpaced tiny
    # model finished its answer before the browser had drawn 20 characters, and Stop was disabled.
    run = engine.runner.run

    def paced_run(plan):
        time.sleep(0.01)
        return run(plan)

    engine.runner.run = paced_run
    try:
        page = browser.new_page()
        page.goto(srv.url + "/")
        page.click("summary")
        page.fill("#max-tokens", "1500")
        ask(page, "Tell me everything.")
        page.wait_for_function("document.querySelector('.assistant span') && "
                               "document.querySelector('.assistant span').textContent.length > 20", timeout=60_000)
        page.click("#stop")
        page.locator(".assistant .stats").wait_for(timeout=30_000)
        assert "stopped" in page.locator(".assistant").inner_text()
        page.screenshot(path=f"{SHOTS}/3-stopped.png")
        assert engine.wait_idle(30)
        assert engine.pool_state()["in_use"] == 0
        engine.scheduler.cm.check_idle_accounting()
    finally:
        srv.stop()
        engine.shutdown()


def test_a_wrong_api_key_shows_the_servers_message(browser):
    engine, srv = start_server(api_key="sekret")
    try:
        page = browser.new_page()
        page.goto(srv.url + "/")
        page.fill("#api-key", "wrong")
        page.dispatch_event("#api-key", "change")
        ask(page, "Hello?")
        alert = page.locator(".error").last
        alert.wait_for(timeout=30_000)
        assert "API key" in alert.inner_text()
        page.screenshot(path=f"{SHOTS}/4-wrong-key.png")
        page.fill("#api-key", "sekret")
        page.dispatch_event("#api-key", "change")
        ask(page, "Hello?")
        page.locator(".assistant .stats").wait_for(timeout=60_000)
    finally:
        srv.stop()
        engine.shutdown()
