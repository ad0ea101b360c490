/**
 * Builds a snapshot from an image manifest, in the API process: a fresh sandbox on a host, the
 * steps run inside it in order (output streamed to the caller as it arrives), a checkpoint of the
 * result, its content hash, and the build sandbox destroyed. Builds run here rather than in a
 * workflow because they are started by a caller who watches them (Server-Sent Events) and their
 * output is streamed straight from the host; a build whose API process dies is marked failed by
 * the next read of the snapshot (its heartbeat stops) and its sandbox destroyed then.
 */
import { createHash } from 'node:crypto';
import path from 'node:path';
import type { SandboxDeps } from '../deps';
import { randomId } from '../../lib/ids';
import { decodeExecFrame, encodeStdinFrame, type HostClient } from '../../sandbox';
import type { ExecRequest } from '../../sandbox';
import { CheckpointDoc, ImageManifest, ImageStep, insertCheckpoint, SnapshotDoc, updateSnapshot } from '../../store/checkpoints';
import { ApiError } from '../../contract/errors';
import { reserveStorage, writableLayerBytes, type StorageHold } from './storage-quota';

/** A build that has not written its heartbeat for this long is considered dead. */
export const BUILD_STALE_MS = 60_000;
const HEARTBEAT_MS = 10_000;
/** Each command of a step is killed after this long. */
const STEP_TIMEOUT_SECONDS = 30 * 60;
const DEFAULT_CWD = '/workspace';

/** Receives build progress: one message per line of output, per step. */
export type BuildLog = (e: { step: number; type: string; message: string }) => void;

/** A step that failed; the message names the step. */
export class StepFailed extends Error {
  override name = 'StepFailed';
}

/**
 * Builds `snap` (status `building`) from `manifest`; resolves with the snapshot as stored once it is
 * `ready` or `failed` (never throws for a failed build: the reason is in `error`; `refusal` is the
 * 507 of a build refused by the storage quota, for a caller that answers with it).
 */
export async function buildSnapshot(
  deps: SandboxDeps,
  snap: SnapshotDoc,
  manifest: ImageManifest,
  log: BuildLog,
): Promise<SnapshotDoc & { refusal?: ApiError }> {
  let sandboxId: string | null = null;
  let host: HostClient | null = null;
  let timer: NodeJS.Timeout | undefined;
  let hold: StorageHold | null = null;
  // One write at a time on the snapshot: a heartbeat racing the final write could undo it.
  let beat: Promise<unknown> = Promise.resolve();
  const stopHeartbeat = async () => {
    if (timer) clearInterval(timer);
    timer = undefined;
    await beat;
  };
  try {
    const picked = await deps.hosts.pick();
    host = picked.client;
    sandboxId = `sb-b${snap._id.replace(/^snap-/, '')}`;
    await updateSnapshot(deps.store, snap._id, { build: { sandboxId, hostId: picked.hostId, heartbeatAt: new Date() } });
    timer = setInterval(() => {
      beat = updateSnapshot(deps.store, snap._id, { 'build.heartbeatAt': new Date() }).catch(() => undefined);
    }, HEARTBEAT_MS);
    timer.unref();
    await host.createSandbox({
      id: sandboxId,
      orgId: snap.orgId,
      owner: { kind: 'snapshot', id: snap._id },
      ...(manifest.builderMemoryMB ? { memoryMB: manifest.builderMemoryMB } : {}),
    });
    const state = { env: {} as Record<string, string>, cwd: null as string | null, environmentBase: null as string | null };
    for (const [i, step] of manifest.steps.entries()) {
      const n = i + 1;
      log({ step: n, type: step.type, message: `step ${n}/${manifest.steps.length}: ${describeStep(step)}` });
      await runStep(host, sandboxId, step, n, state, log);
    }
    // What the capture will add is reserved first (507 over the quota, before anything is copied).
    const cpId = `cp-${randomId()}`;
    const need = await writableLayerBytes(host, sandboxId);
    hold = await reserveStorage(deps, snap.orgId, cpId, need);
    const layer = await host.createCheckpoint(sandboxId, cpId);
    let hash: string;
    try {
      await hold.grow(layer.sizeBytes ?? need);
      hash = await host.layerHash(layer.layerId);
      const cp: CheckpointDoc = {
        _id: cpId,
        orgId: snap.orgId,
        sandboxId,
        hostId: picked.hostId,
        name: `snapshot ${snap.name}`,
        layerId: layer.layerId,
        parents: layer.parents,
        patchSeq: 0,
        sizeBytes: layer.sizeBytes ?? need,
        createdAt: new Date(),
      };
      await insertCheckpoint(deps.store, cp);
    } catch (err) {
      await host.deleteLayer(layer.layerId).catch(() => undefined);
      throw err;
    }
    await stopHeartbeat();
    const ready: Partial<SnapshotDoc> = {
      status: 'ready',
      contentHash: `sha256:${hash}`,
      checkpointId: cpId,
      hostId: picked.hostId,
      layerId: layer.layerId,
      ownsCheckpoint: true,
      env: Object.entries(state.env).map(([name, value]) => ({ name, value })),
      workdir: state.cwd,
      build: null,
      updatedAt: new Date(),
    };
    await updateSnapshot(deps.store, snap._id, ready);
    log({ step: manifest.steps.length, type: 'checkpoint', message: `snapshot ready: ${cpId} sha256:${hash}` });
    return { ...snap, ...ready };
  } catch (err) {
    const message = err instanceof StepFailed ? err.message : `build failed: ${(err as Error).message ?? String(err)}`;
    const failed: Partial<SnapshotDoc> = { status: 'failed', error: message, build: null, updatedAt: new Date() };
    await stopHeartbeat();
    await updateSnapshot(deps.store, snap._id, failed).catch(() => undefined);
    const refused = err instanceof ApiError && err.type === 'insufficient_storage';
    return { ...snap, ...failed, ...(refused ? { refusal: err } : {}) };
  } finally {
    await stopHeartbeat();
    await hold?.release();
    if (host && sandboxId) {
      await host.destroySandbox(sandboxId).catch((err) => deps.logger.warn({ err: String(err), sandboxId }, 'could not destroy a build sandbox'));
    }
  }
}

