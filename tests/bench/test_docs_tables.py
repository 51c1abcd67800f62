"""The docs' tables are their files: each table of README.md, docs/results/*.md and docs/testing.md
that a bench script prints or a saved run backs, its cells recomputed here from the files under
docs/bench/ (apart from the bench's own reading where a test says so)."""
import glob
import itertools
import json
import os
import re
import statistics
import sys
from fractions import Fraction

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # two levels above tests/bench/
sys.path.insert(0, os.path.join(REPO, "bench"))
import bench_groups  # noqa: E402
import bench_learning as bench  # noqa: E402
import appo  # noqa: E402


def test_the_readmes_headline_table_is_what_the_saved_runs_say():
    """README's "How it compares" table is `bench_learning.py --headline`: every cell from the runs
    committed under docs/bench/ (a run added or a figure typed by hand shows here)."""
    with open(os.path.join(REPO, "README.md")) as f:
        readme = f.read()
    table = bench.headline_table()
    assert table.count("\n") == 1 + len(bench.AGAINST_SF), table  # a row for every env of the suite and held out
    assert table in readme


# What the docs say of the precision of a set of saved appo.py runs: (page, its words, the runs
# as a glob under docs/bench, how many, the one precision they all recorded, whether any of their
# machines computes bfloat16). A page that claims a precision for runs that did not record it shows here.
PRECISION_CLAIMS = [
    ("docs/results/learning.md", "Every row is at one code, a8aaf7dad8b25bed (a worktree of b276c28), one "
     "precision, float32 (`--encoder_dtype float32`: this CPU has bfloat16", "gym/gym:*/appo_seed*.json", 21,
     "float32 encoder", True),
    ("docs/results/learning.md", "the 21 gym: runs had an AMD EPYC with it and ran in float32",
     "gym/gym:*/appo_seed*.json", 21, "float32 encoder", True),
    ("docs/results/learning.md", "the 3 pz: runs an AMD EPYC without it (so float32)",
     "pettingzoo/pz:*/appo_seed*.json", 3, "float32 encoder", False),
    ("docs/bench/gym_hopper_ablation/README.md", "All float32 (neither CPU has bfloat16)",
     "gym_hopper_ablation/*/gym:Hopper-v5/appo_seed*.json", 12, "float32 encoder", False),
]


@pytest.mark.parametrize("page, words, pattern, count, precision, bfloat16_machine", PRECISION_CLAIMS)
def test_what_the_docs_say_of_a_set_of_runs_precision_is_what_those_runs_recorded(page, words, pattern, count,
                                                                                     precision, bfloat16_machine):
    with open(os.path.join(REPO, page)) as f:
        text = " ".join(f.read().split())
    assert words in text, f"{page} no longer says: {words} (mend the claim here with it)"
    runs = [bench.load_result(path) for path in glob.glob(os.path.join(BENCH, pattern))]
    assert len(runs) == count, pattern
    assert {r["precision"] for r in runs} == {precision}, pattern
    assert {r["machine"]["bfloat16"] for r in runs} == {bfloat16_machine}, pattern


def test_the_readmes_table_has_no_appo_run_that_recorded_float32():
    """README: "appo.py ran its default bfloat16 encoder, Sample Factory float32". The headline's
    appo.py runs recorded bfloat16 or nothing (those at older code: learning.md's precision section
    says why bfloat16 is inferred for them); none recorded float32."""
    with open(os.path.join(REPO, "README.md")) as f:
        assert "appo.py ran its default bfloat16 encoder, Sample Factory float32" in " ".join(f.read().split())
    recorded = {r.get("precision") for folder in ("learning", "heldout")
                for r in map(bench.load_result, glob.glob(os.path.join(BENCH, folder, "*", "appo_seed*.json")))}
    assert recorded and recorded <= {"bfloat16 encoder", "not recorded"}, recorded


def test_learning_mds_table_of_runs_that_shared_the_machine_is_what_the_saved_runs_say():
    """docs/results/learning.md's rule section: its table of the runs that shared the machine and its
    "every other run" sentence are `bench_learning.py --contention`, from every run file under
    docs/bench/ (a run added, or a share typed by hand, shows here)."""
    with open(os.path.join(REPO, "docs", "results", "learning.md")) as f:
        learning = f.read()
    table = bench.contention_table()
    assert table.startswith(bench.CONTENTION_HEADER[0]) and "every other run had at most" in table
    assert table in learning, table
    # the same figures counted here from the files, apart from the bench: every run file's share of
    # the CPU elsewhere, those over 5% each in a row, and the highest of the others
    shares = []
    for path in glob.glob(os.path.join(BENCH, "**", "*.json"), recursive=True):
        with open(path) as f:
            saved = json.load(f)
        if isinstance(saved, dict) and "other_cpu_share" in saved and "config" in saved:
            shares.append(saved["other_cpu_share"])
    over = sorted(share for share in shares if share > 0.05)
    highest_other = max(share for share in shares if share <= 0.05)
    assert (f"{len(over)} of the {len(shares)} saved runs under docs/bench/ shared the machine; every other run had "
            f"at most {100 * highest_other:.1f}% of the CPU elsewhere.") in " ".join(learning.split())
    _, rows = table_in("Reruns and contention: one rule", ("env", "trainer", "configuration", "seeds"))
    listed = sorted(float(share.rstrip("%")) for row in rows for share in row[4].split(", "))
    assert listed == [round(100 * share, 1) for share in over]


# Rows off their table's code after a refresh, each named in learning.md's rule section: none now
# (the gym: table's HalfCheetah was re-run at the others' code on 2026-11-28).
ROWS_OFF_A_REFRESHED_TABLES_CODE = set()


