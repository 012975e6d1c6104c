"""The extract and train stages on N GPUs under torchrun against 1 GPU: equality and scaling.

    python -m tests.perf.bench_multi_gpu [--world 2] [--shape llama-3.1-8b|tiny]
        [--device cuda|cpu] [--samples 240] [--lengths 1024 2048] [--train-steps 40]
        [--batch 4] [--work DIR] [--out DIR]

Runs the real stages (`python -m stages.extract`, `python -m stages.train`, and the same under
`torchrun --standalone --nproc-per-node N`) on a randomly initialised target of the given shape,
saved as a local Hugging Face checkpoint, and on random merged samples:

1. extract by 1 process and by N: are the shards bitwise equal, and the stage's own tokens/s
   (tokens over the wall time of its shard loop, the slowest rank's) of each;
2. train by 1 process and by N at the same global batch: the loss curves' largest relative gap;
3. train by N at N x the global batch, so each GPU does the work of the 1-GPU run: tokens/s scaling;
4. the N-process checkpoint from mid-run resumed by 1 process: its curve against the N-process run.

Prints a table and writes results.json (and each run's log) to --out.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
import yaml
from safetensors import safe_open
from safetensors.torch import save_file

from stages.drafter.vocab import build_draft_vocab
from stages.runtime.files import CHECKSUM_SUFFIX, checksum_problem
from tests.perf.bench_extract import SHAPES, build_target, print_table
from tests.perf.bench_train import DRAFT_VOCAB

ROOT = Path(__file__).resolve().parents[2]


def write_target(shape: str, device: torch.device, out: Path) -> None:
    """A random target whose next-token distributions are peaked (its LM head scaled up), so the
    drafter has something to learn and the loss curves compare learning, not noise."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    model = build_target(shape, device, dtype)
    with torch.no_grad():
        model.lm_head.weight.mul_(10)
    model.save_pretrained(out)


