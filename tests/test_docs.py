"""The README and the guide in docs/: short enough to read, mirrored in Chinese, no dead links.

A reader switching language lands on the same section: each page's `.zh-CN.md` mirror has
the same headings (count and levels, in order). Every local link, and its #anchor under
GitHub's slug rules, must lead somewhere.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = sorted([REPO / "README.md", REPO / "README.zh-CN.md", *(REPO / "docs").glob("*.md")])
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def prose_lines(path: Path) -> list[str]:
    """The page's lines outside fenced code blocks (a `# comment` in a bash block is no heading)."""
    lines, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def headings(path: Path) -> list[tuple[int, str]]:
    return [(len(m.group(1)), m.group(2).strip())
            for m in (re.match(r"(#{1,6}) (.+)", line) for line in prose_lines(path)) if m]


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text (code and link markup dropped),
    lower case, everything but letters, digits, '_', '-' and spaces removed, spaces -> '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, text in headings(path):
        slug = github_slug(text)
        out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return out


def mirror(path: Path) -> Path:
    if path.name.endswith(".zh-CN.md"):
        return path.with_name(path.name.replace(".zh-CN.md", ".md"))
    return path.with_name(path.name[:-len(".md")] + ".zh-CN.md")


@pytest.mark.quick
def test_readme_is_read_in_one_sitting():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move reference material into docs/"
    assert lines[2] == "```bash" and lines[3].startswith("scripts/smoke.sh ") \
        and lines[4].startswith("scripts/test.sh "), "the two set-up commands come first"


@pytest.mark.parametrize("page", [p for p in PAGES if not p.name.endswith(".zh-CN.md")],
                         ids=lambda p: p.relative_to(REPO).as_posix())
@pytest.mark.quick
def test_every_page_has_a_chinese_mirror_with_the_same_headings(page):
    zh = mirror(page)
    assert zh.exists(), f"{zh.relative_to(REPO)} is missing"
    en_levels = [level for level, _ in headings(page)]
    zh_levels = [level for level, _ in headings(zh)]
    assert en_levels == zh_levels, (
        f"{page.name} headings {headings(page)} do not match {zh.name} headings {headings(zh)}")


@pytest.mark.quick
def test_every_chinese_page_mirrors_an_english_one():
    orphans = [p.name for p in PAGES if p.name.endswith(".zh-CN.md") and not mirror(p).exists()]
    assert not orphans


@pytest.mark.quick
def test_every_local_link_and_anchor_resolves():
    dead = []
    for page in PAGES:
        for line in prose_lines(page):
            for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
                if re.match(r"[a-z]+:", target):  # http(s):, mailto: -- not ours to check
                    continue
                file_part, _, anchor = target.partition("#")
                dest = (page.parent / file_part).resolve() if file_part else page
                if not dest.exists():
                    dead.append(f"{page.relative_to(REPO)}: {target}: no such file")
                elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                    dead.append(f"{page.relative_to(REPO)}: {target}: no heading with that anchor")
    assert not dead, "\n".join(dead)


@pytest.mark.parametrize("heading, slug", [
    ("Will it fit? (`llama-npu plan`)", "will-it-fit-llama-npu-plan"),
    ("放得下吗？（`llama-npu plan`）", "放得下吗llama-npu-plan"),
    ("The smoke recipe's matrix on this CPU", "the-smoke-recipes-matrix-on-this-cpu"),
])
def test_slugs_follow_github(heading, slug):
    assert github_slug(heading) == slug


def two_node_steps(page: Path) -> str:
    text = page.read_text(encoding="utf-8")
    start = text.index("## Two nodes" if page.name == "multi-device.md" else "## 两个节点")
    return text[start:text.index("\n## ", start + 1)]


@pytest.mark.parametrize("page", ["multi-device.md", "multi-device.zh-CN.md"])
@pytest.mark.quick
def test_the_two_node_checklist_is_numbered_steps_whose_commands_parse(page):
    """The steps a user follows on two servers: seven, in order, in both languages; every
    llama-npu command in them parses, every variable launch.sh is given it reads, and the
    HCCL interface variables are CANN's names."""
    import shlex

    from llama_npu.cli import build_parser

    section = two_node_steps(REPO / "docs" / page)
    assert re.findall(r"^(\d+)\. \*\*", section, re.M) == [str(n) for n in range(1, 8)]
    commands = [line.strip() for line in re.findall(r"`(llama-npu [^`]+)`|^\s*(llama-npu .+)$", section, re.M)
                for line in line if line]
    assert {c.split()[1] for c in commands} == {"validate", "doctor", "merge-checkpoints", "train"}
    for command in commands:
        build_parser().parse_args(shlex.split(command)[1:])  # exits (2) on an unknown option
    launch = (REPO / "scripts" / "launch.sh").read_text()
    for variable in re.findall(r"\b([A-Z_]+)=\S+ (?:\\|scripts/launch\.sh)", section) + ["MASTER_ADDR", "MASTER_PORT"]:
        assert variable in launch, variable
    assert "source /usr/local/Ascend/ascend-toolkit/set_env.sh" in section
    assert "HCCL_SOCKET_IFNAME==" in section and "HCCL_IF_IP=" in section
    assert section.count("kill -9") == 1  # said once