def test_a_table_refreshed_at_new_code_or_budget_holds_every_row_at_that_code_but_the_one_named():
    """docs/results/learning.md's rule: a row refreshed at new code or a new budget refreshes every
    row of its table at that code, or none. A refresh sets the earlier runs aside in a superseded_*
    folder beside the table's: every appo.py row of that folder must stand at the code of the rows
    refreshed."""
    import glob
    root = os.path.join(REPO, "docs", "bench")
    off, refreshed_tables = set(), 0
    for superseded in glob.glob(os.path.join(root, "**", "superseded_*"), recursive=True):
        folder = os.path.dirname(superseded)
        codes = {}
        for path in glob.glob(os.path.join(folder, "*", "appo_seed*.json")):
            saved = bench.load_result(path)
            codes.setdefault(saved["config"]["env"], set()).add(saved["config"]["code"])
        refreshed = {name for name in os.listdir(superseded) if os.path.isdir(os.path.join(superseded, name))}
        assert refreshed and refreshed <= set(codes), superseded
        refresh_codes = set().union(*(codes[name] for name in refreshed))
        assert len(refresh_codes) == 1, f"{folder}: rows refreshed at several codes {refresh_codes}"
        off |= {(os.path.relpath(folder, root), name) for name, found in codes.items() if found != refresh_codes}
        refreshed_tables += 1
    assert refreshed_tables
    assert off == ROWS_OFF_A_REFRESHED_TABLES_CODE, (
        "rows off their table's code after a refresh; docs/results/learning.md's rule section names them: "
        f"{sorted(off)}")


# learning.md's other tables, tied to their files as the headline is. Each table is found by the
# section it stands in and its header; each checked cell is recomputed from the runs saved in the
# folder its text names. Cells not checked here are another program's figures (CleanRL's published
# PPO) or the bench's whole row (the report-only tables, checked whole).
def learning_md_tables() -> dict:
    """{(section, header cells): rows of cells} for every table in docs/results/learning.md."""
    with open(os.path.join(REPO, "docs", "results", "learning.md")) as f:
        lines = f.read().splitlines()
    tables, section, i = {}, None, 0
    while i < len(lines):
        if lines[i].startswith("## "):
            section = lines[i][3:]
        if lines[i].startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            header = tuple(cell.strip() for cell in lines[i].strip("|").split("|"))
            rows, i = [], i + 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append([cell.strip() for cell in lines[i].strip("|").split("|")])
                i += 1
            tables[(section, header)] = rows
            continue
        i += 1
    return tables


def table_in(section: str, first_columns: tuple) -> tuple[tuple, list[list[str]]]:
    """(header, rows) of the one table in the section whose header starts with `first_columns`."""
    found = [(header, rows) for (name, header), rows in learning_md_tables().items()
             if name == section and header[:len(first_columns)] == first_columns]
    assert len(found) == 1, f"learning.md: one table under '{section}' starting {first_columns}, found {len(found)}"
    return found[0]


BENCH = os.path.join(REPO, "docs", "bench")


# The cells below are recomputed here, apart from the bench's own functions (its reading of a
# curve, its median and its minutes), so that a bug in the code that printed a table shows.
def runs_in(folder: str, env_name: str, label: str) -> list[dict]:
    """The finished runs saved as <label>_seed<N>.json for the env in the folder, read with json."""
    runs = []
    for path in glob.glob(os.path.join(BENCH, folder, env_name, f"{label}_seed*.json")):
        with open(path) as f:
            runs.append(json.load(f))
    return [r for r in runs if r["status"] == "ok"]


def score_cell(folder: str, env_name: str, label: str, with_n: bool = True) -> str:
    """median [min, max] of the runs' scores at their budget, or the one score; with (n)."""
    runs = runs_in(folder, env_name, label)
    budgets = {r["config"]["frames"] for r in runs}
    assert len(budgets) == 1, (folder, env_name, label, budgets)
    budget = budgets.pop()
    scores = [score_at_budget(r["curve"], budget) for r in runs]
    cell = (f"{scores[0]:.2f}" if len(scores) == 1
            else f"{np.median(scores):.2f} [{min(scores):.2f}, {max(scores):.2f}]")
    return f"{cell} ({len(scores)})" if with_n else cell


def minutes_cell(folder: str, env_name: str, label: str) -> str:
    return f"{np.median([r['wall_s'] for r in runs_in(folder, env_name, label)]) / 60:.1f}"


def report_rows(folder: str, env_names: list[str]) -> dict:
    """`bench_learning.py --report_only --results_dir docs/bench/<folder>`'s table rows, by env, as cells."""
    rows = []
    for env_name in env_names:
        task = (bench.load_result(os.path.join(BENCH, folder, env_name, "task_match.json")) or {}).get("task")
        results = {trainer: runs_in(folder, env_name, trainer) for trainer in ("appo", "sf")}
        rows.append(bench.summarize_env(env_name, bench.BUDGETS[env_name], results, task))
    lines = [line for line in bench.format_table(rows).splitlines() if line.startswith("| ") and "---" not in line]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    return {cells[0]: dict(zip(header, cells))
            for cells in ([cell.strip() for cell in line.strip("|").split("|")] for line in lines[1:])}


@pytest.mark.parametrize("section, folder, env_names", [
    ("The Doom suite", "learning", ["doom_basic", "doom_defend_the_center", "doom_defend_the_line",
                                    "doom_health_gathering", "doom_my_way_home", "doom_take_cover"]),
    ("Atari", "learning", ["atari_breakout", "atari_space_invaders"]),
    ("Held out: envs no default was chosen on", "heldout", ["atari_pong"]),
])
def test_learning_mds_report_tables_are_what_the_saved_runs_say(section, folder, env_names):
    """Each table that is `--report_only`'s, cell for cell under its own header (a held-out table
    may leave a column out), from the runs in the folder its command names."""
    expected = report_rows(folder, env_names)
    header, rows = table_in(section, ("env", "frames", "appo.py (n)", "Sample Factory (n)", "p"))
    found = {row[0]: dict(zip(header, row)) for row in rows}
    assert sorted(found) == sorted(env_names), rows
    for env_name, cells in found.items():
        assert cells == {column: expected[env_name][column] for column in cells}, env_name


