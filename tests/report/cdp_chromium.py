"""A tiny headless-Chromium driver over the DevTools protocol on a pipe (standard library only).

``--remote-debugging-pipe`` makes Chromium read CDP commands from fd 3 and write replies and
events to fd 4, each message a JSON text ended by a NUL byte. We open one page, record console
messages, exceptions, log entries, network requests and JS dialogs, then evaluate expressions.
"""
from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-default-apps", "--disable-extensions", "--mute-audio", "--no-default-browser-check",
    "--remote-debugging-pipe",
)


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class PageLog:
    """What the page did while loading."""

    console: list[dict[str, Any]] = field(default_factory=list)  # Runtime.consoleAPICalled params
    exceptions: list[dict[str, Any]] = field(default_factory=list)  # Runtime.exceptionThrown params
    log_entries: list[dict[str, Any]] = field(default_factory=list)  # Log.entryAdded entries
    requests: list[str] = field(default_factory=list)  # URLs from Network.requestWillBeSent
    dialogs: list[dict[str, Any]] = field(default_factory=list)  # Page.javascriptDialogOpening params

    def errors(self) -> list[str]:
        # plotly.js logs its warnings ("WARN: Invalid color specifier ...") with console.trace,
        # so a trace counts as a warning here; the page itself never calls console.trace.
        out = [f"console.{c['type']}: " + " ".join(str(a.get("value", a.get("description", "")))
                                                   for a in c.get("args", []))
               for c in self.console if c.get("type") in ("error", "assert", "warning", "trace")]
        out += [f"exception: {e.get('exceptionDetails', {})}" for e in self.exceptions]
        out += [f"log {e.get('level')}: {e.get('text')} {e.get('url', '')}" for e in self.log_entries
                if e.get("level") in ("error", "warning")]
        return out


class Chromium:
    """One headless browser with one page; use as a context manager."""

    def __init__(self, binary: str, user_data_dir: Path, timeout_s: float = 60.0):
        self.timeout_s = timeout_s
        self.log = PageLog()
        self._next_id = 0
        self._buffer = b""
        self._session: str | None = None
        cmd_read, self._cmd_write = os.pipe()  # we write commands, Chromium reads fd 3
        self._resp_read, resp_write = os.pipe()  # Chromium writes fd 4, we read
        # Move the child's ends above fd 10 so that dup2 onto 3 and 4 cannot clobber one another.
        child_fds = (fcntl.fcntl(cmd_read, fcntl.F_DUPFD, 10), fcntl.fcntl(resp_write, fcntl.F_DUPFD, 10))
        os.close(cmd_read)
        os.close(resp_write)

        def _wire_fds() -> None:  # in the child, before exec: put the pipe ends on fds 3 and 4
            os.dup2(child_fds[0], 3)
            os.dup2(child_fds[1], 4)

        self.proc = subprocess.Popen(
            [binary, *CHROMIUM_FLAGS, f"--user-data-dir={user_data_dir}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=_wire_fds, close_fds=False,
        )
        for fd in child_fds:
            os.close(fd)

    def __enter__(self) -> "Chromium":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                try:
                    self._send("Browser.close", session=False)
                except OSError:
                    pass
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=5)
        finally:
            for fd in (self._cmd_write, self._resp_read):
                try:
                    os.close(fd)
                except OSError:
                    pass

    # -- protocol -----------------------------------------------------------------------------
    def _send(self, method: str, params: dict[str, Any] | None = None, session: bool = True) -> int:
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session and self._session:
            msg["sessionId"] = self._session
        os.write(self._cmd_write, json.dumps(msg).encode() + b"\0")
        return self._next_id

    def _read_message(self, deadline: float) -> dict[str, Any] | None:
        while b"\0" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([self._resp_read], [], [], min(remaining, 0.5))
            if not ready:
                continue
            chunk = os.read(self._resp_read, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe (crashed or exited)")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def _record(self, msg: dict[str, Any]) -> None:
        method, params = msg.get("method"), msg.get("params", {})
        if method == "Runtime.consoleAPICalled":
            self.log.console.append(params)
        elif method == "Runtime.exceptionThrown":
            self.log.exceptions.append(params)
        elif method == "Log.entryAdded":
            self.log.log_entries.append(params.get("entry", {}))
        elif method == "Network.requestWillBeSent":
            self.log.requests.append(params.get("request", {}).get("url", ""))
        elif method == "Page.javascriptDialogOpening":
            self.log.dialogs.append(params)
            self._send("Page.handleJavaScriptDialog", {"accept": True})

    def call(self, method: str, params: dict[str, Any] | None = None, session: bool = True) -> dict[str, Any]:
        """Send a command and wait for its reply, recording events that arrive meanwhile."""
        msg_id = self._send(method, params, session)
        deadline = time.monotonic() + self.timeout_s
        while True:
            msg = self._read_message(deadline)
            if msg is None:
                raise TimeoutError(f"no reply to {method} within {self.timeout_s} s")
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self._record(msg)

    def pump(self, seconds: float) -> None:
        """Record events for a while."""
        deadline = time.monotonic() + seconds
        while (msg := self._read_message(deadline)) is not None:
            self._record(msg)

    # -- page -----------------------------------------------------------------------------------
    def open(self, url: str, width_px: int = 1280, height_px: int = 900) -> None:
        """Attach to a fresh page with logging on, size its viewport, then navigate to url."""
        target = self.call("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self._session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True},
                                  session=False)["sessionId"]
        for domain in ("Runtime", "Log", "Network", "Page"):
            self.call(f"{domain}.enable")
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width_px, "height": height_px, "deviceScaleFactor": 1, "mobile": False})
        self.call("Page.navigate", {"url": url})

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout_s: float) -> Any:
        """Poll a JS expression until it is truthy (returns its value) or time runs out (None)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            self.pump(0.2)
        return None
