/** Small helpers every provider and the base class's parts share: ids, shell quoting, env, locks, durable writes. */
import { promises as fsp } from 'node:fs';
import { constants as osConstants } from 'node:os';
import * as path from 'node:path';
import { SandboxError } from '../../contract/errors';
import { procStart } from '../proc-refs-and-cgroups';

/** Environment every process in a sandbox starts with (the sandbox's and the process's own envs are added). */
export const DEFAULT_ENV: Record<string, string> = {
  PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
  HOME: '/root',
  LANG: 'C.UTF-8',
  TERM: 'xterm',
};

export const ID_RE = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$/;
export const ENV_KEY_RE = /^[A-Za-z_][A-Za-z0-9_]*$/;
export const PATCH_TAIL_BYTES = 4096;
export const KILL_AFTER_SECONDS = 5;

/** Throws invalid_request unless `id` is usable as a sandbox or layer id (also a hostname and a directory name). */
export function assertId(id: string, what = 'sandbox id'): void {
  if (typeof id !== 'string' || !ID_RE.test(id) || id.includes('..')) {
    throw new SandboxError('invalid_request', `invalid ${what}: ${String(id)} (letters, digits, '_', '.', '-'; at most 63)`);
  }
}

/** Quotes a string for /bin/sh. */
export function shq(s: string): string {
  return `'${s.replace(/'/g, `'\\''`)}'`;
}

/** `KEY=value` pairs for `env -i`; throws invalid_request on bad names. */
export function envPairs(...envs: (Record<string, string> | undefined)[]): string[] {
  const merged: Record<string, string> = {};
  for (const e of envs) {
    for (const [k, v] of Object.entries(e ?? {})) {
      if (!ENV_KEY_RE.test(k)) throw new SandboxError('invalid_request', `invalid environment variable name: ${k}`);
      merged[k] = String(v);
    }
  }
  return Object.entries(merged).map(([k, v]) => `${k}=${v}`);
}

/** Shell prefix that moves the current shell into the given cgroups (errors ignored). */
export function cgroupJoin(files: string[]): string {
  return files.map((f) => `echo $$ > ${shq(f)} 2>/dev/null;`).join(' ');
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Runs a per-key queue so that create/destroy/start of one sandbox never interleave. */
export class KeyedLock {
  private tails = new Map<string, Promise<unknown>>();
  async run<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.tails.get(key) ?? Promise.resolve();
    const next = prev.then(fn, fn);
    const tail = next.catch(() => undefined);
    this.tails.set(key, tail);
    try {
      return await next;
    } finally {
      if (this.tails.get(key) === tail) this.tails.delete(key);
    }
  }
}

/** Writes a small file and fsyncs it and its directory. */
export async function writeDurably(file: string, content: string): Promise<void> {
  const fh = await fsp.open(file, 'wx', 0o600);
  try {
    await fh.writeFile(content);
    await fh.sync();
  } finally {
    await fh.close();
  }
  const dh = await fsp.open(path.dirname(file), 'r');
  try {
    await dh.sync();
  } finally {
    await dh.close();
  }
}

export function signalName(n: number): string | null {
  for (const [name, num] of Object.entries(osConstants.signals)) if (num === n) return name;
  return null;
}

/** The pid of a live process with an argument containing `text`, or null. */
export async function processNaming(text: string): Promise<number | null> {
  for (const name of await fsp.readdir('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    const cmdline = await fsp.readFile(`/proc/${name}/cmdline`, 'utf8').catch(() => '');
    if (cmdline.split('\0').some((a) => a.includes(text)) && procStart(Number(name)) !== null) return Number(name);
  }
  return null;
}
