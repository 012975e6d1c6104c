"""Launching SGLang from params: the exact command line, the health wait, a failed start shown
with the server's log, and the server stopped when the run ends, on Ctrl-C or on SIGTERM."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from stages.params.server import SGLangServerArgs
from stages.serving.launch import (
    ServerError,
    SGLangServer,
    launch_command,
    server_url,
    wait_healthy,
)
from tests.conftest import ROOT
from tests.engines.conftest import free_port
from tests.procstat import running


def test_launch_command_from_params():
    args = SGLangServerArgs(
        host="0.0.0.0",
        port=31000,
        tp_size=8,
        dp_size=2,
        mem_fraction_static=0.85,
        context_length=65536,
        max_running_requests=512,
        kv_cache_dtype="fp8_e4m3",
        enable_hierarchical_cache=True,
        hicache_size=200,
        skip_tokenizer_init=True,
    )
    command = launch_command(
        "/models/kimi-k2.5",
        dataclasses.asdict(args),
        ["--chunked-prefill-size", "8192"],
        trust_remote_code=True,
        python="python",
    )
    assert command == [
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/models/kimi-k2.5",
        "--host",
        "0.0.0.0",
        "--port",
        "31000",
        "--tp-size",
        "8",
        "--dp-size",
        "2",
        "--mem-fraction-static",
        "0.85",
        "--context-length",
        "65536",
        "--max-running-requests",
        "512",
        "--kv-cache-dtype",
        "fp8_e4m3",
        "--enable-hierarchical-cache",
        "--hicache-size",
        "200",
        "--enable-metrics",
        "--skip-tokenizer-init",
        "--trust-remote-code",
        "--chunked-prefill-size",
        "8192",
    ]
    assert server_url(args.host, args.port) == "http://127.0.0.1:31000"
    defaults = launch_command("m", dataclasses.asdict(SGLangServerArgs()), python="python")
    assert defaults == [
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "m",
        "--host",
        "127.0.0.1",
        "--port",
        "30000",
        "--tp-size",
        "1",
        "--dp-size",
        "1",
        "--kv-cache-dtype",
        "auto",
        "--enable-metrics",
    ]


@pytest.mark.integration
def test_health_wait_rides_out_503_until_ready(serve):
    server = serve()
    server.ready.clear()
    threading.Timer(0.3, server.ready.set).start()
    assert wait_healthy(server.url, timeout_s=10, poll_s=0.05) >= 0.3


@pytest.mark.integration
def test_health_wait_gives_up_at_the_timeout(serve):
    server = serve()
    server.ready.clear()
    with pytest.raises(ServerError, match=r"/health did not answer 200 within 0 s"):
        wait_healthy(server.url, timeout_s=0.2, poll_s=0.05)


@pytest.mark.integration
def test_a_server_that_dies_is_reported_with_its_log_and_nccl_env(tmp_path):
    crash = (
        "import os; print('NVLS', os.environ['NCCL_NVLS_ENABLE'], "
        "os.environ['TORCH_SYMM_MEM_DISABLE_MULTICAST'], os.environ['NVSHMEM_DISABLE_NVLS']);"
        "print('torch.OutOfMemoryError: CUDA out of memory'); raise SystemExit(3)"
    )
    server = SGLangServer(
        [sys.executable, "-c", crash],
        f"http://127.0.0.1:{free_port()}",
        tmp_path / "logs" / "server.log",
    ).start()
    with pytest.raises(ServerError) as err:
        server.wait_healthy(timeout_s=30, poll_s=0.05)
    message = str(err.value)
    assert "exited with code 3 before it was healthy" in message
    assert "NVLS 0 1 1" in message and "CUDA out of memory" in message
    assert str(tmp_path / "logs" / "server.log") in message


HEALTHY_SERVER = """
import http.server, sys
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.integration
@pytest.mark.slow
def test_ctrl_c_or_sigterm_of_the_run_stops_the_server(sig):
    port = free_port()
    run = f"""
import signal, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, not a background job
from stages.serving.launch import start_server
server = start_server({[sys.executable, "-c", HEALTHY_SERVER, str(port)]!r},
                      "http://127.0.0.1:{port}", 30, poll_s=0.05)
print(server.process.pid, flush=True)
time.sleep(60)
"""
    parent = subprocess.Popen(
        [sys.executable, "-c", run],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    child = int(parent.stdout.readline() or 0)
    try:
        assert child and running(child), parent.stderr.read()
        parent.send_signal(sig)
        parent.wait(20)
        deadline = time.monotonic() + 10
        while running(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not running(child), "the server outlived the run"
    finally:
        parent.kill()
        if child and running(child):
            os.kill(child, signal.SIGKILL)