def score_at_budget(curve: list, frames: int) -> float:
    """learning.md's reading, written here apart from the bench's: the mean return of the last
    summary at or before the budget (a summary lands a little past a round budget: 0.1% of slack)."""
    return [score for _, trained, score in curve if trained <= frames * 1.001][-1]


def rank_sum_p_lower(ours: list, theirs: list) -> Fraction:
    """Exact one-sided Mann-Whitney p of "ours are lower", in exact fractions: the share of all
    splits of the pooled scores into groups of these sizes whose first group wins at most as many
    pairs against the second as ours really does (a tie a half)."""
    def wins(group, others):
        return sum(Fraction(1) if x > y else Fraction(1, 2) if x == y else Fraction(0) for x in group for y in others)
    pooled = ours + theirs
    observed = wins(ours, theirs)
    splits = list(itertools.combinations(range(len(pooled)), len(ours)))
    at_most = sum(wins([pooled[i] for i in split], [pooled[i] for i in range(len(pooled)) if i not in split]) <= observed
                  for split in splits)
    return Fraction(at_most, len(splits))


def test_rank_sum_p_of_this_file_gives_the_textbook_values():
    """The checker's own p, on splits counted by hand: 3 against 3 all below is 1 split of C(6,3) =
    20; all above, every split; one pair crossed (U = 1), the all-below split and this one, 2/20; a
    tie across the groups counts a half (U = 0.5), and the two splits that take 1, 2 and either 3
    are at or below it, 2/20."""
    assert rank_sum_p_lower([1, 2, 3], [4, 5, 6]) == Fraction(1, 20)
    assert rank_sum_p_lower([4, 5, 6], [1, 2, 3]) == 1
    assert rank_sum_p_lower([1, 2, 4], [3, 5, 6]) == Fraction(2, 20)
    assert rank_sum_p_lower([1, 2, 3], [3, 5, 6]) == Fraction(2, 20)
    assert rank_sum_p_lower([1, 2], [3]) == Fraction(1, 3)


def test_learning_mds_sb3_table_is_what_the_saved_runs_say():
    """The SB3 table, every cell recomputed here from the result files, SB3's under docs/bench/gym_sb3/
    and appo.py's the gym: table's under docs/bench/gym/, without the bench's functions (its reading
    of a curve, median, rank-sum p and minutes are written again above), so a bug in the code that
    printed the table shows here: each env's folder of SB3 runs is a row, every counted run reached
    the budget, SB3 ran in float32, appo.py's rows at one code, as many seeds a side."""
    header, rows = table_in("gym: envs beside Stable-Baselines3 with rl-zoo3's settings", ("env", "steps"))
    assert header == ("env", "steps", "appo.py (n)", "SB3 + rl-zoo3 (n)", "zoo entry", "p", "appo min", "SB3 min")
    folders = {"appo": os.path.join(BENCH, "gym"), "sb3": os.path.join(BENCH, "gym_sb3")}
    assert sorted(row[0] for row in rows) == sorted(  # replaced/, superseded_*/: not counted
        name for name in os.listdir(folders["sb3"]) if glob.glob(os.path.join(folders["sb3"], name, "sb3_seed*.json")))
    codes = set()
    for env_name, steps, appo_cell, sb3_cell, zoo_cell, p_cell, appo_minutes, sb3_minutes in rows:
        saved = {}
        for trainer in ("appo", "sb3"):
            paths = sorted(glob.glob(os.path.join(folders[trainer], env_name, f"{trainer}_seed*.json")))
            runs = []
            for path in paths:
                with open(path) as f:
                    runs.append(json.load(f))
            saved[trainer] = [r for r in runs if r["status"] == "ok"]
        appo_runs, sb3_runs = saved["appo"], saved["sb3"]
        assert appo_runs and len(appo_runs) == len(sb3_runs), env_name
        frames = {r["config"]["frames"] for r in appo_runs + sb3_runs}
        assert len(frames) == 1, (env_name, frames)
        frames = frames.pop()
        assert steps == (f"{frames // 1_000_000}M" if frames % 1_000_000 == 0 else f"{frames // 1000}k"), env_name
        assert all(max(point[1] for point in r["curve"]) >= frames for r in appo_runs + sb3_runs), env_name
        assert {r["precision"] for r in sb3_runs} == {"float32"}, env_name
        scores = {trainer: [score_at_budget(r["curve"], frames) for r in runs] for trainer, runs in saved.items()}
        for cell, trainer in ((appo_cell, "appo"), (sb3_cell, "sb3")):
            values = scores[trainer]
            assert cell == (f"{np.median(values):.2f} [{min(values):.2f}, {max(values):.2f}] ({len(values)})"), (
                env_name, trainer)
        assert zoo_cell == ", ".join(sorted({r["config"]["zoo_entry"] for r in sb3_runs})), env_name
        assert p_cell == f"{float(rank_sum_p_lower(scores['appo'], scores['sb3'])):.2f}", env_name
        for cell, runs in ((appo_minutes, appo_runs), (sb3_minutes, sb3_runs)):
            assert cell == f"{np.median([r['wall_s'] for r in runs]) / 60:.1f}", env_name
        codes |= {r["config"]["code"] for r in appo_runs}
    assert len(codes) == 1, codes  # the table's appo.py rows at one code


