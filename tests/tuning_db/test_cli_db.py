"""`tvmsched db ...` and `compile --db` through the CLI, against a service started by `tvmsched db serve`."""

import json
import socket
import subprocess
import sys
import time

import httpx
import onnx
import pytest

from tests.helpers import assert_user_error, cli_in_process, run_cli
from tvmsched import models

TOKEN = "s3cret-token"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`tvmsched db serve` on a free loopback port with a token: (url, sqlite url, token file)."""
    folder = tmp_path_factory.mktemp("served")
    token_file, db = folder / "token", f"sqlite:///{folder / 'svc.db'}"
    token_file.write_text(TOKEN + "\n")
    url = f"http://127.0.0.1:{free_port()}"
    cmd = [sys.executable, "-m", "tvmsched.cli", "db", "serve", "--db", db, "--port", url.rsplit(":", 1)[1], "--token-file", token_file]
    proc = subprocess.Popen(list(map(str, cmd)), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail(f"tvmsched db serve did not come up: {proc.stderr.read()[-2000:]}")
    yield url, db, token_file
    proc.terminate()
    proc.wait(10)


def test_compile_through_the_service_then_recompile_from_it(served, tmp_path, cli):
    url, db, token_file = served
    model = tmp_path / "tiny.onnx"
    onnx.save(models.build("tiny"), model)
    first = cli("compile", model, "--tune-trials", "4", "--db", url, "--db-token-file", token_file)
    assert first.returncode == 0, first.stderr[-2000:]
    # searched (4 trials): its kernel is the tuned one, or the default where that measured faster (machine speed)
    assert "1 layers tuned" in first.stdout or "1 kept the faster default schedule" in first.stdout, first.stdout
    remote = json.loads(cli("db", "stats", "--db", url, "--json").stdout)
    assert remote == json.loads(cli("db", "stats", "--db", db, "--json").stdout)
    assert remote["workloads"] == 1 and remote["records"] >= 1
    # reads need no token: re-compiling from the service runs zero new trials
    again = cli("compile", model, "--tune-trials", "4", "--db", url)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "0 new trials" in again.stdout, again.stdout
    assert "1 from the database" in again.stdout or "1 kept the faster default schedule" in again.stdout, again.stdout


def test_writes_without_the_token_are_a_user_error(served, tmp_path, cli):
    url, db, _ = served
    model = tmp_path / "mlp.onnx"
    onnx.save(models.build("mlp"), model)
    before = cli("db", "stats", "--db", db, "--json").stdout
    assert_user_error(run_cli("compile", model, "--tune-trials", "4", "--db", url), "needs a valid token", after_progress=True)
    assert cli("db", "stats", "--db", db, "--json").stdout == before


def test_database_url_errors(tmp_path):
    model = tmp_path / "tiny.onnx"
    onnx.save(models.build("tiny"), model)
    assert_user_error(run_cli("compile", model, "--tune-trials", "2", "--db", "ftp://nowhere"), "unsupported database URL")
    assert_user_error(run_cli("db", "stats", "--db", "http://127.0.0.1:1"), "cannot reach")
    assert_user_error(run_cli("db", "serve", "--token-file", tmp_path / "missing"), "token")
    assert_user_error(run_cli("compile", model, "--tune-trials", "-1"), "--tune-trials")


def test_export_then_import_round_trip(served, tmp_path, cli):
    _, db, _ = served
    exported = cli("db", "export", tmp_path / "ms", "--db", db)
    assert exported.returncode == 0, exported.stderr
    other = f"sqlite:///{tmp_path / 'other.db'}"
    for _ in range(2):  # the second import adds nothing
        imported = cli("db", "import", tmp_path / "ms", "--db", other, "--units", "2", "--unit-kind", "cpu_thread")
        assert imported.returncode == 0, imported.stderr
    assert cli("db", "stats", "--db", other, "--json").stdout == cli("db", "stats", "--db", db, "--json").stdout


# --- errors of the db commands: one `error:` line, exit 2, never a traceback --------------------------


def _not_a_database(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("these are notes, not a database\n" * 64)
    return path


@pytest.mark.parametrize("command", ["stats", "serve"])
def test_db_commands_on_a_non_database_file_or_a_malformed_url(command, tmp_path):
    notes = _not_a_database(tmp_path)
    result = run_cli("db", command, "--db", f"sqlite:///{notes}", timeout=120)
    assert_user_error(result, "cannot open the tuning database", "notes.txt", "file is not a database")
    assert notes.read_text().startswith("these are notes")  # left as it was
    for url in ("postgresql+psycopg://tuner:s3cret@127.0.0.1:notaport/db", "sqlite://user:s3cret@/x.db",
                "postgresql+nosuchdriver://tuner@127.0.0.1/db"):
        result = run_cli("db", command, "--db", url, timeout=120)
        assert_user_error(result, "malformed database URL")
        assert "s3cret" not in result.stderr  # the password is never printed


def test_db_import_of_malformed_json_is_a_user_error(tmp_path, cli):
    from tvm.s_tir.meta_schedule.database import Workload

    from factories import add_relu_mod

    db = f"sqlite:///{tmp_path / 'tuning.db'}"
    workload_line = json.dumps(Workload(add_relu_mod()).as_json())
    cases = [  # (workload file, record file, expected fragments)
        ("{not json\n", None, ["database_workload.json, line 1", "not valid JSON"]),
        (workload_line + "\n\n" + "[" * 100_000 + "\n", None, ["database_workload.json, line 3", "nested deeper"]),
        ('["1", 2]\n', None, ["database_workload.json, line 1", "not a MetaSchedule workload entry"]),
        (workload_line + "\n", '[0, [[], [0.1], {"kind": "llvm"}, []]\n', ["database_tuning_record.json, line 1",
                                                                           "not valid JSON"]),
        (workload_line + "\n", '[3, [[], [0.1], {"kind": "llvm"}, []]]\n', ["database_tuning_record.json, line 1",
                                                                            "workload index 3"]),
        (workload_line + "\n", '{"index": 0}\n', ["database_tuning_record.json, line 1",
                                                   "not a MetaSchedule tuning record"]),
    ]
    for i, (workloads, records, fragments) in enumerate(cases):
        folder = tmp_path / f"ms{i}"
        folder.mkdir()
        (folder / "database_workload.json").write_text(workloads)
        if records is not None:
            (folder / "database_tuning_record.json").write_text(records)
        result = cli_in_process("db", "import", folder, "--db", db, "--units", "2", "--unit-kind", "cpu_thread")
        assert_user_error(result, *fragments)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_user_error(cli_in_process("db", "import", empty, "--db", db, "--units", "2", "--unit-kind", "cpu_thread"),
                      "not a MetaSchedule JSON database", "database_workload.json")
    assert json.loads(cli("db", "stats", "--db", db, "--json").stdout) == {"workloads": 0, "records": 0}


def test_tune_import_of_malformed_json_is_a_user_error(tmp_path):
    kit = tmp_path / "kit"
    kit.mkdir()
    for name, content, fragment in (("bad.json", "{bad", "Expecting property name"),
                                    ("deep.json", "[" * 100_000, "nested deeper")):
        (tmp_path / name).write_text(content)
        result = run_cli("tune", "import", kit, tmp_path / name, "--db", f"sqlite:///{tmp_path / 'tuning.db'}")
        assert_user_error(result, f"cannot read results {tmp_path / name}", fragment)


def test_db_serve_on_a_bad_or_busy_port(tmp_path):
    db = f"sqlite:///{tmp_path / 'tuning.db'}"
    assert_user_error(run_cli("db", "serve", "--db", db, "--port", "99999"), "--port", "99999")
    assert_user_error(run_cli("db", "serve", "--db", db, "--port", "-1"), "--port")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_cli("db", "serve", "--db", db, "--port", port, timeout=120)
    assert_user_error(result, f"cannot listen on 127.0.0.1:{port}", "in use")


def test_serve_refuses_a_bad_port_before_opening_the_database(tmp_path):
    from tvmsched.errors import TvmschedError
    from tvmsched.tuning_db.service import serve

    with pytest.raises(TvmschedError, match="invalid port 99999"):
        serve(f"sqlite:///{tmp_path / 'x.db'}", port=99999)
    assert not (tmp_path / "x.db").exists()
