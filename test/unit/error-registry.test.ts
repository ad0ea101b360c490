/**
 * The one error registry (contract/errors.ts): every status table, failure type and
 * nonRetryableErrorTypes list is derived from it, and a code keeps its name and status from the
 * sandbox host to the API.
 */
import * as fs from 'node:fs';
import * as http from 'node:http';
import * as path from 'node:path';
import type { AddressInfo } from 'node:net';
import pino from 'pino';
import { ApplicationFailure } from '@temporalio/common';
import { loadLimits } from '../../config/limits';
import {
  ERRORS,
  HOST_ERROR_STATUS,
  API_ERROR_STATUS,
  ApiError,
  SandboxError,
  nonRetryableFailureTypes,
  provisioningOutcome,
  relayedFromHost,
  type ErrorCode,
  type HostErrorType,
} from '../../contract/errors';
import { HostClient, HostError } from '../../sandbox';
import { ExecManager } from '../../sandbox/host/exec';
import { createApp } from '../../sandbox/host/server';
import type { SandboxProvider } from '../../sandbox/driver';
import { failure } from '../../activities/failures';

const ROOT = path.join(__dirname, '..', '..');
const codes = Object.keys(ERRORS) as ErrorCode[];
const sources = (dir: string) =>
  fs
    .readdirSync(path.join(ROOT, dir))
    .filter((f) => f.endsWith('.ts'))
    .map((f) => ({ file: `${dir}/${f}`, text: fs.readFileSync(path.join(ROOT, dir, f), 'utf8') }));

describe('the error registry', () => {
  it('gives every code one HTTP status', () => {
    for (const code of codes) {
      const { status } = ERRORS[code];
      expect(Number.isInteger(status) && status >= 400 && status <= 599).toBe(true);
    }
  });

  it('is where the API status table comes from, with the statuses the API has always answered', () => {
    for (const [type, status] of Object.entries(API_ERROR_STATUS)) expect(ERRORS[type as ErrorCode].status).toBe(status);
    expect(API_ERROR_STATUS).toEqual({
      invalid_request: 400,
      unauthorized: 401,
      forbidden: 403,
      not_found: 404,
      method_not_allowed: 405,
      request_timeout: 408,
      conflict: 409,
      gone: 410,
      payload_too_large: 413,
      unsupported_media_type: 415,
      rate_limited: 429,
      request_header_fields_too_large: 431,
      internal: 500,
      not_implemented: 501,
      bad_gateway: 502,
      unavailable: 503,
      insufficient_storage: 507,
    });
    expect(new ApiError('gone', 'x').status).toBe(410);
  });

  it("is where the sandbox host's status table comes from, with the statuses the host has always answered", () => {
    for (const [type, status] of Object.entries(HOST_ERROR_STATUS)) expect(ERRORS[type as ErrorCode].status).toBe(status);
    expect(HOST_ERROR_STATUS).toEqual({
      invalid_request: 400,
      unauthorized: 401,
      not_found: 404,
      conflict: 409,
      payload_too_large: 413,
      patch_failed: 422,
      rate_limited: 429,
      internal: 500,
      unavailable: 503,
    });
    expect(new SandboxError('patch_failed', 'x').status).toBe(422);
  });

  it('names each Temporal failure type once, keeping the names the Temporal UI has always shown', () => {
    const types = codes.map((c) => (ERRORS[c] as { failure?: string }).failure).filter(Boolean);
    expect(new Set(types).size).toBe(types.length);
    expect(new Set(types)).toEqual(
      new Set([
        'PatchFailed',
        'SnapshotNotFound',
        'InvalidAgent',
        'SandboxLost',
        'HostLost',
        'NotFound',
        'WebhookTargetRefused',
        'WebhookUnreachable',
        'WebhookRefused',
        'CheckpointFreed',
      ]),
    );
  });

  it("derives the non-retryable failure types, and a failed provisioning's outcome reason", () => {
    expect(new Set(nonRetryableFailureTypes())).toEqual(
      new Set(['PatchFailed', 'SnapshotNotFound', 'InvalidAgent', 'SandboxLost', 'HostLost', 'NotFound', 'WebhookTargetRefused', 'CheckpointFreed']),
    );
    expect(provisioningOutcome('PatchFailed')).toBe('provisioning_failed');
    expect(provisioningOutcome('InvalidAgent')).toBe('provisioning_failed');
    expect(provisioningOutcome(undefined)).toBe('provisioning_failed');
    expect(provisioningOutcome('HostLost')).toBe('host_lost');
  });

  it('says which host codes the API answers as they are', () => {
    expect(['not_found', 'conflict', 'invalid_request', 'payload_too_large', 'unavailable', 'rate_limited'].every(relayedFromHost)).toBe(true);
    expect(['unauthorized', 'internal', 'patch_failed', 'made_up'].some(relayedFromHost)).toBe(false);
  });
});

describe('activities and workflows use the registry', () => {
  it('throws ApplicationFailures only through the registry helper, with registry codes', () => {
    for (const { file, text } of sources('activities')) {
      if (file !== 'activities/failures.ts')
        expect(`${file}: ${/ApplicationFailure\.(create|nonRetryable|retryable)|new ApplicationFailure/.test(text)}`).toBe(`${file}: false`);
      for (const m of text.matchAll(/\bfailure\('([a-z_]+)'/g))
        expect((ERRORS as Record<string, { failure?: string }>)[m[1]!]?.failure).toEqual(expect.any(String));
    }
  });

  it('builds the failure of a code with its type and retryability', () => {
    const f = failure('host_lost', 'gone', 'h1');
    expect(f).toBeInstanceOf(ApplicationFailure);
    expect([f.type, f.nonRetryable, f.message, f.details]).toEqual(['HostLost', true, 'gone', ['h1']]);
    expect(failure('webhook_refused', 'answered 500').nonRetryable).toBe(false);
  });

  it("gives every workflow retry policy the registry's non-retryable failure types", () => {
    const lists = sources('workflows').flatMap(({ text }) => [...text.matchAll(/nonRetryableErrorTypes:\s*([^,}\n]+)/g)].map((m) => m[1]!.trim()));
    expect(lists.length).toBeGreaterThanOrEqual(3);
    for (const l of lists) expect(l).toBe('nonRetryableFailureTypes()');
  });
});

describe('an error thrown on the sandbox host reaches the host client with its code and status', () => {
  const TOKEN = 'unit-test-token-0123456789';
  let server: http.Server;
  let client: HostClient;
  let throwing: HostErrorType = 'internal';

  beforeAll(async () => {
    const logger = pino({ level: 'silent' });
    const provider = {
      kind: 'fake',
      list: () => {
        throw new SandboxError(throwing, `failed with ${throwing}`);
      },
      get: () => undefined,
      load: () => ({ sandboxes: 0, reservedMB: 0 }),
    } as unknown as SandboxProvider;
    const limits = loadLimits({}, { totalMemoryMB: 8000, cores: 4 });
    server = http.createServer(createApp({ provider, token: TOKEN, logger, hostId: 'h', exec: new ExecManager(provider, logger), limits, maxSandboxes: 3 }));
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    client = new HostClient({ url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, token: TOKEN });
  });

  afterAll(async () => {
    server.closeAllConnections();
    await new Promise<void>((r) => server.close(() => r()));
  });

  it.each(Object.keys(HOST_ERROR_STATUS) as HostErrorType[])('%s', async (code) => {
    throwing = code;
    const err = await client.listSandboxes().then(
      () => null,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(HostError);
    expect(err).toMatchObject({ name: 'HostError', type: code, status: ERRORS[code].status, message: `failed with ${code}` });
  });
});
