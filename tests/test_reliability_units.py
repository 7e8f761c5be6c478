"""Fast unit and property tests of the reliability modules, without DeepSpeed or training runs:
checkpoint verification and selection (pretrain/checkpoint.py), the divergence guard
(pretrain/divergence.py), resume signatures and the learning-rate override (pretrain/resume.py),
stop requests (pretrain/preemption.py) and the metrics file (pretrain/metrics.py).

Checkpoints here are synthetic: folders holding the files ``required_files`` names (random bytes)
plus an ``hf/`` export, with a manifest from the real ``write_manifest``. The end-to-end faults
are in tests/test_reliability_pretrain.py.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from biomed_lm.pretrain.checkpoint import (DAMAGED_PREFIX, LATEST, MANIFEST, CheckpointError, Selection, _prune,
                                           checkpoints_root, required_files, rng_file, select_checkpoint, tag_for,
                                           verify_checkpoint, write_manifest)
from biomed_lm.pretrain.config import DataArguments, ModelArguments, TrainArguments
from biomed_lm.pretrain.divergence import DivergenceGuard, Verdict
from biomed_lm.pretrain.metrics import MetricsLogger, cuda_allocator_counts, read_metrics_file
from biomed_lm.optim import SCHEDULE_NAMES, ScheduleConfig, build_lr_scheduler
from biomed_lm.pretrain.preemption import STOP_SIGNALS, StopRequests, ignore_stop_signals
from biomed_lm.pretrain.resume import ConfigChangeRefused, apply_learning_rate, compare_signatures, run_signature

SETTINGS = settings(max_examples=60, deadline=None)
FILE_SETTINGS = settings(max_examples=30, deadline=None)  # examples that write and hash files
SIGNATURE = {"train.seed": 42, "train.micro_batch_size": 8, "model.architecture": {"hidden_size": 64}}


# --- synthetic checkpoints ---------------------------------------------------------------------

def make_checkpoint(run_dir: Path, step: int, *, world_size: int = 1, zero_stage: int = 0, seed: int = 0,
                    manifest: bool = True, manifest_step: int | None = None) -> Path:
    """``<run>/checkpoints/step-…`` with every required file plus an hf export (random bytes)."""
    folder = checkpoints_root(run_dir) / tag_for(step)
    (folder / "hf").mkdir(parents=True)
    rng = random.Random(seed * 1_000_003 + step)
    for name in required_files(world_size, zero_stage) + ["hf/config.json", "hf/model.safetensors"]:
        (folder / name).write_bytes(rng.randbytes(rng.randint(1, 300)))
    if manifest:
        write_manifest(folder, step=step if manifest_step is None else manifest_step, world_size=world_size,
                       zero_stage=zero_stage, signature=SIGNATURE)
    return folder


def set_latest(run_dir: Path, text: str | bytes) -> None:
    pointer = checkpoints_root(run_dir) / LATEST
    pointer.parent.mkdir(parents=True, exist_ok=True)
    pointer.write_bytes(text if isinstance(text, bytes) else text.encode())


def flip_byte(path: Path, offset: int, mask: int = 0x01) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` with its bytes (to check that nothing moved or changed)."""
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def listed_files(folder: Path) -> list[str]:
    return sorted(json.loads((folder / MANIFEST).read_text())["files"])


def edit_manifest(folder: Path, edit, resign: bool = True) -> None:
    """Change the manifest; ``resign`` recomputes its own checksum (a manifest written wrong, as
    opposed to one changed afterwards, which the self-checksum catches)."""
    from biomed_lm.pretrain.checkpoint import _self_checksum

    manifest = json.loads((folder / MANIFEST).read_text())
    edit(manifest)
    if resign and isinstance(manifest, dict):
        manifest["self_xxh3_128"] = _self_checksum(manifest)
    (folder / MANIFEST).write_text(json.dumps(manifest))


def test_an_edited_manifest_is_caught_by_its_own_checksum(tmp_path):
    folder = make_checkpoint(tmp_path, 40)
    edit_manifest(folder, lambda m: m["signature"].update({"train.seed": 52}), resign=False)
    with pytest.raises(CheckpointError, match="its own checksum"):
        verify_checkpoint(folder)


@pytest.fixture(scope="module")
def intact_zero_checkpoint(tmp_path_factory) -> Path:
    """A two-rank ZeRO-1 checkpoint shared by the property tests (each restores what it changes)."""
    return make_checkpoint(tmp_path_factory.mktemp("run"), 500, world_size=2, zero_stage=1, seed=7)


# --- verify_checkpoint -------------------------------------------------------------------------

@pytest.mark.parametrize("world_size,zero_stage", [(1, 0), (2, 0), (2, 1), (3, 2)])
def test_an_intact_checkpoint_verifies(tmp_path, world_size, zero_stage):
    folder = make_checkpoint(tmp_path, 20, world_size=world_size, zero_stage=zero_stage)
    manifest = verify_checkpoint(folder)
    assert manifest["step"] == 20 and manifest["world_size"] == world_size and manifest["zero_stage"] == zero_stage
    assert manifest["signature"] == SIGNATURE
    expected = sorted(required_files(world_size, zero_stage) + ["hf/config.json", "hf/model.safetensors"])
    assert sorted(manifest["files"]) == expected


@FILE_SETTINGS
@given(st.data())
def test_a_flipped_byte_in_any_file_at_any_offset_is_rejected_naming_the_file(intact_zero_checkpoint, data):
    folder = intact_zero_checkpoint
    name = data.draw(st.sampled_from(listed_files(folder)), label="file")
    path = folder / name
    original = path.read_bytes()
    offset = data.draw(st.integers(0, len(original) - 1), label="offset")
    mask = data.draw(st.integers(1, 255), label="xor mask")
    try:
        flip_byte(path, offset, mask)
        with pytest.raises(CheckpointError, match="checksum") as caught:
            verify_checkpoint(folder)
        assert name in str(caught.value)
    finally:
        path.write_bytes(original)
    verify_checkpoint(folder)  # restored


@FILE_SETTINGS
@given(st.data())
def test_a_truncated_file_is_rejected_naming_the_file(intact_zero_checkpoint, data):
    folder = intact_zero_checkpoint
    name = data.draw(st.sampled_from(listed_files(folder)), label="file")
    path = folder / name
    original = path.read_bytes()
    keep = data.draw(st.integers(0, len(original) - 1), label="bytes kept")
    try:
        path.write_bytes(original[:keep])
        with pytest.raises(CheckpointError, match="truncated") as caught:
            verify_checkpoint(folder)
        assert name in str(caught.value)
    finally:
        path.write_bytes(original)


