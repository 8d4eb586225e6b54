"""Pictures beside every run (RUN/images/*.png), the history they draw (history.jsonl), the
series they are drawn from, and `llama-npu report`'s page; on the shared six-step run and
copies of it resumed for one step."""
import hashlib
import html.parser
import json
import shutil
import subprocess

import numpy as np
import pytest
from matplotlib.image import imread

from conftest import read_metrics, run_cli
from llama_npu.report.series import run_series
from llama_npu.report.sparkline import sparkline

PICTURES = ["grad_norm.png", "loss.png", "lr.png", "memory.png", "throughput.png"]


def assert_drawn(path):
    """A PNG that decodes and shows something: more than one colour."""
    pixels = imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100, path
    assert float(np.std(pixels[..., :3])) > 0.01, f"{path} is blank"


def resumed_to_seven(six_step_run, tmp_path, *sets, before=None):
    out = tmp_path / "run"
    shutil.copytree(six_step_run[0], out)
    if before:
        before(out)
    proc = run_cli("train", "--resume", "auto", "--output-dir", out, "--set", "train.max_steps=7",
                   *[a for s in sets for a in ("--set", s)])
    return out, proc


def test_the_series_are_the_runs_metrics_and_its_history(six_step_run):
    out, _ = six_step_run
    rows = read_metrics(out)
    series = run_series(out)
    for name in ("loss", "lr", "grad_norm", "tokens_per_s", "step_seconds", "peak_memory_bytes"):
        assert series.curves[name] == ([r["step"] for r in rows], [r[name] for r in rows]), name
    assert series.memory_source == "host_rss" and series.objective == "sft" and not series.loss_scaling
    assert series.objective_metrics == [] and series.note is None
    assert [(e["event"], e["step"]) for e in series.events] == [("start", 0), ("end", 6)]


def test_a_run_leaves_its_pictures_and_the_loss_as_a_sparkline(six_step_run):
    out, proc = six_step_run
    assert sorted(p.name for p in (out / "images").iterdir()) == PICTURES  # no loss scale: none is used
    for name in PICTURES:
        assert_drawn(out / "images" / name)
    line = next(line for line in proc.stdout.splitlines() if line.startswith("loss curve"))
    assert line == f"loss curve     {sparkline([r['loss'] for r in read_metrics(out)])} (steps 1-6)"
    assert len(line.split()[2]) == 6 and set(line.split()[2]) <= set("▁▂▃▄▅▆▇█")


def test_sparkline_spans_the_blocks_and_averages_long_curves():
    assert sparkline([3.0, 2.0, 1.0]) == "█▅▁"
    assert sparkline(list(range(400)), width=40) == sparkline(list(range(40)), width=40)
    assert len(sparkline([float(i % 7) for i in range(1000)])) == 40
    assert sparkline([float("nan")]) == "" and sparkline([5.0, 5.0]) == "▅▅"


