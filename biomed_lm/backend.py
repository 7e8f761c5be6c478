"""The training backend shared by pretraining and fine-tuning: one DeepSpeed config generator and
one way to start (or not start) a distributed job.

Both trainers hand their step to the same engine, configured the same way: the DeepSpeed config is
*generated* from the typed arguments by :func:`ds_config` (batch, accumulation, clipping, precision,
ZeRO), never written by hand, so it cannot disagree with the run record; :func:`start_distributed`
joins the process group (gloo on CPU, NCCL on GPUs) or, without DeepSpeed, picks the one device of
a single process. torch and deepspeed are imported only when a job starts, so configs can be
generated and checked without them.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Literal, get_args

from biomed_lm.errors import BiomedLMError, ConfigError, exception_chain

if TYPE_CHECKING:
    import torch

__all__ = ["Precision", "PRECISIONS", "ZeroStage", "OptimizerName", "ScheduleName", "ds_config",
           "initialize_engine", "ensure_distributed_env", "DistributedContext", "start_distributed", "local_device",
           "decided_on_rank0", "lost_peer_reason", "end_distributed", "release_shm_buffer_name", "SHM_COMM_OP",
           "announce_op_build", "extensions_dir_of_this_install", "launched_rank", "rank0_log",
           "use_extensions_dir_of_this_install"]

#: The precisions a run trains in through this backend (pretraining's fp8 runs DeepSpeed in bf16).
Precision = Literal["fp32", "bf16", "fp16"]
PRECISIONS: tuple[str, ...] = get_args(Precision)
#: DeepSpeed ZeRO stages (3 is not needed for BERT-sized models).
ZeroStage = Literal[0, 1, 2]
#: The optimizers and learning-rate schedules both trainers hand the engine (built by
#: :mod:`biomed_lm.optim`; named here, where no torch import is needed to check a config).
OptimizerName = Literal["adamw", "lamb"]
ScheduleName = Literal["slanted_triangular", "polynomial", "polynomial_from_start", "constant_with_warmup"]


def ds_config(*, global_batch_size: int, micro_batch_size: int, gradient_accumulation_steps: int,
              max_grad_norm: float, precision: str, zero_stage: int) -> dict[str, Any]:
    """The DeepSpeed config of a run. Progress and metrics are ours (DeepSpeed prints nothing), and
    our optimizers are passed to ``deepspeed.initialize`` as client optimizers."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    config: dict[str, Any] = {
        "train_batch_size": global_batch_size,
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": gradient_accumulation_steps,
        "gradient_clipping": max_grad_norm,
        "steps_per_print": 10 ** 9,  # progress and metrics are ours
        "wall_clock_breakdown": False,
        "zero_optimization": {"stage": zero_stage},
        "zero_allow_untested_optimizer": True,
    }
    config.update(_precision_block(precision))
    return config


def _precision_block(precision: str) -> dict[str, Any]:
    if precision == "fp16":
        return {"fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}}
    if precision != "bf16":
        return {}
    # Autocast, not DeepSpeed's bf16 mode: the weights, their gradients (accumulated over
    # micro-batches) and the optimizer stay fp32 while matrix multiplies run in bf16. bf16 mode
    # would accumulate gradients in bf16 at ZeRO stage 0 (0.3-0.6% off fp32 over 16 micro-batches),
    # and it wraps a client optimizer in DeepSpeed's FP16_UnfusedOptimizer, which reads every
    # parameter's overflow check and two norms back to the host each step (42 reads for a 2-layer
    # BERT: tests/test_finetune_adapters.py), each a wait for the GPU.
    # grad_accum_dtype is said explicitly (and checked by DeepSpeed against the fp32 weights).
    return {"torch_autocast": {"enabled": True, "dtype": "bfloat16"}, "data_types": {"grad_accum_dtype": "fp32"}}


def initialize_engine(model, optimizer, lr_scheduler, config: dict[str, Any]):
    """``deepspeed.initialize`` with our client optimizer and schedule; returns the engine. A run of one
    data-parallel rank without ZeRO skips DeepSpeed's gradient all-reduce, which would still flatten
    every gradient into buckets, reduce them over the one rank and copy each back: identity work, a
    copy kernel per parameter each step."""
    import deepspeed

    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=lr_scheduler, config=config)
    if engine.dp_world_size == 1 and engine.zero_optimization_stage() == 0:
        engine.enable_backward_allreduce = False
    return engine


