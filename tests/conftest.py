"""Shared helpers: run the real CLI in a subprocess, read a run's metrics."""
from __future__ import annotations

import atexit
import fcntl
import fnmatch
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from llama_npu.common.frameworks import mute_mindformers_info, quiet_frameworks

REPO = Path(__file__).resolve().parent.parent
# hypothesis keeps a cache (.hypothesis/constants) in the directory it starts in, the checkout,
# even with database=None: give it one of its own, before tests/fuzz_inputs.py imports it.
if "HYPOTHESIS_STORAGE_DIRECTORY" not in os.environ:  # removed when the process ends: each run made one
    os.environ["HYPOTHESIS_STORAGE_DIRECTORY"] = tempfile.mkdtemp(prefix="llama-npu-hypothesis-")
    atexit.register(shutil.rmtree, os.environ["HYPOTHESIS_STORAGE_DIRECTORY"], True)
# eval --task keeps its compiled graphs under ~/.cache/llama-npu/compile; the suite's runs keep
# none, so that it leaves nothing in the home directory and two test processes never share one
# (test_exams.py checks the cache in a directory of its own).
os.environ.setdefault("LLAMA_NPU_COMPILE_CACHE", "off")
SMOKE = REPO / "recipes" / "cpu_smoke.yaml"

# scripts/test.sh runs the suite in two pytest-xdist processes, --dist loadgroup: each group
# runs whole in one process, so a session fixture is built once. A group is a file, or the
# files that share an expensive fixture (dp2_launch: a 2-worker launch; the conversions of a
# tiny Hugging Face model and the runs trained from them). Groups start heaviest first (the
# order measured in a fresh clone), so that the two processes finish together.
JOINED = {"test_parallel.py": "dp2_launch", "test_reliability.py": "dp2_launch",
          "test_convert.py": "conversions", "test_exams.py": "conversions", "test_chat_export.py": "conversions",
          "test_int8.py": "conversions",
          "test_preference.py": "conversions", "test_kto.py": "conversions", "test_verified_reads.py": "conversions"}
HEAVIEST_FIRST = ["dp2_launch", "conversions", "test_shipped_recipes.py", "test_train.py", "test_strategies.py",
                  "test_offload.py", "test_benchmarks.py", "test_selftest.py", "test_planner.py"]


# First: pytest-xdist's own hook (xdist/remote.py) reads the marks to name each test's group,
# and a conftest's hook would otherwise run after it, when there are none to read.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    def group(item):
        return JOINED.get(item.path.name, item.path.name)

    for item in items:
        item.add_marker(pytest.mark.xdist_group(group(item)))
    rank = {name: i for i, name in enumerate(HEAVIEST_FIRST)}
    items.sort(key=lambda item: rank.get(group(item), len(rank)))  # stable: a file keeps its own order

# Small enough that a run is compile (~15 s) plus well under a second a step on 2 cores.
TINY_RUN = ["--set", "data.max_seq_len=32", "--set", "train.micro_batch_size=2",
            "--set", "train.global_batch_size=0", "--set", "train.warmup_steps=2",
            "--set", "data.eval_files=[]"]
# The shared six-step run: a checkpoint at steps 3 and 6.
SIX_STEPS = [*TINY_RUN, "--set", "train.max_steps=6", "--set", "train.save_every=3", "--set", "train.keep_last=5"]


def shipped_view(root: Path, into: Path) -> Path:
    """`into` holding a link to each top-level entry of the checkout `root` that git tracks, and
    to its .venv: the checkout as shipped, without what a user's own work put there (runs/, a
    prepared data directory, kernel_meta/), which no test may read or write. Outside git (a
    source tree copied without .git) the entries .gitignore names are left out instead."""
    listed = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True)
    if listed.returncode == 0 and listed.stdout:
        names = {line.split("/", 1)[0] for line in listed.stdout.splitlines()}
    else:
        ignored = [line.strip().strip("/") for line in (root / ".gitignore").read_text().splitlines() if line.strip()]
        names = {p.name for p in root.iterdir() if not any(fnmatch.fnmatch(p.name, pattern) for pattern in ignored)}
    for name in names | {".venv"}:
        if (root / name).exists():
            (into / name).symlink_to(root / name)
    return into