def test_a_resumed_run_draws_its_whole_history_with_the_resume_marked(six_step_run, tmp_path):
    out, proc = resumed_to_seven(six_step_run, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    series = run_series(out)
    assert series.curves["loss"][0] == list(range(1, 8))
    assert [(e["event"], e["step"]) for e in series.events] == [("start", 0), ("end", 6), ("resume", 6), ("end", 7)]
    assert series.events[2]["checkpoint"].endswith("step_6") and series.events[2]["discarded_steps"] == 0
    assert "loss curve     " in proc.stdout and "(steps 7-7)" in proc.stdout
    for name in PICTURES:
        assert_drawn(out / "images" / name)


def test_a_drawing_error_is_one_warning_line_and_the_run_goes_on(six_step_run, tmp_path):
    def images_is_a_file(out):
        shutil.rmtree(out / "images")
        (out / "images").write_text("not a directory")

    out, proc = resumed_to_seven(six_step_run, tmp_path, before=images_is_a_file)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [r["step"] for r in read_metrics(out)][-1] == 7 and (out / "checkpoints" / "step_7").is_dir()
    warnings = [line for line in proc.stderr.splitlines() if "pictures not drawn" in line]
    assert len(warnings) == 1 and warnings[0].startswith("[llama-npu] warning: pictures not drawn: ")
    assert "Traceback" not in proc.stderr


def test_plots_false_draws_no_picture(six_step_run, tmp_path):
    out, proc = resumed_to_seven(six_step_run, tmp_path, "train.plots=false",
                                 before=lambda out: shutil.rmtree(out / "images"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not (out / "images").exists()
    assert [e["event"] for e in run_series(out).events][-2:] == ["resume", "end"]  # the history is kept anyway


# ---------------------------------------------------------------- llama-npu report

class Page(html.parser.HTMLParser):
    """What a browser would load from the page: headings, images, scripts, links."""

    def __init__(self):
        super().__init__()
        self.headings, self.images, self.scripts, self.urls, self._in = [], [], 0, [], None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "script":
            self.scripts += 1
        if tag == "img":
            self.images.append(attrs.get("src", ""))
        self.urls += [value for name, value in attrs.items() if name in ("href", "src") and value
                      and not value.startswith(("data:", "#"))]
        self._in = tag if tag in ("h1", "h2") else None

    def handle_data(self, data):
        if self._in:
            self.headings.append(data)


def files_of(run):
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run.rglob("*")) if p.is_file()}


def test_report_of_two_runs_is_one_page_naming_both_with_every_picture_inline(six_step_run, tmp_path):
    first = six_step_run[0]
    second = tmp_path / "before-after"
    shutil.copytree(first, second)
    before = files_of(first), files_of(second)
    page_path = tmp_path / "out" / "report.html"
    (tmp_path / "out").mkdir()
    proc = run_cli("report", first, second, "-o", page_path)
    assert proc.returncode == 0, proc.stderr
    table = proc.stdout.splitlines()
    assert table[0].split()[:2] == ["run", "objective"] and table[-1] == f"wrote {page_path}"
    assert [line.split()[0] for line in table[1:3]] == [first.name, "before-after"]
    page = Page()
    page.feed(page_path.read_text(encoding="utf-8"))
    assert first.name in page.headings and "before-after" in page.headings
    assert page.scripts == 0 and page.urls == []
    # the overlays (6 quantities) and each run's own pictures, every one a PNG that decodes
    assert len(page.images) == 6 + 2 * len(PICTURES)
    for src in page.images:
        assert src.startswith("data:image/png;base64,")
    import base64
    import io
    assert_drawn(io.BytesIO(base64.b64decode(page.images[0].split(",", 1)[1])))
    assert "checkpoints/step_6" in page_path.read_text() and (files_of(first), files_of(second)) == before


def test_report_refuses_bad_input_in_one_line_and_reads_a_cut_last_line(six_step_run, tmp_path):
    run = six_step_run[0]
    out = tmp_path / "r.html"
    proc = run_cli("report", tmp_path, "-o", out)
    assert proc.returncode == 2 and proc.stderr.strip() == f"llama-npu: error: {tmp_path}: not a run directory " \
        "(no recipe.yaml; `llama-npu train` writes one)"
    empty = tmp_path / "empty"
    empty.mkdir()
    shutil.copy(run / "recipe.yaml", empty / "recipe.yaml")
    proc = run_cli("report", empty, "-o", out)
    assert proc.returncode == 2 and "no metrics.jsonl yet" in proc.stderr and len(proc.stderr.splitlines()) == 1
    other = tmp_path / "other"
    shutil.copytree(run, other)
    (other / "recipe.yaml").write_text((run / "recipe.yaml").read_text().replace("objective: sft", "objective: dpo"))
    proc = run_cli("report", run, other, "-o", out)
    assert proc.returncode == 2 and "different objectives" in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert not out.exists()

    cut = tmp_path / "cut"
    shutil.copytree(run, cut)
    text = (cut / "metrics.jsonl").read_text()
    (cut / "metrics.jsonl").write_text(text[:len(text) - 40])  # the kill came while step 6 was written
    proc = run_cli("report", cut, "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert "metrics.jsonl: line 6, the last, is cut short" in proc.stdout
    assert run_series(cut).curves["loss"][0] == [1, 2, 3, 4, 5] and "cut short" in out.read_text()