@pytest.mark.parametrize("name", ["mp_rank_00_model_states.pt", "rng_state_rank1.pt",
                                  "zero_pp_rank_0_mp_rank_00_optim_states.pt", "hf/config.json"])
def test_a_missing_file_is_rejected_naming_it(tmp_path, name):
    folder = make_checkpoint(tmp_path, 30, world_size=2, zero_stage=1)
    (folder / name).unlink()
    with pytest.raises(CheckpointError, match="missing") as caught:
        verify_checkpoint(folder)
    assert name in str(caught.value)


def test_an_rng_file_emptied_after_the_save_is_rejected(tmp_path):
    folder = make_checkpoint(tmp_path, 30)
    (folder / rng_file(0)).write_bytes(b"")
    with pytest.raises(CheckpointError, match=rng_file(0)):
        verify_checkpoint(folder)


def test_an_rng_file_empty_when_the_manifest_was_written_is_rejected(tmp_path):
    folder = make_checkpoint(tmp_path, 30, manifest=False)
    (folder / rng_file(0)).write_bytes(b"")
    write_manifest(folder, step=30, world_size=1, zero_stage=0, signature=SIGNATURE)
    with pytest.raises(CheckpointError, match=rng_file(0)):
        verify_checkpoint(folder)


@pytest.mark.parametrize("name", required_files(2, 2))
def test_a_manifest_missing_a_required_file_is_rejected_naming_it(tmp_path, name):
    folder = make_checkpoint(tmp_path, 40, world_size=2, zero_stage=2)
    edit_manifest(folder, lambda m: m["files"].pop(name))
    with pytest.raises(CheckpointError, match="required") as caught:
        verify_checkpoint(folder)
    assert name in str(caught.value)


def test_a_missing_manifest_is_rejected(tmp_path):
    folder = make_checkpoint(tmp_path, 40, manifest=False)
    with pytest.raises(CheckpointError, match=MANIFEST):
        verify_checkpoint(folder)


@pytest.mark.parametrize("garbage", [b"", b"{\"format\": 1, \"files\": {", b"\xff\xfe\x00garbage", b"[1, 2, 3]",
                                     b"null", b"{\"format\": 2, \"files\": {}}", b"{\"format\": 1, \"files\": []}"])
def test_a_garbage_manifest_is_rejected(tmp_path, garbage):
    folder = make_checkpoint(tmp_path, 40)
    (folder / MANIFEST).write_bytes(garbage)
    with pytest.raises(CheckpointError, match=MANIFEST):
        verify_checkpoint(folder)


@pytest.mark.parametrize("manifest_step", [39, 41, 0, None, "40"])
def test_a_manifest_whose_step_disagrees_with_the_folder_is_rejected(tmp_path, manifest_step):
    folder = make_checkpoint(tmp_path, 40)
    edit_manifest(folder, lambda m: m.update(step=manifest_step))
    with pytest.raises(CheckpointError, match="step"):
        verify_checkpoint(folder)


def test_a_manifest_for_another_folder_step_is_rejected(tmp_path):
    folder = make_checkpoint(tmp_path, 40, manifest_step=400)
    with pytest.raises(CheckpointError, match="400"):
        verify_checkpoint(folder)


# A corrupt manifest that is still JSON must be a CheckpointError too: select_checkpoint only
# catches that, so anything else aborts the resume instead of falling back.
MALFORMED_MANIFESTS = {
    "entry without size": lambda m: m["files"]["hf/config.json"].pop("size"),
    "entry without checksum": lambda m: m["files"]["hf/config.json"].pop("xxh3_128"),
    "entry not an object": lambda m: m["files"].update({"hf/config.json": 5}),
    "size as text": lambda m: m["files"]["hf/config.json"].update(size="12"),
    "world_size null": lambda m: m.update(world_size=None),
    "world_size text": lambda m: m.update(world_size="two"),
}


@pytest.mark.parametrize("corruption", sorted(MALFORMED_MANIFESTS))
def test_a_malformed_manifest_is_a_checkpoint_error(tmp_path, corruption):
    folder = make_checkpoint(tmp_path, 40, world_size=2)
    edit_manifest(folder, MALFORMED_MANIFESTS[corruption])
    with pytest.raises(CheckpointError):
        verify_checkpoint(folder)


def test_a_malformed_newest_manifest_falls_back_to_the_previous_checkpoint(tmp_path):
    make_checkpoint(tmp_path, 10)
    newest = make_checkpoint(tmp_path, 20)
    edit_manifest(newest, MALFORMED_MANIFESTS["entry without size"])
    selection = select_checkpoint(tmp_path)
    assert selection.tag == tag_for(10)


def _single_bit_manifest_flips(folder: Path):
    """(offset, mask, outcome) of every single-bit flip of the manifest: 'rejected', 'accepted', or
    the name of another exception; the manifest is restored afterwards."""
    path = folder / MANIFEST
    original = path.read_bytes()
    try:
        for offset in range(len(original)):
            for mask in (0x01, 0x20):
                data = bytearray(original)
                data[offset] ^= mask
                path.write_bytes(bytes(data))
                try:
                    verify_checkpoint(folder)
                    outcome = "accepted"
                except CheckpointError:
                    outcome = "rejected"
                except Exception as err:  # noqa: BLE001 - what the test is looking for
                    outcome = type(err).__name__
                yield offset, mask, outcome
    finally:
        path.write_bytes(original)


@pytest.fixture(scope="module")
def manifest_flips(intact_zero_checkpoint) -> list[tuple[int, int, str]]:
    return list(_single_bit_manifest_flips(intact_zero_checkpoint))


def test_every_single_bit_flip_of_the_manifest_raises_only_checkpoint_error(manifest_flips):
    others = [(offset, mask, outcome) for offset, mask, outcome in manifest_flips
              if outcome not in ("rejected", "accepted")]
    assert not others, others[:5]


def test_every_single_bit_flip_of_the_manifest_is_detected(manifest_flips):
    accepted = [(offset, mask) for offset, mask, outcome in manifest_flips if outcome == "accepted"]
    assert not accepted, accepted[:5]


# --- select_checkpoint -------------------------------------------------------------------------

def test_an_empty_run_directory_starts_fresh(tmp_path):
    assert select_checkpoint(tmp_path) == Selection(tag=None, manifest={}, notes=[])
    checkpoints_root(tmp_path).mkdir()
    assert select_checkpoint(tmp_path) == Selection(tag=None, manifest={}, notes=[])
    assert select_checkpoint(tmp_path / "does-not-exist") == Selection()


