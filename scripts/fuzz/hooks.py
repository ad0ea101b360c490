"""Schemathesis hooks for `npm run fuzz` (loaded through SCHEMATHESIS_HOOKS; see scripts/fuzz/run.py).

- error_body_contract: every 4xx/5xx answer is JSON `{ "error": { "type": string, "message": string } }`.
- map_case: half of the positive cases name the fixtures run.py created (SAP_FUZZ_IDS) instead of random
  ids, so that the fuzzer reaches the handlers behind the 404 of a missing resource.
- after_call: one line per response (status, contract kept?) in SAP_FUZZ_TALLY, for the summary.
"""
import json
import os
import random
import threading

import schemathesis
from schemathesis import GenerationMode

_IDS = json.loads(os.environ.get("SAP_FUZZ_IDS", "{}"))
_TALLY = os.environ.get("SAP_FUZZ_TALLY")
_lock = threading.Lock()

# Path parameter, by the segment before it and its name → fixture kind (as in test/integration/security/auth-walk.test.ts).
_FILL = {
    "agents/{agentId}": "agent",
    "sessions/{id}": "session",
    "batches/{id}": "batch",
    "instances/{id}": "instance",
    "sandboxes/{id}": "sandbox",
    "checkpoints/{checkpointId}": "checkpoint",
    "from-checkpoint/{checkpointId}": "checkpoint",
    "patches/{patchId}": "patch",
    "snapshots/{idOrName}": "snapshot",
    "preview/{port}": "port",
    "exec/{sessionID}": "exec",
    "agent/{sessionID}": "agentSession",
}


def contract_broken(response) -> str | None:
    """Why a 4xx/5xx answer breaks the error-body contract, or None."""
    if response.status_code < 400:
        return None
    try:
        body = json.loads(response.content or b"")
    except ValueError:
        return f"{response.status_code} body is not JSON: {response.content[:200]!r}"
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict) or not isinstance(err.get("type"), str) or not isinstance(err.get("message"), str):
        return f"{response.status_code} body is not {{error: {{type, message}}}}: {json.dumps(body)[:200]}"
    return None


@schemathesis.check
def error_body_contract(ctx, response, case):
    why = contract_broken(response)
    if why:
        raise AssertionError(why)


@schemathesis.hook
def map_case(context, case):
    meta = case.meta
    if not _IDS or meta is None or meta.generation.mode != GenerationMode.POSITIVE or random.random() < 0.5:
        return case
    parts = case.path.split("/")
    for i, part in enumerate(parts):
        if part.startswith("{") and part.endswith("}"):
            kind = _FILL.get(f"{parts[i - 1]}/{part}")
            if kind and kind in _IDS:
                value = _IDS[kind]
                case.path_parameters[part[1:-1]] = int(value) if kind == "port" else value
    return case


@schemathesis.hook
def after_call(context, case, response):
    if not _TALLY:
        return
    why = contract_broken(response)
    line = json.dumps({"op": f"{case.method.upper()} {case.path}", "status": response.status_code, "contract": why})
    with _lock, open(_TALLY, "a", encoding="utf-8") as f:
        f.write(line + "\n")