/**
 * Marks a `building` snapshot whose build stopped heartbeating as failed and destroys its build
 * sandbox. Returns the snapshot as it now stands.
 */
export async function reapStaleBuild(deps: SandboxDeps, snap: SnapshotDoc): Promise<SnapshotDoc> {
  if (snap.status !== 'building') return snap;
  const beat = snap.build?.heartbeatAt ?? snap.createdAt;
  if (Date.now() - beat.getTime() < BUILD_STALE_MS) return snap;
  const failed: Partial<SnapshotDoc> = {
    status: 'failed',
    error: 'build interrupted: the API process building it stopped',
    build: null,
    updatedAt: new Date(),
  };
  await updateSnapshot(deps.store, snap._id, failed);
  if (snap.build) {
    const host = await deps.hosts.get(snap.build.hostId).catch(() => null);
    await host?.destroySandbox(snap.build.sandboxId).catch(() => undefined);
  }
  return { ...snap, ...failed };
}

function describeStep(step: ImageStep): string {
  switch (step.type) {
    case 'run':
      return `run ${step.args.commands.length} command(s)`;
    case 'apt_install':
    case 'pip_install':
      return `${step.type} ${step.args.packages.join(' ')}`;
    case 'env':
      return `env ${Object.keys(step.args.vars).join(' ')}`;
    case 'workdir':
      return `workdir ${step.args.path}`;
    case 'add_file':
      return `add_file ${step.args.path}`;
    case 'add_dir':
      return `add_dir ${step.args.path} (${step.args.files.length} files)`;
  }
}