def written_by_users(root: Path) -> set[str]:
    """Every path under the checkout but .git, .venv and Python's byte-code caches."""
    found = set()
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in {".git", ".venv", "__pycache__", ".pytest_cache"}]
        found.update(os.path.relpath(os.path.join(folder, name), root) for name in dirs + files)
    return found


@pytest.fixture(scope="session", autouse=True)
def shipped_checkout(request, tmp_path_factory):
    """Every test, and every command it starts, runs in a view of the checkout as shipped (see
    shipped_view): a user's runs/cpu_smoke, left by scripts/smoke.sh, made `validate` add "output
    directory ... is not empty" to the lines seven tests expected. At the end, the session fails
    if anything new appeared in the checkout or in the view: tests write under temporary
    directories only. Both xdist workers share one view, so that a run one worker made (a
    built_once fixture, whose recipe.yaml holds absolute data paths) resumes in the other."""
    before = written_by_users(REPO)
    if hasattr(request.config, "workerinput"):
        view = tmp_path_factory.getbasetemp().parent / "checkout"  # basetemp is the worker's popen-gwN
        with open(f"{view}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not view.exists():
                view.mkdir()
                shipped_view(REPO, view)
    else:
        view = shipped_view(REPO, tmp_path_factory.mktemp("checkout"))
    started_in = os.getcwd()
    os.chdir(view)
    yield view
    os.chdir(started_in)
    wrote = sorted(written_by_users(REPO) - before) + sorted(p.name for p in view.iterdir() if not p.is_symlink())
    assert not wrote, f"tests wrote into the checkout: {wrote[:20]}"


@pytest.fixture(scope="session", autouse=True)
def ms(shipped_checkout, tmp_path_factory):
    """MindSpore for in-process tests: CPU and GRAPH_MODE, set before any test runs a kernel;
    MindFormers' log files kept out of the repo and its INFO lines out of the output."""
    quiet_frameworks(tmp_path_factory.mktemp("framework-logs"))
    import mindspore

    mindspore.set_context(mode=mindspore.GRAPH_MODE)
    mindspore.set_device("CPU")
    mute_mindformers_info()
    return mindspore


@pytest.fixture(autouse=True)
def recycle_mindspore_memory():
    """After each test, the runtime memory MindSpore cached for the networks it ran: a worker
    that trains networks in-process keeps them all (a worker at 14 GB was OOM-killed beside a
    benchmark's subprocess; three of test_offload.py's tests leave 3.4 GB with this, 4.3 without)."""
    yield
    if "mindspore" in sys.modules:
        import gc

        gc.collect()
        sys.modules["mindspore"].ms_memory_recycle()


def run_cli(*args, timeout=600, check=False, env=None, cwd=None, **popen) -> subprocess.CompletedProcess:
    """The real command line in a subprocess, in the shipped checkout's view (the current
    directory, see shipped_checkout) unless `cwd` says where;
    `popen` goes to subprocess.run (e.g. preexec_fn)."""
    # elsewhere than the repository, `-m llama_npu` finds this checkout through PYTHONPATH
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-m", "llama_npu", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": path, **(env or {})}, **popen)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def start_training(out, *args, log_dir):
    """`llama-npu train` in the background, its output in files the test can poll."""
    log_dir.mkdir(parents=True, exist_ok=True)
    stdout, stderr = open(log_dir / "stdout", "w"), open(log_dir / "stderr", "w")
    return subprocess.Popen([sys.executable, "-m", "llama_npu", "train", str(SMOKE), "--output-dir", str(out),
                             *map(str, args)], stdout=stdout, stderr=stderr)


