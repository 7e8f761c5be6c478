"""Run launch/pretrain.py with test hooks: ``python tests/pretrain_hooks.py --hooks JSON <pretrain args>``.

The reliability tests use it to make faults happen at a chosen moment, in one process or as the
script the deepspeed launcher starts on every rank. Hooks (all optional, JSON keys):

- ``sleep_per_step``: seconds to sleep after each step (so a signal lands mid-run; numbers unchanged);
- ``kill_at_step``: SIGKILL this process right after that optimizer step (before its checkpoint);
- ``kill_in_save``: ``[step, moment]``: SIGKILL inside the save of that step, at ``after_engine_save``
  (DeepSpeed's files written, no RNG file yet), ``before_manifest`` (all files and the export
  written), ``before_latest`` (renamed into place, ``latest`` not yet updated) or ``before_prune``;
- ``loss_factor_at_steps``: ``{factor, steps, micro_per_step}``: multiply the loss of those steps
  (1-based) by ``factor`` (``NaN`` for a non-finite loss);
- ``lr_factor_from_step``: ``[step, factor]``: from that optimizer step (1-based) on, the learning
  rate is ``factor`` times the schedule's (an unstable run, for the divergence tests);
- ``fail_save``: ``[step, how]``: make the save of that step fail as a cluster makes it fail:
  ``file_size_limit`` (the file-size limit, ``ulimit -f``, set below the model-state file's size
  just before the save) or ``checkpoints_replaced_by_a_file`` (the folder moved to
  ``checkpoints.moved``, a plain file in its place);
- ``host_syncs``: a JSON file: record every operation that makes the host wait for the device's
  data inside each optimizer step — its micro-batches' forward and backward, the verdict, the
  update (reading a value: ``.item()``, ``bool()``, ``.tolist()``, ``.cpu()``; a shape decided by
  data: ``nonzero``, boolean indexing), with where it was called, and which steps each read of
  the device's numbers covered; the loader's ``next()`` (host-side work) is left out;
- ``only_rank``: apply the kill hooks on this rank only.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _kill(hooks: dict) -> None:
    if hooks.get("only_rank") is None or hooks["only_rank"] == _rank():
        os.kill(os.getpid(), signal.SIGKILL)


def install(hooks: dict) -> None:
    import biomed_lm.pretrain.checkpoint as checkpoint
    import biomed_lm.pretrain.modeling as modeling
    import biomed_lm.pretrain.trainer as trainer

    account = trainer._account_step

    def account_step(run, done):
        account(run, done)
        if hooks.get("kill_at_step") == done.number:
            _kill(hooks)
        time.sleep(hooks.get("sleep_per_step", 0.0))

    trainer._account_step = account_step

    if "lr_factor_from_step" in hooks:
        first, factor = hooks["lr_factor_from_step"]
        accumulate = trainer._accumulate_step

        def accumulate_step(run, step):
            if step + 1 == first:  # ``step`` steps are done; this one is step + 1
                scheduler, optimizer = run.engine.lr_scheduler, run.engine.optimizer
                scheduler.base_lrs = [base * factor for base in scheduler.base_lrs]
                for group in optimizer.param_groups:
                    group["lr"] *= factor
            return accumulate(run, step)

        trainer._accumulate_step = accumulate_step

    if "fail_save" in hooks:
        _install_failing_save(trainer, *hooks["fail_save"])

    if "host_syncs" in hooks:
        _install_host_sync_spy(trainer, Path(hooks["host_syncs"]))

    if "kill_in_save" in hooks:
        kill_step, moment = hooks["kill_in_save"]
        saving = {"step": None}
        save = trainer.save_checkpoint

        def save_checkpoint(engine, run_dir, step, *args, **kwargs):
            saving["step"] = step
            return save(engine, run_dir, step, *args, **kwargs)

        trainer.save_checkpoint = save_checkpoint

        def killing(original, when):
            def wrapper(*args, **kwargs):
                if saving["step"] == kill_step and when(*args):
                    _kill(hooks)
                return original(*args, **kwargs)
            return wrapper

        targets = {"after_engine_save": ("rng_state", lambda *a: True),
                   "before_manifest": ("write_manifest", lambda *a: True),
                   "before_latest": ("write_text_atomically", lambda path, *a: Path(path).name == checkpoint.LATEST),
                   "before_prune": ("_prune", lambda *a: True)}
        name, when = targets[moment]
        setattr(checkpoint, name, killing(getattr(checkpoint, name), when))

    if "loss_factor_at_steps" in hooks:
        spec = hooks["loss_factor_at_steps"]
        steps, per_step = set(spec["steps"]), spec.get("micro_per_step", 1)
        forward, calls = modeling.PretrainingModel.forward, {"n": 0}

        def scaled_forward(self, *args, **kwargs):
            out = forward(self, *args, **kwargs)
            calls["n"] += 1
            if (calls["n"] - 1) // per_step + 1 in steps:
                out.loss = out.loss * float(spec["factor"])
            return out

        modeling.PretrainingModel.forward = scaled_forward


def _install_failing_save(trainer, fail_step: int, how: str) -> None:
    import resource

    save = trainer.save_checkpoint

    def save_checkpoint(engine, run_dir, step, *args, **kwargs):
        if step == fail_step:
            if how == "file_size_limit":
                resource.setrlimit(resource.RLIMIT_FSIZE, (1_000_000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
            else:  # checkpoints/ moved away (to checkpoints.moved) and a file put in its place
                root = Path(run_dir) / "checkpoints"
                root.rename(root.with_name("checkpoints.moved"))
                root.write_text("in the way\n")
        return save(engine, run_dir, step, *args, **kwargs)

    trainer.save_checkpoint = save_checkpoint


def _install_host_sync_spy(trainer, path: Path) -> None:
    sys.path.insert(0, str(REPO / "tests"))
    from host_syncs import host_syncs, paused

    report = {"steps": 0, "syncs": [], "reads": []}

    class HostSideBatches:  # the loader's next() is host work (collation, the layout): not spied on
        def __init__(self, batches):
            self.batches = batches

        def __next__(self):
            with paused():
                return next(self.batches)

    accumulate_step, read_steps = trainer._accumulate_step, trainer._read_steps

    def spied(run, step):
        batches, run.batches = run.batches, HostSideBatches(run.batches)
        try:
            with host_syncs() as found:
                return accumulate_step(run, step)
        finally:
            run.batches = batches
            report["syncs"] += [{**sync, "step": step + 1} for sync in found]
            report["steps"] += 1
            path.write_text(json.dumps(report))

    def reading(run, steps, since=None):
        report["reads"].append([pending.number for pending in steps])
        path.write_text(json.dumps(report))
        return read_steps(run, steps, since)

    trainer._accumulate_step = spied
    trainer._read_steps = reading


def main() -> None:
    args = sys.argv[1:]  # the deepspeed launcher puts --local_rank=N first
    hooks = {}
    if "--hooks" in args:
        at = args.index("--hooks")
        hooks, args = json.loads(args[at + 1]), args[:at] + args[at + 2:]
    os.chdir(REPO)
    install(hooks)
    sys.argv = [str(REPO / "launch" / "pretrain.py"), *args]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