const shq = (s: string): string => `'${s.replace(/'/g, `'\\''`)}'`;

async function runStep(
  host: HostClient,
  sandboxId: string,
  step: ImageStep,
  n: number,
  state: { env: Record<string, string>; cwd: string | null; environmentBase: string | null },
  log: BuildLog,
): Promise<void> {
  const where = `step ${n} (${step.type})`;
  const exec = async (script: string, what: string) => {
    const r = await streamExec(
      host,
      sandboxId,
      { cmd: 'bash', args: ['-c', script], envs: state.env, cwd: state.cwd ?? DEFAULT_CWD, timeout: STEP_TIMEOUT_SECONDS },
      (message) => log({ step: n, type: step.type, message }),
    );
    if (r.exitCode !== 0) throw new StepFailed(`${where} failed: ${what} exited with code ${r.exitCode}${r.tail ? `: ${r.tail}` : ''}`);
  };
  switch (step.type) {
    case 'run':
      for (const c of step.args.commands) await exec(c, `command ${JSON.stringify(c.length > 200 ? `${c.slice(0, 200)}…` : c)}`);
      return;
    case 'apt_install':
      await exec(
        `export DEBIAN_FRONTEND=noninteractive; apt-get update && apt-get install -y --no-install-recommends ${step.args.packages.map(shq).join(' ')}`,
        'apt-get (does the build reach a package mirror?)',
      );
      return;
    case 'pip_install':
      await exec(
        // The sandbox's Python is the distribution's, marked externally managed (PEP 668): a sandbox is
        // a machine of its own, so packages go into its /usr/local like root's `pip install` would.
        `if command -v pip3 >/dev/null; then PIP=pip3; else PIP="python3 -m pip"; fi; export PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1; $PIP install --no-input --retries 2 --timeout 20 ${step.args.packages.map(shq).join(' ')}`,
        'pip (does the build reach a package index?)',
      );
      return;
    case 'env': {
      Object.assign(state.env, step.args.vars);
      // Also written to /etc/environment (for login shells), as the open API does.
      if (state.environmentBase === null) {
        const existing = await host.readFile(sandboxId, '/etc/environment').catch(() => null);
        state.environmentBase = existing ? existing.toString('utf8').replace(/\n?$/, '\n') : '';
        if (state.environmentBase === '\n') state.environmentBase = '';
      }
      const lines = Object.entries(state.env).map(([k, v]) => `${k}="${v.replace(/(["\\$`])/g, '\\$1')}"`);
      await host.writeFile(sandboxId, '/etc/environment', state.environmentBase + lines.join('\n') + '\n');
      return;
    }
    case 'workdir': {
      // Made from the current directory: the new one may not exist yet (nothing can start in it).
      const target = path.posix.resolve(state.cwd ?? DEFAULT_CWD, step.args.path);
      await exec(`mkdir -p ${shq(target)}`, 'mkdir');
      state.cwd = target;
      return;
    }
    case 'add_file': {
      const content = step.args.encoding === 'utf8' ? Buffer.from(step.args.content, 'utf8') : Buffer.from(step.args.content, 'base64');
      await host.writeFile(sandboxId, step.args.path, content).catch((err: Error) => {
        throw new StepFailed(`${where} failed: could not write ${step.args.path}: ${err.message}`);
      });
      return;
    }
    case 'add_dir':
      for (const f of step.args.files) {
        const target = path.posix.join(step.args.path, f.relativePath);
        await host.writeFile(sandboxId, target, Buffer.from(f.content, 'base64')).catch((err: Error) => {
          throw new StepFailed(`${where} failed: could not write ${target}: ${err.message}`);
        });
      }
      return;
  }
}

/**
 * Runs a command as an exec session and streams its output, line by line, to `onLine` as it
 * arrives. Resolves with its exit code and the tail of its output.
 */
async function streamExec(host: HostClient, sandboxId: string, req: ExecRequest, onLine: (line: string) => void): Promise<{ exitCode: number; tail: string }> {
  const session = await host.createExec(sandboxId, req);
  const ws = host.openExecSocket(sandboxId, session.sessionID);
  let tail = '';
  const partial: Record<'stdout' | 'stderr', string> = { stdout: '', stderr: '' };
  const feed = (kind: 'stdout' | 'stderr', text: string, flush = false) => {
    const lines = (partial[kind] + text).split('\n');
    partial[kind] = flush ? '' : (lines.pop() ?? '');
    for (const l of lines) if (l.length) onLine(l);
  };
  return new Promise((resolve, reject) => {
    ws.on('open', () => ws.send(encodeStdinFrame('')));
    ws.on('message', (data: Buffer) => {
      const f = decodeExecFrame(Buffer.isBuffer(data) ? data : Buffer.from(data as ArrayBuffer));
      if (!f) return;
      if (f.kind === 'stdout' || f.kind === 'stderr') {
        const text = f.data.toString('utf8');
        tail = (tail + text).slice(-2000);
        feed(f.kind, text);
      } else if (f.kind === 'exit') {
        feed('stdout', '', true);
        feed('stderr', '', true);
        ws.close();
        resolve({ exitCode: f.exitCode, tail: tail.trim().slice(-1000) });
      }
    });
    ws.on('error', reject);
    ws.on('close', () => reject(new Error(`exec ${session.sessionID} closed before it exited`)));
  });
}

/** `sha256:<hex>` over a chain of layer hashes (the layer alone when it has no parents). */
export function chainHash(hashes: string[]): string {
  if (hashes.length === 1) return `sha256:${hashes[0]}`;
  return `sha256:${createHash('sha256').update(hashes.join('\n')).digest('hex')}`;
}
