#!/usr/bin/env python3
"""The chat page of ``elelem serve`` in a real headless Chromium: a streamed exchange, then stop.

    python scripts/chat_page_check.py [--model smollm2-135m] [--chromium /usr/bin/chromium]
        [--screenshot chat.png]

Needs the Debian package ``chromium`` and the ``playwright`` Python package
(only its driver: the system Chromium is used, nothing is downloaded).  It
serves the model in-process on a free loopback port with an API key, opens
the page, enters the key, sends a message and waits for the streamed reply;
then sends a long request and presses Stop, and checks that the server
cancelled it (its session closed).  Exits 1 with a message when a check fails.
"""
from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

KEY = "page-check-key"


def wait(condition, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the page did not get there in time")
        time.sleep(0.1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--screenshot", default="chat_page.png")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import uvicorn
    from playwright.sync_api import sync_playwright
    from elelem.model.hub import resolve_model
    from elelem.server import ServerConfig, create_app

    app = create_app(ServerConfig(models=[str(resolve_model(args.model))], api_key=KEY, n_ctx=1024, parallel=2,
                                  keep_alive=None, n_threads=args.threads))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None, lifespan="on"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}/"
    model = app.state.server.registry.default
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=args.chromium, headless=True)
            page = browser.new_page(viewport={"width": 900, "height": 600})
            failed_requests = []
            page.on("requestfailed", lambda r: failed_requests.append(r.url))
            page.goto(url)
            page.fill("#key", KEY)
            page.dispatch_event("#key", "change")
            # Polled from here: the page's CSP rightly forbids the eval that wait_for_function needs.
            wait(lambda: page.locator("#model option").count() > 0)
            page.fill("#input", "Write one sentence about the sea.")
            page.press("#input", "Enter")
            wait(lambda: not page.is_disabled("#send") and page.locator(".assistant").count() == 1)
            reply = page.text_content(".assistant")
            page.screenshot(path=args.screenshot)
            print(f"reply: {reply!r}; screenshot: {args.screenshot}")

            page.fill("#input", "Count from one to five hundred, in words.")
            page.press("#input", "Enter")
            wait(lambda: page.locator(".assistant").count() == 2 and page.locator(".assistant").nth(1).text_content())
            page.click("#stop")
            deadline = time.monotonic() + 10
            while model.in_flight and time.monotonic() < deadline:
                time.sleep(0.05)
            stopped = model.in_flight == 0 and model.llm.engine.context.cache.n_used == 0
            errors = page.locator(".error").all_text_contents()
            browser.close()
        checks = {"a streamed reply": bool(reply and reply.strip()), "Stop cancelled it on the server": stopped,
                  "no error shown": not errors, "no request failed but the stopped one": len(failed_requests) <= 1}
        for name, ok in checks.items():
            print(f"{'ok' if ok else 'FAILED'}: {name}")
        return 0 if all(checks.values()) else 1
    finally:
        server.should_exit = True


if __name__ == "__main__":
    sys.exit(main())
