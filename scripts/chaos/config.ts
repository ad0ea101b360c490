/** `npm run chaos`'s settings: its command line, the environment and the running stack's stack.json. */
import fs from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import type { BaseProcName as ProcName, StackFile } from '../launcher';

export const { values } = parseArgs({
  options: {
    sessions: { type: 'string' },
    batch: { type: 'string' },
    c: { type: 'string' },
    kills: { type: 'string' },
    seed: { type: 'string' },
    'data-dir': { type: 'string' },
    url: { type: 'string' },
    key: { type: 'string' },
    out: { type: 'string' },
    profile: { type: 'string' },
  },
});

export const DATA_DIR = path.resolve(values['data-dir'] ?? process.env.DATA_DIR ?? '.data');
export const STACK_FILE = path.join(DATA_DIR, 'stack.json');
/**
 * `--profile production`: against `npm run start:production` (DATA_DIR is then <DATA_DIR>/production):
 * its servers' pids (temporal, mongo, postgres, api2) come from production.json beside stack.json,
 * and each of its two hosts keeps its sandboxes and audit log under hosts/<hostId>.
 */
export const PRODUCTION = values.profile === 'production';
if (values.profile && !PRODUCTION) throw new Error(`--profile: production or nothing, not ${values.profile}`);
/** The state directories of the stack's hosts (DATA_DIR itself for one host). */
export function hostDirs(): string[] {
  const dir = path.join(DATA_DIR, 'hosts');
  return PRODUCTION && fs.existsSync(dir) ? fs.readdirSync(dir).map((h) => path.join(dir, h)) : [DATA_DIR];
}
export const KEY = values.key ?? process.env.SAP_API_KEY ?? process.env.API_KEY ?? 'dev-key';
export const N_SESSIONS = Number(values.sessions ?? 300);
export const N_BATCH = Number(values.batch ?? 300);
export const CONCURRENCY = Number(values.c ?? 30);
export const SEED = Number(values.seed ?? Date.now() % 1_000_000);
export const TASK_QUEUE = process.env.TASK_QUEUE ?? 'sandbox-agents';
export const OUT_DIR = path.resolve(values.out ?? path.join(DATA_DIR, 'chaos'));

export const KILL_PLAN: Record<ProcName, number> = parseKills(values.kills ?? 'worker=5,host=2,api=2,mongo=1,temporal=1');
/** A process is killed again only this long after its last kill: the supervisor gives up on 5 deaths in 60 s. */
export const SAME_PROCESS_SPACING_MS = 20_000;
/** How long one session may take, from its creation, before it counts as lost. */
export const SESSION_DEADLINE_MS = 8 * 60_000;
/** How long the stack may take to come back after one kill. */
export const RECOVERY_LIMIT_MS = 180_000;

export function parseKills(spec: string): Record<ProcName, number> {
  const plan: Record<ProcName, number> = { worker: 0, host: 0, api: 0, mongo: 0, temporal: 0 };
  if (spec === 'none') return plan;
  for (const part of spec.split(',')) {
    const [name, n] = part.split('=');
    if (!(name! in plan) || !/^\d+$/.test(n ?? '')) throw new Error(`--kills: bad part ${part} (e.g. worker=5,host=2)`);
    plan[name as ProcName] = Number(n);
  }
  return plan;
}

/** A small seeded generator (mulberry32), so that a run's mix and kill order can be repeated. */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
export const rand = rng(SEED);
export const between = (lo: number, hi: number) => lo + Math.floor(rand() * (hi - lo + 1));
export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export function readStack(): StackFile | null {
  try {
    const st = JSON.parse(fs.readFileSync(STACK_FILE, 'utf8')) as StackFile;
    if (PRODUCTION) Object.assign(st.pids, (JSON.parse(fs.readFileSync(path.join(DATA_DIR, 'production.json'), 'utf8')) as Pick<StackFile, 'pids'>).pids);
    return st;
  } catch {
    return null;
  }
}

export const initialStack = readStack();
export const API = values.url ?? process.env.SAP_API_URL ?? initialStack?.apiUrl ?? 'http://127.0.0.1:8080';
export const HOST_URL = initialStack?.hostUrl ?? `http://${process.env.HOST_LISTEN ?? '127.0.0.1:7300'}`;
export const TEMPORAL_ADDRESS = initialStack?.temporalAddress ?? process.env.TEMPORAL_ADDRESS ?? '127.0.0.1:7233';

export function hostToken(): string {
  if (process.env.HOST_TOKEN) return process.env.HOST_TOKEN;
  return fs.readFileSync(path.join(DATA_DIR, 'host.token'), 'utf8').trim();
}
