"""Learning curves from appo.py's TensorBoard summaries: PNGs and a results table.

    python scripts/tools/plot.py train_dir/doom_basic --target 75 --out docs/doom_basic.png
    python scripts/tools/plot.py train_dir/lr_sweep/* --out lr_sweep.png

Each experiment folder is one run. Runs whose names differ only in a trailing `_seed<N>` form a
group, drawn as the mean over its seeds with the min-max spread shaded; a run on its own is a
plain line. The figure has two panels: the curve against env frames and against wall time.
The table gives, per run and per group, the frames trained, the wall time, the final and best
average return and the first frame where `--target` was reached. Needs matplotlib for --out.
"""
import argparse
import os
import re
import sys

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

SEED_SUFFIX = re.compile(r"_seed\d+$")


def load_scalars(experiment_dir: str, tag: str) -> np.ndarray:
    """[N, 3] array of (seconds since the first point, env frames, value), across resumed runs."""
    events_dir = os.path.join(experiment_dir, "tb")
    if not os.path.isdir(events_dir):
        events_dir = experiment_dir
    accumulator = EventAccumulator(events_dir, size_guidance={"scalars": 0})
    accumulator.Reload()
    if tag not in accumulator.Tags()["scalars"]:
        raise SystemExit(f"error: {events_dir} has no '{tag}' summaries (tags: {accumulator.Tags()['scalars']}); "
                         "pick one with --tag")
    points = np.array(sorted((event.step, event.wall_time, event.value) for event in accumulator.Scalars(tag)))
    return np.stack([points[:, 1] - points[0, 1], points[:, 0], points[:, 2]], axis=1)


def group_runs(runs: dict[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    groups: dict[str, dict[str, np.ndarray]] = {}
    for name, points in runs.items():
        groups.setdefault(SEED_SUFFIX.sub("", name), {})[name] = points
    return groups


def summarize(name: str, points: np.ndarray, target: float | None) -> dict:
    reached = points[points[:, 2] >= target, 1] if target is not None else []
    return {"name": name, "frames": points[-1, 1], "wall_min": points[-1, 0] / 60, "final": points[-1, 2],
            "best": points[:, 2].max(), "reached": reached[0] if len(reached) else None}


def group_summary(name: str, members: dict[str, np.ndarray], target: float | None) -> dict:
    rows = [summarize(run, points, target) for run, points in members.items()]
    reached = [row["reached"] for row in rows]
    return {"name": f"{name} (mean of {len(rows)})", "frames": np.mean([r["frames"] for r in rows]),
            "wall_min": np.mean([r["wall_min"] for r in rows]), "final": np.mean([r["final"] for r in rows]),
            "best": np.mean([r["best"] for r in rows]),
            "reached": np.mean(reached) if reached and None not in reached else None}


def print_table(rows: list[dict], target: float | None):
    target_header = f"frames to {target:g}" if target is not None else ""
    print(f"| run | env frames | wall time (min) | final avg return | best avg return | {target_header} |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        reached = f"{row['reached']:,.0f}" if row["reached"] is not None else ("not reached" if target is not None else "")
        print(f"| {row['name']} | {row['frames']:,.0f} | {row['wall_min']:.1f} | {row['final']:.2f} "
              f"| {row['best']:.2f} | {reached} |")


def mean_and_spread(members: dict[str, np.ndarray], column: int) -> tuple[np.ndarray, ...]:
    """The members' curves on a common grid of `column` (0: wall time, 1: frames), up to where all reach."""
    end = min(points[-1, column] for points in members.values())
    grid = np.linspace(0, end, 200)
    curves = np.stack([np.interp(grid, points[:, column], points[:, 2]) for points in members.values()])
    return grid, curves.mean(0), curves.min(0), curves.max(0)


def plot(groups: dict, out: str, tag: str, target: float | None, title: str | None):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, panels = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    for column, axes, xlabel, scale in ((1, panels[0], "env frames (frameskip included)", 1.0),
                                        (0, panels[1], "wall time (minutes)", 1 / 60)):
        for name, members in groups.items():
            if len(members) == 1:
                points = next(iter(members.values()))
                axes.plot(points[:, column] * scale, points[:, 2], label=name)
            else:
                grid, mean, low, high = mean_and_spread(members, column)
                line, = axes.plot(grid * scale, mean, label=f"{name} ({len(members)} seeds)")
                axes.fill_between(grid * scale, low, high, color=line.get_color(), alpha=0.2)
        if target is not None:
            axes.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:g}")
        axes.set_xlabel(xlabel)
        axes.grid(alpha=0.3)
    panels[0].set_ylabel(f"{tag} (last 100 episodes)")
    panels[0].legend()
    figure.suptitle(title or ", ".join(groups))
    figure.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    figure.savefig(out, dpi=110)
    print(f"wrote {out}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiments", nargs="+", help="experiment folders (train_dir/<experiment>)")
    parser.add_argument("--tag", default="p0/true_return", help="summary tag to plot")
    parser.add_argument("--target", type=float, default=None, help="draw this return and report when it was reached")
    parser.add_argument("--out", default=None, help="PNG to write (default: only print the table)")
    parser.add_argument("--title", default=None, help="figure title (default: the group names)")
    args = parser.parse_args(argv)
    missing = [path for path in args.experiments if not os.path.isdir(path)]
    if missing:
        print(f"error: no such experiment folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    runs = {os.path.basename(os.path.normpath(path)): load_scalars(path, args.tag) for path in args.experiments}
    groups = group_runs(runs)
    rows = [summarize(name, points, args.target) for name, points in runs.items()]
    rows += [group_summary(name, members, args.target) for name, members in groups.items() if len(members) > 1]
    print_table(rows, args.target)
    if args.out:
        plot(groups, args.out, args.tag, args.target, args.title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
