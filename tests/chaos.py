#!/usr/bin/env python
"""A chaos run: two DeepSpeed ranks on CPU, interrupted again and again, re-run each time with the
same command, must end exactly where an uninterrupted run ends.

    .venv/bin/python tests/chaos.py                          # 300 steps, 20 interruptions, a random seed
    .venv/bin/python tests/chaos.py --seed 1234 --steps 120  # replay a schedule (the seed is printed)

Each interruption is drawn from the seed: SIGKILL to one rank or to the whole process group,
SIGTERM to the ``deepspeed`` launcher alone or to the group, or a SIGKILL inside a checkpoint save
(after DeepSpeed's files, before the manifest, before ``latest``, before pruning; on one rank or
both), at a random moment after a random step. After each, every process of the run must be gone
within :data:`HANG_SECONDS` (no hang), a SIGTERM must leave a checkpoint of the step the ranks
stopped at together (with both ranks' state), and the next launch must not be refused by the run
lock (the dead run's lock must not block its resume). At the end: every step logged exactly once, every
loss and the exported weights bit-identical to the uninterrupted run's.
``tests/test_chaos.py`` runs a short schedule as part of the suite.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `tests` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.conftest import REPO, free_port  # noqa: E402
from tests.pretrain_runs import (deepspeed_launcher, env, group_ended, losses, pretrain_args,  # noqa: E402
                                 pretrain_command, with_option)

KINDS = ("kill -9 a rank", "kill -9 the group", "SIGTERM the launcher", "SIGTERM the group", "kill -9 in a save")
SAVE_MOMENTS = ("after_engine_save", "before_manifest", "before_latest", "before_prune")
HANG_SECONDS = 90  # DeepSpeed's launcher gives surviving ranks 30 s after a SIGTERM before it kills them
SLEEP_PER_STEP = 0.15  # so that a signal lands mid-run; changes no number


class ChaosFailure(AssertionError):
    """The run hung, was blocked by its own lock, or did not end where the uninterrupted run ends."""


@dataclass
class Chaos:
    """One chaos run's settings and what happened."""

    steps: int
    interruptions: int
    seed: int
    checkpoint_every: int = 5
    events: list[dict] = field(default_factory=list)

    def args(self, inputs: dict[str, Path], out: Path) -> list[str]:
        args = with_option(pretrain_args(inputs, out), "--max-steps", str(self.steps))
        args = with_option(args, "--checkpoint-every", str(self.checkpoint_every))
        return with_option(args, "--num-workers", "1")  # the worker path: stop signals, shutdown on errors


