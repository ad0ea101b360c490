/**
 * Sandboxes in tests: create one through the API, run a script in one (through the API or straight
 * through the sandbox host). The one place these helpers live; every test file imports them.
 */
import { HostClient } from '../../sandbox/host-contract/client';
import { api, T, type Res } from './env';

/** How a helper reaches the API: the test stack's `api` unless a file runs a stack of its own. */
export type ApiCall = (method: string, path: string, opts: { body?: unknown; key?: string }) => Promise<Pick<Res, 'status' | 'body'>>;

export interface SandboxOpts {
  /** The caller's API key (another organisation's); the test stack's key when absent. */
  key?: string;
  /** Each new sandbox id is pushed here (a file's cleanup list). */
  created?: string[];
  /** Another API than the test stack's (a file that starts its own stack). */
  via?: ApiCall;
}

/** Creates a sandbox through the API and returns its id; throws unless the API answers 201. */
export async function newSandbox(body: Record<string, unknown> = {}, opts: SandboxOpts = {}): Promise<string> {
  const r = await (opts.via ?? api)('POST', '/api/sandboxes', { body, key: opts.key });
  if (r.status !== 201) throw new Error(`create sandbox ${JSON.stringify(body)}: ${r.status} ${JSON.stringify(r.body)}`);
  const id = r.body.sandboxID as string;
  opts.created?.push(id);
  return id;
}

export interface RunResult {
  exitCode: number;
  stdout: string;
  stderr: string;
}

/** POST /api/sandboxes/{id}/exec/run of `bash -c script`: { exitCode, stdout, stderr }; throws unless 200. */
export async function run(sandboxId: string, script: string, opts: { timeout?: number; via?: ApiCall } = {}): Promise<RunResult> {
  const body = { cmd: 'bash', args: ['-c', script], ...(opts.timeout === undefined ? {} : { timeout: opts.timeout }) };
  const r = await (opts.via ?? api)('POST', `/api/sandboxes/${sandboxId}/exec/run`, { body });
  if (r.status !== 200) throw new Error(`exec/run in ${sandboxId} (${script.slice(0, 80)}): ${r.status} ${JSON.stringify(r.body)}`);
  return r.body as RunResult;
}

/** Like run, but throws (with stderr) unless the script exits 0; returns stdout. */
export async function sh(sandboxId: string, script: string, opts: { timeout?: number; via?: ApiCall } = {}): Promise<string> {
  const r = await run(sandboxId, script, opts);
  if (r.exitCode !== 0) throw new Error(`\`${script.slice(0, 120)}\` in ${sandboxId} exited ${r.exitCode}: ${r.stderr.slice(-500)}`);
  return r.stdout;
}

/** A client of the test stack's sandbox host, to look inside sandboxes without going through the API. */
export const hostClient = (): HostClient => new HostClient({ url: T.hostUrl(), token: T.hostToken() });

/** Runs a bash script inside a sandbox straight through the host (no API, no waking) and returns its stdout; throws on a non-zero exit. */
export async function hostSh(sandboxId: string, script: string): Promise<string> {
  const r = await hostClient().execRun(sandboxId, { cmd: 'bash', args: ['-c', script] });
  if (r.exitCode !== 0) throw new Error(`exit ${r.exitCode}: ${r.stderr}`);
  return r.stdout;
}