def ensure_distributed_env() -> None:
    """Let a script run as a single process without a launcher: without these variables DeepSpeed
    would try to discover an MPI launcher."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=os.environ.get("MASTER_PORT", str(port)))


@dataclass(frozen=True)
class DistributedContext:
    """Where this process runs: a single CPU/GPU process, or one rank of a DeepSpeed job."""

    rank: int
    world_size: int
    device: "torch.device"
    deepspeed: bool


def local_device(local_rank: int) -> "torch.device":
    """This rank's GPU (made current), or the CPU when there is none."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def start_distributed(deepspeed: bool = True, program: str = "biomed-lm") -> DistributedContext:
    """Join the DeepSpeed process group (gloo on CPU, NCCL on GPUs; a single process without a
    launcher is rank 0 of 1), or with ``deepspeed=False`` run as one plain process on the GPU if
    there is one. ``program`` names the stage in the line said before a start that builds DeepSpeed's op."""
    import torch

    if not deepspeed:
        _refuse_launcher_without_deepspeed()
        return DistributedContext(0, 1, torch.device("cuda" if torch.cuda.is_available() else "cpu"), False)
    import deepspeed as ds
    import torch.distributed as dist

    ensure_distributed_env()
    use_extensions_dir_of_this_install()
    announce_op_build(program)
    try:
        ds.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo", verbose=False)
    except RuntimeError as err:
        if _op_build_interrupted(err):  # Ctrl-C reached ninja first: torch reports a failed build
            raise KeyboardInterrupt from err
        raise
    device = local_device(int(os.environ.get("LOCAL_RANK", "0")))
    if device.type == "cpu" and dist.get_world_size() > 1:
        dist.barrier()  # every rank has mapped its peers' all-reduce buffers: the names can go
        release_shm_buffer_name(dist.get_rank())
    return DistributedContext(dist.get_rank(), dist.get_world_size(), device, True)


#: DeepSpeed's shared-memory all-reduce op: its CPU accelerator JIT-builds it when the process group starts
#: (75 s on 2 cores) unless this install's build is in torch's extension folder.
SHM_COMM_OP = "deepspeed_shm_comm"


def launched_rank() -> int:
    """This process's rank as its launcher set it (``RANK``), 0 without a launcher: known before the
    process group starts, and where the group is long gone (a launcher's last line)."""
    return int(os.environ.get("RANK", "0"))


def rank0_log(rank: int, log: Callable[[str], None]) -> Callable[[str], None]:
    """``log`` on rank 0, a log that says nothing on the others: every rank runs the same steps and
    reaches the same lines, and one rank says them (a rank's own error is still its own line)."""
    return log if rank == 0 else (lambda message: None)


def announce_op_build(program: str) -> None:
    """One line from rank 0 before a start that builds DeepSpeed's CPU op: the build prints nothing for about
    a minute, which looked like a hang (QA, 2026-11-28). Ranks are known from the launcher's RANK here."""
    if launched_rank() != 0:
        return
    folder = _op_build_ahead()
    if folder is not None:
        print(f"{program}: starting DeepSpeed (the first launch with this install builds its CPU op {SHM_COMM_OP} "
              f"in {folder}: about a minute)", file=sys.stderr, flush=True)


