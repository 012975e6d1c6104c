"""Launch an SGLang server for a generation run and make sure it goes away with the run.

The command line comes from params (flags named as launch_server names them), the server's output
goes to a log file, the launch waits for /health and, when the server dies or never gets healthy,
fails with the tail of that log. The server runs in its own process group, stopped at exit, on
Ctrl-C and on SIGTERM.
"""

from __future__ import annotations

import atexit
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

import httpx

from ..engines import EngineError
from ..runtime.parallel import NCCL_ENV

# "EAGLE" loads an EAGLE-3 drafter too, and silently accepts almost nothing
EAGLE3: Final = "EAGLE3"
DFLASH: Final = "DFLASH"


class ServerError(EngineError):
    """The server did not start or did not get healthy; the message holds its log's tail."""


def launch_command(
    model_path: str,
    server_args: dict,
    extra_args: Sequence[str] = (),
    *,
    trust_remote_code: bool = False,
    module: str = "sglang.launch_server",
    python: str = sys.executable,
) -> list[str]:
    """`python -m sglang.launch_server --model-path M` and one flag per set server argument:
    `tp_size: 8` gives `--tp-size 8`, `true` a bare flag, `false` and null nothing."""
    command = [python, "-m", module, "--model-path", str(model_path)]
    for name, value in server_args.items():
        if value is None or value is False:
            continue
        flag = "--" + name.replace("_", "-")
        command += [flag] if value is True else [flag, str(value)]
    if trust_remote_code:
        command.append("--trust-remote-code")
    return command + list(extra_args)


def server_url(host: str, port: int) -> str:
    """Where a server bound to host:port is reached from this machine."""
    reachable = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return f"http://{reachable}:{port}"


def is_healthy(url: str, timeout_s: float = 5.0) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=timeout_s, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def wait_healthy(
    url: str, timeout_s: float, poll_s: float = 1.0, failed: Callable[[], str | None] = lambda: None
) -> float:
    """Poll /health until it answers 200 (SGLang answers 503 while loading); return the seconds
    waited. `failed` says why waiting is pointless (the process exited), or None."""
    start = time.monotonic()
    while True:
        if is_healthy(url):
            return time.monotonic() - start
        reason = failed()
        if reason:
            raise ServerError(reason)
        if time.monotonic() - start > timeout_s:
            raise ServerError(f"{url}/health did not answer 200 within {timeout_s:.0f} s")
        time.sleep(poll_s)


class SGLangServer:
    """One server process: start, wait until healthy, stop (the whole process group)."""

    def __init__(self, command: list[str], url: str, log_path: str | Path | None = None):
        self.command, self.url = command, url
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix="sglang-", suffix=".log")
            os.close(fd)
        self.log_path = Path(log_path)
        self.process: subprocess.Popen | None = None

    def start(self) -> SGLangServer:
        if is_healthy(self.url):
            raise ServerError(
                f"{self.url} already answers /health (a server left from an earlier "
                f"run?): stop it, or attach to it instead of launching one"
            )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        print(f"[sglang] {shlex.join(self.command)}", file=sys.stderr, flush=True)
        print(f"[sglang] log: {self.log_path}", file=sys.stderr, flush=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **NCCL_ENV},
                start_new_session=True,
            )
        return self

    def wait_healthy(self, timeout_s: float, poll_s: float = 1.0) -> float:
        try:
            return wait_healthy(self.url, timeout_s, poll_s, failed=self._exited)
        except ServerError as err:
            self.stop()
            raise ServerError(
                f"{err}; command: {shlex.join(self.command)}\n"
                f"last lines of {self.log_path}:\n{self.log_tail()}"
            ) from None

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM to the process group, SIGKILL after `grace_s`: SGLang's scheduler and
        detokenizer processes go with it."""
        if self.process is None or self.process.poll() is not None:
            return
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(wait_s)
                return
            except subprocess.TimeoutExpired:
                continue

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return "(no log)"
        with open(self.log_path, errors="replace") as f:
            return "".join(deque(f, maxlen=lines)).rstrip() or "(empty log)"

    def _exited(self) -> str | None:
        code = self.process.poll() if self.process else None
        return None if code is None else f"the server exited with code {code} before it was healthy"

    def __enter__(self) -> SGLangServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def start_server(
    command: list[str],
    url: str,
    health_timeout_s: float = 1800.0,
    log_path: str | Path | None = None,
    poll_s: float = 1.0,
) -> SGLangServer:
    """Start a server that lives as long as this process: stopped at exit, on Ctrl-C (which
    ends the process through KeyboardInterrupt) and on SIGTERM; return it once healthy."""
    server = SGLangServer(command, url, log_path).start()
    atexit.register(server.stop)
    _exit_on_sigterm()
    waited = server.wait_healthy(health_timeout_s, poll_s)
    print(f"[sglang] {url} healthy after {waited:.0f} s", file=sys.stderr, flush=True)
    return server


def _exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit, so atexit handlers (stopping servers) run."""
    if (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    ):
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


@dataclass(frozen=True)
class Speculation:
    """A drafter in front of the target as SGLang runs it: the launch flags, and the settings
    /server_info then reports. `tokens_per_step`: tokens the target verifies per step (an EAGLE3
    chain of n drafts: n + 1; DFLASH: its block size), the width two drafters compare at."""

    algorithm: Literal["EAGLE3", "DFLASH"]
    drafter_dir: str
    tokens_per_step: int

    @classmethod
    def eagle3(cls, drafter_dir: str | Path, num_steps: int) -> Speculation:
        """A chain (topk 1) of `num_steps` drafts, verified with the target's own next token."""
        return cls(EAGLE3, str(drafter_dir), num_steps + 1)

    @classmethod
    def dflash(cls, drafter_dir: str | Path, block_size: int) -> Speculation:
        """Blocks of `block_size` (the last accepted token, then block_size - 1 drafts)."""
        return cls(DFLASH, str(drafter_dir), block_size)

    @property
    def drafts(self) -> int:
        """Draft positions per verify step."""
        return self.tokens_per_step - 1

    def args(self) -> list[str]:
        """The launch_server flags. DFLASH takes no chain depth nor topk (it forces both to 1)
        and reads --speculative-num-draft-tokens as its block size (absent: the drafter's
        config.json's); its draft attention falls back to flashinfer (triton on ROCm) from a
        backend it does not run, with a warning, so no attention flag is needed."""
        chain = ["--speculative-num-steps", str(self.drafts), "--speculative-eagle-topk", "1"]
        return [
            "--speculative-algorithm",
            self.algorithm,
            "--speculative-draft-model-path",
            self.drafter_dir,
            *(chain if self.algorithm == EAGLE3 else []),
            "--speculative-num-draft-tokens",
            str(self.tokens_per_step),
        ]

    def settings(self) -> dict[str, object]:
        """The speculative_* fields of /server_info a server launched with args() reports."""
        return {
            "speculative_algorithm": self.algorithm,
            "speculative_num_steps": self.drafts if self.algorithm == EAGLE3 else 1,
            "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": self.tokens_per_step,
        }

    def launch_line(self, model_path: str) -> str:
        """The SGLang launch the drafter is meant for, as one shell line."""
        return shlex.join(launch_command(model_path, {}, self.args(), python="python"))
