import fs from 'node:fs';
import path from 'node:path';
import { MongoClient } from 'mongodb';
import type { StackFile } from '../../scripts/launcher';

/** Connection details of the stack started by test/global-setup.ts. */
export const T = {
  api: () => must('SAP_TEST_API_URL'),
  key: () => must('SAP_TEST_API_KEY'),
  mongo: () => must('SAP_TEST_MONGO_URL'),
  temporal: () => must('SAP_TEST_TEMPORAL_ADDRESS'),
  hostUrl: () => must('SAP_TEST_HOST_URL'),
  hostToken: () => must('SAP_TEST_HOST_TOKEN'),
  dataDir: () => must('SAP_TEST_DATA_DIR'),
  logDir: () => must('SAP_TEST_LOG_DIR'),
};

/** The pid of one of the stack's processes now, from <DATA_DIR>/stack.json. */
export function stackPid(name: keyof StackFile['pids']): number {
  const pid = (JSON.parse(fs.readFileSync(path.join(T.dataDir(), 'stack.json'), 'utf8')) as StackFile).pids[name];
  if (!pid) throw new Error(`no ${name} pid in stack.json`);
  return pid;
}

function must(name: string): string {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: run the tests with npm test (jest's global setup starts the stack)`);
  return v;
}

export interface Res<T = any> {
  status: number;
  body: T;
  headers: Headers;
}

/** Calls the API with the default test key (or `key`, or none when key is null). */
export async function api<T = any>(
  method: string,
  path: string,
  opts: { body?: unknown; raw?: string; key?: string | null; headers?: Record<string, string> } = {},
): Promise<Res<T>> {
  const headers: Record<string, string> = { ...opts.headers };
  const key = opts.key === undefined ? T.key() : opts.key;
  if (key !== null) headers['x-api-key'] = key;
  let body: string | undefined;
  if (opts.raw !== undefined) body = opts.raw;
  else if (opts.body !== undefined) {
    body = JSON.stringify(opts.body);
    headers['content-type'] ??= 'application/json';
  }
  const res = await fetch(`${T.api()}${path}`, { method, headers, body });
  const text = await res.text();
  let parsed: unknown = text;
  try {
    parsed = text ? JSON.parse(text) : null;
  } catch {
    /* not JSON: keep the text so the assertion shows it */
  }
  return { status: res.status, body: parsed as T, headers: res.headers };
}

/** Kills or starts one of the stack's processes through global-setup's control endpoint. */
export async function control(action: 'kill' | 'start', proc: 'worker' | 'api' | 'host', signal?: string): Promise<{ pid?: number }> {
  const res = await fetch(`${must('SAP_TEST_CONTROL_URL')}/${action}/${proc}${signal ? `?signal=${signal}` : ''}`, { method: 'POST' });
  const body = (await res.json()) as { pid?: number; error?: string };
  if (!res.ok) throw new Error(`control ${action} ${proc}: ${body.error}`);
  return body;
}

/** Polls `fn` until it returns a truthy value or the time runs out. */
export async function eventually<T>(fn: () => Promise<T | undefined | null | false>, timeoutMs = 30_000, everyMs = 100): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline) throw new Error(`condition not met within ${timeoutMs} ms${last ? `: ${String(last)}` : ''}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

export async function withMongo<T>(fn: (client: MongoClient) => Promise<T>): Promise<T> {
  const client = new MongoClient(T.mongo());
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.close();
  }
}

let counter = 0;
/** A unique name for this test run. */
export const unique = (prefix: string): string => `${prefix}-${Date.now().toString(36)}-${(counter++).toString(36)}`;