def _op_build_ahead() -> Path | None:
    """The folder DeepSpeed is about to build its CPU op in, or None when it will not build it: on a GPU, with
    the op installed prebuilt, or with this install's build there. Ninja rebuilds when the last build was
    another install's (another virtualenv sharing the folder), which its ``build.ninja`` names."""
    import importlib.util

    import torch

    if torch.cuda.is_available() or sys.platform != "linux":
        return None  # only the CPU accelerator uses the op, and only on Linux
    from deepspeed.git_version_info import installed_ops

    if installed_ops.get(SHM_COMM_OP):
        return None
    folder = _torch_extensions_dir() / SHM_COMM_OP
    deepspeed_dir = Path(importlib.util.find_spec("deepspeed").origin).parent
    try:
        build_file = (folder / "build.ninja").read_text(encoding="utf-8")
    except OSError:
        return folder
    ours = all(str(path) in build_file for path in (deepspeed_dir / "ops" / "csrc", Path(torch.__file__).parent))
    # Without its .ninja_log (an interrupted build leaves none) ninja rebuilds everything ("build log
    # version is too old; starting over").
    built = all((folder / name).is_file() for name in (f"{SHM_COMM_OP}.so", ".ninja_log"))
    return None if ours and built else folder


def _op_build_interrupted(err: BaseException) -> bool:
    """Whether ``err`` is torch's "Error building extension" for a ninja that SIGINT stopped (exit 130),
    which is how Ctrl-C during the op's build reaches this process (QA: a page of build traceback per rank)."""
    import subprocess

    return any(isinstance(e, subprocess.CalledProcessError) and e.returncode in (130, -2)
               or "interrupted by user" in str(e) for e in exception_chain(err))


def use_extensions_dir_of_this_install() -> None:
    """Unless the user set ``TORCH_EXTENSIONS_DIR``, point it at a folder of this install's own inside torch's:
    torch keeps one folder per op for every virtualenv, and ninja rebuilds an op whose last build was another
    install's, so two virtualenvs on one host rebuilt DeepSpeed's CPU op in turn, about a minute per launch
    (QA: a 4-step pretraining took 88 s; 18 s without the rebuild). Every rank derives the same folder."""
    if os.environ.get("TORCH_EXTENSIONS_DIR") is None:
        os.environ["TORCH_EXTENSIONS_DIR"] = str(extensions_dir_of_this_install())


def extensions_dir_of_this_install() -> Path:
    """``<torch's extension folder>/install-<digest of DeepSpeed's and torch's folders>``."""
    import hashlib
    import importlib.util

    import torch

    deepspeed_dir = Path(importlib.util.find_spec("deepspeed").origin).parent
    digest = hashlib.sha1(f"{deepspeed_dir}\0{Path(torch.__file__).parent}".encode()).hexdigest()[:12]
    return _torch_default_extensions_dir() / f"install-{digest}"


def _torch_extensions_dir() -> Path:
    """Where torch JIT-builds extensions (``torch.utils.cpp_extension``'s own rule, which it keeps private)."""
    if os.environ.get("TORCH_EXTENSIONS_DIR") is not None:
        return Path(os.environ["TORCH_EXTENSIONS_DIR"])
    return _torch_default_extensions_dir()


def _torch_default_extensions_dir() -> Path:
    import torch
    from torch.utils.cpp_extension import get_default_build_root

    device = f"rocm{torch.version.hip.replace('.', '')}" if torch.version.hip else \
        f"cu{torch.version.cuda.replace('.', '')}" if torch.version.cuda else "cpu"
    return Path(get_default_build_root(), f"py{sys.version_info.major}{sys.version_info.minor}{sys.abiflags}_{device}")


def _refuse_launcher_without_deepspeed() -> None:
    """A launcher that started several ranks of a run that will not join them: each rank would train alone on the
    same data and write the same output files (and each would take the run lock only one can hold)."""
    world_size = os.environ.get("WORLD_SIZE", "1")
    if world_size.isdigit() and int(world_size) > 1:
        raise ConfigError(f"--deepspeed false, but a launcher started this run as {world_size} ranks "
                          "(WORLD_SIZE): each rank would train alone and write the same files. Pass --deepspeed "
                          "to train as one job on every rank, or run it with python as one process")


