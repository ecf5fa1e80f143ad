"""torch is optional: embnic.client_lib imports without it, and embnic.client_lib.torch says in
one line how to install it.

Run alone: python3 -m pytest -q tests/client_lib/test_torch_optional.py
"""
from __future__ import annotations

import subprocess
import sys

# a meta-path finder that makes torch, torchrec and fbgemm_gpu unimportable in the child
BLOCK = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'torchrec', 'fbgemm_gpu'):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, Block())
"""


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK + code], capture_output=True, text=True, timeout=120)


def test_client_library_imports_without_torch():
    r = run("import embnic.client_lib.batch, embnic.client_lib.client, embnic.client_lib.local, embnic.client_lib.table_numerics, "
            "embnic.client_lib.config, embnic.client_lib.codec; print('ok')")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_torch_module_names_the_extra():
    r = run("""
try:
    import embnic.client_lib.torch
except ImportError as e:
    print(str(e))
""")
    assert r.returncode == 0, r.stderr
    line = r.stdout.strip()
    assert "\\n" not in line and "pip install 'embnic[torch]'" in line and "torchrec==1.9.2" in line, line
