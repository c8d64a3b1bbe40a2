"""The Hub tests again under the oldest huggingface_hub the project supports (pyproject: >=0.24).

The main run uses the newest client (what `pip install` resolves); `make setup` also installs
huggingface_hub 0.24.7 and its dependencies into ``.venv/hub-min``, and this test reruns every
non-slow Hub test with that folder first on the path, in a fresh process (the client reads its
settings at import).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

OLDEST = "0.24.7"
HUB_MIN = Path(sys.prefix) / "hub-min"
HERE = Path(__file__).resolve().parent


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("ZOO_HUB_VERSION_RUN") == "1", reason="already inside the oldest-client run")
def test_the_hub_tests_pass_with_the_oldest_supported_client():
    if not (HUB_MIN / "huggingface_hub").is_dir():
        pytest.skip(f"{HUB_MIN} holds no huggingface_hub: run `make setup` (it installs huggingface_hub=={OLDEST} there)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HUB_MIN), *filter(None, [os.environ.get("PYTHONPATH")])]),
           "ZOO_HUB_VERSION_RUN": "1"}
    version = subprocess.run([sys.executable, "-c", "import huggingface_hub; print(huggingface_hub.__version__)"],
                             env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert version == OLDEST
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", str(HERE)],
                          env=env, capture_output=True, text=True, timeout=600, cwd=HERE.parents[1])
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