def decided_on_rank0(rank: int, decide: Callable[[], Any], share: bool = True) -> Any:
    """``decide()`` run on rank 0 alone (the process group joined). Its error for the user
    (:class:`BiomedLMError`: a bad option, the run lock's refusal) reaches every rank, which raise it
    together rather than leave rank 0's peers waiting in a collective; its result reaches them too with
    ``share`` (otherwise they get None)."""
    import torch.distributed as dist

    result, outcome = None, [None, None]  # [error, shared result]
    if rank == 0:
        try:
            result = decide()
            outcome[1] = result if share else None
        except BiomedLMError as err:
            outcome[0] = err
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(outcome, src=0)
    if outcome[0] is not None:
        raise outcome[0]
    return result if rank == 0 else outcome[1]


class LostRank(RuntimeError):
    """Another rank is gone in the middle of a job of several ranks (killed, out of memory, crashed): this
    rank's collective failed. Its traceback says nothing about why (that rank's own output does); the
    message says what was kept and what the same command does next."""


def lost_rank(err: BaseException, rank: int, world_size: int, kept: str) -> LostRank | None:
    """``err`` as a :class:`LostRank` whose one line says which rank saw it, the transport's words and
    ``kept`` (what survives and what a re-run does); None when ``err`` is not a lost peer."""
    reason = lost_peer_reason(err)
    if reason is None:
        return None
    return LostRank(f"rank {rank}: another rank of the {world_size} is gone ({reason}); its own output says why "
                    f"(killed, out of memory, an error). {kept}")


#: What gloo and NCCL say when a collective's peer is gone (killed, out of memory, crashed): the
#: connection to it ended, or the communicator was aborted.
_LOST_PEER_SIGNS = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "remote process exited",
                    "NCCL communicator was aborted", "ncclRemoteError")


def lost_peer_reason(err: BaseException) -> str | None:
    """The transport's own words (gloo's or NCCL's first line, without its source location) when ``err``
    is a collective that failed because another rank is gone, else None: a failure of this rank's own
    code is not one, and keeps its traceback."""
    import torch

    if not isinstance(err, (RuntimeError, torch.distributed.DistError)):
        return None
    first_line = str(err).strip().splitlines()[0] if str(err).strip() else ""
    if not any(sign in first_line for sign in _LOST_PEER_SIGNS):
        return None
    reason = re.sub(r"^\[[^\]]*\]\s*", "", first_line)  # "[.../gloo/transport/tcp/pair.cc:537] Read error ..."
    return reason.split(". This is typically")[0][:300]


def end_distributed() -> None:
    """Leave the process group, if this process joined one. Call it where every rank ends alike (a
    finished run; an error every rank raises before training): a process that exits with gloo's
    threads still running can abort at interpreter shutdown (``terminate called without an active
    exception``), turning exit status 2 into SIGABRT (seen once in CI, on a run-lock refusal)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def release_shm_buffer_name(rank: int) -> None:
    """Unlink this rank's name of DeepSpeed's CPU all-reduce buffer.

    On CPU, when every rank is on one machine, DeepSpeed maps a shared-memory workspace per rank
    (``/dev/shm/deepspeed_allreduce_buffer_<uid>_<addr>_<port>_<rank>``, 69 MB) and never unlinks
    it: each two-rank launch left 138 MB of RAM behind, killed or not (172 such files, 12 GB, after a
    day of tests here). Once every rank has opened its peers' buffers, which DeepSpeed does while the
    process group starts, the name is no longer needed: the mappings stay valid, and the kernel frees
    the memory when the last rank exits, however it exits."""
    name = (f"deepspeed_allreduce_buffer_{os.getuid()}_{os.environ.get('MASTER_ADDR', '')}_"
            f"{os.environ.get('MASTER_PORT', '')}_{rank}")
    try:
        os.unlink(os.path.join("/dev/shm", name))
    except FileNotFoundError:  # not created: ranks on several machines, or another accelerator
        pass
