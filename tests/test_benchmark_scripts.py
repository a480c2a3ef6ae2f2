"""The benchmark scripts that no suite test imports start on a CPU machine (``--help``): their imports
and argument parsers hold. ``read_ceiling.py`` and ``copy_ceiling.py`` imported a module that had
moved (``activations``'s ``head_to_head``, now in ``tunekit.bench.suites.common``) and failed on the
GPU before measuring anything."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("script", ["benchmarks/ceilings/copy_ceiling.py", "benchmarks/ceilings/read_ceiling.py",
                                    "benchmarks/pretune.py"])
def test_script_starts(script):
    done = subprocess.run([sys.executable, "-W", "error::SyntaxWarning", str(ROOT / script), "--help"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