def test_learning_mds_batch_512_and_held_out_doom_tables_are_what_the_saved_runs_say():
    _, rows = table_in("Sample Factory at the Doom family's batch", ("env", "appo.py, batch 512 (table above)"))
    assert len(rows) == 6
    for cells in rows:
        env_name = cells[0].split(" (")[0]
        assert cells[1:] == [score_cell("learning", env_name, "appo"), score_cell("learning", env_name, "sf"),
                             score_cell("ablations/sf_doom_batch_512", env_name, "sf_doom_batch_512")], env_name
    _, rows = table_in("Held out: envs no default was chosen on", ("env", "frames", "appo.py (n)",
                                                                "Sample Factory, published (n)"))
    assert [cells[0] for cells in rows] == ["doom_deadly_corridor", "doom_health_gathering_supreme"]
    for env_name, frames, *cells in rows:
        assert frames == f"{bench.BUDGETS[env_name] / 1e6:g}M"
        assert cells == [score_cell("heldout", env_name, label) for label in
                         ("appo", "sf", "sf_doom_batch_512", "sf_doom_batch_512_area_resize")] + [
            minutes_cell("heldout", env_name, "appo"), minutes_cell("heldout", env_name, "sf")], env_name


def test_learning_mds_atari_medians_along_the_way_are_what_the_saved_runs_say():
    header, rows = table_in("Atari", ("env", "frames", "0.5M"))
    grid = np.array([float(column[:-1]) * 1e6 for column in header[2:]])
    folders = {"appo.py (default)": ("learning", "appo"), "Sample Factory": ("learning", "sf"),
               "appo.py, GAE targets per minibatch": ("ablations/gae_per_minibatch", "appo"),
               "appo.py, asynchronous": ("ablations/async_atari", "appo")}
    env_name = None
    assert len(rows) == 8
    for first, label, *values in rows:
        env_name = first or env_name
        name = re.sub(r" \(code \w+\)", "", label.rsplit(", ", 1)[0])  # "..., 5 seeds" less its seeds and code
        folder, trainer = folders[name]
        runs = runs_in(folder, env_name, trainer)
        assert label.endswith(f"{len(runs)} seeds"), label
        medians = bench.band([r["curve"] for r in runs], 1, grid)[0]
        digits = len(values[0].split(".")[1]) if "." in values[0] else 0
        assert values == [f"{m:.{digits}f}" for m in medians], (env_name, label)


def test_learning_mds_gym_pz_and_repin_tables_are_what_the_saved_runs_say():
    _, rows = table_in("gym: envs (appo.py alone)", ("env", "steps"))
    assert len(rows) == 7
    for env_name, steps, score, mins, code, random_play, _published in rows:
        runs = runs_in("gym", env_name, "appo")
        assert steps == f"{bench.BUDGETS[env_name] // 1000}k" if bench.BUDGETS[env_name] < 1e6 else "1M"
        assert (score, mins) == (score_cell("gym", env_name, "appo"), minutes_cell("gym", env_name, "appo"))
        assert {code} == {r["config"]["code"][:8] for r in runs}, env_name
        random = bench.load_result(os.path.join(BENCH, "gym", "random", f"{env_name}.json"))
        assert random_play == f"{random['mean_return']:.2f}", env_name
    _, rows = table_in("pz: envs (appo.py alone)", ("env", "frames"))
    random = bench.load_result(os.path.join(BENCH, "pettingzoo", "random.json"))
    assert [row[2:] for row in rows] == [[score_cell("pettingzoo", random["env"], "appo"),
                                          minutes_cell("pettingzoo", random["env"], "appo"),
                                          f"{random['mean_return']:.2f}"]]
    _, rows = table_in("Re-pin of 2026-11-28", ("env", "frames"))
    for env_name, frames, after, before, published, after_min, before_min in rows:
        assert after == score_cell("repin_2026-11-28/after_70ed530", env_name, "appo", with_n=False), env_name
        assert after_min == minutes_cell("repin_2026-11-28/after_70ed530", env_name, "appo")
        done = runs_in("repin_2026-11-28/before_e4fc108", env_name, "appo")
        assert (before, before_min) == ((score_cell("repin_2026-11-28/before_e4fc108", env_name, "appo", with_n=False),
                                         minutes_cell("repin_2026-11-28/before_e4fc108", env_name, "appo"))
                                        if done else ("not run", "-")), env_name
        # the published rows of then: the gym: table's at 8b3162ef, set aside when it was re-run
        home = {"doom": "learning", "gym": "gym/superseded_8b3162ef", "atari": "heldout"}[bench.family(env_name)]
        assert published.startswith(score_cell(home, env_name, "appo", with_n=False) + " "), env_name
    _, rows = table_in("Re-pin of 2026-12-05", ("env", "frames"))
    for env_name, frames, code, after, before, after_min, before_min in rows:
        assert frames == f"{bench.BUDGETS[env_name] / 1e6:g}M", env_name
        for score, minutes, folder in ((after, after_min, f"repin_2026-12-05/after_{code}"),
                                       (before, before_min, "repin_2026-12-05/before_a033fe0")):
            runs = runs_in(folder, env_name, "appo")
            assert len(runs) == 3 and {r["commit"][:7] for r in runs} == {folder.rsplit("_", 1)[1]}, folder
            assert (score, minutes) == (score_cell(folder, env_name, "appo", with_n=False),
                                        minutes_cell(folder, env_name, "appo")), (folder, env_name)
    assert {("doom_basic", "e4725c7"), ("gym:Acrobot-v1", "894d4bf")} <= {(row[0], row[2]) for row in rows}


@pytest.mark.parametrize("section, folder, arms, followed_by, least", [
    ("The gym vector defaults: an ablation, pre-registered (issue 80)", "gym_ablation",
     ("defaults", "bootstrap", "init", "sgd", "separate", "bundle"), "The rules as read from these files", 12),
    ("Continuous control, round two (issue 95)", "gym_round2", ("baseline", "quiet", "shuffle", "shuffle10", "scale"),
     "Each arm's HalfCheetah basin rate so far", 3)])
