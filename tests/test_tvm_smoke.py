"""The pinned TVM wheels must not crash where unpinned ones do (see ../shared/tvm-notes.md)."""

import subprocess
import sys


def test_save_json_of_primtype_does_not_crash():
    code = "import tvm; s = tvm.ir.save_json(tvm.ir.PrimType('int32')); assert 'int32' in s; print('ok')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("ok")