def test_the_newest_verified_checkpoint_wins(tmp_path):
    for step in (10, 20, 30):
        make_checkpoint(tmp_path, step)
    set_latest(tmp_path, tag_for(30) + "\n")
    selection = select_checkpoint(tmp_path)
    assert selection.tag == tag_for(30) and selection.manifest["step"] == 30 and selection.notes == []


def test_a_checkpoint_renamed_into_place_before_latest_was_updated_is_taken(tmp_path):
    make_checkpoint(tmp_path, 10)
    make_checkpoint(tmp_path, 20)
    set_latest(tmp_path, tag_for(10))  # a crash between the rename and the update of `latest`
    assert select_checkpoint(tmp_path).tag == tag_for(20)


@pytest.mark.parametrize("damage", ["flip", "truncate", "missing file", "no manifest", "garbage manifest"])
def test_a_damaged_newest_checkpoint_falls_back_and_is_moved_aside(tmp_path, damage):
    make_checkpoint(tmp_path, 10)
    newest = make_checkpoint(tmp_path, 20)
    set_latest(tmp_path, tag_for(20))
    target = newest / rng_file(0)
    if damage == "flip":
        flip_byte(target, 0)
    elif damage == "truncate":
        target.write_bytes(target.read_bytes()[:-1])
    elif damage == "missing file":
        target.unlink()
    elif damage == "no manifest":
        (newest / MANIFEST).unlink()
    else:
        (newest / MANIFEST).write_text("{not json")
    before = snapshot(newest)
    selection = select_checkpoint(tmp_path)
    assert selection.tag == tag_for(10) and selection.manifest["step"] == 10
    moved = checkpoints_root(tmp_path) / f"{DAMAGED_PREFIX}{tag_for(20)}"
    assert not newest.exists() and snapshot(moved) == before  # moved, not deleted or changed
    assert len(selection.notes) == 1
    note = selection.notes[0]
    assert tag_for(20) in note and "damaged" in note and moved.name in note and tag_for(10) in note


def test_several_damaged_checkpoints_are_all_moved_and_reported(tmp_path):
    make_checkpoint(tmp_path, 10)
    for step in (20, 30):
        flip_byte(make_checkpoint(tmp_path, step) / "hf/config.json", 3)
    selection = select_checkpoint(tmp_path)
    assert selection.tag == tag_for(10)
    root = checkpoints_root(tmp_path)
    assert sorted(p.name for p in root.iterdir()) == [f"{DAMAGED_PREFIX}{tag_for(20)}",
                                                      f"{DAMAGED_PREFIX}{tag_for(30)}", tag_for(10)]
    assert [tag_for(30) in selection.notes[0], tag_for(20) in selection.notes[1]] == [True, True]
    assert all("hf/config.json" in note for note in selection.notes)


def test_a_damaged_folder_of_the_same_step_is_not_overwritten(tmp_path):
    make_checkpoint(tmp_path, 10)
    root = checkpoints_root(tmp_path)
    earlier = root / f"{DAMAGED_PREFIX}{tag_for(20)}"
    earlier.mkdir()
    (earlier / "marker").write_text("first damaged copy")
    (make_checkpoint(tmp_path, 20) / MANIFEST).unlink()
    selection = select_checkpoint(tmp_path)
    assert selection.tag == tag_for(10)
    assert (earlier / "marker").read_text() == "first damaged copy"
    assert (root / f"{DAMAGED_PREFIX}{tag_for(20)}-2" / rng_file(0)).is_file()
    assert f"{DAMAGED_PREFIX}{tag_for(20)}-2" in selection.notes[0]


def test_move_damaged_false_skips_without_moving(tmp_path):
    make_checkpoint(tmp_path, 10)
    newest = make_checkpoint(tmp_path, 20)
    (newest / MANIFEST).unlink()
    selection = select_checkpoint(tmp_path, move_damaged=False)
    assert selection.tag == tag_for(10) and newest.is_dir()
    assert "skipped" in selection.notes[0] and tag_for(20) in selection.notes[0]


def test_latest_naming_a_missing_folder_falls_back_with_a_note(tmp_path):
    make_checkpoint(tmp_path, 10)
    set_latest(tmp_path, tag_for(20) + "\n")
    selection = select_checkpoint(tmp_path)
    assert selection.tag == tag_for(10)
    assert len(selection.notes) == 1 and tag_for(20) in selection.notes[0] and "not there" in selection.notes[0]


@pytest.mark.parametrize("garbage", [b"garbage", b"", b"\xff\xfe\xfd", b"step-1", b"../../etc"])
def test_garbage_in_latest_with_verified_checkpoints_takes_the_newest(tmp_path, garbage):
    make_checkpoint(tmp_path, 10)
    make_checkpoint(tmp_path, 20)
    set_latest(tmp_path, garbage)
    selection = select_checkpoint(tmp_path)
    assert selection.tag == tag_for(20)
    assert len(selection.notes) == 1 and LATEST in selection.notes[0]


def test_no_verified_checkpoint_is_refused_naming_each_and_nothing_moves(tmp_path):
    flip_byte(make_checkpoint(tmp_path, 10) / rng_file(0), 0)
    (make_checkpoint(tmp_path, 20) / MANIFEST).unlink()
    make_checkpoint(tmp_path, 30, manifest_step=31)
    set_latest(tmp_path, tag_for(30))
    before = snapshot(tmp_path)
    with pytest.raises(CheckpointError) as caught:
        select_checkpoint(tmp_path)
    message = str(caught.value)
    for tag in (tag_for(10), tag_for(20), tag_for(30)):
        assert tag in message
    assert rng_file(0) in message and MANIFEST in message
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("pointer", [tag_for(20), "garbage", ""])
def test_latest_without_any_checkpoint_is_refused(tmp_path, pointer):
    set_latest(tmp_path, pointer)
    before = snapshot(tmp_path)
    with pytest.raises(CheckpointError, match=LATEST):
        select_checkpoint(tmp_path)
    assert snapshot(tmp_path) == before


def test_partial_staging_folders_are_ignored(tmp_path):
    make_checkpoint(tmp_path, 10)
    root = checkpoints_root(tmp_path)
    staged = make_checkpoint(tmp_path, 20)  # a complete-looking save that was never renamed into place
    os.replace(staged, root / f".partial-{tag_for(20)}")
    broken = root / f".partial-{tag_for(30)}"
    broken.mkdir()
    (broken / "mp_rank_00_model_states.pt").write_bytes(b"half")
    before = snapshot(tmp_path)
    selection = select_checkpoint(tmp_path)
    assert selection.tag == tag_for(10) and selection.notes == []
    assert snapshot(tmp_path) == before


