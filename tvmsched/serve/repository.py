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
holds the queued rows only while they are fewer than the smallest of these; each must be a compiled batch size),
refresh_sizes (a model compiled at several batch sizes: their figures follow the launches, Runtime.load(refresh_sizes=);
default false; docs/batching.md).
The candidates (and their unit counts) are the artifact's: choose them when compiling (`tvmsched compile --qos-ms
--units`). A config.toml with the same keys is read when there is no config.json.

The engine reads the folders (runtime/native/src/repository.cc: the same keys, checks and error lines for the C++
server); this module hands it what it does not parse itself (config.pbtxt, config.toml) as JSON.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from tvmsched.errors import TvmschedError
from tvmsched.runtime import native


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
    refresh_sizes: bool = False  # Runtime.load(refresh_sizes=)
    # a Triton-layout folder (serve/triton_config.py): the version served, the queue policy (Runtime.load(queue_policy=)),
    # max_batch_size (None: the artifact's largest batch size), and the config's path
    version: str = "1"
    queue_policy: dict = field(default_factory=dict)
    max_batch_size: int | None = None
    config_path: str | None = None
    devices: tuple[int, ...] = ()  # a server on several devices: a replica on each (Runtime.load(devices=); none: placed)


def parse_model(spec: str) -> ModelSpec:
    """NAME=ARTIFACT[:QOS_MS[:PRIORITY]] (examples/server.py's --model; read by the engine, as the C++ server reads it)."""
    return _spec(native.func("model_flag")(spec))


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
        return [str(name) for name in native.func("repository_names")(str(self.root))]

    def spec(self, name: str) -> ModelSpec:
        folder = self.root / name
        if "/" in name or name.startswith(".") or not folder.is_dir():
            raise LookupError(f"no model named {name!r} in the repository {self.root}")
        return _spec(native.func("repository_model")(str(self.root), name, list(self.devices), _to_json))


def _spec(s) -> ModelSpec:
    """The engine's serving::ModelSpec (qos_ms 0: the artifact's; max_queue, max_batch_size < 0: not set)."""
    return ModelSpec(str(s["name"]), str(s["path"]), float(s["qos_ms"]) or None, str(s["priority"]), bool(s["warmup"]),
                     int(s["max_queue"]) if s["max_queue"] >= 0 else None, int(s["streams"]),
                     float(s["max_queue_delay_us"]), tuple(int(n) for n in s["preferred_batch_sizes"]),
                     bool(s["refresh_sizes"]),
                     version=str(s["version"]), queue_policy={str(k): v for k, v in s["queue_policy"].items()},
                     max_batch_size=int(s["max_batch_size"]) if s["max_batch_size"] >= 0 else None,
                     config_path=str(s["config_path"]) or None, devices=tuple(int(d) for d in s["devices"]))


def _to_json(path: str, text: str) -> str:
    """A config file the engine does not parse itself, as JSON: config.pbtxt (protobuf's text format) or config.toml."""
    if path.endswith(".pbtxt"):
        from tvmsched.serve import triton_config

        return triton_config.to_json(path, text)
    try:
        return json.dumps(tomllib.loads(text), allow_nan=False)  # (a nan or inf value: refused here)
    except (ValueError, TypeError) as err:
        raise TvmschedError(f"cannot read {path}: {' '.join(str(err).split())}") from None
