"""The tests' shared cache (tests/artifact_cache.py): keyed by everything the compiler's output depends on, one
writer per entry across processes, read-only entries, and a cache written into is caught."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from tests.artifact_cache import COMPILER_ENV, ROOT, Cache, Compiled
from tvmsched import models

# where the compile pipeline lives (what `tvmsched compile` runs); the CLI and the servers read variables of their own
COMPILE_PATH = ("tvmsched/frontend", "tvmsched/lower", "tvmsched/tune", "tvmsched/artifact", "tvmsched/pipeline.py",
                "passes", "tuning_db")


def test_the_key_covers_every_variable_the_compiler_reads():
    named = set()
    for part in COMPILE_PATH:
        files = [ROOT / part] if part.endswith(".py") else sorted((ROOT / part).rglob("*.py"))
        for path in files:
            named |= set(re.findall(r"\b(TVMSCHED_[A-Z0-9_]+)\b", path.read_text()))
    assert named, "no TVMSCHED_ variable found: the scan is broken"
    assert named <= set(COMPILER_ENV), f"add to COMPILER_ENV: {sorted(named - set(COMPILER_ENV))}"


def test_keys_change_with_the_model_the_options_and_the_environment(tmp_path, monkeypatch):
    compiled = Compiled(Cache(tmp_path))
    tiny, mlp = models.build("tiny"), models.build("mlp")
    base = compiled.key(tiny, {"name": "tiny"})
    assert compiled.key(models.build("tiny"), {"name": "tiny"}) == base  # rebuilt, same bytes
    assert compiled.key(mlp, {"name": "tiny"}) != base
    assert compiled.key(models.build("mlp", seed=1), {"name": "tiny"}) != compiled.key(mlp, {"name": "tiny"})
    assert compiled.key(tiny, {"name": "tiny", "preempt_checks": False}) != base
    assert compiled.key(tiny, {"name": "other"}) != base
    assert compiled.key(tiny, {"name": "tiny", "target": "llvm:x86-64-v2"}) != base
    monkeypatch.setenv("TVMSCHED_GPU_SMS", "7")
    assert compiled.key(tiny, {"name": "tiny"}) != base


def test_one_process_writes_an_entry_the_others_wait_and_read_it(tmp_path):
    """Three processes ask for the same entry at once: one makes it (slowly), all read the same bytes."""
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        sys.path.insert(0, {str(ROOT)!r})
        from tests.artifact_cache import Cache

        def make(tmp):
            with open({str(tmp_path / 'makers')!r}, "a") as log:
                log.write("made\\n")
            time.sleep(1.0)
            tmp.write_bytes(b"x" * 100000)

        path = Cache(Path({str(tmp_path / 'cache')!r})).entry("key", ".bin", make, lambda: "a test entry")
        print(len(path.read_bytes()))
    """)
    runs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) for _ in range(3)]
    outputs = [run.communicate(timeout=120)[0].strip() for run in runs]
    assert [run.returncode for run in runs] == [0, 0, 0]
    assert outputs == ["100000"] * 3
    assert (tmp_path / "makers").read_text() == "made\n"
    assert not list((tmp_path / "cache").glob("*.tmp"))
    made = [json.loads(line) for line in (tmp_path / "cache" / "made.jsonl").read_text().splitlines()]
    assert [(m["entry"], m["what"]) for m in made] == [("key.bin", "a test entry")] and made[0]["seconds"] >= 1.0


def test_entries_are_read_only_and_a_test_that_writes_one_is_caught(tmp_path):
    cache = Cache(tmp_path)
    path = cache.entry("key", ".bin", lambda tmp: tmp.write_bytes(b"cached"))
    assert path.stat().st_mode & 0o777 == 0o444
    assert cache.changed() == []
    os.chmod(path, 0o644)  # root writes whatever the mode says: the digest catches it
    path.write_bytes(b"changed")
    assert cache.changed() == [str(path)]


def test_a_cached_artifact_runs_and_its_copy_is_writable(compiled, reference, tmp_path):
    from tvmsched.runtime import load

    path = compiled("tiny")
    assert compiled("tiny") == path  # the same entry, not a second compile
    copy = compiled.copy("tiny", tmp_path)
    assert copy == tmp_path / "tiny.tvms" and copy.read_bytes() == path.read_bytes()
    copy.write_bytes(b"tampered")  # the cache is untouched
    assert Path(path).read_bytes() != b"tampered"
    executor = load(path)
    inputs = executor.random_inputs(seed=0)
    want = reference("tiny", inputs)
    got = executor.run(inputs)
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5)
    assert compiled.artifact("tiny").manifest.model_name == "tiny"