def test_only_partial_staging_folders_start_fresh(tmp_path):
    root = checkpoints_root(tmp_path)
    (root / f".partial-{tag_for(10)}").mkdir(parents=True)
    assert select_checkpoint(tmp_path) == Selection()


@FILE_SETTINGS
@given(st.lists(st.tuples(st.integers(1, 60), st.sampled_from(["intact", "flip", "no manifest", "wrong step"])),
                min_size=1, max_size=5, unique_by=lambda c: c[0]))
def test_selection_takes_the_newest_intact_checkpoint_and_moves_only_newer_damaged_ones(checkpoints):
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp)
        for step, state in checkpoints:
            folder = make_checkpoint(run_dir, step, manifest_step=step + 1 if state == "wrong step" else None)
            if state == "flip":
                flip_byte(folder / "mp_rank_00_model_states.pt", 0)
            elif state == "no manifest":
                (folder / MANIFEST).unlink()
        intact = sorted(step for step, state in checkpoints if state == "intact")
        damaged = sorted(step for step, state in checkpoints if state != "intact")
        root = checkpoints_root(run_dir)
        if not intact:
            before = snapshot(run_dir)
            with pytest.raises(CheckpointError):
                select_checkpoint(run_dir)
            assert snapshot(run_dir) == before
            return
        selection = select_checkpoint(run_dir)
        assert selection.tag == tag_for(intact[-1])
        newer = [step for step in damaged if step > intact[-1]]
        assert len(selection.notes) == len(newer)
        expected = {tag_for(s) for s in intact} | {tag_for(s) for s in damaged if s < intact[-1]} | \
                   {f"{DAMAGED_PREFIX}{tag_for(s)}" for s in newer}
        assert {p.name for p in root.iterdir()} == expected


# --- _prune --------------------------------------------------------------------------------------

@SETTINGS
@given(st.sets(st.integers(0, 99_999_999), min_size=0, max_size=8), st.integers(0, 6))
def test_prune_keeps_the_newest_keep_last_and_never_touches_other_folders(steps, keep_last):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for step in steps:
            (root / tag_for(step)).mkdir()
            (root / tag_for(step) / "x").write_bytes(b"x")
        others = [f"{DAMAGED_PREFIX}{tag_for(1)}", f"{DAMAGED_PREFIX}{tag_for(99_999_999)}",
                  f"diverged-{tag_for(5)}", f".partial-{tag_for(99_999_999)}"]
        for name in others:
            (root / name).mkdir()
            (root / name / "x").write_bytes(b"x")
        (root / LATEST).write_text(tag_for(max(steps, default=0)))
        _prune(root, keep_last)
        kept = sorted(steps)[-keep_last:] if keep_last > 0 else sorted(steps)
        assert sorted(p.name for p in root.iterdir()) == sorted([tag_for(s) for s in kept] + others + [LATEST])
        assert all((root / name / "x").is_file() for name in others)


# --- DivergenceGuard -----------------------------------------------------------------------------

def guard(loss_factor: float = 2.0, grad_factor: float = 10.0, window: int = 5, warmup: int = 3) -> DivergenceGuard:
    return DivergenceGuard(loss_spike_factor=loss_factor, grad_norm_spike_factor=grad_factor, window=window,
                           warmup_steps=warmup)


def warmed(g: DivergenceGuard, n: int | None = None, loss: float = 2.0, grad_norm: float = 1.0) -> DivergenceGuard:
    for _ in range(g.warmup_steps if n is None else n):
        assert g.judge(loss, grad_norm) == Verdict(False)
    return g


class ReferenceGuard:
    """The rules as the module's doc states them, on Python floats (the guard before it moved onto the
    device): what :class:`DivergenceGuard` must agree with, verdict for verdict."""

    def __init__(self, loss_factor, grad_factor, window, warmup, ceiling):
        import collections

        self.loss_factor, self.grad_factor, self.warmup, self.ceiling = loss_factor, grad_factor, warmup, ceiling
        self.losses, self.grad_norms = collections.deque(maxlen=window), collections.deque(maxlen=window)
        self.accepted = 0

    def judge(self, loss, grad_norm):
        import statistics

        if not math.isfinite(loss):
            return "nonfinite_loss"
        if grad_norm is not None and not math.isfinite(grad_norm):
            return "nonfinite_grad_norm"
        if self.ceiling > 0 and loss > self.ceiling:
            return "loss_ceiling"
        if self.accepted >= self.warmup:
            if self.loss_factor > 0 and self.losses and loss > self.loss_factor * statistics.median(self.losses):
                return "loss_spike"
            if self.grad_factor > 0 and grad_norm is not None and self.grad_norms and \
                    grad_norm > self.grad_factor * statistics.median(self.grad_norms):
                return "grad_norm_spike"
        self.losses.append(loss)
        if grad_norm is not None:
            self.grad_norms.append(grad_norm)
        self.accepted += 1
        return None


_values = st.one_of(st.floats(0.01, 100.0), st.sampled_from([math.nan, math.inf, 1e308]))


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.tuples(_values, st.one_of(st.none(), _values)), max_size=40),
       window=st.integers(1, 6), warmup=st.integers(0, 4), loss_factor=st.sampled_from([0.0, 1.5, 2.0]),
       grad_factor=st.sampled_from([0.0, 3.0]), ceiling=st.sampled_from([0.0, 50.0]), reload_at=st.integers(0, 40))
def test_the_device_guard_judges_as_the_rules_on_python_floats(steps, window, warmup, loss_factor, grad_factor,
                                                               ceiling, reload_at):
    """Verdict for verdict, history included (medians of even counts, the window's eviction, huge
    values), and through a state_dict round trip at any step (a resume)."""
    reference = ReferenceGuard(loss_factor, grad_factor, window, warmup, ceiling)
    guard = DivergenceGuard(loss_spike_factor=loss_factor, grad_norm_spike_factor=grad_factor, window=window,
                            warmup_steps=warmup, loss_ceiling=ceiling)
    for index, (loss, grad_norm) in enumerate(steps):
        if index == reload_at:
            resumed = DivergenceGuard(loss_spike_factor=loss_factor, grad_norm_spike_factor=grad_factor,
                                      window=window, warmup_steps=warmup, loss_ceiling=ceiling)
            resumed.load_state_dict(json.loads(json.dumps(guard.state_dict())))
            guard = resumed
        assert guard.judge(loss, grad_norm).reason == reference.judge(loss, grad_norm)
        assert guard.losses == list(reference.losses) and guard.accepted == reference.accepted
        assert guard.grad_norms == list(reference.grad_norms)