def free_port() -> int:
    """A port nothing listens on now, chosen by the kernel. A random draw from 20000-40000 was
    found taken in CI (by another test's process), and launch.sh refuses a taken MASTER_PORT."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until(condition, proc, what: str, timeout: float = 400) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            stderr = proc.stderr.read()[-2000:] if getattr(proc.stderr, "read", None) else ""
            raise AssertionError(f"training ended (exit {proc.returncode}) before {what}: {stderr}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def assert_same_steps(resumed_dir: Path, reference_dir: Path, steps) -> None:
    """A resumed run's records equal an uninterrupted run's for `steps` (exact resume)."""
    resumed = {r["step"]: r for r in read_metrics(resumed_dir)}
    reference = {r["step"]: r for r in read_metrics(reference_dir)}
    assert sorted(resumed) == sorted(reference)
    for step in steps:
        assert resumed[step]["loss"] == pytest.approx(reference[step]["loss"], abs=1e-6), step
        assert resumed[step]["lr"] == pytest.approx(reference[step]["lr"], rel=1e-12), step
        assert resumed[step]["samples_consumed"] == reference[step]["samples_consumed"], step


def built_once(request, tmp_path_factory, name: str, build) -> tuple[Path, subprocess.CompletedProcess]:
    """(directory, process) of `build(directory)`, once a session: under pytest-xdist the first
    worker to ask runs it in the session's shared temporary directory, holding a lock, and
    the other worker reads the process it kept there. Tests copy the directory to change it."""
    if not hasattr(request.config, "workerinput"):  # one pytest process
        out = tmp_path_factory.mktemp(name) / "run"
        return out, build(out)
    shared = tmp_path_factory.getbasetemp().parent / name  # basetemp is the worker's popen-gwN
    with open(f"{shared}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        kept = shared / "process.json"
        if not kept.exists():
            shared.mkdir(exist_ok=True)
            proc = build(shared / "run")
            kept.write_text(json.dumps({key: getattr(proc, key) for key in ("args", "returncode", "stdout", "stderr")}))
        return shared / "run", subprocess.CompletedProcess(**json.loads(kept.read_text()))


@pytest.fixture(scope="session")
def six_step_run(request, tmp_path_factory):
    """One real 6-step tiny run, checkpoint every 3 steps, shared by several tests in both
    xdist workers."""
    return built_once(request, tmp_path_factory, "six", lambda out: run_cli(
        "train", SMOKE, "--output-dir", out, *SIX_STEPS, check=True))



def run_launch(recipe, workers, *args, log_dir, env=None, timeout=300) -> subprocess.CompletedProcess:
    """scripts/launch.sh on CPU workers; the timeout is far below msrun's default cluster
    time-out (600 s), so a launch that waits it out fails the test."""
    env = {**os.environ, "MASTER_PORT": str(free_port()), "LOG_DIR": str(log_dir), **(env or {})}
    return subprocess.run(["bash", "scripts/launch.sh", str(recipe), str(workers), *map(str, args)],
                          env=env, capture_output=True, text=True, timeout=timeout)


# The launch scripts/fault_matrix.py injects its faults into (its ARGS): 8 steps, saving at 3 and 6.
EIGHT_STEPS = [*TINY_RUN, "--set", "train.max_steps=8", "--set", "train.save_every=3", "--set", "train.keep_last=3"]


@pytest.fixture(scope="session")
def dp2_launch(tmp_path_factory):
    """One uninterrupted 2-worker data-parallel launch of EIGHT_STEPS (data: auto -> 2), the
    reference of the data-parallel check and of the fault matrix: (run dir, process, worker logs)."""
    base = tmp_path_factory.mktemp("dp2")
    proc = run_launch(SMOKE, 2, "--output-dir", base / "run", *EIGHT_STEPS, log_dir=base / "logs",
                      env={"CLUSTER_TIME_OUT": "60"}, timeout=900)
    logs = {p.name: p.read_text() for p in (base / "logs").glob("worker_*.log")}
    return base / "run", proc, logs


@pytest.fixture(scope="session")
def single_process_run(request, tmp_path_factory) -> Path:
    """The data-parallel checks' reference: EIGHT_STEPS in one process, 4 samples a step (what
    2 ranks x 2 make)."""
    return built_once(request, tmp_path_factory, "single", lambda out: run_cli(
        "train", SMOKE, "--output-dir", out, *EIGHT_STEPS, "--set", "train.micro_batch_size=4", check=True))[0]


# ---------------------------------------------------------------- tiny Hugging Face model, its conversions and runs
# (shared by test_convert.py and test_exams.py)

def script_module(name: str):
    """scripts/<name>.py as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tiny_hf_script():
    return script_module("make_tiny_hf_model")


@pytest.fixture(scope="session")
def hf_dir(tmp_path_factory):
    """A tiny random Llama 3.2 (llama3 RoPE scaling, GQA 4/2, tied embeddings) saved by transformers,
    made by the script the docs tell users to run."""
    path = tmp_path_factory.mktemp("hf") / "tiny-llama3.2"
    model = _tiny_hf_script().make_tiny_hf_model(path)
    return path, model


