"""
OpenComputer's published Python client (opencomputer-sdk, installed by scripts/toolchain.sh) against
this server, as a new user's first script: a sandbox with the client's default template, the user
and the directories its environment checks expect, what its default image has (python, tree, git-lfs,
the en_US.UTF-8 locale, libffi's headers), a file written and read back, passwordless sudo.
Configured as the client documents: OPENCOMPUTER_API_URL and OPENCOMPUTER_API_KEY. Prints one JSON
line; the sandbox is destroyed whatever happens. argv[1]: a metadata mark (the test's cleanup finds
a sandbox left behind by it).
"""
import asyncio
import json
import sys

from opencomputer import Sandbox


async def main() -> None:
    out: dict = {}
    sb = await Sandbox.create(metadata={"pyclient": sys.argv[1]})
    try:
        out["id"] = sb.sandbox_id
        for name, cmd in [
            ("whoami", "whoami"),
            ("home", "echo $HOME"),
            ("pwd", "pwd"),
            ("sudo", "sudo -n true && echo sudo-ok"),
            ("sudo_id", "sudo -n id -u"),
            # What OpenComputer's default image has and its examples check (test_default_template.py).
            ("python", "python --version"),
            ("tree", "tree --version"),
            ("git_lfs", "git lfs version"),
            ("locale", "locale -a | grep -i en_US.utf8"),
            ("utf8", "LANG=en_US.UTF-8 python3 -c 'import locale; print(locale.setlocale(locale.LC_ALL, \"\"))'"),
            ("ffi", "ls /usr/include/ffi.h /usr/include/*/ffi.h 2>/dev/null | head -1"),
            ("df_workspace", "df -h /workspace | tail -1"),
        ]:
            r = await sb.commands.run(cmd)
            out[name] = {"exit": r.exit_code, "stdout": r.stdout.strip(), "stderr": r.stderr.strip()}
        await sb.files.write("/workspace/hello.txt", "hello from python\n")
        out["read"] = await sb.files.read("/workspace/hello.txt")
        r = await sb.commands.run("echo more >> /workspace/hello.txt && stat -c %U /workspace/hello.txt && cat /workspace/hello.txt")
        out["edit"] = {"exit": r.exit_code, "stdout": r.stdout, "stderr": r.stderr.strip()}
    finally:
        await sb.kill()
        await sb.close()
    print(json.dumps(out))


asyncio.run(main())