def test_learning_mds_ablation_tables_are_what_the_saved_runs_say(section, folder, arms, followed_by, least):
    """The gym defaults' ablation (issue 80) and round two (issue 95): learning.md's tables are
    `bench_learning.py --ablation` and `--round2`, and each cell is recomputed here from the files:
    every arm folder's finished runs, the score at the last summary at or before 200k and 1M steps,
    median [min, max], and the median minutes."""
    assert tuple(bench.ROUND2_ARMS if folder == "gym_round2" else bench.ABLATION_ARMS) == arms
    table = bench.ablation_table(os.path.join(BENCH, folder), arms)
    with open(os.path.join(REPO, "docs", "results", "learning.md")) as f:
        text = f.read()
    assert f"{table}\n\n{followed_by}" in text
    if folder == "gym_ablation":
        held_out = bench.held_out_table()
        assert f"R2's verdict is the last line of the list above:\n\n{held_out}\n\n" in text
    else:  # the basin rates under it, counted here
        for arm in arms:
            scores = [score_at_budget(run["curve"], 1_000_000) for run in runs_in(os.path.join(folder, arm),
                                                                                   "gym:HalfCheetah-v5", "appo")]
            if scores:
                assert (f"- {arm}: {sum(score >= 3000 for score in scores)} of {len(scores)} seeds at or above 3,000 "
                        "at 1M") in text
        assert f"\n\n{bench.round2_choice(os.path.join(BENCH, folder))[0]}\n" in text  # R1', or what it waits for
    header, rows = table_in(section, ("env", "arm", "seeds"))
    found = {(row[0], row[1]): dict(zip(header, row)) for row in rows}
    expected_keys = set()
    for arm in arms:
        for env_dir in glob.glob(os.path.join(BENCH, folder, arm, "*")):
            env_name = os.path.basename(env_dir)
            runs = sorted(runs_in(os.path.join(folder, arm), env_name, "appo"),
                          key=lambda run: run["config"]["seed"])
            if not os.path.isdir(env_dir) or not runs:
                continue
            expected_keys.add((env_name, arm))
            cells = found[(env_name, arm)]
            assert cells["seeds"] == ", ".join(str(run["config"]["seed"]) for run in runs)
            for column, steps in (("at 200k steps", 200_000), ("at 1M steps", 1_000_000)):
                scores = [score_at_budget(run["curve"], steps) for run in runs]
                assert cells[column] == (f"{scores[0]:.2f}" if len(scores) == 1 else
                                         f"{np.median(scores):.2f} [{min(scores):.2f}, {max(scores):.2f}]")
            assert cells["minutes"] == f"{np.median([run['wall_s'] for run in runs]) / 60:.1f}"
    assert set(found) == expected_keys and len(expected_keys) >= least


# R2's held-out envs and budgets, copied from learning.md's pre-registered rule ("R2, held out"), not
# from the bench: 1M steps but for the guards CartPole-v1 and Acrobot-v1 at 500k
R2_HELD_OUT = {"gym:InvertedDoublePendulum-v5": 1_000_000, "gym:Swimmer-v5": 1_000_000, "gym:Reacher-v5": 1_000_000,
               "gym:Ant-v5": 1_000_000, "gym:LunarLanderContinuous-v3": 1_000_000, "gym:CartPole-v1": 500_000,
               "gym:Acrobot-v1": 500_000, "gym:InvertedPendulum-v5": 1_000_000}


def random_play_return(env_name: str) -> float:
    with open(os.path.join(BENCH, "gym", "random", f"{env_name}.json")) as f:
        return json.load(f)["mean_return"]


def first_three_seeds(folder: str, env_name: str, steps: int) -> list[float]:
    """The rules' reading of an arm: its seeds 1 to 3 (later seeds are reported, never judged), each
    scored at `steps`; every one of the three must be saved and finished."""
    runs = {run["config"]["seed"]: run for run in runs_in(folder, env_name, "appo")}
    assert {1, 2, 3} <= set(runs), (folder, env_name, sorted(runs))
    return [score_at_budget(runs[seed]["curve"], steps) for seed in (1, 2, 3)]


