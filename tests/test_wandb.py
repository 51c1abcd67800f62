"""--with_wandb, offline (WANDB_MODE=offline): the same scalars and the config reach a W&B run,
charted against env frames.

The offline run is read back from its .wandb file: a LevelDB-style log (32 KiB blocks of
checksummed, possibly fragmented records) of W&B's own protobuf records."""
import glob
import json
import os
import struct
import subprocess
import sys
import uuid

import pytest

import appo
from conftest import RUN_TIMEOUT_S, processes_still_tagged

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_offline_wandb_run_gets_the_config_and_the_summaries_against_env_frames(tmp_path):
    tag = uuid.uuid4().hex
    command = [sys.executable, os.path.join(REPO, "appo.py"), "--env", "doom_basic", "--num_workers", "1",
               "--num_envs_per_worker", "2", "--worker_num_splits", "1", "--batch_size", "64", "--rollout", "16",
               "--train_dir", str(tmp_path), "--experiment", "logged", "--train_for_env_steps", "4000",
               "--report_every_sec", "2", "--with_wandb", "--wandb_group", "tests", "--wandb_tags", "a", "b",
               "--serial_mode"]  # the runner logs to W&B; one process is enough to feed it
    home = tmp_path / "home"  # where W&B's service would otherwise keep its logs (~/.cache/wandb)
    environment = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "APPO_TEST_TAG": tag,
                   "HOME": str(home)}
    environment.pop("WANDB_CACHE_DIR", None)
    result = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=environment)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    runs = glob.glob(str(tmp_path / "logged" / "wandb" / "offline-run-*"))
    assert len(runs) == 1, os.listdir(tmp_path / "logged")
    history_keys, config, step_metrics = read_offline_run(glob.glob(os.path.join(runs[0], "run-*.wandb"))[0])
    assert {"perf/fps", "env_frames", "p0/loss", "p0/true_return"} <= history_keys
    assert step_metrics.get("*") == "env_frames", step_metrics  # every chart's x-axis, not W&B's log-call count
    assert json.loads(config["env"]) == "doom_basic" and json.loads(config["batch_size"]) == 64
    with open(tmp_path / "logged" / "wandb_run_id") as f:
        assert f.read().strip() in os.path.basename(runs[0])  # a resumed run continues this one
    assert processes_still_tagged(tag) == []  # W&B's service process too
    # W&B wrote in the experiment's folder only
    assert glob.glob(str(tmp_path / "logged" / "wandb" / "cache" / "wandb" / "logs" / "core-debug-*.log"))
    written = [os.path.join(folder, name) for folder, _, names in os.walk(home) for name in names]
    assert not [path for path in written if "wandb" in path], written


def read_offline_run(path: str) -> tuple[set, dict, dict]:
    """The history keys, the config (key -> JSON) and the step metric of each defined metric (name
    or glob -> step metric name) recorded in an offline run's .wandb file."""
    from wandb.proto import wandb_internal_pb2
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B"
    block_size, position, payloads, pending = 32768, 7, [], b""  # after the 7-byte file header
    while position + 7 <= len(data):
        space = block_size - position % block_size
        _, length, kind = struct.unpack("<IHB", data[position:position + 7]) if space >= 7 else (0, 0, 0)
        if kind == 0:  # the padded end of a block
            position += space
            continue
        payload = data[position + 7:position + 7 + length]
        position += 7 + length
        pending = payload if kind in (1, 2) else pending + payload  # full, first, middle, last
        if kind in (1, 4):
            payloads.append(pending)
    history_keys, config, step_metrics = set(), {}, {}
    for payload in payloads:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history_keys |= {item.key or "/".join(item.nested_key) for item in record.history.item}
        elif kind in ("run", "config"):
            updates = record.run.config.update if kind == "run" else record.config.update
            config.update({item.key: item.value_json for item in updates})
        elif kind == "metric" and record.metric.step_metric:
            step_metrics[record.metric.name or record.metric.glob_name] = record.metric.step_metric
    return history_keys, config, step_metrics


def test_with_wandb_without_the_package_is_a_flag_error(monkeypatch):
    real_find_spec = appo.importlib.util.find_spec
    monkeypatch.setattr(appo.importlib.util, "find_spec",
                        lambda name, *args: None if name == "wandb" else real_find_spec(name, *args))
    errors = appo.config_errors(appo.parse_args(["--env", "doom_basic", "--with_wandb"]))
    assert errors == ["--with_wandb needs the wandb package: pip install wandb"]