@pytest.fixture(scope="session")
def conversions(hf_dir, tmp_path_factory):
    """dtype -> the tiny model converted by `convert hf-to-ms --dtype`, shared by the tests that only read it."""
    out = tmp_path_factory.mktemp("converted")
    for dtype in ("float32", "float16"):
        run_cli("convert", "hf-to-ms", "--src", hf_dir[0], "--dst", out / dtype, "--dtype", dtype, check=True)
    return {dtype: out / dtype for dtype in ("float32", "float16")}


def rehearsal_sets(checkpoint) -> list:
    """The --set of a shipped recipe's rehearsal (`train --rehearse`: tiny model, CPU, the
    recipe's own precision with bfloat16 as float16) started from `checkpoint`, at a learning
    rate at which a few steps visibly move LoRA adapters."""
    return ["model.preset=tiny", f"model.checkpoint={checkpoint}", "train.optimizer.lr=0.05"]


LORA_RECIPE = REPO / "recipes" / "llama3_2_3b_zh_lora_910a.yaml"


@pytest.fixture(scope="session")
def shrunk_run(conversions, tmp_path_factory):
    """(recipe, dtype) -> (run directory, process) of that recipe shrunk to tiny, started from
    the `dtype` conversion; each trained once per session, as a user starts a run: in a
    working directory where the conversion (weights/DTYPE), the data (data/, as the recipes
    name it) and the output directory are relative paths."""
    work = tmp_path_factory.mktemp("shrunk")
    (work / "weights").mkdir()
    for dtype, path in conversions.items():
        (work / "weights" / dtype).symlink_to(path)
    (work / "data").symlink_to(REPO / "data")
    runs = {}

    def run(path, dtype):
        if (path, dtype) not in runs:
            name = f"{path.stem}-{dtype}"
            runs[path, dtype] = work / name, run_cli(
                "train", path, "--output-dir", name, "--rehearse",
                *[a for s in rehearsal_sets(f"weights/{dtype}") for a in ("--set", s)], cwd=work)
        return runs[path, dtype]
    return run


@pytest.fixture(scope="session")
def lora_export(shrunk_run, tmp_path_factory):
    """The shrunk LoRA recipe's run directory and its `convert ms-to-hf --src RUN` export."""
    run, proc = shrunk_run(LORA_RECIPE, "float32")
    assert proc.returncode == 0, proc.stderr[-3000:]
    export = tmp_path_factory.mktemp("lora-export") / "hf"
    # float32, not the float16 the run computed in (its default): the tests compare its logits to ours to 1e-4
    run_cli("convert", "ms-to-hf", "--src", run, "--dst", export, "--dtype", "float32", check=True)
    return run, export


def write_layouts(records: list, directory: Path, stem: str = "data") -> dict:
    """suffix -> the same records as a JSON array, CSV, TSV, .xlsx and Parquet file (a list or
    mapping value as JSON text in the spreadsheets, as an export of it holds it), and as JSONL."""
    import csv

    import pyarrow as pa
    import pyarrow.parquet as pq
    from openpyxl import Workbook

    directory.mkdir(parents=True, exist_ok=True)
    header = list(dict.fromkeys(key for record in records for key in record))
    cells = [[v if isinstance(v, str) else json.dumps(v, ensure_ascii=False) for v in (r.get(k, "") for k in header)]
             for r in records]
    paths = {suffix: directory / f"{stem}{suffix}" for suffix in (".jsonl", ".json", ".csv", ".tsv", ".xlsx", ".parquet")}
    paths[".jsonl"].write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    paths[".json"].write_text(json.dumps(records, ensure_ascii=False, indent=1), encoding="utf-8")
    for suffix in (".csv", ".tsv"):
        with open(paths[suffix], "w", encoding="utf-8", newline="") as fh:
            csv.writer(fh, delimiter="\t" if suffix == ".tsv" else ",").writerows([header, *cells])
    book = Workbook()
    for row in [header, *cells]:
        book.active.append(row)
    book.save(paths[".xlsx"])
    # every key a column: from_pylist alone takes its columns from the first record, and a later
    # record's system message was lost (its Parquet copy scored other tokens once data.truncation kept them)
    pq.write_table(pa.Table.from_pydict({k: [r.get(k) for r in records] for k in header}), paths[".parquet"])
    return paths