@pytest.mark.parametrize("loss", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("warmup", [0, 3, 100])
def test_a_nonfinite_loss_is_skipped(loss, warmup):
    g = warmed(guard(warmup=warmup), 3)
    state = g.state_dict()
    verdict = g.judge(loss, 1.0)
    assert verdict.skip and verdict.reason == "nonfinite_loss"
    assert g.state_dict() == state  # not in the history, not counted


@pytest.mark.parametrize("grad_norm", [math.inf, math.nan, -math.inf])
def test_a_nonfinite_grad_norm_is_skipped(grad_norm):
    g = warmed(guard(warmup=0), 2)
    state = g.state_dict()
    verdict = g.judge(2.0, grad_norm)
    assert verdict.skip and verdict.reason == "nonfinite_grad_norm"
    assert g.state_dict() == state


def test_nonfinite_values_are_skipped_even_with_every_check_off():
    g = guard(loss_factor=0, grad_factor=0, warmup=0)
    assert g.judge(math.nan, 1.0).reason == "nonfinite_loss"
    assert g.judge(1.0, math.inf).reason == "nonfinite_grad_norm"


def test_no_spike_is_judged_during_the_warmup_steps():
    g = guard(warmup=3)
    for loss, grad_norm in [(1.0, 1.0), (500.0, 1000.0), (1.0, 1.0)]:
        assert g.judge(loss, grad_norm) == Verdict(False)
    assert g.accepted == 3
    verdict = g.judge(2.5, 1.0)  # median of (1, 500, 1) is 1
    assert verdict.skip and verdict.reason == "loss_spike"


def test_skipped_steps_do_not_count_towards_the_warmup():
    g = guard(warmup=2)
    assert g.judge(1.0, 1.0) == Verdict(False)
    assert g.judge(math.nan, 1.0).skip
    assert g.judge(100.0, 1.0) == Verdict(False)  # still the second accepted step: not judged
    assert g.accepted == 2
    assert g.judge(1000.0, 1.0).reason == "loss_spike"


def test_a_loss_spike_is_skipped_and_does_not_join_the_history():
    g = warmed(guard(loss_factor=2.0, warmup=3), loss=2.0)
    state = g.state_dict()
    verdict = g.judge(4.01, 1.0)
    assert verdict.skip and verdict.reason == "loss_spike" and "median" in verdict.detail
    assert g.state_dict() == state
    assert g.judge(4.0, 1.0) == Verdict(False)  # exactly factor × median is not a spike
    assert g.losses[-1] == 4.0 and g.accepted == 4


def test_a_grad_norm_spike_is_skipped_and_does_not_join_the_history():
    g = warmed(guard(grad_factor=10.0, warmup=3), grad_norm=1.0)
    state = g.state_dict()
    verdict = g.judge(2.0, 10.5)
    assert verdict.skip and verdict.reason == "grad_norm_spike" and "median" in verdict.detail
    assert g.state_dict() == state
    assert g.judge(2.0, 10.0) == Verdict(False)
    assert g.grad_norms[-1] == 10.0


def test_a_missing_grad_norm_is_not_judged_and_not_recorded():
    g = warmed(guard(warmup=3))
    assert g.judge(2.0, None) == Verdict(False)
    assert len(g.grad_norms) == 3 and len(g.losses) == 4


@pytest.mark.parametrize("which", ["loss", "grad"])
def test_a_factor_of_zero_turns_that_check_off(which):
    g = warmed(guard(loss_factor=0.0 if which == "loss" else 2.0, grad_factor=0.0 if which == "grad" else 10.0))
    if which == "loss":
        assert g.judge(1e6, 1.0) == Verdict(False)
        assert g.judge(2.0, 1e6).reason == "grad_norm_spike"
    else:
        assert g.judge(2.0, 1e6) == Verdict(False)
        assert g.judge(1e6, 1.0).reason == "loss_spike"


def test_the_history_is_a_window_of_the_last_accepted_steps():
    short, long = guard(window=3, warmup=0), guard(window=5, warmup=0)
    for loss in (100.0, 100.0, 1.0, 1.0):
        assert short.judge(loss, None) == long.judge(loss, None) == Verdict(False)
    assert list(short.losses) == [100.0, 1.0, 1.0] and short.accepted == 4
    assert short.judge(2.5, None).reason == "loss_spike"  # median 1
    assert long.judge(2.5, None) == Verdict(False)  # median 50.5


STEP_VALUES = st.tuples(
    st.one_of(st.floats(0.5, 3.0), st.floats(3.0, 50.0), st.sampled_from([math.nan, math.inf])),
    st.one_of(st.none(), st.floats(0.1, 2.0), st.floats(2.0, 100.0), st.just(math.inf)))


@SETTINGS
@given(st.lists(STEP_VALUES, min_size=0, max_size=60), st.data(), st.integers(1, 8), st.integers(0, 6),
       st.sampled_from([0.0, 1.5, 2.0]), st.sampled_from([0.0, 3.0]))
def test_a_restored_guard_judges_the_rest_exactly_like_an_uninterrupted_one(steps, data, window, warmup,
                                                                            loss_factor, grad_factor):
    cut = data.draw(st.integers(0, len(steps)), label="cut")
    straight = guard(loss_factor, grad_factor, window, warmup)
    expected = [straight.judge(loss, grad_norm) for loss, grad_norm in steps]
    first = guard(loss_factor, grad_factor, window, warmup)
    verdicts = [first.judge(loss, grad_norm) for loss, grad_norm in steps[:cut]]
    saved = json.loads(json.dumps(first.state_dict()))  # as the trainer state stores it
    resumed = guard(loss_factor, grad_factor, window, warmup)
    resumed.load_state_dict(saved)
    verdicts += [resumed.judge(loss, grad_norm) for loss, grad_norm in steps[cut:]]
    assert verdicts == expected
    assert resumed.state_dict() == straight.state_dict()


def test_an_empty_state_loads_as_a_fresh_guard():
    g = guard()
    g.load_state_dict({})
    assert g.state_dict() == guard().state_dict() == {"losses": [], "grad_norms": [], "accepted": 0}


def test_load_state_dict_replaces_the_history():
    g = warmed(guard(warmup=3), 3, loss=7.0)
    g.load_state_dict({"losses": [1.0], "grad_norms": [1.0], "accepted": 1})
    assert g.state_dict() == {"losses": [1.0], "grad_norms": [1.0], "accepted": 1}


# --- resume: signatures --------------------------------------------------------------------------

@dataclasses.dataclass
class ExtraArgs:
    """A section with values JSON has no type for (tuples, paths)."""

    betas: tuple = (0.9, 0.98)
    path: Path = Path("/data/x")
    nested: tuple = ((1, 2), (3,))


def signature(**train_changes) -> dict:
    train = dataclasses.replace(TrainArguments(output_dir="/runs/a"), **train_changes)
    return run_signature(model_args=ModelArguments(model="bert-tiny"), data_args=DataArguments(data_dir="/d"),
                         train_args=train, adversarial=ExtraArgs(), world_size=2,
                         architecture={"hidden_size": 128, "num_hidden_layers": 2},
                         data_meta={"vocab_sha256": "ab" * 32, "max_seq_length": 128, "fingerprint": "f",
                                    "instances": 1000})


def test_run_signature_is_json_serializable_and_stable():
    first, second = signature(), signature()
    assert first == second
    assert json.loads(json.dumps(first)) == first  # what a manifest stores is what it was
    assert first["adversarial.betas"] == [0.9, 0.98] and first["adversarial.nested"] == [[1, 2], [3]]
    assert first["adversarial.path"] == "/data/x"
    assert first["train.world_size"] == 2 and first["data.vocab_sha256"] == "ab" * 32
    assert first["model.architecture"] == {"hidden_size": 128, "num_hidden_layers": 2}
    assert first["train.micro_batch_size"] == 32 and first["model.model"] == "bert-tiny"


def test_run_signature_leaves_out_an_absent_section():
    sig = run_signature(model_args=ModelArguments(), data_args=DataArguments(), train_args=TrainArguments(),
                        adversarial=None, world_size=1, architecture={}, data_meta={})
    assert not any(key.startswith("adversarial.") for key in sig)
    assert sig["data.vocab_sha256"] is None


def test_a_signature_survives_the_manifest(tmp_path):
    current = signature()
    folder = checkpoints_root(tmp_path) / tag_for(5)
    folder.mkdir(parents=True)
    (folder / "mp_rank_00_model_states.pt").write_bytes(b"m")
    (folder / rng_file(0)).write_bytes(b"r")
    write_manifest(folder, step=5, world_size=1, zero_stage=0, signature=current)
    saved = verify_checkpoint(folder)["signature"]
    assert compare_signatures(saved, signature(), allow_change=False) == {}


def test_identical_signatures_have_no_changes():
    assert compare_signatures(signature(), signature(), allow_change=False) == {}


@pytest.mark.parametrize("allow", [False, True])
def test_a_harmless_change_is_returned_without_error(allow):
    changes = compare_signatures(signature(), signature(log_every=50, checkpoint_every=7), allow_change=allow)
    assert changes == {"train.log_every": {"checkpoint": 1, "now": 50},
                       "train.checkpoint_every": {"checkpoint": 500, "now": 7}}


def test_a_breaking_change_is_refused_listing_it_unless_allowed():
    saved, current = signature(), signature(micro_batch_size=16, seed=1, log_every=3)
    with pytest.raises(ConfigChangeRefused) as caught:
        compare_signatures(saved, current, allow_change=False)
    message = str(caught.value)
    assert "train.micro_batch_size" in message and "32" in message and "16" in message and "train.seed" in message
    assert "train.log_every" not in message and "--allow-config-change" in message
    changes = compare_signatures(saved, current, allow_change=True)
    assert set(changes) == {"train.micro_batch_size", "train.seed", "train.log_every"}
    assert changes["train.micro_batch_size"] == {"checkpoint": 32, "now": 16}


def test_a_checkpoint_from_before_the_feistel_order_is_a_reported_change():
    """pretrain.sampler's order changed (2026-11-26): an older checkpoint, whose signature has no
    data.sample_order, would read other instances for the rest of its epoch."""
    current = signature()
    saved = {key: value for key, value in current.items() if key != "data.sample_order"}
    with pytest.raises(ConfigChangeRefused, match="data.sample_order: 'permutation' in the checkpoint"):
        compare_signatures(saved, current, allow_change=False)
    assert compare_signatures(saved, current, allow_change=True) == {
        "data.sample_order": {"checkpoint": "permutation", "now": "feistel-v1"}}


def test_a_field_missing_on_one_side_is_a_change():
    saved = signature()
    current = dict(saved, **{"train.new_option": 1})
    with pytest.raises(ConfigChangeRefused, match="train.new_option"):
        compare_signatures(saved, current, allow_change=False)
    assert compare_signatures(saved, current, allow_change=True) == {"train.new_option": {"checkpoint": None,
                                                                                          "now": 1}}


@pytest.mark.parametrize("key,value", [("model.architecture", {"hidden_size": 256, "num_hidden_layers": 2}),
                                       ("train.zero_stage", 2), ("data.vocab_sha256", "cd" * 32),
                                       ("model.init", "continual"), ("model.model", "bert-base")])
@pytest.mark.parametrize("allow", [False, True])
def test_a_fixed_change_is_refused_even_when_changes_are_allowed(key, value, allow):
    saved = signature()
    current = dict(saved, **{key: value}, **{"train.log_every": 9})
    with pytest.raises(ConfigChangeRefused) as caught:
        compare_signatures(saved, current, allow_change=allow)
    assert key in str(caught.value) and "train.log_every" not in str(caught.value)


def test_a_changed_learning_rate_points_at_resume_lr_scale():
    with pytest.raises(ConfigChangeRefused, match="--resume-lr-scale"):
        compare_signatures(signature(), signature(learning_rate=1e-4), allow_change=False)
    with pytest.raises(ConfigChangeRefused) as caught:
        compare_signatures(signature(), signature(seed=3), allow_change=False)
    assert "--resume-lr-scale" not in str(caught.value)


# --- resume: the learning-rate override ---------------------------------------------------------

PEAK_LR = 1e-3


def optimizer_and_scheduler(config: ScheduleConfig, total_steps: int):
    params = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))]
    optimizer = torch.optim.AdamW([{"params": params[:1]}, {"params": params[1:], "weight_decay": 0.0}],
                                  lr=PEAK_LR)
    return optimizer, build_lr_scheduler(optimizer, config, total_steps)


