"""Screenshot of XProf's trace viewer in headless Chromium, for docs/profiler.md.

    python scripts/trace_screenshot.py URL OUT.png [--click X,Y] [--view START_MS,END_MS]

URL is the trace viewer page XProf's "Trace Viewer" tool embeds
(``/data/plugin/profile/trace_viewer_index.html?...``, served by
``scripts/profiler_trace.py LOGDIR --serve PORT``). Chromium runs headless
with no network but loopback, driven over the DevTools protocol (on
127.0.0.1): the page loads, a click at X,Y selects the span there (its full
name shows in the details panel), and the view is set to START_MS..END_MS
of the trace, as zooming by hand would. Needs `chromium` (Debian) and aiohttp
(installed with xprof).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import socket
import subprocess
import tempfile

import aiohttp

WIDTH, HEIGHT = 1600, 900
LOAD_SECONDS = 25  # the viewer imports the trace after the page loads

_SET_VIEW = """(() => {{
  const viewport = document.querySelector('tr-ui-timeline-view').trackView.viewport;
  const transform = viewport.currentDisplayTransform;
  transform.xSetWorldBounds({start}, {end}, viewport.modelTrackContainer.canvas.width);
  viewport.setDisplayTransformImmediately(transform);
}})()"""


class DevTools:
    """One page's DevTools protocol connection: `call(method, **params)`."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws, self.last_id = ws, 0

    async def call(self, method: str, **params: object) -> dict:
        self.last_id += 1
        await self.ws.send_json({"id": self.last_id, "method": method, "params": params})
        while True:
            message = json.loads((await self.ws.receive()).data)
            if message.get("id") == self.last_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]


async def _page_socket(http: aiohttp.ClientSession, port: int) -> str:
    for _ in range(150):
        try:
            async with http.get(f"http://127.0.0.1:{port}/json") as response:
                targets = await response.json()
            return next(t for t in targets if t["type"] == "page")["webSocketDebuggerUrl"]
        except (aiohttp.ClientError, StopIteration):
            await asyncio.sleep(0.2)
    raise RuntimeError("Chromium's DevTools endpoint never answered")


async def screenshot(url: str, out: str, click: tuple[float, float] | None,
                     view: tuple[float, float] | None) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    chromium = subprocess.Popen(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu",
         "--disable-background-networking", "--disable-component-update", "--no-first-run",
         f"--user-data-dir={tempfile.mkdtemp()}", f"--remote-debugging-port={port}",
         "--remote-debugging-address=127.0.0.1", f"--window-size={WIDTH},{HEIGHT}",
         "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(await _page_socket(http, port), max_msg_size=0) as ws:
                page = DevTools(ws)
                await page.call("Emulation.setDeviceMetricsOverride", width=WIDTH,
                                height=HEIGHT, deviceScaleFactor=1, mobile=False)
                await page.call("Page.navigate", url=url)
                await asyncio.sleep(LOAD_SECONDS)
                # A click first: it selects the span under X,Y (its full name shows in
                # the details panel) and gives the track view the focus, without
                # which a new view is not drawn.
                x, y = click if click is not None else (WIDTH / 2, 120)
                for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
                    await page.call("Input.dispatchMouseEvent", type=kind, x=x, y=y,
                                    button="left", clickCount=1)
                if view is not None:
                    result = await page.call(
                        "Runtime.evaluate", expression=_SET_VIEW.format(start=view[0], end=view[1]))
                    if "exceptionDetails" in result:
                        raise RuntimeError(f"setting the view: {result['exceptionDetails']}")
                await asyncio.sleep(3)
                shot = await page.call("Page.captureScreenshot", format="png")
        with open(out, "wb") as f:
            f.write(base64.b64decode(shot["data"]))
    finally:
        chromium.terminate()
        chromium.wait()


def _pair(text: str) -> tuple[float, float]:
    a, b = text.split(",")
    return float(a), float(b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("out")
    parser.add_argument("--click", type=_pair, metavar="X,Y")
    parser.add_argument("--view", type=_pair, metavar="START_MS,END_MS")
    args = parser.parse_args()
    asyncio.run(screenshot(args.url, args.out, args.click, args.view))


if __name__ == "__main__":
    main()
