"""Fine-tuning's training order (finetune.trainer._training_order): every feature once an epoch,
seeded, and with group_by_length (the default) in batches of similar lengths, which the collator pads
to less; without it, exactly the order of the uniformly shuffled loader runs had before the option."""

from __future__ import annotations

import json
import subprocess
from dataclasses import fields
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from biomed_lm.finetune.blurb import TRAIN
from biomed_lm.finetune.trainer import RUN_RECORD, FinetuneArgs, _training_loader
from tests.conftest import REPO, free_port, ncbi_slice
from tests.pretrain_runs import deepspeed_launcher, env

lengths_lists = st.lists(st.integers(min_value=1, max_value=128), min_size=1, max_size=300)


def _features(lengths: list[int]) -> list[dict]:
    return [{"input_ids": [0] * n, "index": i} for i, n in enumerate(lengths)]


def _loader(lengths: list[int], batch_size: int, group_by_length: bool, seed: int = 0, world_size: int = 1,
            rank: int = 0):
    """The trainer's training loader over features that carry their index (a batch: their list)."""
    args = SimpleNamespace(batch_size=batch_size, seed=seed, group_by_length=group_by_length, num_workers=0)
    data = SimpleNamespace(features={TRAIN: _features(lengths)}, generator=torch.Generator().manual_seed(seed),
                           task=SimpleNamespace(collate=list))
    return _training_loader(args, data, SimpleNamespace(world_size=world_size, rank=rank,
                                                        device=torch.device("cpu")))


def _epoch(loader) -> list[int]:
    return [feature["index"] for batch in loader for feature in batch]


def _order(lengths: list[int], batch_size: int, group_by_length: bool, seed: int = 0, world_size: int = 1,
           rank: int = 0, epoch: int | None = None) -> list[int]:
    loader = _loader(lengths, batch_size, group_by_length, seed, world_size, rank)
    if epoch is not None:
        loader.sampler.set_epoch(epoch)
    return _epoch(loader)


def _padding_share(lengths: list[int], order: list[int], batch_size: int) -> float:
    real = padded = 0
    for begin in range(0, len(order), batch_size):
        batch = [lengths[i] for i in order[begin:begin + batch_size]]
        real, padded = real + sum(batch), padded + max(batch) * len(batch)
    return 1 - real / padded


@settings(max_examples=40, deadline=None)
@given(lengths=lengths_lists, batch_size=st.integers(min_value=1, max_value=40), grouped=st.booleans(),
       seed=st.integers(min_value=0, max_value=2 ** 16))
def test_every_feature_comes_once_an_epoch_and_a_seed_repeats_its_order(lengths, batch_size, grouped, seed):
    order = _order(lengths, batch_size, grouped, seed)
    assert sorted(order) == list(range(len(lengths)))
    assert _order(lengths, batch_size, grouped, seed) == order


@settings(max_examples=30, deadline=None)
@given(lengths=lengths_lists, batch_size=st.integers(min_value=1, max_value=16), grouped=st.booleans(),
       world_size=st.integers(min_value=2, max_value=4))
def test_ranks_share_every_feature_between_them(lengths, batch_size, grouped, world_size):
    """Each rank's share of an epoch; together they hold every feature (the last global batch topped
    up with features from the epoch's start, as DistributedSampler does)."""
    shares = [_order(lengths, batch_size * world_size, grouped, world_size=world_size, rank=r, epoch=1)
              for r in range(world_size)]
    assert len({len(share) for share in shares}) == 1
    assert set().union(*shares) == set(range(len(lengths)))
    assert sum(len(share) for share in shares) - len(lengths) < world_size


def test_without_grouping_the_order_is_the_shuffled_loader_runs_had():
    """Runs before the option shuffled with DataLoader(shuffle=True, generator=the seeded generator)."""
    before = [int(index) for index in DataLoader(list(range(100)), batch_size=1, shuffle=True,
                                                 generator=torch.Generator().manual_seed(3))]
    assert _order(list(range(1, 101)), 8, group_by_length=False, seed=3) == before


def test_grouped_batches_pad_far_less_and_each_epoch_draws_a_new_order():
    """NCBI-disease-like lengths (sub-words per sentence, mean 34): uniformly shuffled batches of 32 are
    more than half padding; grouped ones well under a tenth. Successive epochs (one seeded generator,
    as a run has) differ."""
    lengths = np.random.default_rng(0).lognormal(np.log(30), 0.5, 5000).clip(5, 128).astype(int).tolist()
    grouped, shuffled = _order(lengths, 32, True), _order(lengths, 32, False)
    assert _padding_share(lengths, shuffled, 32) > 0.4
    assert _padding_share(lengths, grouped, 32) < 0.1
    assert {f.name: f.default for f in fields(FinetuneArgs)}["group_by_length"] is True  # the default
    loader = _loader(lengths, 32, True)
    assert _epoch(loader) != _epoch(loader)


def test_two_ranks_fine_tune_on_their_shares_of_length_grouped_batches(tiny_bert, tmp_path):
    """deepspeed --num_gpus 2 launch/finetune.py (two CPU ranks over gloo): each rank trains on its share
    of every length-grouped global batch, epoch after epoch, and rank 0 writes the complete record."""
    launcher = deepspeed_launcher()
    if launcher is None:
        pytest.skip("the deepspeed launcher is not installed")
    data, out = ncbi_slice(tmp_path, train=40, eval_=8), tmp_path / "ft"
    done = subprocess.run([launcher, "--num_gpus", "2", "--master_port", str(free_port()), "launch/finetune.py",
                           "--deepspeed", "--model", str(tiny_bert), "--dataset", "ncbi-disease",
                           "--data_dir", str(data), "--output_dir", str(out), "--learning_rate", "5e-4",
                           "--batch_size", "8", "--epochs", "2", "--seed", "1"],
                          cwd=REPO, env=env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((out / RUN_RECORD).read_text())
    assert record["status"] == "complete" and record["world_size"] == 2 and record["deepspeed"] is True
    assert record["settings"]["group_by_length"] is True and len(record["dev_per_epoch"]) == 2
    assert record["total_steps"] == 2 * 40 // 8  # 4 examples a rank a step: each its own share
    # Every rank runs the same steps, and rank 0 alone says them (each line came twice before)
    assert sum("test score:" in line for line in done.stdout.splitlines()) == 1, done.stdout
    assert sum("epoch 2: train loss" in line for line in done.stderr.splitlines()) == 1, done.stderr[-3000:]
