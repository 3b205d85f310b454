"""Token authentication for the local cluster rlgen starts: on by default, as ray.init() sets it, without Ray's
warning that it turned it on; a mode the user set is kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("ray")

CALL = """
import json, os
from rlgen.runtime.cluster.local_ray import _token_auth_as_ray_init
from ray._raylet import AuthenticationMode, get_authentication_mode
_token_auth_as_ray_init()
print(json.dumps({"env": os.environ.get("RAY_AUTH_MODE"), "token": get_authentication_mode() == AuthenticationMode.TOKEN,
                  "saved": os.path.isfile(os.path.expanduser("~/.ray/auth_token"))}))
"""


def _call(home, mode: str | None) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")} | {"HOME": str(home)}
    if mode is not None:
        env["RAY_AUTH_MODE"] = mode
    proc = subprocess.run([sys.executable, "-c", CALL], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stdout + proc.stderr


def test_local_cluster_turns_token_auth_on_without_rays_warning(tmp_path):
    got, output = _call(tmp_path, None)
    assert got == {"env": "token", "token": True, "saved": True}  # as ray.init() does for a cluster it starts
    assert "Token authentication" not in output, output


def test_a_mode_the_user_set_is_kept(tmp_path):
    got, output = _call(tmp_path, "disabled")
    assert got == {"env": "disabled", "token": False, "saved": False}
    assert "Token authentication" not in output, output
