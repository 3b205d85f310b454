"""Whether a Ray cluster wants its authentication token, and whether the one found here (Ray's own lookup:
RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token) is the right one. The cluster's head (its GCS) is asked
for its cluster id, first without a token: a cluster with token authentication answers that with an
authentication error. This process then takes the cluster's mode (RAY_AUTH_MODE), so ray.init() joins it
without the user setting the mode; where it cannot join, one sentence says why and how to fix it."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator

PROBE_TIMEOUT_MS = 3000
HOW_TO_GET_IT = ("copy the head node's ~/.ray/auth_token to ~/.ray/auth_token on this machine, or set "
                 "RAY_AUTH_TOKEN=<the cluster's token>")


def set_auth_mode(mode: str | None) -> None:
    """RAY_AUTH_MODE for this process (None: unset), read again by Ray's cached config and token loader."""
    from ray._raylet import AuthenticationTokenLoader, Config

    if mode is None:
        os.environ.pop("RAY_AUTH_MODE", None)
    else:
        os.environ["RAY_AUTH_MODE"] = mode
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Ray's C++ client logs a failed cluster-id call on file descriptor 2; that line is the answer asked for
    here, not news. Everything else written meanwhile is passed on."""
    with tempfile.TemporaryFile() as held:
        saved = os.dup(2)
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            rest = [line for line in held.read().decode(errors="replace").splitlines(keepends=True)
                    if "Failed to get cluster ID from GCS server" not in line]
            if rest:
                os.write(2, "".join(rest).encode())


def _answer(target: str) -> str:
    """How the GCS at target answers this process, in its current mode: "ok", "refused" (an authentication
    error) or "silent: <Ray's message>"."""
    from ray._raylet import InnerGcsClient
    from ray.exceptions import AuthenticationError, RayError

    try:
        with _quiet_stderr():
            InnerGcsClient.standalone(target, None, PROBE_TIMEOUT_MS)
    except AuthenticationError:
        return "refused"
    except RayError as err:
        return f"silent: {err}"
    return "ok"


def _token_source() -> str:
    """Where Ray's token loader takes the token from (RAY_AUTH_TOKEN first, then RAY_AUTH_TOKEN_PATH, then the
    file)."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN"
    if os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return f"RAY_AUTH_TOKEN_PATH={os.environ['RAY_AUTH_TOKEN_PATH']}"
    return "~/.ray/auth_token"


def _verdict(target: str, user_mode: str | None, has_token: bool) -> str:
    """What the cluster says to this process, leaving it in the mode that joins: "ok", "silent: <why>",
    "no-token", "wrong-token" or "disabled-here"."""
    if user_mode == "token":  # the user's mode; Ray's client aborts the process in token mode without a token
        if not has_token:
            return "no-token"
        answer = _answer(target)
        return "wrong-token" if answer == "refused" else answer
    # unset: disabled, Ray's default, said out loud, so that ray.init(address="auto") does not turn token mode on
    # against a cluster that wants none because a token lies here
    set_auth_mode(user_mode or "disabled")
    answer = _answer(target)
    if answer != "refused":
        return answer
    if user_mode is not None:
        return "disabled-here"
    if not has_token:
        return "no-token"
    set_auth_mode("token")  # the cluster wants a token and there is one here: join in token mode, if it is right
    answer = _answer(target)
    return "wrong-token" if answer == "refused" else answer


def join_mode(target: str, address: str) -> str | None:
    """Put this process in the authentication mode of the Ray cluster whose head (GCS) is at target (host:port),
    before ray.init() joins it. None when it can join; else one sentence: why not and what to do (the process's
    RAY_AUTH_MODE is then as it was). address is what the user gave (ray.address or RAY_ADDRESS)."""
    from ray._raylet import AuthenticationTokenLoader

    user_mode = os.environ.get("RAY_AUTH_MODE")
    has_token = AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True)
    verdict = _verdict(target, user_mode, has_token)
    if verdict == "ok":
        return None
    if os.environ.get("RAY_AUTH_MODE") != user_mode:
        set_auth_mode(user_mode)
    where = f"the Ray cluster at {target}" + (f" (ray.address={address})" if address != target else "")
    if verdict == "no-token" and user_mode == "token":
        return (f"RAY_AUTH_MODE=token here, but there is no authentication token on this machine to join {where}; "
                f"{HOW_TO_GET_IT} (or unset RAY_AUTH_MODE if the cluster runs without token authentication).")
    if verdict == "no-token":
        return f"{where} wants its authentication token, and there is none on this machine; {HOW_TO_GET_IT}."
    if verdict == "wrong-token":
        source = _token_source()
        fix = {"RAY_AUTH_TOKEN": "set RAY_AUTH_TOKEN to the cluster's token (the head node's ~/.ray/auth_token), or "
                                 "unset it to use ~/.ray/auth_token",
               "RAY_AUTH_TOKEN_PATH": "put the cluster's token (the head node's ~/.ray/auth_token) in that file, or "
                                      "unset RAY_AUTH_TOKEN_PATH to use ~/.ray/auth_token"}.get(
            source.split("=")[0], HOW_TO_GET_IT)
        return f"{where} refuses the authentication token found here ({source}): it is not the cluster's; {fix}."
    if verdict == "disabled-here":
        return (f"{where} wants its authentication token, but RAY_AUTH_MODE={user_mode} here; unset RAY_AUTH_MODE "
                f"(or set it to token) and make sure the token is here: {HOW_TO_GET_IT}.")
    return (f"{where} does not answer as a Ray cluster's head ({verdict.removeprefix('silent: ')}); check that it "
            "runs (ray status) and that the port is the head's (ray start --head --port=..., 6379 by default).")
