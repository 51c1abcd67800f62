"""The extras below appo.py's core (reporting, torchrun, PBT and past opponents, evaluation) attach
through the runner's seams (appo.Extra): a copy of appo.py without any one of their blocks, or
without all of them, still trains. Each block runs from its "# EXTRAS:" header to the next header,
its registration line (EXTRAS.append) last."""
import ast
import os
import re
import subprocess
import sys

import pytest

import appo
from conftest import RUN_TIMEOUT_S

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = re.compile(r"^# =+\n# EXTRAS: (\S+)", re.MULTILINE)
MAIN = "# =============================================================================================\n# main\n"


def extra_blocks(source: str) -> dict[str, tuple[int, int]]:
    """Each EXTRAS block's first word (e.g. "reporting:") -> its span in `source`."""
    starts = [(match.group(1), match.start()) for match in HEADER.finditer(source)]
    ends = [start for _, start in starts[1:]] + [source.index(MAIN)]
    return {name: (start, end) for (name, start), end in zip(starts, ends)}


def without(source: str, names: list[str]) -> str:
    for start, end in sorted((extra_blocks(source)[name] for name in names), reverse=True):
        source = source[:start] + source[end:]
    return source


def train_copy(tmp_path, source: str, *flags: str) -> subprocess.CompletedProcess:
    (tmp_path / "appo.py").write_text(source)
    command = [sys.executable, str(tmp_path / "appo.py"), "--env", "doom_basic", "--num_workers", "1",
               "--num_envs_per_worker", "2", "--rollout", "16", "--batch_size", "64", "--hidden_size", "32",
               "--train_for_env_steps", "1000", "--train_dir", str(tmp_path / "runs"), "--experiment", "e",
               "--seed", "1", *flags]
    # the copy imports env.py and the C++ module from the checkout
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=environment, cwd=tmp_path)


def test_every_extra_is_one_block_with_its_registration_last_and_the_core_names_none_of_them():
    """The core reaches an extra only through the seams (class Extra): it names nothing a block
    defines, so deleting the block leaves no dangling name (torchrun's all-reduces, say)."""
    source = open(os.path.join(REPO, "appo.py")).read()
    blocks = extra_blocks(source)
    assert list(blocks) == ["reporting:", "multi-node", "population-based", "evaluation:"]
    core = source[:min(start for start, _ in blocks.values())]
    for start, end in blocks.values():
        block = source[start:end]
        registered = re.findall(r"^EXTRAS\.append\((\w+)\)$", block, re.MULTILINE)
        assert len(registered) == 1 and block.rstrip().endswith(f"EXTRAS.append({registered[0]})")
        body = ast.parse(block).body
        defined = [node.name for node in body if isinstance(node, (ast.FunctionDef, ast.ClassDef))] + \
                  [target.id for node in body if isinstance(node, ast.Assign) for target in node.targets
                   if isinstance(target, ast.Name)]
        assert registered[0] in defined
        assert [name for name in defined if re.search(rf"\b{name}\b", core)] == []
    assert [extra.__name__ for extra in appo.EXTRAS] == ["Reporting", "Torchrun", "Population", "Evaluation"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["reporting:", "multi-node", "population-based", "evaluation:"])
def test_a_copy_without_one_extra_still_trains(tmp_path, name):
    result = train_copy(tmp_path, without(open(os.path.join(REPO, "appo.py")).read(), [name]), "--serial_mode")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert os.listdir(tmp_path / "runs" / "e" / "checkpoint_p0")
    assert re.search(r"^\[ *\d+s\] frames [\d,]+ .*100% of 1,000", result.stdout, re.MULTILINE), result.stdout
    assert ("done: " in result.stdout) == (name != "reporting:")  # the closing lines are reporting's


@pytest.mark.slow
def test_the_core_alone_trains_with_its_processes_and_says_an_extras_flag_is_unknown(tmp_path):
    source = without(open(os.path.join(REPO, "appo.py")).read(), list(extra_blocks(open(os.path.join(REPO, "appo.py")).read())))
    result = train_copy(tmp_path, source)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert os.listdir(tmp_path / "runs" / "e" / "checkpoint_p0")
    assert not (tmp_path / "runs" / "e" / "tb").exists()  # TensorBoard is reporting's
    unknown = train_copy(tmp_path, source, "--with_pbt")
    assert unknown.returncode == 2 and "--with_pbt" in unknown.stderr


def test_appo_py_reads_research_first_then_plumbing_then_extras():
    """A forker opens appo.py on what they edit: the research flags (CONFIG), the model and the losses
    with the update (ALGO LOGIC), all before the first PLUMBING section, then the plumbing, then the
    extras. How much a change needs read is counted per change, not as this prefix's length (the
    900-line bar of the code-shape reviews, retired by issue 96): tests/test_fork_doc.py."""
    lines = open(os.path.join(REPO, "appo.py")).read().splitlines()
    sections = [(number, line.split(":")[0].split(" (")[0][2:]) for number, line in enumerate(lines, 1)
                if re.match(r"# (CONFIG|ALGO LOGIC|PLUMBING|EXTRAS)\b", line)]
    kinds = [kind for _, kind in sections]
    assert kinds[:3] == ["CONFIG", "ALGO LOGIC", "ALGO LOGIC"] and kinds[3] == "PLUMBING"
    assert kinds == sorted(kinds, key=["CONFIG", "ALGO LOGIC", "PLUMBING", "EXTRAS"].index)
    first_plumbing = sections[3][0]
    assert lines[first_plumbing - 2].startswith("# ====")
