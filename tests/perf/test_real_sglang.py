"""tests/perf/real_sglang.py keeps working where no GPU or SGLang is: every params file it writes
passes the project's params check, and its comparisons tell a match from a mismatch."""

from __future__ import annotations

import json
import shlex
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stages.params.schema import load_params
from stages.params.sections import check_all
from stages.serving.launch import Speculation
from tests.perf import real_sglang


@pytest.mark.parametrize("name", sorted(real_sglang.VARIANTS))
def test_every_params_file_it_writes_passes_the_check(name, tmp_path):
    path = real_sglang.params(tmp_path, name, real_sglang.VARIANTS[name])
    check_all(path)
    written = load_params(path)
    assert written["target"]["device"] == "cuda" and written["extract"]["sglang"]["tp_size"] == 1


def launch_line(model: str, drafter_dir: str, num_steps: int) -> str:
    return Speculation.eagle3(drafter_dir, num_steps).launch_line(model)


def test_the_launch_line_check_tells_a_match_from_a_mismatch():
    card = f"Serve it with\n\n    {launch_line('data/demo/target', 'models/drafter', 3)}\n"
    ran = launch_line("data/demo/target", "models/drafter", 3).replace(
        "--model-path", "--host 127.0.0.1 --port 30101 --model-path"
    )
    assert real_sglang.launch_line_differences(card, ran) == (6, {})
    other = ran.replace("--speculative-num-steps 3", "--speculative-num-steps 5")
    count, differ = real_sglang.launch_line_differences(card, other)
    assert differ == {"--speculative-num-steps": ("3", "5")}
    assert count == len(real_sglang.flags(shlex.split(launch_line("t", "d", 3))))


def test_raw_ids_read_the_parts_not_their_checksums(tmp_path):
    rows = pa.table({"sample_id": ["a", "b"], "output_ids": [[1, 2], [3]]})
    pq.write_table(rows, tmp_path / "part-00000.parquet")
    (tmp_path / "part-00000.parquet.sha256.json").write_text(json.dumps({"sha256": "0"}))
    assert real_sglang.raw_ids(tmp_path) == {"a": [1, 2], "b": [3]}


def test_greedy_tau_leaves_the_prefill_token_out_of_the_served_figure():
    served = {
        "tau_greedy": 3.7,
        "temperatures": {"0.0": {"tau": 3.7, "tau_excluding_prefill": 2.7}},
    }
    in_process = {"tau_greedy": 2.6, "temperatures": {"0.0": {"tau": 2.6}}}
    assert real_sglang.greedy_tau(served) == 2.7
    assert real_sglang.greedy_tau(in_process) == 2.6


def test_a_failed_command_names_the_ranks_error_before_the_launchers_traceback(tmp_path):
    """Under torchrun the launcher's traceback ends the log; the rank's own error is what a
    reader needs, so it comes first in the failure."""
    script = tmp_path / "fail.py"
    script.write_text(
        "import sys\n"
        "print('[rank0]: ImportError: cannot import name Live')\n"
        "for i in range(40):\n"
        "    print(f'  File launcher.py, line {i}')\n"
        "sys.exit(1)\n"
    )
    with pytest.raises(RuntimeError) as failed:
        real_sglang.run_logged(tmp_path / "x.log", [sys.executable, str(script)], tmp_path)
    message = str(failed.value)
    assert message.index("ImportError: cannot import name Live") < message.index("line 39")
    assert "line 10" not in message, "the tail is short"