def advance(optimizer, scheduler) -> None:
    optimizer.step()  # no gradients: a no-op that keeps torch's order check quiet
    scheduler.step()


def lrs(optimizer) -> list[float]:
    return [group["lr"] for group in optimizer.param_groups]


SCHEDULES = st.one_of(st.builds(ScheduleConfig, lr_schedule=st.sampled_from(SCHEDULE_NAMES),
                                warmup_ratio=st.sampled_from([0.0, 0.1, 0.5])),
                      st.builds(ScheduleConfig, lr_schedule=st.just("polynomial"),
                                warmup_ratio=st.just(0.2), lr_power=st.sampled_from([0.5, 2.0]),
                                end_lr=st.sampled_from([0.0, 1e-5])))


@settings(max_examples=30, deadline=None)
@given(SCHEDULES, st.integers(2, 30), st.data(), st.sampled_from([0.1, 0.5, 1.0, 2.0, 0.37]), st.booleans())
def test_a_scaled_schedule_is_the_unscaled_one_times_the_scale(config, total_steps, data, scale, twice):
    at = data.draw(st.integers(0, total_steps), label="step of the resume")
    reference, ref_scheduler = optimizer_and_scheduler(config, total_steps)
    optimizer, scheduler = optimizer_and_scheduler(config, total_steps)
    for _ in range(at):
        advance(reference, ref_scheduler)
        advance(optimizer, scheduler)
    for _ in range(2 if twice else 1):  # the same scale again does not compound
        apply_learning_rate(optimizer, scheduler, learning_rate=PEAK_LR, scale=scale)
    assert lrs(optimizer) == pytest.approx([scale * lr for lr in lrs(reference)], rel=1e-12, abs=1e-18)
    assert scheduler.get_last_lr() == lrs(optimizer)
    for _ in range(at, total_steps + 2):
        advance(reference, ref_scheduler)
        advance(optimizer, scheduler)
        assert lrs(optimizer) == pytest.approx([scale * lr for lr in lrs(reference)], rel=1e-12, abs=1e-18)