def test_learning_mds_held_out_table_r1_and_r2_are_what_the_saved_runs_say():
    """R1's choice and score, R2's table and verdict (learning.md's ablation section), each computed
    here from the saved runs, the SB3 runs and the random-play files, without the bench's rules or
    tables: an arm's score is the median of its seeds 1-3 at the budget; R1 qualifies an arm above
    bootstrap on HalfCheetah and Walker2d, not every seed below bootstrap's on Hopper or LunarLander,
    and at SB3's medians on both, and scores it by the mean of (median - random) / (SB3 - random)
    over the four envs; R2 reads (sgd - bootstrap) / |bootstrap - random| over the eight held-out
    envs and the envs where every sgd seed ends below every bootstrap seed."""
    with open(os.path.join(REPO, "docs", "results", "learning.md")) as f:
        text = f.read()
    section = "The gym vector defaults: an ablation, pre-registered (issue 80)"
    verdicts = {line[2:4]: line[2:] for line in text.split(f"## {section}")[1].split("\n## ")[0].splitlines()
                if line.startswith(("- R1:", "- R2:"))}
    assert set(verdicts) == {"R1", "R2"}
    median = lambda values: float(np.median(values))  # noqa: E731

    # R1, on seeds 1-3 at 1M steps, against B = bootstrap (R0 held for the gym: family)
    stage_1, stage_2 = ("gym:HalfCheetah-v5", "gym:Walker2d-v5"), ("gym:Hopper-v5", "gym:LunarLander-v3")
    sb3 = {env_name: median([score_at_budget(run["curve"], 1_000_000) for run in runs_in("gym_sb3", env_name, "sb3")])
           for env_name in stage_1 + stage_2}
    assert round(sb3["gym:Hopper-v5"]) == 1001 and round(sb3["gym:LunarLander-v3"], 1) == 263.6  # the rule's bars
    arm_scores = lambda arm, env_name: first_three_seeds(os.path.join("gym_ablation", arm), env_name, 1_000_000)  # noqa: E731
    qualifying = {}
    for arm in ("init", "sgd", "separate", "bundle"):
        if not all(median(arm_scores(arm, e)) > median(arm_scores("bootstrap", e)) for e in stage_1):
            continue
        if not all(glob.glob(os.path.join(BENCH, "gym_ablation", arm, e, "appo_seed*.json")) for e in stage_2):
            continue  # never ran Stage 2: not an arm R1 can choose
        if any(max(arm_scores(arm, e)) < min(arm_scores("bootstrap", e)) for e in stage_2):
            continue
        if not all(median(arm_scores(arm, e)) >= sb3[e] for e in stage_2):
            continue
        qualifying[arm] = float(np.mean([(median(arm_scores(arm, e)) - random_play_return(e))
                                         / (sb3[e] - random_play_return(e)) for e in stage_1 + stage_2]))
    assert {arm: round(score, 3) for arm, score in qualifying.items()} == {"sgd": 1.053}
    assert verdicts["R1"] == "R1: qualifying against bootstrap (mean normalised score): sgd 1.053; chosen: sgd"

    # R2's table: every held-out env, bootstrap then sgd, each cell from the files
    assert sorted(os.listdir(os.path.join(BENCH, "gym_ablation", "held_out"))) == ["bootstrap", "sgd"]
    for arm in ("bootstrap", "sgd"):
        folder = os.path.join(BENCH, "gym_ablation", "held_out", arm)
        assert sorted(name for name in os.listdir(folder) if os.path.isdir(os.path.join(folder, name))) == sorted(R2_HELD_OUT)
    header, rows = table_in(section, ("env", "steps", "random play", "arm"))
    assert header == ("env", "steps", "random play", "arm", "seeds", "score", "minutes")
    expected_rows, scores = [], {}
    for env_name, budget in R2_HELD_OUT.items():
        for arm in ("bootstrap", "sgd"):
            runs = sorted(runs_in(os.path.join("gym_ablation", "held_out", arm), env_name, "appo"),
                          key=lambda run: run["config"]["seed"])
            assert [run["config"]["seed"] for run in runs] == [1, 2, 3], (env_name, arm)
            assert {run["config"]["frames"] for run in runs} == {budget}, (env_name, arm)
            values = [score_at_budget(run["curve"], budget) for run in runs]
            scores[arm, env_name] = values
            expected_rows.append([env_name, f"{budget // 1000}k", f"{random_play_return(env_name):.2f}", arm, "1, 2, 3",
                                  f"{median(values):.2f} [{min(values):.2f}, {max(values):.2f}]",
                                  f"{median([run['wall_s'] for run in runs]) / 60:.1f}"])
    assert rows == expected_rows

    # R2's verdict: condition (1), no env with every sgd seed below every bootstrap seed; (2) the mean gain >= 0
    below = {env_name for env_name in R2_HELD_OUT if max(scores["sgd", env_name]) < min(scores["bootstrap", env_name])}
    gain = float(np.mean([(median(scores["sgd", e]) - median(scores["bootstrap", e]))
                          / abs(median(scores["bootstrap", e]) - random_play_return(e)) for e in R2_HELD_OUT]))
    assert below == {"gym:InvertedDoublePendulum-v5", "gym:Swimmer-v5", "gym:Ant-v5"}
    assert f"{gain:+.3f}" == "-0.176"
    assert verdicts["R2"] == (  # both conditions fail, on more than one env: nothing to narrow
        "R2: fails (mean (arm - B) / |B - random| -0.176; every seed below B's on "
        "gym:InvertedDoublePendulum-v5, gym:Swimmer-v5, gym:Ant-v5): no gym default changes but by R0")


def test_learning_mds_time_limits_table_is_what_the_saved_runs_say():
    """R0's table (learning.md, "Time limits bootstrapped"): each measured family's env, without and
    with --value_bootstrap, recomputed from its two folders: median [min, max] (n) at the budget and
    the rank-sum p that the runs with it score lower, and the family's default as parse_args gives
    it. The gym: rows are the ablation's `defaults` and `bootstrap` arms."""
    header, rows = table_in("Time limits bootstrapped (`--value_bootstrap`)", ("family (env)", "budget"))
    found = {row[0]: dict(zip(header, row)) for row in rows}
    folders = {"Doom scenarios (doom_basic)": ("time_limits/doom_off", "time_limits/doom_on", "doom_basic"),
               "Atari (atari_pong)": ("time_limits/atari_off", "time_limits/atari_on", "atari_pong")}
    folders.update({f"gym: and pz: ({env_name})": ("gym_ablation/defaults", "gym_ablation/bootstrap", env_name)
                    for env_name in bench.STAGE_1 + bench.STAGE_2
                    if f"gym: and pz: ({env_name})" in found})
    assert len(folders) >= 6
    for name, (without, with_it, env_name) in folders.items():
        cells = found[name]
        # R0 reads seeds 1 to 3; the ablation's later seeds 4 and 5 of `bootstrap` are not its
        scores = [[score_at_budget(run["curve"], run["config"]["frames"]) for run in runs_in(folder, env_name, "appo")
                   if run["config"]["seed"] <= 3] for folder in (with_it, without)]
        for column, values in (("with (n)", scores[0]), ("without (n)", scores[1])):
            assert cells[column] == f"{np.median(values):.2f} [{min(values):.2f}, {max(values):.2f}] (3)", name
        assert cells["p"] == f"{float(rank_sum_p_lower(*scores)):.2f}", name
        # the default column says what the family's defaults are now
        assert cells["default"].startswith("on since") == appo.parse_args(["--env", env_name]).value_bootstrap, name


