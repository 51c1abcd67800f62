"""The chaos run (scripts/chaos.py), short: a real doom_basic training whose rollout workers,
policy workers and game processes are SIGKILLed every ~2 s, some at the instants the IPC review
found dangerous (a policy worker while a split steps, a rollout worker with a slot in flight).
The long run and its figures are in the README's fault table."""
import json
import os
import subprocess
import sys

TESTS = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(os.path.dirname(TESTS), "scripts", "chaos.py")


def test_a_run_whose_workers_are_killed_every_two_seconds_loses_nothing(tmp_path):
    figures_path = tmp_path / "chaos.json"
    temp_dir = tmp_path / "tmp"  # where the run makes its folder (TMPDIR), to see that it goes
    temp_dir.mkdir()
    result = subprocess.run([sys.executable, SCRIPT, "--minutes", "1", "--kill_every", "2", "--warmup_s", "10",
                             "--quiet_end_s", "10", "--seed", "1", "--json", str(figures_path)],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, TMPDIR=str(temp_dir)))
    summary = result.stdout[result.stdout.find("chaos run:"):]
    assert result.returncode == 0, summary or result.stdout[-3000:] + result.stderr[-3000:]
    figures = json.loads(figures_path.read_text())
    assert figures["kills"] >= 8, summary  # the run was really attacked
    assert figures["stalled_splits"] == 0 and figures["slots_lost"] == 0 and figures["unexpected_restarts"] == 0
    assert figures["learner_frames"] > 0 and figures["processes_left"] == 0 and figures["shm_entries_left"] == 0
    assert [p.name for p in temp_dir.iterdir() if p.name.startswith("appo_chaos_")] == []  # its 34 MB folder is gone