def first_run_section(page: Path) -> str:
    text = page.read_text(encoding="utf-8")
    start = text.index("## First run on a new card" if page.name == "ascend.md" else "## 新卡上的第一次运行")
    return text[start:text.index("\n## ", start + 1)]


@pytest.mark.parametrize("page", ["ascend.md", "ascend.zh-CN.md"])
@pytest.mark.quick
def test_the_first_run_protocol_is_five_numbered_commands_in_order_that_parse(page):
    """On a new card, in both languages: doctor, selftest, validate, the rehearsal, then 20 steps
    of the 3B offload recipe, each a numbered step whose command parses."""
    import shlex

    from llama_npu.cli import build_parser

    steps = re.findall(r"^(\d+)\. \*\*`(llama-npu [^`]+)`\*\*", first_run_section(REPO / "docs" / page), re.M)
    assert [number for number, _ in steps] == ["1", "2", "3", "4", "5"]
    commands = [shlex.split(command)[1:] for _, command in steps]
    assert [c[0] for c in commands] == ["doctor", "selftest", "validate", "train", "train"]
    recipe = "recipes/llama3_2_3b_zh_full_offload_910a.yaml"
    assert commands[3] == ["train", recipe, "--rehearse"]
    assert commands[4][:4] == ["train", recipe, "--set", "train.max_steps=20"]
    for command in commands:
        build_parser().parse_args(command)  # exits (2) on an unknown option


def test_the_first_run_comparison_reads_a_real_runs_metrics(six_step_run, tmp_path):
    """The page's script (the same in both languages) on a real run's metrics.jsonl: the median
    over the steps after the first that did not overflow, the peak against the planned peak."""
    import subprocess
    import sys

    scripts = {re.search(r"python - <<'PY'\n(.*?)\nPY\n", first_run_section(REPO / "docs" / page), re.S).group(1)
               for page in ("ascend.md", "ascend.zh-CN.md")}
    assert len(scripts) == 1
    script = scripts.pop().replace("runs/first_run", str(six_step_run[0]))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    records = [json.loads(line) for line in (six_step_run[0] / "metrics.jsonl").read_text().splitlines()]
    timed = sum(not r["overflow"] for r in records[1:])
    assert re.fullmatch(rf"median step [\d.]+ s over {timed} steps\npeak [\d.]+ GiB \(host_rss\), planned [\d.]+ GiB\n"
                        r"host resident [\d.]+ GiB\n", out), out


@pytest.mark.quick
def test_the_directories_the_docs_have_users_write_are_ignored_by_git():
    # the docs put runs under runs/ and converted weights under weights/: neither belongs in a commit,
    # while the package's own llama_npu/weights/ does
    import subprocess

    written = {m.group(1) for page in PAGES for m in re.finditer(r"(?<![\w/.])(runs|weights)/\w",
                                                                  page.read_text(encoding="utf-8"))}
    assert written == {"runs", "weights"}

    def ignored(path: str) -> bool:
        return subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=REPO).returncode == 0
    assert [ignored(f"{name}/x/model.ckpt") for name in sorted(written)] == [True, True]
    assert not ignored("llama_npu/weights/convert.py")


def doc_block_after(page: Path, marker: str) -> list[str]:
    """The commands of the first ```bash block after `marker` in `page`."""
    text = page.read_text(encoding="utf-8")
    block = text[text.index("```bash", text.index(marker)) + len("```bash"):]
    return [line for line in block[:block.index("```")].splitlines() if line.strip()]


def test_the_tiny_checkpoint_rehearsal_runs_as_the_doc_prints_it(tmp_path):
    """docs/recipes-and-data.md's three commands, word for word (both languages print the same),
    in a working directory holding the checkout's recipes, data and scripts."""
    import shlex
    import subprocess
    import sys

    commands = doc_block_after(REPO / "docs" / "recipes-and-data.md", "**Rehearsing with another model's checkpoint.**")
    assert commands == doc_block_after(REPO / "docs" / "recipes-and-data.zh-CN.md", "**用另一个模型的 checkpoint 演练。**")
    for name in ("recipes", "data", "scripts"):
        (tmp_path / name).symlink_to(REPO / name)
    programs = {"python": [sys.executable], "llama-npu": [sys.executable, "-m", "llama_npu"]}
    for command in commands:
        words = shlex.split(command)
        proc = subprocess.run(programs[words[0]] + words[1:], cwd=tmp_path, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
        assert proc.returncode == 0, f"{command}\n{proc.stderr[-2000:]}"
    assert (tmp_path / "runs" / "llama3_2_3b_zh_lora_910a-rehearsal" / "checkpoints" / "step_3").is_dir()