def test_learning_mds_sb3_table_read_at_equal_seconds_is_what_the_saved_runs_say():
    """learning.md's equal-seconds table is `--equal_seconds` on the saved runs (the gym: table's,
    SB3's and the 4M-step ones), whose reading of a curve at a time the test above checks: a run
    added, or a cell typed by hand, fails it."""
    with open(os.path.join(REPO, "docs", "results", "learning.md")) as f:
        text = f.read()
    table = bench.equal_seconds_table()
    assert len(table.splitlines()) == 2 + 4  # the SB3 table's four envs
    assert f"--results_dir docs/bench/gym_sb3_4m\n\n{table}\n\n" in text


def test_learning_mds_basin_table_is_what_the_saved_runs_and_the_probe_say():
    """Round two's HalfCheetah basin table: `--basin` from the runs and probe.json; the probe's file is
    what the probe reads now from a low run's kept checkpoint (seeded, so the same games), and the
    basin column is the score at 1M against 3,000, read here apart from the bench."""
    with open(os.path.join(REPO, "docs", "results", "learning.md")) as f:
        learning = f.read()
    table = bench.basin_table()
    assert table in learning, table
    runs = sorted(glob.glob(os.path.join(bench.BASIN_DIR, "gym:HalfCheetah-v5", "appo_seed*.json")))
    assert len(runs) >= 8
    lows = []
    for path in runs:
        with open(path) as f:
            run = json.load(f)
        final = [point[2] for point in run["curve"] if point[1] <= 1_000_000 * 1.001][-1]
        if final < 3000:
            lows.append(run["checkpoint"])
    assert table.count("| low |") == len(lows) > 0
    sys.path.insert(0, os.path.join(REPO, "bench"))
    import probe_policy
    with open(os.path.join(bench.BASIN_DIR, "probe.json")) as f:
        saved = {os.path.basename(report["checkpoint"]): report for report in json.load(f)["reports"]}
    report = saved[lows[0]]
    again = probe_policy.probe(os.path.join(bench.BASIN_DIR, "gym:HalfCheetah-v5", lows[0]), report["episodes"],
                               report["deterministic"], seed=1)
    for key in ("mean_return", "upside_down", "mean_cos_pitch", "forward_speed", "clipped_share", "max_abs_pitch_deg"):
        assert again[key] == pytest.approx(report[key], rel=1e-6), key


def test_throughput_mds_table_at_head_is_what_its_result_files_say():
    """docs/results/throughput.md's like-for-like table of 2026-12-07: each row's medians, runs in the
    order run and ratio from the result file of its env, and both files of one commit, float32 on
    both sides, on a CPU without bfloat16 (why the page has no bfloat16 column for it)."""
    with open(os.path.join(REPO, "docs", "results", "throughput.md")) as f:
        page = f.read()
    folder = os.path.join(REPO, "docs", "bench", "throughput", "head_2026-12-07")
    commits = set()
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".json"):
            continue
        with open(os.path.join(folder, name)) as f:
            saved = json.load(f)
        result, provenance = saved["results"][0], saved["provenance"]
        commits.add(provenance["commit"][:7])
        assert name == f"{result['env']}_{provenance['commit'][:7]}.json" and provenance["uncommitted"] == []
        assert result["precision"]["ours_fp32"] == "float32 encoder" and result["precision"]["sf"] == "float32"
        assert provenance["cpu_bfloat16"] is False
        legs = [result["runs"][key] for key in ("ours_fp32", "sf")]
        cells = [f"{statistics.median(run['fps'] for run in runs):,.0f} ("
                 + ", ".join(f"{run['fps']:,.0f}" for run in runs) + ")" for runs in legs]
        ratio = statistics.median(run["fps"] for run in legs[0]) / statistics.median(run["fps"] for run in legs[1])
        row = next(line for line in page.splitlines() if line.startswith(f"| {result['env']} |") and "/ SF" not in line
                   and line.endswith(f"| {cells[0]} | {cells[1]} | **{ratio:.2f}** |"))
        assert row.count("|") == 6, row
    assert commits == {"9a23702"} and "**At 9a23702 (2026-12-07), like for like.**" in page


def test_throughput_mds_compile_table_is_what_its_result_file_says():
    """docs/results/throughput.md's `--compile` row: each leg's median and runs, and both ratios to
    Sample Factory, as the result file it names records them (rounded as the page prints them)."""
    with open(os.path.join(REPO, "docs", "results", "throughput.md")) as f:
        page = f.read()
    section = page[page.index("## `--compile`"):page.index("## The cost of `--encoder resnet`")]
    name = re.search(r"docs/bench/throughput/compile/(doom_basic_\w+\.json)", section).group(1)
    with open(os.path.join(REPO, "docs", "bench", "throughput", "compile", name)) as f:
        result = json.load(f)["results"][0]
    row = next(line for line in section.splitlines() if line.startswith("| frames trained / s |"))

    def leg(key: str) -> str:
        runs = ", ".join(f"{run['fps']:,.0f}" for run in result["runs"][key])
        return f"{result[key + '_fps']:,.0f} ({runs})"
    expected = (f"| frames trained / s | {leg('ours')} | {leg('ours_compile')} | {leg('sf')} | "
                f"{result['ours_over_sf']:.2f} | {result['ours_compile_over_sf']:.2f} |")
    assert row == expected
    start_up = [", ".join(f"{run['first_trained_s']:.1f}" for run in result["runs"][key]) + " s"
                for key in ("ours", "ours_compile")]
    assert f"| launch to the first frames trained | {start_up[0]} | {start_up[1]} |" in section
    busy = [", ".join(f"{run['busy_percent']['learner']:.0f}%" for run in result["runs"][key])
            for key in ("ours", "ours_compile")]
    assert f"| learner busy (each run's status line) | {busy[0]} | {busy[1]} |" in section
    assert result["precision"]["ours"] == result["precision"]["ours_compile"] == "float32 encoder"  # like for like
    gain = result["ours_compile_fps"] / result["ours_fps"]
    assert f"`--compile` over appo.py: {gain:.2f} at the medians" in section


