/**
 * OpenComputer's published Python client (opencomputer-sdk, in the venv scripts/toolchain.sh
 * installs at .tools/opencomputer-py) against the test stack: test/helpers/opencomputer-client.py
 * creates a sandbox with the client's defaults and checks what its environment checks expect
 * (user sandbox, HOME=/home/sandbox, /workspace a mount of its own, passwordless sudo, what its default
 * image has), writes and reads a file, destroys it.
 */
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import * as path from 'node:path';
import { api, T, unique } from '../../helpers/env';

const ROOT = path.join(__dirname, '..', '..', '..');
const PYTHON = path.join(ROOT, '.tools', 'opencomputer-py', 'bin', 'python');
const SCRIPT = path.join(ROOT, 'test', 'helpers', 'opencomputer-client.py');

/** Runs the script with the client configured as its documentation says (environment variables). */
function runScript(mark: string): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(
      PYTHON,
      [SCRIPT, mark],
      { env: { PATH: process.env.PATH, OPENCOMPUTER_API_URL: T.api(), OPENCOMPUTER_API_KEY: T.key() }, timeout: 120_000 },
      (err, stdout, stderr) => resolve({ code: err ? ((err as { code?: number }).code ?? 1) : 0, stdout, stderr }),
    );
  });
}

describe("OpenComputer's Python client", () => {
  const mark = unique('pyclient');

  // A sandbox the script left behind (it failed before its kill) goes here.
  afterAll(async () => {
    const list = await api('GET', '/api/sandboxes');
    for (const sb of (list.body as { sandboxID: string; metadata: Record<string, string> }[]) ?? []) {
      if (sb.metadata?.pyclient === mark) await api('DELETE', `/api/sandboxes/${sb.sandboxID}`);
    }
  });

  it('is installed by the toolchain', () => {
    expect(existsSync(PYTHON)).toBe(true);
  });

  it('runs as the sandbox user in /workspace, with passwordless sudo, and reads back what it wrote', async () => {
    const r = await runScript(mark);
    if (r.code !== 0) throw new Error(`the Python client's script exited ${r.code}: ${r.stderr.slice(-2000)}`);
    const out = JSON.parse(r.stdout.trim().split('\n').pop()!) as Record<string, any>;
    expect(out.whoami).toEqual({ exit: 0, stdout: 'sandbox', stderr: '' });
    expect(out.home).toEqual({ exit: 0, stdout: '/home/sandbox', stderr: '' });
    expect(out.pwd).toEqual({ exit: 0, stdout: '/workspace', stderr: '' });
    expect(out.sudo).toEqual({ exit: 0, stdout: 'sudo-ok', stderr: '' });
    expect(out.sudo_id).toEqual({ exit: 0, stdout: '0', stderr: '' });
    // OpenComputer's default image: what its examples use.
    expect(out.python).toMatchObject({ exit: 0, stdout: expect.stringMatching(/^Python 3\./) });
    expect(out.tree).toMatchObject({ exit: 0, stdout: expect.stringMatching(/^tree v/) });
    expect(out.git_lfs).toMatchObject({ exit: 0, stdout: expect.stringMatching(/^git-lfs\//) });
    expect(out.locale).toEqual({ exit: 0, stdout: 'en_US.utf8', stderr: '' });
    expect(out.utf8).toEqual({ exit: 0, stdout: 'en_US.UTF-8', stderr: '' });
    expect(out.ffi).toMatchObject({ exit: 0, stdout: expect.stringMatching(/\/ffi\.h$/) });
    // /workspace is a mount of its own (OpenComputer's is a disk of its own).
    expect(out.df_workspace).toMatchObject({ exit: 0, stdout: expect.stringMatching(/ \/workspace$/) });
    expect(out.read).toBe('hello from python\n');
    // Written through the files API as the sandbox user's: the user can edit it.
    expect(out.edit).toEqual({ exit: 0, stdout: 'sandbox\nhello from python\nmore\n', stderr: '' });
    // The script destroyed its sandbox (its record may stay a while, stopped).
    const after = await api('GET', `/api/sandboxes/${out.id}`);
    expect(after.status === 404 || after.body.status === 'stopped').toBe(true);
  });
});
