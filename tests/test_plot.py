"""scripts/tools/plot.py on real TensorBoard event files, written the way appo.py writes them."""
import os
import sys

import pytest
from torch.utils.tensorboard import SummaryWriter

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "tools"))
import plot  # noqa: E402


def write_run(folder, returns_by_frames: dict[int, float]):
    writer = SummaryWriter(os.path.join(folder, "tb"))
    for frames, value in returns_by_frames.items():
        writer.add_scalar("p0/true_return", value, frames)
    writer.close()


def test_seeds_are_grouped_and_summarised_and_both_panels_are_drawn(tmp_path, capsys):
    write_run(tmp_path / "lr_seed1", {0: -10.0, 1000: 20.0, 2000: 80.0})
    write_run(tmp_path / "lr_seed2", {0: -30.0, 1000: 40.0, 2000: 60.0, 3000: 90.0})
    write_run(tmp_path / "baseline", {0: 0.0, 1000: 5.0})
    out = tmp_path / "curves.png"
    assert plot.main([str(tmp_path / name) for name in ("lr_seed1", "lr_seed2", "baseline")]
                     + ["--target", "75", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| lr_seed1 | 2,000 |" in table and "| 80.00 | 80.00 | 2,000 |" in table
    assert "| lr_seed2 | 3,000 |" in table and "| 90.00 | 90.00 | 3,000 |" in table
    assert "| lr (mean of 2) | 2,500 |" in table and "| 85.00 | 85.00 | 2,500 |" in table
    assert "| baseline | 1,000 |" in table and "not reached" in table
    assert "baseline (mean of" not in table  # a lone run is not a group
    assert out.stat().st_size > 10_000


def test_mean_and_spread_stop_where_the_shortest_seed_stops(tmp_path):
    write_run(tmp_path / "a_seed1", {0: 0.0, 100: 10.0})
    write_run(tmp_path / "a_seed2", {0: 10.0, 200: 30.0})
    members = {name: plot.load_scalars(str(tmp_path / name), "p0/true_return") for name in ("a_seed1", "a_seed2")}
    grid, mean, low, high = plot.mean_and_spread(members, column=1)
    assert grid[-1] == 100
    assert mean[-1] == pytest.approx((10.0 + 20.0) / 2) and low[-1] == 10.0 and high[-1] == 20.0


def test_a_missing_tag_names_the_tags_there(tmp_path):
    write_run(tmp_path / "run", {0: 1.0})
    with pytest.raises(SystemExit, match="pick one with --tag"):
        plot.load_scalars(str(tmp_path / "run"), "p0/nothing")