@pytest.mark.parametrize("scale", [0.5, 1.0, 3.0])
def test_a_resume_reapplying_the_saved_scale_does_not_compound(scale):
    config, total = ScheduleConfig(lr_schedule="slanted_triangular", warmup_ratio=0.2), 20
    reference, ref_scheduler = optimizer_and_scheduler(config, total)
    optimizer, scheduler = optimizer_and_scheduler(config, total)
    for _ in range(5):
        advance(reference, ref_scheduler)
        advance(optimizer, scheduler)
    apply_learning_rate(optimizer, scheduler, learning_rate=PEAK_LR, scale=scale)
    for _ in range(4):
        advance(reference, ref_scheduler)
        advance(optimizer, scheduler)
    saved = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
    # resume: fresh objects, the checkpoint's states, then the trainer applies the kept scale again
    optimizer, scheduler = optimizer_and_scheduler(config, total)
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    apply_learning_rate(optimizer, scheduler, learning_rate=PEAK_LR, scale=scale)
    for _ in range(9, total + 1):
        assert lrs(optimizer) == pytest.approx([scale * lr for lr in lrs(reference)], rel=1e-12, abs=1e-18)
        advance(reference, ref_scheduler)
        advance(optimizer, scheduler)


@pytest.mark.parametrize("extended", [0, 6], ids=["same schedule", "max_steps extended by 6"])
def test_a_resume_with_a_changed_schedule_runs_its_next_step_at_the_new_rate(extended):
    """QA (2026-11-28): a finished 30-step run resumed with max_steps 36 ran step 31 at the old end's lr 0 (the
    optimizer state's), the new schedule only from step 32. An unchanged schedule keeps its exact rates."""
    from biomed_lm.pretrain.resume import follow_changed_schedule

    config, total = ScheduleConfig(lr_schedule="slanted_triangular", warmup_ratio=0.1), 30
    optimizer, scheduler = optimizer_and_scheduler(config, total)
    for _ in range(total):
        advance(optimizer, scheduler)
    saved = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
    reference, ref_scheduler = optimizer_and_scheduler(config, total + extended)  # as if started so
    for _ in range(total):
        advance(reference, ref_scheduler)
    optimizer, scheduler = optimizer_and_scheduler(config, total + extended)
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    assert lrs(optimizer) == [0.0, 0.0]  # what step 31 ran at before
    follow_changed_schedule(optimizer, scheduler)
    assert lrs(optimizer) == lrs(reference) and scheduler.get_last_lr() == lrs(reference)
    assert (lrs(optimizer)[0] > 0) == bool(extended)


def test_a_new_scale_replaces_the_previous_one():
    config, total = ScheduleConfig(lr_schedule="constant_with_warmup", warmup_ratio=0.0), 10
    optimizer, scheduler = optimizer_and_scheduler(config, total)
    advance(optimizer, scheduler)
    apply_learning_rate(optimizer, scheduler, learning_rate=PEAK_LR, scale=0.5)
    apply_learning_rate(optimizer, scheduler, learning_rate=PEAK_LR, scale=0.25)
    assert lrs(optimizer) == pytest.approx([0.25 * PEAK_LR] * 2)
    advance(optimizer, scheduler)
    assert lrs(optimizer) == pytest.approx([0.25 * PEAK_LR] * 2)


# --- preemption ----------------------------------------------------------------------------------

@pytest.fixture
def stops():
    requests = StopRequests(watch_launcher=False)
    yield requests
    requests.restore()


def test_no_stop_is_requested_at_first(stops):
    assert stops.reason() is None
    assert stops.install().reason() is None
    assert StopRequests(stop_after_hours=1.0, watch_launcher=False).reason() is None
    assert stops.watched_launchers == []


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_is_the_reason(stops, sig):
    stops.install()
    os.kill(os.getpid(), sig)
    time.sleep(0.01)  # the handler runs at the next bytecode of the main thread
    assert stops.reason() == signal.Signals(sig).name


def test_the_first_signal_is_kept_and_a_second_sigint_interrupts(stops):
    stops.install()
    os.kill(os.getpid(), signal.SIGUSR1)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.01)
    assert stops.reason() == "SIGUSR1"
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)


def test_restore_puts_the_previous_handlers_back():
    def custom(signum, frame):
        pass

    previous_usr1 = signal.signal(signal.SIGUSR1, custom)
    try:
        before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
        requests = StopRequests(watch_launcher=False).install()
        assert all(signal.getsignal(sig) == requests._on_signal for sig in STOP_SIGNALS)
        requests.restore()
        assert {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} == before
        assert signal.getsignal(signal.SIGUSR1) is custom
        requests.restore()  # a second restore changes nothing
        assert {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} == before
    finally:
        signal.signal(signal.SIGUSR1, previous_usr1)


