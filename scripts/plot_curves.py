"""Learning curves from appo.py's TensorBoard summaries: a PNG and a results table.

    python scripts/plot_curves.py train_dir/doom_basic --out docs/doom_basic.png
    python scripts/plot_curves.py train_dir/run_a train_dir/run_b --tag p0/true_return

Needs matplotlib for --out (`pip install -e .[bench]`). Each experiment folder becomes one line
(average episode return of its last 100 episodes, the unscaled game score, against env frames). The table printed underneath gives, per experiment,
the frames trained, the wall time, the final average return and the first frame where a
`--target` return was reached.
"""
import argparse
import os
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def load_scalars(experiment_dir: str, tag: str) -> list[tuple[float, int, float]]:
    """(wall_time, env_frames, value) for every point of `tag`, oldest first, across resumed runs."""
    events_dir = os.path.join(experiment_dir, "tb")
    if not os.path.isdir(events_dir):
        events_dir = experiment_dir
    accumulator = EventAccumulator(events_dir, size_guidance={"scalars": 0})
    accumulator.Reload()
    if tag not in accumulator.Tags()["scalars"]:
        raise SystemExit(f"error: {events_dir} has no '{tag}' summaries (tags: {accumulator.Tags()['scalars']})")
    return sorted((event.wall_time, event.step, event.value) for event in accumulator.Scalars(tag))


def summarize(name: str, points, target: float | None) -> dict:
    wall_s = points[-1][0] - points[0][0]
    reached = next((frames for _, frames, value in points if target is not None and value >= target), None)
    return {"experiment": name, "frames": points[-1][1], "wall_min": wall_s / 60, "final": points[-1][2],
            "best": max(value for _, _, value in points), "reached": reached}


def print_table(rows: list[dict], target: float | None):
    target_header = f"frames to {target:g}" if target is not None else ""
    print(f"| experiment | env frames | wall time (min) | final avg return | best avg return | {target_header} |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        reached = f"{row['reached']:,}" if row["reached"] is not None else ("not reached" if target is not None else "")
        print(f"| {row['experiment']} | {row['frames']:,} | {row['wall_min']:.1f} | {row['final']:.1f} "
              f"| {row['best']:.1f} | {reached} |")


def plot(curves: dict, out: str, tag: str, target: float | None, title: str | None):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.2))
    for name, points in curves.items():
        axes.plot([frames for _, frames, _ in points], [value for _, _, value in points], label=name)
    if target is not None:
        axes.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:g}")
    axes.set_xlabel("env frames (frameskip included)")
    axes.set_ylabel(f"{tag} (last 100 episodes)")
    axes.set_title(title or ", ".join(curves))
    axes.grid(alpha=0.3)
    axes.legend()
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
    parser.add_argument("--title", default=None, help="plot title (default: the experiment names)")
    args = parser.parse_args(argv)
    missing = [path for path in args.experiments if not os.path.isdir(path)]
    if missing:
        print(f"error: no such experiment folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    curves = {os.path.basename(os.path.normpath(path)): load_scalars(path, args.tag) for path in args.experiments}
    print_table([summarize(name, points, args.target) for name, points in curves.items()], args.target)
    if args.out:
        plot(curves, args.out, args.tag, args.target, args.title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