def launch(args: list[str], hooks: dict) -> subprocess.Popen:
    launcher = deepspeed_launcher()
    if launcher is None:
        raise RuntimeError("the deepspeed launcher is not installed")
    command, port = pretrain_command(args, hooks)[1:], free_port()
    process = subprocess.Popen([launcher, "--num_gpus", "2", "--master_port", str(port), *command], cwd=REPO,
                               env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    process.master_port = port  # names DeepSpeed's shared-memory buffers of this launch
    return process


def leftover_shm_buffers(ports: list[int]) -> list[str]:
    """DeepSpeed's CPU all-reduce buffers of these launches still in /dev/shm (each holds 69 MB of
    RAM until unlinked; ``biomed_lm.backend.release_shm_buffer_name`` unlinks them at start-up)."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        return []
    return sorted(p.name for port in ports for p in shm.glob(f"deepspeed_allreduce_buffer_{os.getuid()}_*_{port}_*"))


def straight_run(chaos: Chaos, inputs: dict[str, Path], out: Path) -> Path:
    """The uninterrupted run every chaos run must reproduce."""
    finished = launch(chaos.args(inputs, out), {})
    _, stderr = finished.communicate(timeout=1800)
    if finished.returncode != 0:
        raise ChaosFailure(f"the uninterrupted run failed (exit {finished.returncode}): {stderr[-3000:]}")
    return out


def run_chaos(chaos: Chaos, inputs: dict[str, Path], out: Path, reference: Path, say=print) -> None:
    """Interrupt the run ``chaos.interruptions`` times, then let it finish and compare it with
    ``reference``; raises :class:`ChaosFailure` naming the seed to replay."""
    rng = random.Random(chaos.seed)
    say(f"chaos: seed {chaos.seed} ({chaos.steps} steps, {chaos.interruptions} interruptions); replay with "
        f"tests/chaos.py --seed {chaos.seed} --steps {chaos.steps} --interruptions {chaos.interruptions}")
    args = chaos.args(inputs, out)
    ports: list[int] = []
    for number in range(1, chaos.interruptions + 1):
        start = _checkpointed_step(out)
        if start >= chaos.steps - 1:
            say(f"chaos: the run reached step {start} after {number - 1} interruptions")
            break
        event = _interrupt_once(chaos, rng, args, out, start)
        ports.append(event.pop("port"))
        chaos.events.append(event)
        say(f"chaos: {number:2d}. {event['kind']} after step {event['after_step']} "
            f"({event.get('detail', '')}) -> exit {event['exit']}, resumable from step {_checkpointed_step(out)}")
    final = launch(args, {})
    _, stderr = final.communicate(timeout=1800)
    _check(final.returncode == 0, chaos, f"the final run failed (exit {final.returncode}): {stderr[-3000:]}")
    _compare(chaos, out, reference)
    leaked = leftover_shm_buffers(ports + [final.master_port])
    _check(not leaked, chaos, f"shared memory left behind by the killed runs: {leaked}")


def _interrupt_once(chaos: Chaos, rng: random.Random, args: list[str], out: Path, start: int) -> dict:
    kind = rng.choice(KINDS)
    target = min(chaos.steps - 1, start + rng.randint(1, 2 * chaos.checkpoint_every))
    hooks: dict = {"sleep_per_step": SLEEP_PER_STEP}
    event = {"kind": kind, "after_step": target}
    if kind == "kill -9 in a save":
        save_step = min(chaos.steps, (start // chaos.checkpoint_every + 1) * chaos.checkpoint_every)
        moment, rank = rng.choice(SAVE_MOMENTS), rng.choice([0, 1, None])
        rank = rank if moment == "after_engine_save" else 0  # the later moments are rank 0's work alone
        hooks.update(kill_in_save=[save_step, moment], only_rank=rank)
        event.update(after_step=save_step, detail=f"{moment}, rank {'both' if rank is None else rank}")
    launched = time.time()
    process = launch(args, hooks)
    try:
        if kind != "kill -9 in a save":
            _wait_for_step(out, target, launched, process)
            time.sleep(rng.uniform(0, 2 * SLEEP_PER_STEP))  # anywhere in the next step or its save
            event["detail"] = _deliver(kind, process, rng)
        _, stderr = process.communicate(timeout=HANG_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        raise ChaosFailure(f"chaos seed {chaos.seed}: the run hung after {kind} (step {target})") from None
    _check(group_ended(process.pid, HANG_SECONDS), chaos, f"processes of the run outlived it after {kind}")
    _check("is in use by another run" not in stderr, chaos, f"the run lock blocked a resume: {stderr[-2000:]}")
    if kind.startswith("SIGTERM"):
        _check_stopped_together(chaos, out, target, kind)
    event.update(exit=process.returncode, port=process.master_port)
    return event


def _check_stopped_together(chaos: Chaos, out: Path, target: int, kind: str) -> None:
    """A SIGTERM is a stop, not a crash: the ranks agree on a step at or after the one logged before
    the signal, and ``latest`` names that step's checkpoint, holding both ranks' state."""
    latest = out / "checkpoints" / "latest"
    tag = latest.read_text().strip() if latest.is_file() else ""
    _check(tag.startswith("step-") and int(tag.split("-")[1]) >= target, chaos,
           f"after {kind} at step {target} the newest checkpoint is {tag or 'absent'}")
    states = {p.name for p in (out / "checkpoints" / tag).glob("rng_state_rank*.pt")}
    _check(states == {"rng_state_rank0.pt", "rng_state_rank1.pt"}, chaos,
           f"after {kind} checkpoint {tag} holds the state of {sorted(states)}, not of both ranks")


def _deliver(kind: str, process: subprocess.Popen, rng: random.Random) -> str:
    if kind == "kill -9 a rank":
        ranks = _rank_pids(process.pid)
        if not ranks:  # the run ended on its own before the signal
            return "no rank left"
        victim = rng.choice(ranks)
        os.kill(victim, signal.SIGKILL)
        return f"pid {victim}"
    if kind == "SIGTERM the launcher":
        process.send_signal(signal.SIGTERM)  # the deepspeed command alone: it dies without passing it on
        return f"pid {process.pid}"
    _signal_group(process.pid, signal.SIGKILL if kind.startswith("kill") else signal.SIGTERM)
    return f"group {process.pid}"


def _rank_pids(launcher_pid: int) -> list[int]:
    """The ranks: processes whose parent is DeepSpeed's per-node launcher (their children, the
    DataLoader workers, run the same command line)."""
    import psutil

    try:
        found = psutil.Process(launcher_pid).children(recursive=True)
    except psutil.Error:
        return []
    return sorted(p.pid for p in found if _is_rank(p))


def _is_rank(process) -> bool:
    import psutil

    try:
        return "deepspeed.launcher.launch" in " ".join(process.parent().cmdline())
    except (psutil.Error, AttributeError):
        return False


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _wait_for_step(out: Path, step: int, launched: float, process: subprocess.Popen) -> None:
    """Until this launch (its run_config.json is written after the resume point is chosen and the
    metrics cut back to it) has logged ``step``, or it has ended."""
    config, metrics = out / "run_config.json", out / "metrics.jsonl"
    deadline = time.time() + 600
    while time.time() < deadline and process.poll() is None:
        if config.exists() and config.stat().st_mtime >= launched and _logged_step(metrics) >= step:
            return
        time.sleep(0.02)


def _logged_step(metrics: Path) -> int:
    try:
        lines = metrics.read_text().splitlines()
        return json.loads(lines[-1])["step"] if lines else 0
    except (OSError, ValueError, KeyError):
        return 0


def _checkpointed_step(out: Path) -> int:
    tags = sorted((out / "checkpoints").glob("step-*")) if (out / "checkpoints").is_dir() else []
    return int(tags[-1].name.split("-")[1]) if tags else 0


def _compare(chaos: Chaos, out: Path, reference: Path) -> None:
    logged = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    _check(logged == list(range(1, chaos.steps + 1)), chaos, f"steps lost or repeated: {logged}")
    mine, theirs = losses(out), losses(reference)
    differing = [step for step in theirs if mine.get(step) != theirs[step]]
    _check(not differing, chaos, f"losses differ from the uninterrupted run at steps {differing[:10]}")
    _check(_weights(out / "model") == _weights(reference / "model"), chaos,
           "the exported weights differ from the uninterrupted run's")


def _weights(model_dir: Path) -> dict[str, bytes]:
    from safetensors.torch import load_file

    return {name: tensor.numpy().tobytes() for name, tensor in load_file(model_dir / "model.safetensors").items()}


def _check(condition: bool, chaos: Chaos, problem: str) -> None:
    if not condition:
        raise ChaosFailure(f"chaos seed {chaos.seed}: {problem}; events: {chaos.events}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--interruptions", type=int, default=20)
    parser.add_argument("--seed", type=int, default=None, help="the schedule's seed (default: drawn and printed)")
    parser.add_argument("--work-dir", type=Path, default=None, help="where the runs go (default: a temporary folder)")
    options = parser.parse_args(argv)
    import tempfile

    from tests.pretrain_runs import make_pretraining_inputs

    seed = options.seed if options.seed is not None else random.SystemRandom().randrange(2**31)
    work = options.work_dir or Path(tempfile.mkdtemp(prefix="chaos-"))
    chaos = Chaos(options.steps, options.interruptions, seed)
    inputs = make_pretraining_inputs(work / "inputs")
    reference = straight_run(chaos, inputs, work / "straight")
    run_chaos(chaos, inputs, work / "chaos", reference)
    print(f"chaos: passed ({len(chaos.events)} interruptions; runs in {work})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