def test_a_spent_time_budget_is_the_reason():
    requests = StopRequests(stop_after_hours=1e-7, watch_launcher=False)  # 0.36 ms
    time.sleep(0.01)
    reason = requests.reason()
    assert reason is not None and "time budget" in reason and "1e-07 h" in reason


def _ignoring_child(ready, report) -> None:
    ignore_stop_signals(0)
    report.send({int(sig): signal.getsignal(sig) == signal.SIG_IGN for sig in STOP_SIGNALS})
    ready.set()
    time.sleep(30)


def test_dataloader_workers_ignore_stop_signals():
    ctx = multiprocessing.get_context("fork")
    ready, (receive, send) = ctx.Event(), ctx.Pipe(duplex=False)
    child = ctx.Process(target=_ignoring_child, args=(ready, send), daemon=True)
    child.start()
    try:
        assert ready.wait(10)
        assert receive.recv() == {int(sig): True for sig in STOP_SIGNALS}
        for sig in STOP_SIGNALS:
            os.kill(child.pid, sig)
        time.sleep(0.3)
        assert child.is_alive() and child.exitcode is None
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
    assert child.exitcode == -signal.SIGKILL


@pytest.mark.parametrize("reaped", [True, False])
def test_a_launcher_that_exits_is_reported_by_pid(reaped):
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        requests = StopRequests(watch_launcher=False)
        requests._launchers = [psutil.Process(launcher.pid)]
        assert requests.reason() is None and requests.watched_launchers == [launcher.pid]
        launcher.kill()
        if reaped:
            launcher.wait(10)
        else:  # a killed launcher nobody has waited for yet: a zombie
            deadline = time.monotonic() + 10
            while psutil.Process(launcher.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
                time.sleep(0.01)
            assert psutil.Process(launcher.pid).status() == psutil.STATUS_ZOMBIE
        reason = requests.reason()
        assert reason is not None and str(launcher.pid) in reason and "launcher" in reason
    finally:
        launcher.kill()
        launcher.wait(10)


def test_signals_take_precedence_over_a_gone_launcher(stops):
    launcher = subprocess.Popen([sys.executable, "-c", "pass"])
    stops._launchers = [psutil.Process(launcher.pid)]
    launcher.wait(10)
    assert "launcher" in stops.reason()
    stops.install()
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.01)
    assert stops.reason() == "SIGTERM"


# --- metrics -------------------------------------------------------------------------------------

def record(step: int) -> dict:
    return {"step": step, "loss": 10.0 / step, "lr": 1e-4, "tokens": step * 512}


def test_read_metrics_file_returns_good_records_and_bad_line_numbers(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps(record(1)), "", "[1, 2]", "\"text\"", "42", json.dumps(record(2)), "   ",
             json.dumps(record(3))[:-7]]
    path.write_text("\n".join(lines), encoding="utf-8")  # no newline after the half-written last line
    records, bad = read_metrics_file(path)
    assert records == [record(1), record(2)]
    assert bad == [3, 4, 5, 8]


@SETTINGS
@given(st.integers(1, 20), st.data())
def test_a_half_written_last_line_is_the_only_bad_line(n, data):
    lines = [json.dumps(record(step)) for step in range(1, n + 1)]
    cut = data.draw(st.integers(1, len(lines[-1]) - 1), label="characters of the last line written")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "metrics.jsonl"
        path.write_text("".join(line + "\n" for line in lines[:-1]) + lines[-1][:cut], encoding="utf-8")
        records, bad = read_metrics_file(path)
    assert records == [record(step) for step in range(1, n)]
    assert bad == [n]


def test_invalid_utf8_is_a_bad_line_not_a_crash(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(json.dumps(record(1)).encode() + b"\n\xff\xfe{\"step\n" + json.dumps(record(2)).encode() + b"\n")
    assert read_metrics_file(path) == ([record(1), record(2)], [2])


def test_the_cuda_allocators_counts_are_logged_on_cuda_only(monkeypatch):
    """What metrics.jsonl gets from the CUDA caching allocator each logged step: retries (a synchronize and
    cudaFree each), cudaMalloc calls and the peak allocated; nothing on the CPU."""
    assert cuda_allocator_counts(torch.device("cpu")) == {}
    stats = {"num_alloc_retries": 3, "num_device_alloc": 41, "allocated_bytes.all.peak": 3 * 2 ** 30}
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device: stats)
    assert cuda_allocator_counts(torch.device("cuda", 0)) == {"cuda_alloc_retries": 3, "cuda_mallocs": 41,
                                                               "peak_memory_gib": 3.0}


@pytest.mark.parametrize("initial_step", [0, 3, 6, 100])
def test_a_resumed_logger_keeps_complete_records_up_to_its_step_and_drops_the_bad_line(tmp_path, caplog,
                                                                                      initial_step):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps(record(step)) for step in range(1, 7)]
    path.write_text("".join(line + "\n" for line in lines) + json.dumps(record(7))[:11], encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="biomed_lm.pretrain.metrics"):
        logger = MetricsLogger(tmp_path, enabled=True, wandb_mode="disabled", wandb_project="p", run_name="r",
                               config={"train": {"seed": 1}}, total_steps=10, initial_step=initial_step)
    try:
        kept = [record(step) for step in range(1, min(initial_step, 6) + 1)]
        assert read_metrics_file(path) == (kept, [])
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and str(path) in warnings[0] and "line 7" in warnings[0]
        logger.log(record(initial_step + 1))
    finally:
        logger.close()
    assert read_metrics_file(path) == (kept + [record(initial_step + 1)], [])
    assert json.loads((tmp_path / "run_config.json").read_text()) == {"train": {"seed": 1}}


def test_a_clean_metrics_file_gives_no_warning(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(record(step)) + "\n" for step in range(1, 4)), encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="biomed_lm.pretrain.metrics"):
        MetricsLogger(tmp_path, enabled=True, wandb_mode="disabled", wandb_project="p", run_name="r", config={},
                      total_steps=10, initial_step=2).close()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert read_metrics_file(path) == ([record(1), record(2)], [])


def test_a_disabled_logger_touches_nothing(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("not json\n", encoding="utf-8")
    logger = MetricsLogger(tmp_path, enabled=False, wandb_mode="disabled", wandb_project="p", run_name="r",
                           config={}, total_steps=10, initial_step=0)
    logger.log(record(1))
    logger.close()
    assert path.read_text(encoding="utf-8") == "not json\n" and not (tmp_path / "run_config.json").exists()