def suite_log_says(path: str) -> dict:
    """What a saved run of the test suite says of itself: its header's commit, machine and mode, and
    pytest's summary line (a stopped run has none: its result lines are counted instead)."""
    with open(path) as f:
        text = f.read()
    command, machine_line = text.splitlines()[:2]
    said = {"commit": re.search(r"(?:worktree|checkout) of ([0-9a-f]{7})", command).group(1),
            "machine": "AMD EPYC" if "AMD EPYC" in machine_line else
                       "Intel Xeon @ 2.50GHz" if "Intel(R) Xeon(R) Processor @ 2.50GHz" in machine_line else "?",
            "how": ("two at a time" if "-n 2" in command else "one at a time")
                   + (", beside a training" if "beside `python appo.py --env doom_basic`" in command else ", alone")}
    summary = re.findall(r"^(.*(?:passed|failed).*) in ([0-9.]+)s", text, re.M)
    if summary:
        counts, seconds = summary[-1]
        count = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|error)", counts)}
        failed = str(count.get("failed", 0)) + (f" (+{count['error']} error)" if count.get("error") else "")
        said.update(passed=str(count["passed"]), failed=failed, skipped=str(count["skipped"]),
                    s=str(round(float(seconds))))
    else:
        stopped = re.search(r"stopped by hand at (\d+%)", text).group(1)
        errors = len(re.findall(r" ERROR\b", text))
        said.update(passed=f"stopped at {stopped}: {len(re.findall(r' PASSED', text))}",
                    failed=f"{len(re.findall(r' FAILED', text))} (+{errors} errors)", skipped="-", s="-")
    return said


def test_every_saved_run_of_the_suite_is_in_testing_mds_table_as_its_log_says():
    """docs/testing.md's table of the suite's runs: one row for each log in docs/bench/suite/, its
    commit, machine, mode, counts and seconds as the log's own header and pytest's summary say."""
    with open(os.path.join(REPO, "docs", "testing.md")) as f:
        rows = [line.split("|")[1:-1] for line in f if line.startswith("| `")]
    columns = ["commit", "machine", "how", "passed", "failed", "skipped", "s"]
    table = {row[0].strip().strip("`"): dict(zip(columns, (cell.strip() for cell in row[1:]))) for row in rows}
    logs = sorted(os.listdir(os.path.join(REPO, "docs", "bench", "suite")))
    assert sorted(table) == logs
    for name in logs:
        assert table[name] == suite_log_says(os.path.join(REPO, "docs", "bench", "suite", name)), name


def test_throughput_mds_feed_forward_learner_table_is_what_its_result_file_says():
    """docs/results/throughput.md's learner steps before and after a12023f: each cell the median of
    the three alternating rounds its result file records, and the ratio of the two."""
    with open(os.path.join(REPO, "docs", "results", "throughput.md")) as f:
        page = f.read()
    section = page[page.index("## A feed-forward policy's learner step"):page.index("## The IPC queue")]
    with open(os.path.join(REPO, "docs", "bench", "throughput", "feedforward_core_2026-12-05.txt")) as f:
        blocks = f.read().split("\n\n")
    rows = [line for line in section.splitlines() if line.startswith("| ") and " ms |" in line]
    # the file's blocks in its order: 10 epochs, the family's 2 epochs, atari_pong; the table's rows:
    # 2 epochs, 10 epochs, atari_pong
    assert len(blocks) == len(rows) == 3
    for block, row in zip((blocks[1], blocks[0], blocks[2]), rows):
        medians = []
        for side in ("before", "after"):
            runs = [float(ms) for ms in re.findall(rf"^{side}: .*wall_ms_per_step: ([0-9.]+)", block, re.M)]
            assert len(runs) == 3, block
            medians.append(sorted(runs)[1])
        cells = row.strip("| ").split(" | ")
        assert cells[1:] == [f"{medians[0]:,.1f} ms", f"{medians[1]:,.1f} ms", f"{medians[1] / medians[0]:.2f}"], row


GROUP_TABLES = {"simple_tag": "## Groups of agents: predators and prey",
                "simple_adversary": "### A second mixed env: simple_adversary"}


@pytest.mark.parametrize("folder, heading", GROUP_TABLES.items())
def test_the_groups_tables_in_learning_md_are_their_files(folder, heading):
    """learning.md's table of each groups bench, cell for cell from its result files (rows in the
    bench's order of pairings), with the minutes and the code its text gives."""
    results = [bench_groups.bench.load_result(path) for path in
               sorted(glob.glob(os.path.join(REPO, "docs", "bench", "groups", folder, "appo_seed*.json")))]
    assert len(results) == 3
    with open(os.path.join(REPO, "docs", "results", "learning.md")) as f:
        section = f.read().split(heading, 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "[" in line]
    assert len(rows) == len(results[0]["scores"])
    for row, pairing in zip(rows, results[0]["scores"]):
        cells = [cell.strip().strip("*").replace("** [", " [") for cell in row.strip("|").split("|")[1:]]
        for group, cell in enumerate(cells):
            values = sorted(result["scores"][pairing][group] for result in results)
            assert cell == f"{np.median(values):.2f} [{values[0]:.2f}, {values[-1]:.2f}]", (pairing, group)
    minutes = np.median([result["wall_s"] / 60 for result in results])
    assert f"{minutes:.1f} minutes median" in " ".join(section.split())
    assert f"Code {results[0]['config']['code']}" in " ".join(section.split())
