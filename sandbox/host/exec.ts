/**
 * Exec sessions: long-running commands inside a live sandbox, attachable over WebSocket.
 */
import type * as http from 'node:http';
import type express from 'express';
import type { Logger } from 'pino';
import type { SandboxProvider } from '../provider';

/** Owns the exec sessions of every sandbox on this host. */
export class ExecManager {
  constructor(
    readonly provider: SandboxProvider,
    readonly logger: Logger,
  ) {}

  /** Registers the exec routes on the app. */
  routes(_app: express.Express, _h: unknown, _parse: unknown): void {}

  /** Kills and forgets the exec sessions of a sandbox (before it is destroyed). */
  dropSandbox(_id: string): void {}

  /** Kills every session's sockets (not the processes). */
  close(): void {}
}

/** Handles WebSocket upgrades for exec attachment. */
export function attachExec(_server: http.Server, _exec: ExecManager, _token: string): void {}
