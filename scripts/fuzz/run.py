"""`npm run fuzz`: fuzzes a running stack (npm start) from its own /openapi.json with schemathesis.

Creates fixtures (an agent, a session, a batch, an instance, a sandbox with an exec session, an agent
session, a preview, a checkpoint with a patch, a snapshot) that half of the generated cases name, runs
schemathesis with its checks plus the error-body contract (hooks.py), removes what the run created, and
prints a summary: operations, requests, statuses, 5xx answers, contract violations, schemathesis failures.
Exit status 0 only when there is no 5xx answer, no contract violation and no failed check.

Settings (environment): SAP_API_URL (default http://127.0.0.1:8080), SAP_API_KEY (default dev-key),
FUZZ_MAX_EXAMPLES (per operation and phase, default 25), FUZZ_WORKERS (default 1: with 2, hypothesis on Python 3.11 hit a SystemError in ast.parse once), FUZZ_SEED (default random),
FUZZ_MAX_TIME (seconds, default 600).
"""
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

URL = os.environ.get("SAP_API_URL", "http://127.0.0.1:8080").rstrip("/")
KEY = os.environ.get("SAP_API_KEY", "dev-key")
HERE = os.path.dirname(os.path.abspath(__file__))


def call(method, path, body=None, timeout=90):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(URL + path, data=data, method=method, headers={"x-api-key": KEY, **({"content-type": "application/json"} if data else {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read().decode()
            return r.status, (json.loads(text) if text and r.headers.get_content_type() == "application/json" else text)
    except urllib.error.HTTPError as e:
        text = e.read().decode()
        try:
            return e.code, json.loads(text)
        except ValueError:
            return e.code, text


def must(what, got, status=201):
    if got[0] != status:
        sys.exit(f"fuzz: could not create the {what} fixture: {got[0]} {got[1]}")
    return got[1]


def listing(path, field=None):
    status, body = call("GET", path)
    if status != 200:
        return []
    return body[field] if field else body


def main():
    try:
        urllib.request.urlopen(URL + "/healthz", timeout=5).read()
    except Exception as e:  # noqa: BLE001: any failure means the same thing here
        sys.exit(f"fuzz: no API at {URL} ({e}); start the stack first (npm start) or set SAP_API_URL / SAP_API_KEY")
    if call("GET", "/v1/agents?limit=1")[0] != 200:
        sys.exit(f"fuzz: the API at {URL} refuses the key in SAP_API_KEY")
    with urllib.request.urlopen(URL + "/openapi.json", timeout=10) as r:
        doc = json.load(r)
    operations = sum(len(m) for m in doc["paths"].values())

    before_sandboxes = {s["sandboxID"] for s in listing("/api/sandboxes")}
    before_snapshots = {s["id"] for s in listing("/api/snapshots")}
    before_agents = {a["id"] for a in listing("/v1/agents?limit=1000", "agents")}

    stamp = str(int(time.time()))
    ids = {"agent": f"fuzz-{stamp}", "port": "47311"}
    must("agent", call("POST", "/v1/agents", {"id": ids["agent"], "core": "bash", "entrypoint": ["bash", "-c", 'echo "{}" > /tmp/agent_result.json']}))
    ids["session"] = must("session", call("POST", f"/v1/agents/{ids['agent']}/sessions", {"input": {}}))["id"]
    ids["batch"] = must("batch", call("POST", f"/v1/agents/{ids['agent']}/batches", {"items": [{"input": {}}]}))["id"]
    ids["instance"] = must("instance", call("POST", f"/v1/agents/{ids['agent']}/instances", {}))["id"]
    ids["sandbox"] = must("sandbox", call("POST", "/api/sandboxes", {}))["sandboxID"]
    ids["exec"] = must("exec", call("POST", f"/api/sandboxes/{ids['sandbox']}/exec", {"cmd": "sleep", "args": ["600"]}))["sessionID"]
    ids["agentSession"] = must("agent session", call("POST", f"/api/sandboxes/{ids['sandbox']}/agent", {"runner": ["sleep", "600"]}))["sessionID"]
    must("preview", call("POST", f"/api/sandboxes/{ids['sandbox']}/preview", {"port": int(ids["port"])}))
    ids["checkpoint"] = must("checkpoint", call("POST", f"/api/sandboxes/{ids['sandbox']}/checkpoints", {}))["id"]
    ids["patch"] = must("patch", call("POST", f"/api/sandboxes/checkpoints/{ids['checkpoint']}/patches", {"script": "true"}))["patch"]["id"]
    ids["snapshot"] = must("snapshot", call("POST", "/api/snapshots", {"name": f"fuzz-{stamp}", "checkpointId": ids["checkpoint"]}))["name"]
    call("GET", f"/v1/agents/{ids['agent']}/sessions/{ids['session']}?wait=60")

    tally_fd, tally = tempfile.mkstemp(prefix="sap-fuzz-", suffix=".ndjson")
    os.close(tally_fd)
    report_dir = tempfile.mkdtemp(prefix="sap-fuzz-report-")
    env = {**os.environ, "SCHEMATHESIS_HOOKS": os.path.join(HERE, "hooks.py"), "SAP_FUZZ_IDS": json.dumps(ids), "SAP_FUZZ_TALLY": tally}
    checks = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,error_body_contract"
    args = [
        os.path.join(os.path.dirname(sys.executable), "schemathesis"), "run", f"{URL}/openapi.json",
        "--header", f"X-API-Key: {KEY}",
        "--checks", checks,
        "--phases", "examples,coverage,fuzzing",
        "--max-examples", os.environ.get("FUZZ_MAX_EXAMPLES", "25"),
        "--workers", os.environ.get("FUZZ_WORKERS", "1"),
        "--max-time", os.environ.get("FUZZ_MAX_TIME", "600"),
        "--request-timeout", "90",
        "--suppress-health-check", "all",
        "--generation-database", "none",
        "--no-color",
        "--report", "junit", "--report-dir", report_dir,
    ]
    if os.environ.get("FUZZ_SEED"):
        args += ["--seed", os.environ["FUZZ_SEED"]]
    started = time.time()
    proc = subprocess.run(args, env=env, check=False)
    seconds = round(time.time() - started)

    statuses = collections.Counter()
    server_errors = collections.Counter()
    violations = collections.Counter()
    examples = {}
    with open(tally, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            statuses[r["status"]] += 1
            if r["status"] >= 500:
                server_errors[f"{r['status']} {r['op']}"] += 1
            if r["contract"]:
                violations[r["op"]] += 1
                examples.setdefault(r["op"], r["contract"])
    os.unlink(tally)

    # Remove what the fixtures and the fuzzer created (sandboxes, snapshots, agents); sessions and batches end by themselves.
    call("DELETE", f"/v1/agents/{ids['agent']}/instances/{ids['instance']}")
    for s in listing("/api/snapshots"):
        if s["id"] not in before_snapshots:
            call("DELETE", f"/api/snapshots/{s['id']}")
    for s in listing("/api/sandboxes"):
        if s["sandboxID"] not in before_sandboxes:
            call("DELETE", f"/api/sandboxes/{s['sandboxID']}")
    for a in listing("/v1/agents?limit=1000", "agents"):
        if a["id"] not in before_agents:
            call("DELETE", f"/v1/agents/{a['id']}")

    requests = sum(statuses.values())
    summary = {
        "operations": operations,
        "requests": requests,
        "seconds": seconds,
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "server_errors": sum(server_errors.values()),
        "contract_violations": sum(violations.values()),
        "schemathesis_exit": proc.returncode,
        "junit": os.path.join(report_dir, "junit.xml"),
    }
    if server_errors:
        summary["server_errors_by_operation"] = dict(server_errors)
    if violations:
        summary["contract_violations_by_operation"] = {op: {"count": n, "example": examples[op]} for op, n in violations.items()}
    print(json.dumps(summary))
    ok = proc.returncode == 0 and not server_errors and not violations
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