def write_merged(
    out: Path, samples: int, lengths: tuple[int, int], vocab: int, eval_samples: int
) -> tuple[torch.Tensor, int]:
    """Random samples in the merge stage's schema; (supervised-token counts, all tokens).

    Tokens are drawn from a few thousand ids, so the target's outputs repeat enough to be learnt.
    """
    g = torch.Generator().manual_seed(0)
    alphabet = torch.randperm(vocab, generator=g)[: min(vocab, 4096)]
    counts, total = torch.zeros(vocab, dtype=torch.int64), 0
    out.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", samples), ("eval", eval_samples)):
        rows = []
        for i in range(n):
            length = int(torch.randint(lengths[0], lengths[1] + 1, (), generator=g))
            ids = alphabet[torch.randint(len(alphabet), (length,), generator=g)]
            # two supervised turns, as regenerate: all_turns gives
            first, second = sorted(torch.randint(length // 8, length, (2,), generator=g).tolist())
            spans = [[first, (first + second) // 2], [second, length]]
            for start, end in spans:
                counts += torch.bincount(ids[start:end], minlength=vocab)
            total += length
            rows.append(
                dict(
                    sample_id=f"{split}/{i:05d}",
                    dataset="random",
                    input_ids=ids.tolist(),
                    loss_spans=spans,
                    length=length,
                    truncated=False,
                    split=split,
                )
            )
        pq.write_table(pa.Table.from_pylist(rows), out / f"{split}.parquet")
    return counts, total


def write_params(path: Path, args, target: Path, total_tokens: int) -> None:
    params = {
        "target": {"path": str(target), "device": args.device},
        "extract": {
            "layers": None,
            "batch_tokens": args.batch_tokens,
            "dtype": "bfloat16",
            # about 8 shards per rank, so every rank gets the same share of the work
            "shard_tokens": max(1, total_tokens // (8 * args.world)),
        },
        "train": {
            "ttt_steps": args.ttt_steps,
            "max_steps": args.train_steps,
            "batch_size": args.batch,
            "max_length": args.lengths[1],
            "lr": 1e-3,
            "eval_every": args.train_steps,
            "eval_max_samples": 4 * args.world,
            "checkpoint_every": args.train_steps // 2,
            "device": args.device,
        },
    }
    path.write_text(yaml.safe_dump(params))


def run_stage(module: str, args: list, world: int, log: Path, on_wait=None) -> float:
    """Run a stage (by torchrun when world > 1) from the repository root; its wall seconds."""
    cmd = (
        [sys.executable, "-m", module]
        if world == 1
        else [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(world),
            "-m",
            module,
        ]
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    start = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [*cmd, *map(str, args)], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )
        while proc.poll() is None:
            if on_wait:
                on_wait()
            time.sleep(0.05)
    if proc.returncode:
        sys.exit(
            f"{module} x{world} failed (exit {proc.returncode}); see {log}:\n"
            + log.read_text()[-3000:]
        )
    return time.monotonic() - start


def compare_shards(a: Path, b: Path) -> dict:
    names = sorted(p.name for p in a.glob("shard-*.safetensors"))
    if names != sorted(p.name for p in b.glob("shard-*.safetensors")):
        return {"shards": len(names), "same_files": False}
    equal, max_abs = 0, 0.0
    for name in names:
        with safe_open(str(a / name), "pt") as fa, safe_open(str(b / name), "pt") as fb:
            same = True
            for key in fa.keys():
                x, y = fa.get_tensor(key), fb.get_tensor(key)
                if not torch.equal(x, y):
                    same = False
                    max_abs = max(max_abs, float((x.float() - y.float()).abs().max()))
            equal += same
    return {
        "shards": len(names),
        "same_files": True,
        "bitwise_equal": equal,
        "max_abs_diff": max_abs,
    }


def losses(report_dir: Path) -> list[float]:
    with open(report_dir / "plots" / "train_loss.csv") as f:
        return [float(row["loss"]) for row in csv.DictReader(f)]


def largest_gap(a: list[float], b: list[float]) -> float:
    if len(a) != len(b) or not a:
        raise SystemExit(f"loss curves of different lengths: {len(a)} vs {len(b)}")
    return max(abs(x - y) / abs(x) for x, y in zip(a, b))


class Snapshot:
    """Hard-links the first checkpoint a run writes and its checksum, renamed beside it right
    after it (os.replace leaves the links on the old files)."""

    def __init__(self, source: Path, dest: Path):
        self.source, self.dest, self.taken = source, dest, False

    def __call__(self) -> None:
        names = ("last.pt", "last.pt" + CHECKSUM_SUFFIX)
        if self.taken or not all((self.source / n).exists() for n in names):
            return
        self.dest.mkdir(parents=True, exist_ok=True)
        for name in names:
            (self.dest / name).unlink(missing_ok=True)
            os.link(self.source / name, self.dest / name)
        if checksum_problem(self.dest / "last.pt") is None:  # else caught between the two
            shutil.copyfile(self.source / "run.json", self.dest / "run.json")
            self.taken = True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2, help="processes (GPUs) of the N runs")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.1-8b")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--samples", type=int, default=240, help="train samples")
    parser.add_argument(
        "--lengths",
        type=int,
        nargs=2,
        default=[1024, 2048],
        help="shortest and longest sample, tokens",
    )
    parser.add_argument("--batch-tokens", type=int, default=16384, help="extract.batch_tokens")
    parser.add_argument("--train-steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=4, help="global batch of the 1-GPU run")
    parser.add_argument("--ttt-steps", type=int, default=7)
    parser.add_argument(
        "--stages",
        nargs="+",
        choices=["extract", "train"],
        default=["extract", "train"],
        help="which comparisons to run",
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench-multi-gpu"))
    parser.add_argument("--out", type=Path, default=Path("reports/perf-multi-gpu"))
    args = parser.parse_args(argv)
    if args.batch % args.world or args.train_steps < 2:
        parser.error("--batch must be a multiple of --world, and --train-steps at least 2")
    work, out, n = args.work, args.out, args.world
    shutil.rmtree(work, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    print(f"[multi-gpu] building a random {args.shape} target in {work / 'target'}", flush=True)
    write_target(args.shape, device, work / "target")
    vocab = SHAPES[args.shape]["vocab_size"]
    counts, total = write_merged(
        work / "merged", args.samples, tuple(args.lengths), vocab, eval_samples=4 * n
    )
    params = work / "params.yaml"
    write_params(params, args, work / "target", total)
    d2t, t2d, _ = build_draft_vocab(counts, DRAFT_VOCAB[args.shape])
    (work / "vocab").mkdir()
    save_file({"d2t": d2t, "t2d": t2d}, str(work / "vocab" / "d2t_t2d.safetensors"))

    results: dict = {
        "world": n,
        "shape": args.shape,
        "device": args.device,
        "gpu": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "tokens": total,
        "torch": torch.__version__,
    }

    def save() -> None:
        (out / "results.json").write_text(json.dumps(results, indent=2))

    for world in (1, n):
        seconds = run_stage(
            "stages.extract",
            [
                "--params",
                params,
                "--merged",
                work / "merged",
                "--out",
                work / f"hidden-{world}",
                "--report",
                work / f"extract-{world}.json",
            ],
            world,
            out / f"extract-{world}.log",
        )
        report = json.loads((work / f"extract-{world}.json").read_text())
        results[f"extract_{world}"] = {
            "tokens_per_s": report["tokens_per_s"],
            "wall_s": round(seconds, 1),
        }
        print(
            f"[multi-gpu] extract x{world}: {report['tokens_per_s']:,.0f} tok/s "
            f"({seconds:.0f} s with start-up)",
            flush=True,
        )
        save()
    results["extract_equality"] = compare_shards(work / "hidden-1", work / f"hidden-{n}")
    save()
    if "train" in args.stages:
        train_runs(args, work, params, results, save)
    print_report(results, n)


def train_runs(args, work: Path, params: Path, results: dict, save) -> None:
    """Train by 1 process, by N at the same and at N x the global batch, and resumed by 1."""
    n, out = args.world, args.out

    def train(
        run: str, world: int, batch: int, checkpoints: Path | None = None, on_wait=None
    ) -> dict:
        checkpoints = checkpoints or work / f"checkpoints-{run}"
        run_params = work / f"params-{run}.yaml"
        p = yaml.safe_load(params.read_text())
        p["train"]["batch_size"] = batch
        run_params.write_text(yaml.safe_dump(p))
        seconds = run_stage(
            "stages.train",
            [
                "--params",
                run_params,
                "--hidden-dir",
                work / "hidden-1",
                "--vocab-file",
                work / "vocab" / "d2t_t2d.safetensors",
                "--checkpoint-dir",
                checkpoints,
                "--out-dir",
                work / f"drafter-{run}",
                "--report",
                work / f"reports-{run}" / "train.json",
                "--plots",
                work / f"reports-{run}" / "plots",
            ],
            world,
            out / f"train-{run}.log",
            on_wait,
        )
        report = json.loads((work / f"reports-{run}" / "train.json").read_text())
        row = {
            "world": world,
            "global_batch": batch,
            "tokens_per_s": report["tokens_per_s"],
            "final_loss": report["final_loss"],
            "wall_s": round(seconds, 1),
        }
        results[f"train_{run}"] = row
        print(f"[multi-gpu] train {run}: {row}", flush=True)
        save()
        return row

    snapshot = Snapshot(work / f"checkpoints-{n}", work / "checkpoints-resumed")
    train("1", 1, args.batch)
    train(str(n), n, args.batch, on_wait=snapshot)
    train(f"{n}-scaled", n, args.batch * n)
    results["train_loss_gap"] = largest_gap(
        losses(work / "reports-1"), losses(work / f"reports-{n}")
    )
    if snapshot.taken:
        results["resumed_at_step"] = torch.load(
            snapshot.dest / "last.pt", map_location="cpu", weights_only=True
        )["state"]["step"]
        train("resumed", 1, args.batch, checkpoints=work / "checkpoints-resumed")
        resumed = losses(work / "reports-resumed")
        results["resume_loss_gap"] = largest_gap(resumed, losses(work / f"reports-{n}"))
    save()


def print_report(r: dict, n: int) -> None:
    e1, en = r["extract_1"]["tokens_per_s"], r[f"extract_{n}"]["tokens_per_s"]
    eq = r["extract_equality"]
    print(f"\n{r['world']} x {r['gpu']} against 1, {r['shape']}, {r['tokens']:,} tokens")
    rows = [
        ["extract", "1", f"{e1:,.0f}", "1.00", "-"],
        [
            "extract",
            str(n),
            f"{en:,.0f}",
            f"{en / e1:.2f}",
            f"{eq.get('bitwise_equal', 0)}/{eq['shards']} shards bitwise equal",
        ],
    ]
    if "train_1" not in r:
        print_table(["run", "processes", "tokens/s", "x 1 process", "check"], rows)
        return
    t1, tn = r["train_1"]["tokens_per_s"], r[f"train_{n}-scaled"]["tokens_per_s"]
    print_table(
        ["run", "processes", "tokens/s", "x 1 process", "check"],
        rows
        + [
            ["train", "1", f"{t1:,.0f}", "1.00", "-"],
            [
                "train, same global batch",
                str(n),
                f"{r[f'train_{n}']['tokens_per_s']:,.0f}",
                f"{r[f'train_{n}']['tokens_per_s'] / t1:.2f}",
                f"loss within {r['train_loss_gap']:.2e} rel. of 1 process",
            ],
            ["train, same batch per GPU", str(n), f"{tn:,.0f}", f"{tn / t1:.2f}", "-"],
            [
                "train, resumed by 1",
                "1",
                f"{r['train_resumed']['tokens_per_s']:,.0f}",
                "-",
                f"from step {r['resumed_at_step']}: loss within {r['resume_loss_gap']:.2e} rel.",
            ]
            if "train_resumed" in r
            else ["train, resumed by 1", "1", "-", "-", "not run"],
        ],
    )


if __name__ == "__main__":
    main()
