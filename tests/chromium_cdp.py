"""Open a page in headless Chromium and report what a reader's browser would: every image's state, the console.

Talks the Chrome DevTools protocol over ``--remote-debugging-pipe`` (JSON messages ended by NUL on file
descriptors 3 and 4), so that it needs nothing beyond Debian's ``chromium`` package and the standard library.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["PageCheck", "chromium_path", "open_page"]

_IMAGES_JS = ("JSON.stringify(Array.from(document.images).map(i => ({alt: i.alt, complete: i.complete, "
              "width: i.naturalWidth, height: i.naturalHeight})))")


def chromium_path() -> str | None:
    """The Chromium binary on PATH (Debian: ``chromium``), or None."""
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


@dataclass
class PageCheck:
    images: list[dict[str, Any]]  # alt, complete, width, height (natural size in pixels) of every <img>
    errors: list[str] = field(default_factory=list)  # console errors, uncaught exceptions, failed loads
    title: str = ""


class _Pipe:
    def __init__(self, proc: subprocess.Popen[bytes], write_fd: int, read_fd: int) -> None:
        self.proc, self.write_fd, self.read_fd = proc, write_fd, read_fd
        self.buffer = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout_s: float = 30.0) -> dict[str, Any]:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.write_fd, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read(timeout_s)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return dict(reply.get("result", {}))
            self.events.append(reply)

    def wait_event(self, method: str, timeout_s: float = 30.0) -> dict[str, Any]:
        for i, ev in enumerate(self.events):
            if ev.get("method") == method:
                return self.events.pop(i)
        while True:
            ev = self._read(timeout_s)
            if ev.get("method") == method:
                return ev
            self.events.append(ev)

    def _read(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while b"\0" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.read_fd], [], [], left)[0]:
                raise TimeoutError(f"no answer from chromium in {timeout_s:g} s")
            chunk = os.read(self.read_fd, 1 << 20)
            if not chunk:
                raise RuntimeError(f"chromium closed the pipe (exit status {self.proc.poll()})")
            self.buffer += chunk
        message, _, self.buffer = self.buffer.partition(b"\0")
        return dict(json.loads(message))


def _high(fd: int) -> int:
    """``fd`` moved above the descriptors the child will use (3 and 4)."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return moved


def _errors(events: list[dict[str, Any]]) -> list[str]:
    out = []
    for ev in events:
        p = ev.get("params", {})
        if ev.get("method") == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append("console: " + " ".join(str(a.get("value", a.get("description", ""))) for a in p["args"]))
        elif ev.get("method") == "Runtime.exceptionThrown":
            out.append("exception: " + str(p["exceptionDetails"].get("text")))
        elif ev.get("method") == "Log.entryAdded" and p["entry"].get("level") == "error":
            out.append(f"log ({p['entry'].get('source')}): {p['entry'].get('text')} {p['entry'].get('url', '')}")
    return out


def open_page(path: Path, timeout_s: float = 60.0, screenshot: Path | None = None) -> PageCheck:
    """Load ``path`` (a local HTML file) in headless Chromium; return its images and console errors (and write
    a PNG of the whole page to ``screenshot``, to look at)."""
    binary = chromium_path()
    if binary is None:
        raise FileNotFoundError("chromium is not installed (Debian: apt-get install chromium)")
    to_child_r, to_child_w = (_high(fd) for fd in os.pipe())
    from_child_r, from_child_w = (_high(fd) for fd in os.pipe())

    def child_fds() -> None:
        os.dup2(to_child_r, 3)
        os.dup2(from_child_w, 4)

    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
             "--disable-extensions", "--remote-debugging-pipe", f"--user-data-dir={profile}", "about:blank"],
            pass_fds=(3, 4), preexec_fn=child_fds, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        os.close(to_child_r)
        os.close(from_child_w)
        pipe = _Pipe(proc, to_child_w, from_child_r)
        try:
            target = pipe.send("Target.createTarget", {"url": "about:blank"}, timeout_s=timeout_s)["targetId"]
            session = pipe.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime", "Log"):
                pipe.send(f"{domain}.enable", session=session)
            pipe.send("Page.navigate", {"url": path.resolve().as_uri()}, session=session)
            pipe.wait_event("Page.loadEventFired", timeout_s)
            result = pipe.send("Runtime.evaluate", {"expression": _IMAGES_JS, "returnByValue": True},
                               session=session)
            title = pipe.send("Runtime.evaluate", {"expression": "document.title", "returnByValue": True},
                              session=session)
            images = json.loads(result["result"]["value"])
            if screenshot is not None:
                shot = pipe.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True},
                                 session=session, timeout_s=timeout_s)
                screenshot.write_bytes(base64.b64decode(shot["data"]))
            return PageCheck(images, _errors(pipe.events), str(title["result"]["value"]))
        finally:
            with contextlib.suppress(RuntimeError, TimeoutError, OSError):
                pipe.send("Browser.close", timeout_s=10)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            os.close(to_child_w)
            os.close(from_child_r)
