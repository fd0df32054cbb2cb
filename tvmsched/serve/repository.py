"""Where served models come from: `--model NAME=PATH[:QOS_MS[:PRIORITY]]` specs and model repositories.

A model repository is a folder with one folder per model, named as the model is served. A model folder is either in
Triton's layout (`NAME/config.pbtxt`, `NAME/1/model.tvms`, ...: serve/triton_config.py says what is read) or in
tvmsched's own:

    models/
      resnet/
        resnet.tvms        # exactly one artifact (tvmsched compile ... -o resnet.tvms)
        config.json        # optional: {"qos_ms": 20, "priority": "realtime", "warmup": true, "max_queue": 64,
                           #            "streams": 2, "max_queue_delay_us": 500, "preferred_batch_sizes": [4]}

config.json keys (all optional): qos_ms (the model's latency target, default: the artifact's), priority
("realtime" or "best_effort", default best_effort), warmup (run every candidate kernel once at load, default true),
max_queue (requests queued or running for it before more are answered 503, default: the server's --max-queue),
streams (serve it on that many streams, resident, the streams reading one copy of its weights, every request on
the one with the fewest pending: Runtime.load(streams=); default 1), max_queue_delay_us (a model compiled for a batch: how long a free stream waits
after the oldest queued request arrived for the queued rows to fill the batch, Triton's max_queue_delay_microseconds;
default 0, launch at once; docs/batching.md), preferred_batch_sizes (Triton's preferred_batch_size: a free stream
holds the queued rows only while they are fewer than the smallest of these; each must be a compiled batch size).
The candidates (and their unit counts) are the artifact's: choose them when compiling (`tvmsched compile --qos-ms
--units`). A config.toml with the same keys is read when there is no config.json.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from tvmsched.errors import TvmschedError

PRIORITIES = ("realtime", "best_effort")
CONFIG_KEYS = {"qos_ms": (int, float), "priority": str, "warmup": bool, "max_queue": int, "streams": int,
               "max_queue_delay_us": (int, float), "preferred_batch_sizes": list}


@dataclass(frozen=True)
class ModelSpec:
    """One model to serve."""

    name: str
    path: str
    qos_ms: float | None = None
    priority: str = "best_effort"
    warmup: bool = True
    max_queue: int | None = None  # None: the server's
    streams: int = 1  # Runtime.load(streams=)
    max_queue_delay_us: float = 0.0  # Runtime.load(max_queue_delay_us=)
    preferred_batch_sizes: tuple[int, ...] = ()  # Runtime.load(preferred_batch_sizes=)
    # a Triton-layout folder (serve/triton_config.py): the version served, the queue policy (Runtime.load(queue_policy=)),
    # max_batch_size (None: the artifact's largest batch size), the instance groups' kinds, and the config's path
    version: str = "1"
    queue_policy: dict = field(default_factory=dict)
    max_batch_size: int | None = None
    instance_kinds: tuple[int, ...] = ()
    config_path: str | None = None
    devices: tuple[int, ...] = ()  # a server on several devices: a replica on each (Runtime.load(devices=); none: placed)


def parse_model(spec: str) -> ModelSpec:
    """NAME=ARTIFACT[:QOS_MS[:PRIORITY]] (examples/server.py's --model)."""
    name, _, rest = spec.partition("=")
    path, qos, priority = (rest.split(":") + ["", ""])[:3]
    try:
        qos_ms = float(qos) if qos else None
    except ValueError:
        qos_ms = -1.0
    if not name or not path or (qos_ms is not None and not qos_ms > 0):
        raise TvmschedError(f"--model {spec!r} is not NAME=ARTIFACT[:QOS_MS[:PRIORITY]] with a positive QOS_MS")
    priority = priority or "best_effort"
    if priority not in PRIORITIES:
        raise TvmschedError(f"--model {spec!r}: priority must be one of {', '.join(PRIORITIES)}, not {priority!r}")
    return ModelSpec(name, path, qos_ms, priority)


def check_artifact(path: str) -> None:
    if not Path(path).is_file():
        raise TvmschedError(f"no artifact file at {path}")


class Repository:
    """A model repository folder (layout in the module docstring)."""

    def __init__(self, root: str | Path, devices: tuple[str, ...] = ("cpu",)):
        self.root = Path(root)
        self.devices = devices  # the server's, by name (a Triton config's instance_group gpus are checked against them)
        if not self.root.is_dir():
            raise TvmschedError(f"--model-repository {root}: not a folder")

    def names(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def spec(self, name: str) -> ModelSpec:
        folder = self.root / name
        if "/" in name or name.startswith(".") or not folder.is_dir():
            raise LookupError(f"no model named {name!r} in the repository {self.root}")
        from tvmsched.serve import triton_config

        if triton_config.is_triton_folder(folder):
            return triton_config.spec(name, folder, self.devices)
        artifacts = sorted(folder.glob("*.tvms"))
        if len(artifacts) != 1:
            raise TvmschedError(f"model folder {folder} must hold exactly one .tvms artifact, not {len(artifacts)}")
        config = _read_config(folder)
        return ModelSpec(name, str(artifacts[0]), config.get("qos_ms"), config.get("priority", "best_effort"),
                         config.get("warmup", True), config.get("max_queue"), config.get("streams", 1),
                         float(config.get("max_queue_delay_us", 0)), tuple(config.get("preferred_batch_sizes", ())))


def _read_config(folder: Path) -> dict:
    path = folder / "config.json"
    try:
        if path.is_file():
            config = json.loads(path.read_text())
        elif (folder / "config.toml").is_file():
            path = folder / "config.toml"
            config = tomllib.loads(path.read_text())
        else:
            return {}
    except (ValueError, OSError) as err:
        raise TvmschedError(f"cannot read {path}: {' '.join(str(err).split())}") from None
    if not isinstance(config, dict):
        raise TvmschedError(f"{path} must hold an object")
    for key, value in config.items():
        kind = CONFIG_KEYS.get(key)
        if kind is None:
            raise TvmschedError(f"{path}: unknown key {key!r} (known: {', '.join(CONFIG_KEYS)})")
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise TvmschedError(f"{path}: {key} has the wrong type ({type(value).__name__})")
    if config.get("priority", "best_effort") not in PRIORITIES:
        raise TvmschedError(f"{path}: priority must be one of {', '.join(PRIORITIES)}")
    if "qos_ms" in config and not config["qos_ms"] > 0 or "max_queue" in config and config["max_queue"] < 1:
        raise TvmschedError(f"{path}: qos_ms and max_queue must be positive")
    if not 1 <= config.get("streams", 1) <= 64:
        raise TvmschedError(f"{path}: streams must be from 1 to 64")
    sizes = config.get("preferred_batch_sizes", [])
    if not all(isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 1 << 20 for n in sizes):
        raise TvmschedError(f"{path}: preferred_batch_sizes must be a list of row counts from 1 to 1048576")
    if not 0 <= config.get("max_queue_delay_us", 0) <= 60e6:
        raise TvmschedError(f"{path}: max_queue_delay_us must be from 0 to 60000000")
    return config
